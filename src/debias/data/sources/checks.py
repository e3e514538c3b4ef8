"""What ``debias check-params`` checks beyond the schema, cheaply (no image decoded, no model built): the files a
source reads and the params that need the class count.

:func:`check_source` raises a :class:`~debias.core.errors.DataSourceError` naming the param or file at fault, else
returns one line per source check that ran (e.g. how many images an image folder lists):

- ``imagefolder``: the root is a folder, the metadata table reads and holds the named columns, labels, attributes
  and split values are valid, no image is listed twice and every image exists (existence only);
- ``npz``: ``data.path`` exists, and its labels ``y`` (and attribute ``a``, when given) take at least two values;
  ``adult`` / ``compas`` with ``data.path``: the folder holds the original files, and each is the published one
  (sha256) unless ``data.tabular.verify_sha256`` is false;
- the ``foreground`` protocol: ``bias.foreground.class_digits`` puts every label of the data in a class, where the
  labels are known cheaply (the digit sources' 0-9, an npz's ``y``; :func:`check_class_digits`);
- a ``probe.postprocess`` registered as binary-only (equalized odds) needs a binary task: refused when the class
  count is known to be otherwise (:func:`class_count`); where only the data tells, the linear_probe stage refuses it
  before any fit.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

import debias.data.sources  # noqa: F401  (registers every source: SOURCE_PROTOCOLS)
from debias.core.paths import resolve_data_path
from debias.data.bias import unassigned_labels
from debias.data.sources.base import SOURCE_PROTOCOLS, DataSourceError, check_varies
from debias.params import Params

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


def npz_arrays(path: Path, names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """The arrays ``names`` of the npz at ``path`` that it holds (read alone: x is not loaded); {} when unreadable
    (the download stage names what is wrong with the file)."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in names if name in archive.files}
    except (OSError, ValueError):
        return {}


def check_npz(params: Params) -> str:
    path = resolve_data_path(params.data.path or "")
    if not path.is_file():
        raise DataSourceError(f"data.path = '{path}' does not exist; point data.path at a local .npz with arrays x and y")
    arrays = npz_arrays(path, ("y", "a"))
    for role, values in arrays.items():
        if values.ndim == 1:
            check_varies(values, role, f"array '{role}' of data.path = '{path}'", f"all {len(values)} images")
    return f"data.path = '{path}' exists" + (f", {len(np.unique(arrays['y']))} classes" if "y" in arrays else "")


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
    """A ``probe.postprocess`` registered as binary-only on a task known not to be binary is refused (the schema's
    ``postprocess`` field lists them: :func:`debias.params.probe.probe_model`)."""
    name = params.probe.postprocess
    field = type(params.probe).model_fields["postprocess"]
    if name not in (field.json_schema_extra or {}).get("binary", ()):  # type: ignore[union-attr]
        return None
    classes = class_count(params)
    if classes is not None and classes != 2:
        raise DataSourceError(f"probe.postprocess = {name} needs a binary task; data.source = "
                              f"{params.data.source} (bias.protocol = {params.bias.protocol}) has {classes} classes; "
                              "allowed here: probe.postprocess = none")
    return None if classes is None else f"probe.postprocess = {name}: a binary task"


# The labels of the digit sources, known without reading them.
DIGIT_LABELS = {"digits": 10, "mnist": 10, "fashion_mnist": 10}




def check_class_digits(params: Params) -> str | None:
    """The foreground protocol's class_digits against the labels, where they are known cheaply."""
    source, protocol = params.data.source, params.bias.protocol
    if source == "npz":
        arrays = npz_arrays(resolve_data_path(params.data.path or ""), ("y", "a"))
        labels = arrays.get("y")
        protocol = ("given" if "a" in arrays else SOURCE_PROTOCOLS[source]) if protocol == "auto" else protocol
    else:
        labels = np.arange(DIGIT_LABELS[source]) if source in DIGIT_LABELS else None
        protocol = SOURCE_PROTOCOLS.get(source, protocol) if protocol == "auto" else protocol
    if protocol != "foreground" or labels is None or labels.ndim != 1:
        return None
    problem = unassigned_labels(labels, params.bias.foreground.class_digits, counted=source == "npz")
    if problem:
        raise DataSourceError(problem)
    return "bias.foreground.class_digits: every label has a class"


def check_source(params: Params) -> list[str]:
    """The checks above for ``params``; returns what each found, raises a DataSourceError at the first fault."""
    found = [SOURCE_CHECKS[params.data.source](params)] if params.data.source in SOURCE_CHECKS else []
    found += [line for line in (check_class_digits(params), check_postprocess(params)) if line]
    return found
