"""Data: sources (sources/), bias injection (bias.py, corruptions.py), stored splits (store.py), augmentation."""
