"""Digit sources: scikit-learn's digits, torchvision's MNIST and a local npz.

``digits``  scikit-learn's bundled 8x8 handwritten digits, resized (offline; the default).
``mnist``   torchvision's MNIST, downloaded into ``data/raw/mnist`` (offline when the raw
            idx files are already there); validation carved from the official train split.
``npz``     a local ``.npz`` with ``x`` uint8 ``[N,H,W]`` or ``[N,H,W,3]``, ``y`` int and
            optionally ``a`` int (a bias attribute, for ``bias.protocol: given``).

digits and npz are split stratified by class (:func:`split_by_index`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from debias.data.sources.base import (DataSourceError, RawSplit, RawSplits, register_source, resize_images,
                                      split_by_index)
from debias.params import DataParams
from debias.paths import resolve_data_path

@register_source("digits")
def digits_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """scikit-learn's 1,797 8x8 digits (grey 0..16), scaled to 0..255 and resized."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    data = RawSplit(resize_images(x, params.image_size), bunch.target.astype(np.int64))
    return split_by_index(data, params, seed)


@register_source("mnist")
def mnist_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """torchvision MNIST into ``raw_dir``; validation = a seeded subset of the official train split."""
    from torchvision.datasets import MNIST

    root = raw_dir / "mnist"
    try:
        train = MNIST(str(root), train=True, download=True)
        test = MNIST(str(root), train=False, download=True)
    except Exception as exc:  # URLError, HTTPError, checksum failures, ...
        raise DataSourceError(
            f"data.source=mnist: MNIST could not be downloaded into {root} ({type(exc).__name__}: {exc}). "
            f"Without network, put the four official idx files (train-images-idx3-ubyte.gz, ..., or uncompressed) into {root}/MNIST/raw/, "
            "or use data.source=npz with data.path pointing at a local .npz (x uint8 [N,H,W], y int)."
        ) from None
    x_train, y_train = train.data.numpy(), train.targets.numpy().astype(np.int64)
    if params.mnist_val_size >= len(y_train):
        raise DataSourceError(
            f"data.mnist_val_size = {params.mnist_val_size} must be smaller than the {len(y_train)} training images"
        )
    order = np.random.default_rng(seed).permutation(len(y_train))
    val_idx, train_idx = np.sort(order[: params.mnist_val_size]), np.sort(order[params.mnist_val_size :])
    full = RawSplit(resize_images(x_train, params.image_size), y_train)
    return {
        "train": full.take(train_idx),
        "val": full.take(val_idx),
        "test": RawSplit(resize_images(test.data.numpy(), params.image_size), test.targets.numpy().astype(np.int64)),
    }


def read_npz(path: Path) -> RawSplit:
    """Load and check a bring-your-own ``.npz``: ``x`` uint8 [N,H,W] or [N,H,W,3], ``y`` int >= 0, optional ``a``."""
    if not path.exists():
        raise DataSourceError(f"data.path = '{path}' does not exist; point data.path at a local .npz with arrays x and y")
    try:
        archive = np.load(path, allow_pickle=False)
        arrays = {key: archive[key] for key in archive.files}
    except Exception as exc:
        raise DataSourceError(f"data.path = '{path}' is not a readable .npz ({type(exc).__name__}: {exc})") from None
    missing = [key for key in ("x", "y") if key not in arrays]
    if missing:
        raise DataSourceError(f"data.path = '{path}' lacks array(s) {missing}; it holds {sorted(arrays)} (need x and y)")
    x, y, a = arrays["x"], arrays["y"], arrays.get("a")
    if x.dtype != np.uint8:
        if np.issubdtype(x.dtype, np.floating) and np.isnan(x).any():
            raise DataSourceError(f"data.path = '{path}': x holds NaN values; x must be uint8 images in 0..255")
        raise DataSourceError(f"data.path = '{path}': x has dtype {x.dtype}; allowed: uint8 images in 0..255")
    if not (x.ndim == 3 or (x.ndim == 4 and x.shape[-1] == 3)):
        raise DataSourceError(f"data.path = '{path}': x has shape {x.shape}; allowed: [N,H,W] or [N,H,W,3]")
    if x.shape[1] != x.shape[2]:
        raise DataSourceError(f"data.path = '{path}': images are {x.shape[1]}x{x.shape[2]}; allowed: square images")
    for name, labels in (("y", y), ("a", a)):
        if labels is None:
            continue
        if labels.ndim != 1 or len(labels) != len(x):
            raise DataSourceError(f"data.path = '{path}': {name} has shape {labels.shape}; need [{len(x)}] (one per image)")
        if not np.issubdtype(labels.dtype, np.integer):
            raise DataSourceError(f"data.path = '{path}': {name} has dtype {labels.dtype}; allowed: integers")
        if labels.min(initial=0) < 0:
            raise DataSourceError(f"data.path = '{path}': {name} holds negative values (min {labels.min()}); allowed: 0, 1, ...")
    if len(x) == 0:
        raise DataSourceError(f"data.path = '{path}' holds no images")
    return RawSplit(x, y.astype(np.int64), None if a is None else a.astype(np.int64))


@register_source("npz", protocol="foreground", files=lambda params: {"data.path": resolve_data_path(params.path or "")})
def npz_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """A local .npz, split stratified by class."""
    assert params.path is not None  # the schema requires it for this source
    data = read_npz(resolve_data_path(params.path))
    data = RawSplit(resize_images(data.x, params.image_size), data.y, data.a)
    return split_by_index(data, params, seed)
