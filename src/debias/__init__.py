"""debias: learn image representations robust to dataset bias, and measure how robust they are."""

__version__ = "0.1.0"
