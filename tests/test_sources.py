"""Data sources: digits, mnist and fashion_mnist (from raw idx files, offline) and npz, with their splits and errors."""

from __future__ import annotations

import gzip
import shutil
import struct
import urllib.error
from pathlib import Path

import numpy as np
import pytest

from debias.data import sources
from debias.data.sources import DataSourceError, load_source, stratified_split
from debias.data.sources.mnist import read_npz
from debias.params import DataParams
from tests.conftest import SHARED_DATASETS, tiny_grey_digits


def test_digits_is_offline_resized_and_stratified(tmp_path) -> None:
    params = DataParams(source="digits", val_fraction=0.15, test_fraction=0.25, image_size=28)
    splits = load_source(params, tmp_path, seed=0)
    assert sum(len(s) for s in splits.values()) == 1797
    train = splits["train"]
    assert train.x.shape[1:] == (28, 28) and train.x.dtype == np.uint8 and train.x.max() > 200
    # stratified: every class has the same share of the test split (+- rounding)
    for label in range(10):
        share = (splits["test"].y == label).sum() / ((splits["test"].y == label).sum() + (train.y == label).sum()
                                                     + (splits["val"].y == label).sum())
        assert abs(share - 0.25) < 0.02
    again = load_source(params, tmp_path, seed=0)
    assert np.array_equal(again["val"].x, splits["val"].x)
    other = load_source(params, tmp_path, seed=1)
    assert not np.array_equal(other["val"].y, splits["val"].y)


def test_stratified_split_is_a_partition() -> None:
    y = np.repeat(np.arange(4), 25)
    parts = stratified_split(y, 0.2, 0.2, seed=3)
    everything = np.concatenate(list(parts.values()))
    assert np.array_equal(np.sort(everything), np.arange(100))


def _write_idx(path, array: np.ndarray) -> None:
    """Write an MNIST idx file (magic, dims, big-endian, uint8 payload); gzipped when ``path`` ends in .gz."""
    kind = 0x0803 if array.ndim == 3 else 0x0801
    header = struct.pack(">I", kind) + b"".join(struct.pack(">I", d) for d in array.shape)
    payload = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(payload, compresslevel=1) if path.suffix == ".gz" else payload)


def test_mnist_from_raw_idx_files_without_network(tmp_path, monkeypatch, mnist10k) -> None:
    raw = tmp_path / "mnist" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):  # the real test files
        with gzip.open(SHARED_DATASETS / "MNIST" / "raw" / f"{name}.gz") as src, open(raw / name, "wb") as dst:
            shutil.copyfileobj(src, dst)
    _write_idx(raw / "train-images-idx3-ubyte", mnist10k["x"][:600])
    _write_idx(raw / "train-labels-idx1-ubyte", mnist10k["y"][:600])

    def no_network(*args, **kwargs):
        raise AssertionError("the test tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    params = DataParams(source="mnist", mnist_val_size=100)
    splits = load_source(params, tmp_path, seed=0)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (500, 100, 10000)
    assert np.array_equal(splits["test"].x, mnist10k["x"]) and np.array_equal(splits["test"].y, mnist10k["y"])
    # train and val are a partition of the official training images
    seen = np.concatenate([splits["train"].x, splits["val"].x]).reshape(600, -1)
    assert len(np.unique(seen, axis=0)) == len(np.unique(mnist10k["x"][:600].reshape(600, -1), axis=0))


@pytest.mark.parametrize(("source", "dataset"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_mnist_download_failure_says_what_to_do(tmp_path, monkeypatch, source: str, dataset: str) -> None:
    import torchvision.datasets

    def fail(*args, **kwargs):
        raise urllib.error.URLError("no network")

    monkeypatch.setattr(torchvision.datasets, dataset, fail)
    with pytest.raises(DataSourceError, match=f"data.source={source}.*{source}/{dataset}/raw.*data.source=npz"):
        load_source(DataParams(source=source), tmp_path, seed=0)


def test_fashion_mnist_from_gzipped_idx_files_without_network(tmp_path, monkeypatch) -> None:
    """Official idx layout, gzipped with another compressor than the official files (md5 differs, as the shared
    Debian copies): decompressed beside the .gz and loaded without touching the network."""
    rng = np.random.default_rng(0)
    x_train, y_train = rng.integers(0, 256, (130, 28, 28), dtype=np.uint8), np.tile(np.arange(10), 13)
    x_test, y_test = rng.integers(0, 256, (40, 28, 28), dtype=np.uint8), np.tile(np.arange(10), 4)
    raw = tmp_path / "fashion_mnist" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for name, array in (("train-images-idx3-ubyte", x_train), ("train-labels-idx1-ubyte", y_train),
                        ("t10k-images-idx3-ubyte", x_test), ("t10k-labels-idx1-ubyte", y_test)):
        _write_idx(raw / f"{name}.gz", array)

    def no_network(*args, **kwargs):
        raise AssertionError("the test tried to reach the network")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)
    params = DataParams(source="fashion_mnist", mnist_val_size=30)
    splits = load_source(params, tmp_path, seed=0)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (100, 30, 40)
    assert np.array_equal(splits["test"].x, x_test) and np.array_equal(splits["test"].y, y_test)
    assert splits["train"].x.dtype == np.uint8 and splits["train"].x.shape[1:] == (28, 28)
    # train and val partition the official training images (row order kept)
    order = np.random.default_rng(0).permutation(130)
    assert np.array_equal(splits["val"].x, x_train[np.sort(order[:30])])
    assert np.array_equal(splits["train"].y, y_train[np.sort(order[30:])])
    assert sorted(p.name for p in raw.iterdir() if not p.name.endswith(".gz")) == sorted(sources.mnist.IDX_FILES)
    again = load_source(params, tmp_path, seed=0)  # second run: the decompressed files as they are
    assert np.array_equal(again["train"].x, splits["train"].x)


def test_fashion_mnist_under_a_temporary_workspace_takes_the_main_repositorys_files(tmp_path, monkeypatch) -> None:
    """dvc exp run --temp / the queue run in a copy without data/raw: the idx files come from $DVC_ROOT's data/raw."""
    main_raw = tmp_path / "main" / "data" / "raw" / "fashion_mnist" / "FashionMNIST" / "raw"
    main_raw.mkdir(parents=True)
    x, y = np.zeros((200, 28, 28), np.uint8), np.tile(np.arange(10), 20)
    for split in ("train", "t10k"):
        _write_idx(main_raw / f"{split}-images-idx3-ubyte.gz", x)
        _write_idx(main_raw / f"{split}-labels-idx1-ubyte.gz", y)
    workspace = tmp_path / "temp-workspace"
    workspace.mkdir()
    monkeypatch.setenv("DVC_ROOT", str(tmp_path / "main"))
    monkeypatch.chdir(workspace)
    splits = load_source(DataParams(source="fashion_mnist", mnist_val_size=100), Path("data/raw"), seed=0)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (100, 100, 200)
    local = workspace / "data" / "raw" / "fashion_mnist" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in local.glob("*.gz")) == sorted(p.name for p in main_raw.iterdir())
    assert sorted(p.name for p in main_raw.iterdir()) == sorted(f"{n}.gz" for n in sources.mnist.IDX_FILES)  # untouched


def test_max_train_caps_only_the_training_split_nested(tmp_path) -> None:
    x, y = tiny_grey_digits(n_per_class=20, classes=4)
    path = tmp_path / "d.npz"
    np.savez(path, x=x, y=y)
    params = dict(source="npz", path=str(path), val_fraction=0.2, test_fraction=0.2)
    full = load_source(DataParams(**params), tmp_path, seed=0)
    small = load_source(DataParams(**params, max_train=12), tmp_path, seed=0)
    larger = load_source(DataParams(**params, max_train=30), tmp_path, seed=0)
    assert (len(small["train"]), len(larger["train"])) == (12, 30)
    for name in ("val", "test"):
        assert np.array_equal(small[name].x, full[name].x)
    rows = {row.tobytes() for row in larger["train"].x}
    assert all(row.tobytes() in rows for row in small["train"].x)  # the 12 lie inside the 30
    with pytest.raises(DataSourceError, match=r"data.max_train = 1 leaves split 'train' without labels"):
        load_source(DataParams(**params, max_train=1), tmp_path, seed=0)


def test_fashion_mnist_shared_copy_has_the_papers_sizes(tmp_path) -> None:
    """The complete Fashion-MNIST beside the repository (symlinked, never copied into it): 54k / 6k / 10k."""
    shared = SHARED_DATASETS / "FashionMNIST" / "raw"
    if not shared.exists():
        pytest.skip(f"shared dataset {shared} is not beside the repository")
    raw = tmp_path / "fashion_mnist" / "FashionMNIST" / "raw"
    raw.mkdir(parents=True)
    for packed in shared.glob("*-ubyte.gz"):
        (raw / packed.name).symlink_to(packed)
    splits = load_source(DataParams(source="fashion_mnist"), tmp_path, seed=0)
    assert (len(splits["train"]), len(splits["val"]), len(splits["test"])) == (54000, 6000, 10000)
    assert splits["train"].x.dtype == np.uint8 and splits["train"].x.shape[1:] == (28, 28)
    counts = np.bincount(np.concatenate([splits["train"].y, splits["val"].y]), minlength=10)
    assert counts.tolist() == [6000] * 10 and np.bincount(splits["test"].y).tolist() == [1000] * 10


def test_npz_source_on_real_mnist(tmp_path, mnist10k) -> None:
    path = tmp_path / "m.npz"
    np.savez(path, x=mnist10k["x"][:2000], y=mnist10k["y"][:2000])
    splits = load_source(DataParams(source="npz", path=str(path)), tmp_path, seed=0)
    assert sum(len(s) for s in splits.values()) == 2000
    assert splits["train"].x.shape[1:] == (28, 28)


@pytest.mark.parametrize(
    ("arrays", "message"),
    [
        ({"y": np.zeros(4, dtype=np.int64)}, r"lacks array\(s\) \['x'\]"),
        ({"x": np.zeros((4, 8, 8), np.uint8)}, r"lacks array\(s\) \['y'\]"),
        ({"x": np.full((4, 8, 8), np.nan), "y": np.zeros(4, np.int64)}, "NaN"),
        ({"x": np.zeros((4, 8, 8), np.float32), "y": np.zeros(4, np.int64)}, "dtype float32; allowed: uint8"),
        ({"x": np.zeros((4, 8), np.uint8), "y": np.zeros(4, np.int64)}, r"shape \(4, 8\); allowed"),
        ({"x": np.zeros((4, 8, 9), np.uint8), "y": np.zeros(4, np.int64)}, "square"),
        ({"x": np.zeros((4, 8, 8), np.uint8), "y": np.array([0, 1, -1, 2])}, "negative"),
        ({"x": np.zeros((4, 8, 8), np.uint8), "y": np.zeros(3, np.int64)}, r"need \[4\]"),
        ({"x": np.zeros((4, 8, 8), np.uint8), "y": np.zeros(4, np.float64)}, "allowed: integers"),
        ({"x": np.zeros((0, 8, 8), np.uint8), "y": np.zeros(0, np.int64)}, "holds no images"),
    ],
)
def test_malformed_npz_is_a_clear_error(tmp_path, arrays: dict, message: str) -> None:
    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(DataSourceError, match=message):
        read_npz(path)


def test_missing_or_garbage_npz(tmp_path) -> None:
    with pytest.raises(DataSourceError, match="does not exist"):
        read_npz(tmp_path / "missing.npz")
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(DataSourceError, match="not a readable .npz"):
        read_npz(garbage)


def test_empty_split_is_an_error(tmp_path) -> None:
    x, y = tiny_grey_digits(n_per_class=1, classes=3)
    path = tmp_path / "few.npz"
    np.savez(path, x=x, y=y)
    with pytest.raises(DataSourceError, match="split 'val' is empty"):
        load_source(DataParams(source="npz", path=str(path), val_fraction=0.1, test_fraction=0.5), tmp_path, seed=0)


def test_unknown_source_is_named(tmp_path, monkeypatch) -> None:
    params = DataParams()
    object.__setattr__(params, "source", "imagenet")  # bypass the schema, as a plugin might
    with pytest.raises(DataSourceError, match="data.source = 'imagenet' is unknown; allowed"):
        load_source(params, tmp_path, seed=0)
    assert set(sources.SOURCES) == {"digits", "mnist", "fashion_mnist", "npz", "imagefolder", "waterbirds", "celeba", "cifar10", "adult",
                                    "compas"}
