"""Digit and garment sources: scikit-learn's digits, torchvision's MNIST and Fashion-MNIST, and a local npz.

``digits``         scikit-learn's bundled 8x8 handwritten digits, resized (offline; the default).
``mnist``          torchvision's MNIST, downloaded into ``data/raw/mnist`` (offline when the raw
                   idx files are already in ``data/raw/mnist/MNIST/raw/``).
``fashion_mnist``  torchvision's Fashion-MNIST (Zalando; 60k + 10k 28x28 grey images, 10 classes, the
                   same format and size as MNIST), downloaded into ``data/raw/fashion_mnist`` (offline when
                   the idx files are already in ``data/raw/fashion_mnist/FashionMNIST/raw/``). It is how a
                   machine without the full MNIST tests the papers' scale.
``npz``            a local ``.npz`` with ``x`` uint8 ``[N,H,W]`` or ``[N,H,W,3]``, ``y`` int and
                   optionally ``a`` int (a bias attribute, for ``bias.protocol: given``).

mnist and fashion_mnist share one loader (:func:`torchvision_idx_source`): validation is a seeded subset
of ``data.mnist_val_size`` images of the official training split (default 6,000: 54k / 6k; CNC App. D.1's
80 / 20 is the cnc-cmnist preset's 12,000), the test split is the official 10k. Offline, the four
official idx files may be gzipped (``*.gz``, e.g. recompressed copies whose md5 differs from
torchvision's list) or not: a ``.gz`` without its decompressed twin is decompressed
beside it first, since torchvision only accepts a ``.gz`` whose md5 it knows. Under ``dvc exp run --temp``
and the queue (temporary copies without ``data/raw``) the files are copied from the main repository's
``data/raw/<source>/<Dataset>/raw/`` first (:func:`borrow_idx_files`).

Fashion-MNIST under the bias protocols (the labels are 0 T-shirt/top, 1 Trouser, 2 Pullover, 3 Dress,
4 Coat, 5 Sandal, 6 Shirt, 7 Sneaker, 8 Bag, 9 Ankle boot):
- ``foreground`` (CMNIST*): ``bias.foreground.class_digits`` pairs labels as for digits; the default pairs
  [0,1] [2,3] [4,5] [6,7] [8,9] are kept, so a run changes only the source (the pairs are as arbitrary as
  CMNIST*'s digit pairs; ``[[0,6],[2,4],[1,3],[5,7],[8,9]]`` pairs look-alikes instead, a harder task).
  Pixels with grey >= ``stroke_threshold`` take the colour: on garments that is the bright fabric, while
  darker texture keeps its grey.
- ``background`` (Biased-MNIST): every non-zero pixel becomes white, so the garment turns into its white
  silhouette on the coloured background and its grey texture is lost. Keeping the texture was not added as
  an option: it is not a better test. The silhouette keeps nearly all of what tells the classes apart (a
  logistic regression on 10k official training images scored 81.1 % on the 10k test images as silhouettes,
  82.7 % in grey; worst class 56 % both, Shirt), and half of every image is background (50.4 % zero
  pixels, no image without one), so the colour shows on every image.
digits and npz are split stratified by class (:func:`split_by_index`).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from debias.data.sources.base import (DataSourceError, RawSplit, RawSplits, register_source, resize_images,
                                      split_by_index)
from debias.core.paths import resolve_data_path
from debias.params import DataParams

@register_source("digits")
def digits_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """scikit-learn's 1,797 8x8 digits (grey 0..16), scaled to 0..255 and resized."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.round(bunch.images * (255.0 / 16.0)).astype(np.uint8)
    data = RawSplit(resize_images(x, params.image_size), bunch.target.astype(np.int64))
    return split_by_index(data, params, seed)


# The official idx files of torchvision's MNIST-format datasets, as torchvision names them (without .gz).
IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def decompress_idx_files(raw_folder: Path) -> list[str]:
    """Decompress every ``<idx file>.gz`` of :data:`IDX_FILES` in ``raw_folder`` whose decompressed file is missing
    (atomically: a partial file never passes for a complete one); return the names written."""
    import gzip
    import shutil

    written = []
    for name in IDX_FILES:
        target, packed = raw_folder / name, raw_folder / f"{name}.gz"
        if target.exists() or not packed.exists():
            continue
        partial = raw_folder / f".{name}.partial"
        with gzip.open(packed, "rb") as source, open(partial, "wb") as sink:
            shutil.copyfileobj(source, sink, 1 << 20)
        partial.replace(target)
        written.append(name)
    return written


def borrow_idx_files(raw_folder: Path) -> list[str]:
    """Copy into ``raw_folder`` (relative to the working folder) the idx files it lacks that the main repository holds
    in the same folder; return the names copied.

    ``dvc exp run --temp`` and queued experiments run in a temporary copy of the repository without the git-ignored
    ``data/raw``; without this, the offline copies a user put into the main repository's ``data/raw`` would be
    invisible there and the source would try to download. Copies, not links: DVC may make its outputs read-only.
    """
    import shutil

    if raw_folder.is_absolute():
        return []
    main = resolve_data_path(raw_folder)
    if not main.is_dir() or main.resolve() == raw_folder.resolve():
        return []
    copied = []
    for name in IDX_FILES:
        if (raw_folder / name).exists() or (raw_folder / f"{name}.gz").exists():
            continue
        for candidate in (name, f"{name}.gz"):
            if (main / candidate).is_file():
                raw_folder.mkdir(parents=True, exist_ok=True)
                partial = raw_folder / f".{candidate}.partial"
                shutil.copyfile(main / candidate, partial)
                partial.replace(raw_folder / candidate)
                copied.append(candidate)
                break
    return copied


def torchvision_idx_source(source: str, dataset: str, params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """``torchvision.datasets.<dataset>`` (MNIST, FashionMNIST) into ``raw_dir/<source>``: train and val from the
    official training split (val = a seeded subset of ``data.mnist_val_size`` images), test = the official test set."""
    import torchvision.datasets

    root = raw_dir / source
    borrow_idx_files(root / dataset / "raw")  # under --temp and the queue: the main repository's offline copies
    decompress_idx_files(root / dataset / "raw")  # offline copies given as .gz (any compression) count as present
    try:
        dataset_class = getattr(torchvision.datasets, dataset)
        train = dataset_class(str(root), train=True, download=True)
        test = dataset_class(str(root), train=False, download=True)
    except Exception as exc:  # URLError, HTTPError, checksum failures, ...
        raise DataSourceError(
            f"data.source={source}: {dataset} could not be downloaded into {root} ({type(exc).__name__}: {exc}). "
            f"Without network, put the four official idx files ({', '.join(f'{n}.gz' for n in IDX_FILES[:2])}, ..., "
            f"gzipped or uncompressed) into {root}/{dataset}/raw/, "
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


@register_source("mnist")
def mnist_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """torchvision MNIST into ``raw_dir/mnist``; validation = a seeded subset of the official train split."""
    return torchvision_idx_source("mnist", "MNIST", params, raw_dir, seed)


@register_source("fashion_mnist")
def fashion_mnist_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """torchvision Fashion-MNIST into ``raw_dir/fashion_mnist``; validation = a seeded subset of the official train split."""
    return torchvision_idx_source("fashion_mnist", "FashionMNIST", params, raw_dir, seed)


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


@register_source("npz", protocol="foreground", files=lambda params: {"data.path": resolve_data_path(params.path or "")},
                 values=lambda params: {role: f"array '{role}' of data.path = '{params.path}'" for role in ("y", "a")})
def npz_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """A local .npz, split stratified by class."""
    assert params.path is not None  # the schema requires it for this source
    data = read_npz(resolve_data_path(params.path))
    data = RawSplit(resize_images(data.x, params.image_size), data.y, data.a)
    return split_by_index(data, params, seed)
