"""CIFAR-10 (torchvision), the base of Corrupted CIFAR-10 (``bias.protocol: corruption``).

``cifar10``  torchvision's CIFAR-10 downloaded into ``data/raw/cifar10``. Offline, the official
             python batches under ``data/raw/cifar10/cifar-10-batches-py/`` (data_batch_1 ... 5,
             test_batch: pickled dicts with ``b'data'`` uint8 ``[N, 3072]`` channel-major and
             ``b'labels'``) are read directly; torchvision reads them only after checking each file's
             MD5 sum. Validation = a seeded subset of ``data.cifar10.val_size`` official training
             images (LfF / DFA validate on other data; the papers report the test split).
The files are Python pickles, as CIFAR-10 ships them: read only batches from the official archive.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np

from debias.data.sources.base import DataSourceError, RawSplit, RawSplits, check_memory, register_source, resize_images
from debias.params import DataParams

CIFAR_FOLDER = "cifar-10-batches-py"  # torchvision's CIFAR10.base_folder
CIFAR_BATCHES = {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]}
CIFAR_SIDE = 32


def read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One pickled CIFAR batch: uint8 ``[N, 32, 32, 3]`` images and int64 labels; anything else is a DataSourceError."""
    try:
        with open(path, "rb") as handle:
            entry = pickle.load(handle, encoding="bytes")
    except Exception as exc:
        raise DataSourceError(f"{path} is not a CIFAR-10 python batch ({type(exc).__name__}: {exc})") from None
    if not isinstance(entry, dict):
        raise DataSourceError(f"{path} holds a {type(entry).__name__}; a CIFAR-10 batch is a dict with b'data' and b'labels'")
    entry = {key.decode() if isinstance(key, bytes) else key: value for key, value in entry.items()}
    if "data" not in entry or "labels" not in entry:
        raise DataSourceError(f"{path} lacks b'data' or b'labels'; it holds {sorted(entry)}")
    data, labels = np.asarray(entry["data"]), np.asarray(entry["labels"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3 * CIFAR_SIDE * CIFAR_SIDE or len(labels) != len(data):
        raise DataSourceError(f"{path}: b'data' is {data.dtype} {data.shape} with {len(labels)} labels; "
                              f"need uint8 [N, {3 * CIFAR_SIDE * CIFAR_SIDE}] and N labels")
    x = data.reshape(-1, 3, CIFAR_SIDE, CIFAR_SIDE).transpose(0, 2, 3, 1)
    return np.ascontiguousarray(x), labels.astype(np.int64)


def read_cifar_split(folder: Path, names: list[str]) -> RawSplit:
    parts = [read_cifar_batch(folder / name) for name in names]
    return RawSplit(np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts]))


def cifar_files_present(folder: Path) -> bool:
    return all((folder / name).is_file() for names in CIFAR_BATCHES.values() for name in names)


@register_source("cifar10", protocol="corruption")
def cifar10_source(params: DataParams, raw_dir: Path, seed: int) -> RawSplits:
    """CIFAR-10 into ``raw_dir``; validation = a seeded subset of the official training split."""
    root = raw_dir / "cifar10"
    folder = root / CIFAR_FOLDER
    if not cifar_files_present(folder):
        from torchvision.datasets import CIFAR10

        try:
            CIFAR10(str(root), train=True, download=True)
        except Exception as exc:  # URLError, HTTPError, checksum failures, ...
            raise DataSourceError(
                f"data.source=cifar10: CIFAR-10 could not be downloaded into {root} ({type(exc).__name__}: {exc}). "
                f"Without network, extract cifar-10-python.tar.gz into {root}/ (giving {folder}/data_batch_1 ... "
                "data_batch_5 and test_batch)") from None
    train, test = read_cifar_split(folder, CIFAR_BATCHES["train"]), read_cifar_split(folder, CIFAR_BATCHES["test"])
    val_size = params.cifar10.val_size
    if val_size >= len(train):
        raise DataSourceError(f"data.cifar10.val_size = {val_size} must be smaller than the {len(train)} training images")
    check_memory(len(train) + len(test), max(params.image_size, CIFAR_SIDE), params)
    order = np.random.default_rng(seed).permutation(len(train))
    resized = RawSplit(resize_images(train.x, params.image_size), train.y)
    return {
        "train": resized.take(np.sort(order[val_size:])),
        "val": resized.take(np.sort(order[:val_size])),
        "test": RawSplit(resize_images(test.x, params.image_size), test.y),
    }
