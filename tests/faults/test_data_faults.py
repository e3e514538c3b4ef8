"""Bad data through the real stage entrypoints: a clear message and exit code 2, never a traceback.

Bring-your-own ``.npz`` files with NaNs, wrong dtype or shape, labels out of range, an empty
file or an empty split go through ``python pipeline/download.py``; data a protocol cannot use
(a class with no samples, more classes than colours) through ``inject_bias``; truncated or
foreign split, checkpoint, embedding and group files through the stage that reads them. A
group absent from a split is reported (``empty_groups``) and skipped by the metrics.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.conftest import tiny_grey_digits
from tests.faults.conftest import (
    assert_clean_failure,
    make_workspace,
    run_entrypoint_in_process,
    run_parallel,
    run_stage,
    snapshot,
)


def grey_digits(n_per_class: int = 12, classes: int = 10) -> tuple[np.ndarray, np.ndarray]:
    return tiny_grey_digits(n_per_class=n_per_class, classes=classes)


def _nan_images() -> dict:
    x, y = grey_digits()
    x = x.astype(np.float32)
    x[3, 5, 5] = np.nan
    return {"x": x, "y": y}


def _float_images() -> dict:
    x, y = grey_digits()
    return {"x": x.astype(np.float32) / 255.0, "y": y}


def _four_channels() -> dict:
    x, y = grey_digits()
    return {"x": np.repeat(x[..., None], 4, axis=-1), "y": y}


def _flat_images() -> dict:
    x, y = grey_digits()
    return {"x": x.reshape(len(x), -1), "y": y}


def _negative_labels() -> dict:
    x, y = grey_digits()
    y = y.copy()
    y[7] = -1
    return {"x": x, "y": y}


def _labels_of_wrong_length() -> dict:
    x, y = grey_digits()
    return {"x": x, "y": y[:-5]}


def _float_labels() -> dict:
    x, y = grey_digits()
    return {"x": x, "y": y.astype(np.float64) + 0.5}


def _no_y() -> dict:
    x, _ = grey_digits()
    return {"x": x, "labels": np.zeros(len(x), dtype=np.int64)}


def _no_images() -> dict:
    return {"x": np.zeros((0, 28, 28), np.uint8), "y": np.zeros(0, np.int64)}


def _too_few_for_a_val_split() -> dict:
    x, y = grey_digits(n_per_class=2)  # round(2 * 0.15) = 0 validation images per class
    return {"x": x, "y": y}


# case: (arrays, fragments of the message)
NPZ_CASES = {
    "nan": (_nan_images, ["x holds NaN values", "uint8 images in 0..255"]),
    "float-dtype": (_float_images, ["x has dtype float32", "allowed: uint8"]),
    "four-channels": (_four_channels, ["x has shape (120, 28, 28, 4)", "allowed: [N,H,W] or [N,H,W,3]"]),
    "flat-images": (_flat_images, ["x has shape (120, 784)", "allowed: [N,H,W] or [N,H,W,3]"]),
    "negative-label": (_negative_labels, ["y holds negative values (min -1)"]),
    "labels-wrong-length": (_labels_of_wrong_length, ["y has shape (115,)", "need [120]"]),
    "float-labels": (_float_labels, ["y has dtype float64", "allowed: integers"]),
    "missing-y": (_no_y, ["lacks array(s) ['y']", "need x and y"]),
    "no-images": (_no_images, ["holds no images"]),
    "empty-split": (_too_few_for_a_val_split, ["split 'val' is empty", "data.val_fraction"]),
    "not-an-npz": (None, ["is not a readable .npz"]),
    "missing-file": ("missing", ["does not exist"]),
}


def _npz_workspace(root: Path, name: str) -> Path:
    maker = NPZ_CASES[name][0]
    path = root / f"{name}.npz"
    if maker is None:
        path.write_text("x,y\n1,2\n")
    elif maker != "missing":
        np.savez(path, **maker())
    return make_workspace(root / f"ws-{name}", {"data": {"source": "npz", "path": str(path), "max_per_split": None}})


@pytest.mark.parametrize("name", list(NPZ_CASES))
def test_bad_npz_fails_download_with_a_clear_message(name: str, tmp_path: Path, monkeypatch, capsys) -> None:
    workspace = _npz_workspace(tmp_path, name)
    done = run_entrypoint_in_process(workspace, "download", monkeypatch, capsys)
    assert_clean_failure(done, "data.path = '" if name != "empty-split" else "data.source = 'npz'",
                         *NPZ_CASES[name][1], stage="download")
    assert not (workspace / "data/raw/splits.pt").exists()
    assert not (workspace / "reports/runs/download.json").exists()


# --------------------------------------------------------------------------- data a protocol cannot use


def _labels_npz(path: Path, labels: list[int], n_per_label: int = 12, with_attribute: bool = False) -> Path:
    x, y = grey_digits(n_per_class=n_per_label, classes=10)
    keep = np.isin(y, labels)
    arrays = {"x": x[keep], "y": y[keep]}
    if with_attribute:
        arrays["a"] = (arrays["y"] % 2).astype(np.int64)
    np.savez(path, **arrays)
    return path


PROTOCOL_CASES = {
    # foreground pairs digits 8 and 9 into class 4: with neither present that class has no sample
    "class-without-samples": ({"bias": {"protocol": "foreground"}}, list(range(8)),
                              ["bias.foreground.class_digits names labels [8, 9]", "does not have"]),
    # background has 10 colours: labels 0..11 are 12 classes it cannot colour
    "more-classes-than-colours": ({"bias": {"protocol": "background"}}, list(range(12)),
                                  ["has 10 colours (bias.background.colours) for 12 classes", "at most one class per colour"]),
    "given-without-attribute": ({"bias": {"protocol": "given"}}, list(range(10)),
                                ["bias.protocol = given needs a bias attribute", "array 'a'"]),
}


def _twelve_classes(path: Path) -> Path:
    x, y = grey_digits(n_per_class=12, classes=10)
    x = np.concatenate([x, x[y < 2]])
    y = np.concatenate([y, y[y < 2] + 10])
    np.savez(path, x=x, y=y)
    return path


def _protocol_workspace(root: Path, name: str) -> Path:
    changes, labels, _ = PROTOCOL_CASES[name]
    path = root / f"{name}.npz"
    _twelve_classes(path) if name == "more-classes-than-colours" else _labels_npz(path, labels)
    return make_workspace(root / f"ws-{name}", {"data": {"source": "npz", "path": str(path), "max_per_split": None},
                                                **changes})


@pytest.mark.parametrize("name", list(PROTOCOL_CASES))
def test_data_the_protocol_cannot_use_fails_inject_bias_clearly(name: str, tmp_path: Path, monkeypatch, capsys) -> None:
    workspace = _protocol_workspace(tmp_path, name)
    assert run_entrypoint_in_process(workspace, "download", monkeypatch, capsys).returncode == 0
    done = run_entrypoint_in_process(workspace, "inject_bias", monkeypatch, capsys)
    assert_clean_failure(done, *PROTOCOL_CASES[name][2], stage="inject_bias")
    assert not (workspace / "data/biased").exists() or not any((workspace / "data/biased").iterdir())


def test_an_attribute_that_is_not_an_index_fails_given_clearly(tmp_path: Path, monkeypatch, capsys) -> None:
    x, y = grey_digits(n_per_class=12, classes=4)
    a = (y % 2).astype(np.int64)
    a[3] = 2**40
    path = tmp_path / "given.npz"
    np.savez(path, x=x, y=y, a=a)
    ws = make_workspace(tmp_path / "ws", {"data": {"source": "npz", "path": str(path), "max_per_split": None},
                                          "bias": {"protocol": "given"}})
    assert run_entrypoint_in_process(ws, "download", monkeypatch, capsys).returncode == 0
    done = run_entrypoint_in_process(ws, "inject_bias", monkeypatch, capsys)
    assert_clean_failure(done, f"a holds the value {2**40}", "allowed: indices 0, 1, ..., K-1", stage="inject_bias")


# --------------------------------------------------------------------------- a group absent from a split


@pytest.mark.slow
def test_a_group_absent_from_every_split_is_listed_and_skipped(tmp_path: Path, monkeypatch, capsys) -> None:
    """``given`` attribute where class 0 never has attribute 2: group (0, 2) is empty in every split.

    The stages run; the metrics list the empty group, leave its per-group accuracy null, and
    worst-group / unbiased are the min / mean over the groups that are present.
    """
    x, y = grey_digits(n_per_class=30, classes=3)
    rng = np.random.default_rng(0)
    a = rng.integers(0, 3, len(y))
    a[(y == 0) & (a == 2)] = 1
    path = tmp_path / "given.npz"
    np.savez(path, x=x, y=y, a=a)
    ws = make_workspace(tmp_path / "ws", {"data": {"source": "npz", "path": str(path), "max_per_split": None},
                                          "bias": {"protocol": "given"}, "erm": {"epochs": 1}})
    for stage in ("download", "inject_bias", "train_erm"):
        done = run_entrypoint_in_process(ws, stage, monkeypatch, capsys)
        assert done.returncode == 0, done.stderr
        if stage == "inject_bias":
            assert "1 empty groups" in done.stdout  # it says so (training split)
    summary = json.loads((ws / "data/biased/summary.json").read_text())
    assert all(stats["empty_groups"] == 1 for stats in summary["splits"].values())
    groups = json.loads((ws / "reports/metrics/erm_groups.json").read_text())
    metrics = json.loads((ws / "reports/metrics/erm.json").read_text())
    for split in ("train", "val", "test"):
        assert groups[split]["empty_groups"] == [[0, 2]]
        assert groups[split]["group_counts"][0][2] == 0
        assert groups[split]["per_group"][0][2] is None  # skipped, not counted as 0
        present = [v for row in groups[split]["per_group"] for v in row if v is not None]
        assert len(present) == 8
        assert metrics[split]["worst_group"] == pytest.approx(min(present))
        assert metrics[split]["unbiased"] == pytest.approx(sum(present) / len(present))


def test_metrics_skip_a_group_missing_from_one_split_only() -> None:
    """The one metrics definition on a split where one group is present in training but not here."""
    from debias.metrics import accuracy_report

    y = torch.tensor([0, 0, 1, 1, 1])
    a = torch.tensor([0, 0, 0, 1, 1])  # group (0, 1) absent
    pred = torch.tensor([0, 1, 1, 1, 0])
    report = accuracy_report(pred, y, a, a == y, 2, 2)
    assert report["empty_groups"] == [[0, 1]]
    assert report["per_group"] == [[0.5, None], [1.0, 0.5]]
    assert report["worst_group"] == 0.5 and report["unbiased"] == pytest.approx((0.5 + 1.0 + 0.5) / 3)
    assert not any(isinstance(v, float) and math.isnan(v) for v in report.values() if not isinstance(v, list))


# --------------------------------------------------------------------------- truncated or foreign files


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _foreign_torch(path: Path) -> None:
    torch.save({"weights": torch.zeros(3)}, path)  # a torch file, but not one of ours


def _text(path: Path) -> None:
    path.write_text('{"hello": "world"}\n')


def _foreign_split(path: Path) -> None:
    """Our format tag, but tensors that disagree (a split from another tool or version)."""
    from debias.core.io import load_torch, save_torch

    payload = load_torch(path, "biased-split")
    payload["g"] = payload["g"] + 1
    save_torch(path, payload, kind="biased-split")


# case: (file, damage, stage that reads it, message fragments)
FILE_CASES = {
    "truncated-biased-split": ("data/biased/train.pt", _truncate, "train_erm",
                               ["data/biased/train.pt cannot be read as a debias biased-split file", "truncated or foreign"]),
    "foreign-biased-split": ("data/biased/val.pt", _foreign_torch, "train_erm",
                             ["data/biased/val.pt is not a debias biased-split file"]),
    "inconsistent-biased-split": ("data/biased/test.pt", _foreign_split, "train_erm",
                                  ["data/biased/test.pt: stored groups disagree", "rerun inject_bias"]),
    "truncated-raw-splits": ("data/raw/splits.pt", _truncate, "inject_bias",
                             ["data/raw/splits.pt cannot be read as a debias raw-splits file"]),
    "text-as-raw-splits": ("data/raw/splits.pt", _text, "inject_bias",
                           ["data/raw/splits.pt cannot be read as a debias raw-splits file"]),
    "truncated-embeddings": ("data/erm/embeddings_train.pt", _truncate, "infer_groups",
                             ["data/erm/embeddings_train.pt cannot be read as a debias embeddings file"]),
    "foreign-embeddings": ("data/erm/embeddings_train.pt", _foreign_torch, "infer_groups",
                           ["data/erm/embeddings_train.pt is not a debias embeddings file"]),
    "truncated-checkpoint": ("models/erm.pt", _truncate, "linear_probe",
                             ["models/erm.pt cannot be read as a debias checkpoint file"]),
    "foreign-checkpoint": ("models/erm.pt", _foreign_torch, "evaluate",
                           ["models/erm.pt is not a debias checkpoint file"]),
    "truncated-groups": ("data/groups/train.parquet", _truncate, "train_contrastive",
                         ["data/groups/train.parquet cannot be read as parquet", "rerun infer_groups"]),
    "missing-groups": ("data/groups/train.parquet", lambda p: p.unlink(), "train_contrastive",
                       ["data/groups/train.parquet not found"]),
}


@pytest.mark.parametrize("name", list(FILE_CASES))
def test_damaged_file_fails_the_stage_that_reads_it_clearly(name: str, prepared_workspace: Path, monkeypatch,
                                                            capsys) -> None:
    relative, damage, stage, fragments = FILE_CASES[name]
    damage(prepared_workspace / relative)
    before = snapshot(prepared_workspace)
    done = run_entrypoint_in_process(prepared_workspace, stage, monkeypatch, capsys)
    assert_clean_failure(done, *fragments, stage=stage)
    assert snapshot(prepared_workspace) == before  # nothing else written or touched


# --------------------------------------------------------------------------- the same, as real processes

# A few cases (and one bad npz) as ``python pipeline/<stage>.py`` subprocesses (two at a time).
SUBPROCESS_CASES = ["truncated-biased-split", "truncated-checkpoint"]


@pytest.fixture(scope="module")
def subprocess_results(prepared_template: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("damaged")
    cases = {}
    for name in SUBPROCESS_CASES:
        relative, damage, _, _ = FILE_CASES[name]
        ws = root / name
        shutil.copytree(prepared_template, ws, symlinks=True)
        damage(ws / relative)
        cases[name] = (ws, snapshot(ws))
    npz_ws = _npz_workspace(root, "nan")
    jobs = {name: (lambda ws=ws, stage=FILE_CASES[name][2]: run_stage(ws, stage)) for name, (ws, _) in cases.items()}
    jobs["npz-nan"] = lambda: run_stage(npz_ws, "download")
    results = run_parallel(jobs)
    out = {name: (cases[name][0], cases[name][1], results[name]) for name in SUBPROCESS_CASES}
    out["npz-nan"] = (npz_ws, {}, results["npz-nan"])
    return out


@pytest.mark.parametrize("name", SUBPROCESS_CASES + ["npz-nan"])
def test_stage_process_exits_2_with_one_message(name: str, subprocess_results) -> None:
    workspace, before, done = subprocess_results[name]
    if name == "npz-nan":
        assert_clean_failure(done, "x holds NaN values", stage="download")
        assert not (workspace / "data/raw").exists() or not any((workspace / "data/raw").iterdir())
        return
    _, _, stage, fragments = FILE_CASES[name]
    assert_clean_failure(done, *fragments, "(set DEBIAS_DEBUG=1 for the traceback)", stage=stage)
    assert done.stderr.strip().count("\n") <= 2, done.stderr  # one message, not a log
    assert snapshot(workspace) == before


def test_debug_mode_shows_the_traceback(prepared_workspace: Path) -> None:
    """DEBIAS_DEBUG=1: the same failure raises, with the traceback, for whoever debugs it."""
    _truncate(prepared_workspace / "data/biased/train.pt")
    done = run_stage(prepared_workspace, "train_erm", DEBIAS_DEBUG="1")
    assert done.returncode == 1 and "Traceback" in done.stderr and "CorruptFileError" in done.stderr
