"""Tests of debias.losses, one file per loss family, against the float64 references of reference.py."""
