"""Data sources behind a registry (``data.source``); see :mod:`debias.data.sources.base`.

Importing this package registers every source family's module.
"""

from debias.data.sources import cifar, images, mnist, tabular  # noqa: F401  (register every source family)
from debias.data.sources.base import (RAW_LAYOUTS, SOURCE_FILES, SOURCE_PROTOCOLS, SOURCES, SPLITS, DataSourceError,
                                      RawSplit, RawSplits, cap_splits, external_files, load_source, random_split,
                                      raw_modality, register_source, resize_images, split_by_index, stratified_split)

__all__ = ["RAW_LAYOUTS", "SOURCE_FILES", "SOURCE_PROTOCOLS", "SOURCES", "SPLITS", "DataSourceError", "RawSplit",
           "RawSplits", "cap_splits", "external_files", "load_source", "random_split", "raw_modality",
           "register_source", "resize_images", "split_by_index", "stratified_split"]
