"""Data sources behind a registry (``data.source``); see :mod:`debias.data.sources.base`.

Importing this package registers every source family's module.
"""

from debias.data.sources import mnist  # noqa: F401  (registers digits, mnist, npz)
from debias.data.sources import tabular  # noqa: F401  (registers adult, compas)
from debias.data.sources.base import (RAW_LAYOUTS, SOURCE_PROTOCOLS, SOURCES, SPLITS, DataSourceError, RawSplit, RawSplits,
                                      cap_splits, load_source, random_split, raw_modality, register_source,
                                      resize_images, split_by_index, stratified_split)

__all__ = ["RAW_LAYOUTS", "SOURCE_PROTOCOLS", "SOURCES", "SPLITS", "DataSourceError", "RawSplit", "RawSplits", "cap_splits",
           "load_source", "random_split", "raw_modality", "register_source", "resize_images", "split_by_index",
           "stratified_split"]
