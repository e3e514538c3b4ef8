"""Data sources behind a registry (``data.source``); see :mod:`debias.data.sources.base`.

Importing this package registers every source family's module.
"""

from debias.data.sources import cifar, images, mnist  # noqa: F401  (register cifar10; imagefolder, waterbirds, celeba; digits, mnist, npz)
from debias.data.sources.base import (SOURCE_FILES, SOURCE_PROTOCOLS, SOURCES, SPLITS, DataSourceError, RawSplit,
                                      RawSplits, cap_splits, external_files, load_source, register_source, resize_images, split_by_index,
                                      stratified_split)

__all__ = ["SOURCE_FILES", "SOURCE_PROTOCOLS", "SOURCES", "SPLITS", "DataSourceError", "RawSplit", "RawSplits", "cap_splits",
           "external_files", "load_source",
           "register_source", "resize_images", "split_by_index", "stratified_split"]
