"""The source registry and what every source shares: :class:`RawSplit`, split helpers, :func:`load_source`.

A source is a function ``(DataParams, raw_dir, seed) -> {"train", "val", "test"}`` registered under
its ``data.source`` name with :func:`register_source`; each family lives in its own module of this
package (``mnist``: digits, MNIST, npz; ``tabular``: adult, compas) and :mod:`debias.data.sources`
imports them all.

:class:`RawSplit`, :data:`RAW_LAYOUTS` and :func:`raw_modality` live in :mod:`debias.data.raw` (re-exported here),
which the stages after ``download`` import instead of this package: a change to a source reruns ``download`` alone.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import numpy as np

from debias.data.raw import RAW_LAYOUTS, SPLITS, RawSplit, RawSplits, raw_modality  # noqa: F401  (re-exported)
from debias.core.errors import DataSourceError
from debias.params import DataParams

SourceFn = Callable[[DataParams, Path, int], RawSplits]
FilesFn = Callable[[DataParams], dict[str, Path]]
DigestsFn = Callable[[DataParams], dict[str, str]]
SOURCES: dict[str, SourceFn] = {}
# The bias protocol each source's data calls for (``bias.protocol: auto`` resolves through it):
# ``foreground`` for grey digits, ``given`` where the data carries its own bias attribute.
SOURCE_PROTOCOLS: dict[str, str] = {}
# Files outside the pipeline a source reads, by the param naming them (npz: data.path); the ``source``
# stage fingerprints their content so DVC reruns ``download`` when one changes in place.
SOURCE_FILES: dict[str, FilesFn] = {}
# A source's own fingerprint of some of those params (the files it actually reads), where a folder's walk
# (names, sizes, times of what lies under it) would miss files or see others: keyed as its files.
SOURCE_DIGESTS: dict[str, DigestsFn] = {}
# Where a source's labels ``y`` and attribute ``a`` come from (the column, array or param), for error messages.
ValuesFn = Callable[[DataParams], dict[str, str]]
SOURCE_VALUES: dict[str, ValuesFn] = {}


def register_source(name: str, protocol: str = "foreground", files: FilesFn | None = None,
                    digests: DigestsFn | None = None, values: ValuesFn | None = None) -> Callable[[SourceFn], SourceFn]:
    """Register ``fn`` as ``data.source = name``; ``protocol`` is the bias protocol its data calls for,
    ``files(params)`` the external files (or folders) it reads, by the param that names each, ``digests(params)``
    its own fingerprint of some of them (default: a file's bytes, a folder's walk), ``values(params)`` where its
    ``y`` and ``a`` come from, by role (for messages; default: the source's labels and attribute)."""
    def decorate(fn: SourceFn) -> SourceFn:
        SOURCES[name] = fn
        SOURCE_PROTOCOLS[name] = protocol
        if values is not None:
            SOURCE_VALUES[name] = values
        if files is not None:
            SOURCE_FILES[name] = files
        if digests is not None:
            SOURCE_DIGESTS[name] = digests
        return fn

    return decorate


def external_files(params: DataParams) -> dict[str, Path]:
    """The external files (or folders) ``data.source`` reads, by the param naming each (resolved paths)."""
    return SOURCE_FILES[params.source](params) if params.source in SOURCE_FILES else {}


def source_digests(params: DataParams) -> dict[str, str]:
    """The source's own fingerprints of its external files, by param (empty: each file or folder as it is)."""
    return SOURCE_DIGESTS[params.source](params) if params.source in SOURCE_DIGESTS else {}


# --------------------------------------------------------------------------- helpers


def resize_images(x: np.ndarray, size: int) -> np.ndarray:
    """Bilinear (antialiased) resize of uint8 ``[N,H,W]`` or ``[N,H,W,3]`` to ``size`` x ``size``."""
    if x.shape[1] == size and x.shape[2] == size:
        return x
    import torch  # here: the source stage fingerprints files without importing torch
    import torch.nn.functional as F

    t = torch.from_numpy(np.ascontiguousarray(x)).float()
    rgb = t.ndim == 4
    t = t.permute(0, 3, 1, 2) if rgb else t.unsqueeze(1)
    t = F.interpolate(t, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
    t = t.round().clamp_(0, 255).to(torch.uint8)
    t = t.permute(0, 2, 3, 1) if rgb else t.squeeze(1)
    return t.contiguous().numpy()


def stratified_split(y: np.ndarray, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Indices per split, the same fractions within every class, shuffled with ``seed``."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for label in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == label))
        n_test = int(round(len(members) * test_fraction))
        n_val = int(round(len(members) * val_fraction))
        parts["test"].append(members[:n_test])
        parts["val"].append(members[n_test : n_test + n_val])
        parts["train"].append(members[n_test + n_val :])
    return {name: np.sort(np.concatenate(idx)) for name, idx in parts.items()}


def random_split(n: int, val_fraction: float, test_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Indices per split from one seeded permutation of ``range(n)`` (not stratified), each sorted."""
    order = np.random.default_rng(seed).permutation(n)
    n_test, n_val = int(round(n * test_fraction)), int(round(n * val_fraction))
    parts = {"test": order[:n_test], "val": order[n_test : n_test + n_val], "train": order[n_test + n_val :]}
    return {name: np.sort(parts[name]) for name in SPLITS}


def split_by_index(data: RawSplit, params: DataParams, seed: int) -> RawSplits:
    index = stratified_split(data.y, params.val_fraction, params.test_fraction, seed)
    return {name: data.take(idx) for name, idx in index.items()}


def cap_splits(splits: RawSplits, cap: int | None, seed: int) -> RawSplits:
    """Keep at most ``cap`` images (rows) per split (a seeded random subset, order preserved)."""
    if cap is None:
        return splits
    rng = np.random.default_rng(seed)
    out: RawSplits = {}
    for name, split in splits.items():
        if len(split) > cap:
            split = split.take(np.sort(rng.choice(len(split), cap, replace=False)))
        out[name] = split
    return out


def cap_train(splits: RawSplits, cap: int | None, seed: int) -> RawSplits:
    """Keep at most ``cap`` training images: the first ``cap`` of one seeded permutation (order preserved), so
    a smaller cap's subset lies inside a larger one's (``data.max_train``; validation and test unchanged)."""
    if cap is None or "train" not in splits or len(splits["train"]) <= cap:
        return splits
    order = np.random.default_rng([seed, 61]).permutation(len(splits["train"]))
    return {**splits, "train": splits["train"].take(np.sort(order[:cap]))}


def value_origins(params: DataParams) -> dict[str, str]:
    """Where ``y`` and ``a`` of ``data.source`` come from, by role, for messages (:data:`SOURCE_VALUES`)."""
    default = {"y": f"the labels y of data.source = {params.source}",
               "a": f"the bias attribute a of data.source = {params.source}"}
    return {**default, **(SOURCE_VALUES[params.source](params) if params.source in SOURCE_VALUES else {})}


# Why each role needs two values, and what to do instead.
ONE_VALUE = {
    "y": ("at least 2 classes (a task of one class scores a 'perfect' 1.000 that measures nothing)",
          "give data with at least two classes"),
    "a": ("at least 2 values of the bias attribute (one that never varies makes every image 'bias-aligned': a "
          "maximal bias that is none)", "give the attribute that varies (or, for data without one, a source or "
          "protocol that makes it: an npz without array 'a' is coloured by bias.protocol auto)"),
}


def check_varies(values: np.ndarray, role: str, origin: str, where: str) -> None:
    """Refuse (DataSourceError) ``values`` of ``role`` (``y`` or ``a``) with fewer than two distinct values,
    naming ``origin`` (the column, array or param) and ``where`` (which images)."""
    present = np.unique(values)
    if len(present) >= 2:
        return
    allowed, fix = ONE_VALUE[role]
    found = f"only the value {present[0]}" if len(present) else "no value"
    raise DataSourceError(f"{origin} holds {found} in {where}; allowed: {allowed}; {fix}")


def check_two_values(splits: RawSplits, params: DataParams) -> None:
    """Every source: the labels take at least two values, in all the data and in the training split, and so does
    the attribute (where the source gives one) in the training split, whose majority defines the aligned images."""
    origins = value_origins(params)
    n_total = sum(len(split) for split in splits.values())
    check_varies(np.concatenate([split.y for split in splits.values()]), "y", origins["y"], f"all {n_total} images")
    check_varies(splits["train"].y, "y", origins["y"], f"the {len(splits['train'])} training images")
    if all(split.a is not None for split in splits.values()):
        check_varies(np.concatenate([split.a for split in splits.values()]), "a", origins["a"],  # type: ignore[misc]
                     f"all {n_total} images")
        check_varies(splits["train"].a, "a", origins["a"], f"the {len(splits['train'])} training images")  # type: ignore[arg-type]


def missing_classes(splits: RawSplits) -> dict[str, list[int]]:
    """Per split, the classes of the whole dataset that the split holds no image of."""
    classes = set(np.unique(np.concatenate([split.y for split in splits.values()])).tolist())
    return {name: sorted(classes - set(np.unique(split.y).tolist())) for name, split in splits.items()}


def cap_index(index: dict[str, np.ndarray], cap: int | None, seed: int) -> dict[str, np.ndarray]:
    """The rows :func:`cap_splits` would keep, chosen before any image is decoded (same seeded draws)."""
    if cap is None:
        return index
    rng = np.random.default_rng(seed)
    return {name: rows[np.sort(rng.choice(len(rows), cap, replace=False))] if len(rows) > cap else rows
            for name, rows in index.items()}


# The download stage decodes into one array per split, then inject_bias holds the raw arrays and their
# channels-first copy at once: the peak is about two copies of the uint8 images.
PEAK_COPIES = 2
GIB = 2**30


def available_memory_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages; None where neither is known."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_memory(n_images: int, size: int, params: DataParams) -> None:
    """Refuse (DataSourceError) when PEAK_COPIES x the RGB uint8 arrays would exceed data.memory_gb or the memory available."""
    needed = PEAK_COPIES * n_images * size * size * 3
    budget = int(params.memory_gb * GIB) if params.memory_gb is not None else available_memory_bytes()
    if budget is None or needed <= budget:
        return
    where = f"data.memory_gb = {params.memory_gb:g}" if params.memory_gb is not None else "the memory available now"
    fitting = int((budget / (PEAK_COPIES * 3 * n_images)) ** 0.5)
    raise DataSourceError(
        f"data.source={params.source}: {n_images} images at {size}x{size} need about {needed / GIB:.1f} GiB "
        f"({PEAK_COPIES} copies of {n_images} x {size} x {size} x 3 bytes, held by inject_bias), more than {where} "
        f"({budget / GIB:.1f} GiB); lower data.image_size (at most {max(fitting, 1)} fits), cap data.max_per_split, "
        "or raise data.memory_gb on a machine with more memory")


def load_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """Run the registered source named by ``data.source``, then check every split is usable: not empty, not
    stripped by ``data.max_per_split`` of a label it had (classes missing from a split after the bias protocol
    made them are refused by :func:`debias.data.bias.inject_bias`), and with two classes and, where the source
    gives an attribute, two attribute values (:func:`check_two_values`)."""
    if params.source not in SOURCES:
        raise DataSourceError(f"data.source = '{params.source}' is unknown; allowed: {sorted(SOURCES)}")
    full = SOURCES[params.source](params, raw_dir, seed)
    capped = cap_splits(full, params.max_per_split, seed)
    splits = cap_train(capped, params.max_train, seed)
    for name in SPLITS:
        if name not in splits or len(splits[name]) == 0:
            raise DataSourceError(
                f"split '{name}' is empty for data.source = '{params.source}'; "
                "raise data.val_fraction / data.test_fraction (adult, compas: data.tabular.val_fraction / "
                "test_fraction) or provide more data"
            )
    before, after, after_split_cap = missing_classes(full), missing_classes(splits), missing_classes(capped)
    for name in SPLITS:
        lost = sorted(set(after[name]) - set(before[name]))
        if lost:
            cap = "data.max_per_split" if set(after_split_cap[name]) - set(before[name]) else "data.max_train"
            value = params.max_train if cap == "data.max_train" else params.max_per_split
            raise DataSourceError(
                f"{cap} = {value} leaves split '{name}' without labels {lost[:10]}: "
                f"raise {cap} (the capped split keeps {len(splits[name])} of {len(full[name])} images) "
                "or set it to null")
    check_two_values(splits, params)
    return splits
