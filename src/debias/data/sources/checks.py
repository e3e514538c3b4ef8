"""What ``debias check-params`` checks beyond the schema, cheaply (no image decoded, no model built): the files a
source reads and the params that need the class count.

:func:`check_source` raises a :class:`~debias.errors.DataSourceError` naming the param or file at fault, else
returns one line per source check that ran (e.g. how many images an image folder lists):

- ``imagefolder``: the root is a folder, the metadata table reads and holds the named columns, labels, attributes
  and split values are valid, no image is listed twice and every image exists (existence only);
- ``npz``: ``data.path`` exists; ``adult`` / ``compas`` with ``data.path``: the folder holds the original files,
  and each is the published one (sha256) unless ``data.tabular.verify_sha256`` is false;
- ``probe.postprocess: equalized_odds`` needs a binary task: refused when the class count is known to be
  otherwise (:func:`class_count`); where only the data tells, the linear_probe stage refuses it before any fit.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import debias.data.sources  # noqa: F401  (registers every source: SOURCE_PROTOCOLS)
from debias.data.sources.base import SOURCE_PROTOCOLS, DataSourceError
from debias.params import Params
from debias.paths import resolve_data_path

# Classes of each source whose class count does not depend on its files (the foreground protocol: its own).
FIXED_CLASSES = {"digits": 10, "mnist": 10, "fashion_mnist": 10, "cifar10": 10, "adult": 2, "compas": 2,
                 "waterbirds": 2, "celeba": 2}


def class_count(params: Params) -> int | None:
    """The task's class count as far as params and a cheap look at the files tell (the foreground protocol: its
    class_digits groups; else the source's labels); None when unknown."""
    source, protocol = params.data.source, params.bias.protocol
    labels = None
    if source == "npz":
        path = resolve_data_path(params.data.path or "")
        try:
            with np.load(path, allow_pickle=False) as archive:
                labels = archive["y"] if "y" in archive.files else None
                attributed = "a" in archive.files
        except (OSError, ValueError):
            return None  # the download stage names what is wrong with the file
        if protocol == "auto":
            protocol = "given" if attributed else SOURCE_PROTOCOLS[source]
    elif protocol == "auto":
        protocol = SOURCE_PROTOCOLS.get(source, protocol)
    if protocol == "foreground":
        return len(params.bias.foreground.class_digits)
    if source in FIXED_CLASSES:
        return FIXED_CLASSES[source]
    if source == "imagefolder":
        from debias.data.sources.images import table_from_metadata

        spec = params.data.imagefolder
        return len(table_from_metadata(spec, resolve_data_path(spec.root or "")).y_names)
    if labels is not None and labels.size and np.issubdtype(labels.dtype, np.integer):
        return int(labels.max()) + 1
    return None


def check_imagefolder(params: Params) -> str:
    from debias.data.sources.images import check_imagefolder as check

    return check(params.data)


def check_npz(params: Params) -> str:
    path = resolve_data_path(params.data.path or "")
    if not path.is_file():
        raise DataSourceError(f"data.path = '{path}' does not exist; point data.path at a local .npz with arrays x and y")
    return f"data.path = '{path}' exists"


def check_tabular(params: Params) -> str:
    from debias.data.sources.tabular import DATASET_FILES, fetch_files, verify_files

    if not params.data.path:
        return f"{params.data.source}: data/raw/{params.data.source}/ (downloaded when missing)"
    folder = resolve_data_path(params.data.path)
    files = DATASET_FILES[params.data.source]
    paths = fetch_files(folder, files, params.data.source, download=False)
    verify_files(paths, files, params.data.source, params.data.tabular)
    return f"data.path = '{folder}' holds {', '.join(f.name for f in files)}" + (
        " (the published files)" if params.data.tabular.verify_sha256 else "")


SOURCE_CHECKS: dict[str, Callable[[Params], str]] = {"imagefolder": check_imagefolder, "npz": check_npz,
                                                     "adult": check_tabular, "compas": check_tabular}


def check_postprocess(params: Params) -> str | None:
    """``probe.postprocess: equalized_odds`` on a task known not to be binary is refused."""
    if params.probe.postprocess != "equalized_odds":
        return None
    classes = class_count(params)
    if classes is not None and classes != 2:
        raise DataSourceError(f"probe.postprocess = equalized_odds needs a binary task; data.source = "
                              f"{params.data.source} (bias.protocol = {params.bias.protocol}) has {classes} classes; "
                              "allowed here: probe.postprocess = none")
    return None if classes is None else "probe.postprocess = equalized_odds: a binary task"


def check_source(params: Params) -> list[str]:
    """The checks above for ``params``; returns what each found, raises a DataSourceError at the first fault."""
    found = [SOURCE_CHECKS[params.data.source](params)] if params.data.source in SOURCE_CHECKS else []
    post = check_postprocess(params)
    return found + ([post] if post else [])
