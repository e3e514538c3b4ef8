"""What every stage shares: atomic I/O, output paths, errors, machine settings, lazy imports, fingerprints, param
trees, multi-process helpers, headline metrics and the training-health warnings. These compute or write output
values, so a stage that imports one depends on it."""
