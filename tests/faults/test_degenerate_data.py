"""Data that cannot mean what its numbers would say, refused clearly through the real entrypoints.

- labels the foreground protocol's ``class_digits`` put in no class (an npz with labels 0-11 lost 581 of 3,581
  images and two classes without a word);
- one class (an image folder of one class trained to a "perfect" 1.000);
- an attribute with one value (``a = 0`` everywhere was reported as maximal bias, 0 bias-conflicting images).

Each is refused by ``debias check-params`` where the files tell cheaply, and by the first stage that reads the data
(before any image is decoded for an image folder), with the param, column or array named.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from debias.core.errors import BiasProtocolError
from debias.data.sources.base import RawSplit
from tests.conftest import tiny_grey_digits
from tests.faults.conftest import assert_clean_failure, make_workspace, run_entrypoint_in_process

REPO = Path(__file__).resolve().parents[2]


def check_params(workspace: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    return subprocess.run([sys.executable, "-m", "debias.tools.cli", "check-params", "params.yaml"], cwd=workspace, env=env,
                          capture_output=True, text=True, timeout=300)


def npz_workspace(root: Path, arrays: dict[str, np.ndarray], bias: dict | None = None) -> Path:
    path = root / "data.npz"
    root.mkdir(parents=True, exist_ok=True)
    np.savez(path, **arrays)
    return make_workspace(root / "ws", {"data": {"source": "npz", "path": str(path), "max_per_split": None},
                                        "bias": bias or {}})


# --------------------------------------------------------------------------- labels class_digits leaves out


@pytest.mark.slow
def test_labels_outside_class_digits_are_refused_naming_the_param_and_the_labels(tmp_path: Path, monkeypatch,
                                                                               capsys) -> None:
    x, y = tiny_grey_digits(n_per_class=12, classes=10)
    x = np.concatenate([x, x[y < 2]])
    y = np.concatenate([y, y[y < 2] + 10])  # labels 0-11: 10 and 11 are in no group of the default pairs
    workspace = npz_workspace(tmp_path, {"x": x, "y": y}, {"protocol": "foreground"})
    fragments = ["bias.foreground.class_digits = [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]] puts no class on labels "
                 "10 (12 images), 11 (12 images): 24 of 144 images would be dropped", "allowed: every label"]
    checked = check_params(workspace)
    assert checked.returncode == 2 and all(f in checked.stderr for f in fragments), checked.stderr
    assert run_entrypoint_in_process(workspace, "download", monkeypatch, capsys).returncode == 0
    done = run_entrypoint_in_process(workspace, "inject_bias", monkeypatch, capsys)
    assert_clean_failure(done, *fragments, stage="inject_bias")
    assert not (workspace / "data/biased/summary.json").exists()


@pytest.mark.slow
def test_check_params_refuses_digit_pairs_that_leave_digits_out(tmp_path: Path) -> None:
    workspace = make_workspace(tmp_path / "ws", {"bias": {"foreground": {"class_digits": [[0, 1], [2, 3]]}}})
    checked = check_params(workspace)
    assert checked.returncode == 2, checked.stderr
    assert ("bias.foreground.class_digits = [[0, 1], [2, 3]] puts no class on labels 4, 5, 6, 7, 8, 9: their images "
            "would be dropped") in checked.stderr


def test_a_label_far_out_of_range_is_refused_without_sizing_a_table_by_it(tmp_path: Path, monkeypatch,
                                                                          capsys) -> None:
    """A stray label (2**40, as a corrupted or mis-cast label file might hold) is named, not looked up in a
    table sized by the largest label (8 TiB here: MemoryError; 2**32 - 1: 32 GiB and the OOM killer)."""
    x, y = tiny_grey_digits(n_per_class=12)
    y = y.astype(np.int64)
    y[5] = 2**40
    workspace = npz_workspace(tmp_path, {"x": x, "y": y}, {"protocol": "foreground"})
    assert run_entrypoint_in_process(workspace, "download", monkeypatch, capsys).returncode == 0
    done = run_entrypoint_in_process(workspace, "inject_bias", monkeypatch, capsys)
    assert_clean_failure(done, f"puts no class on labels {2**40} (1 images): 1 of {len(y)} images", stage="inject_bias")


# --------------------------------------------------------------------------- one class


@pytest.mark.slow
def test_an_npz_of_one_class_is_refused_by_check_params_and_download(tmp_path: Path, monkeypatch, capsys) -> None:
    x, _ = tiny_grey_digits(n_per_class=12)
    workspace = npz_workspace(tmp_path, {"x": x, "y": np.full(len(x), 3)}, {"protocol": "background"})
    fragment = f"array 'y' of data.path = '{tmp_path / 'data.npz'}' holds only the value 3 in all {len(x)} images"
    checked = check_params(workspace)
    assert checked.returncode == 2 and fragment in checked.stderr and "at least 2 classes" in checked.stderr
    done = run_entrypoint_in_process(workspace, "download", monkeypatch, capsys)
    assert_clean_failure(done, fragment, "allowed: at least 2 classes", stage="download")
    assert not (workspace / "data/raw/splits.pt").exists()


def shapes_folder(root: Path, **columns: object) -> Path:
    """``debias example-folder``'s images, with ``columns`` of its metadata table set to one value."""
    from debias.data.examples import write_shapes_folder

    table = write_shapes_folder(root, n_train=16, n_eval=8, size=16)
    frame = pd.read_csv(table)
    for column, value in columns.items():
        frame[column] = value
    frame.to_csv(table, index=False)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("column, role, key, allowed", [
    ("y", "y", "data.imagefolder.label_column", "at least 2 classes"),
    ("place", "a", "data.imagefolder.attribute_column", "at least 2 values of the bias attribute"),
])
def test_an_image_folder_of_one_class_or_one_attribute_value_is_refused_before_decoding(
        tmp_path: Path, monkeypatch, capsys, column: str, role: str, key: str, allowed: str) -> None:
    folder = shapes_folder(tmp_path / "shapes", **{column: 0})
    workspace = make_workspace(tmp_path / "ws", {"data": {"source": "imagefolder", "max_per_split": None,
                                                          "image_size": 16, "imagefolder": {"root": str(folder)}}})
    fragment = f"column '{column}' ({key}) holds only the value 0 in the 32 rows of metadata table"
    checked = check_params(workspace)
    assert checked.returncode == 2 and fragment in checked.stderr and allowed in checked.stderr, checked.stderr

    def no_decoding(*args, **kwargs):
        raise AssertionError("an image was decoded before the table was refused")

    monkeypatch.setattr("debias.data.sources.images.decode_images", no_decoding)
    done = run_entrypoint_in_process(workspace, "download", monkeypatch, capsys)
    assert_clean_failure(done, fragment, allowed, stage="download")


# --------------------------------------------------------------------------- one attribute value


@pytest.mark.slow
def test_an_npz_attribute_of_one_value_is_refused_by_check_params_and_download(tmp_path: Path, monkeypatch,
                                                                                capsys) -> None:
    x, y = tiny_grey_digits(n_per_class=12)
    workspace = npz_workspace(tmp_path, {"x": x, "y": y, "a": np.zeros(len(y), dtype=np.int64)})
    fragment = f"array 'a' of data.path = '{tmp_path / 'data.npz'}' holds only the value 0 in all {len(y)} images"
    checked = check_params(workspace)
    assert checked.returncode == 2 and fragment in checked.stderr, checked.stderr
    done = run_entrypoint_in_process(workspace, "download", monkeypatch, capsys)
    assert_clean_failure(done, fragment, "allowed: at least 2 values of the bias attribute", stage="download")


def test_the_given_protocol_refuses_an_attribute_that_never_varies_in_training() -> None:
    from debias.data.bias import inject_bias
    from debias.params import BiasParams

    x, y = tiny_grey_digits(n_per_class=6, classes=4)
    splits = {name: RawSplit(x, y, np.zeros(len(y), dtype=np.int64) if name == "train" else y % 2)
              for name in ("train", "val", "test")}
    with pytest.raises(BiasProtocolError, match="the bias attribute a holds only the value 0 in the 24 training"):
        inject_bias(splits, BiasParams(protocol="given"), 0)
