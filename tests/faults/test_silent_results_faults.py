"""Nothing finishes with a wrong result: each path that once ended with exit code 0 and a meaningless number,
done for real through the stage entrypoints, must now stop with one message naming the param or file.

- training diverges (erm.lr = 10): train_erm stops at the first non-finite loss, naming epoch, step and erm.lr;
  infer_groups refuses non-finite ERM embeddings;
- a killed train_erm whose training data then changed (bias.foreground.p_corr): the rerun ignores the stale
  resume state and says so; with unchanged inputs it resumes and says so (log and run record);
- an npz overwritten in place: `dvc repro` reruns from download; a relative data.path means the repository
  root under `dvc repro` and `dvc exp run --temp`;
- inputs that make the experiment meaningless are refused before any work (colourless images, a class
  emptied by data.max_per_split, booleans for numbers, duplicate keys, NaN in a list).
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from debias.core.io import save_torch
from tests.conftest import tiny_grey_digits
from tests.faults.conftest import (
    PYTHON,
    assert_clean_failure,
    dvc,
    git_commit_all,
    make_clone,
    make_workspace,
    run_entrypoint_in_process,
    run_stage,
    run_stages_in_one_process,
    sigkill,
    snapshot,
    stage_env,
    wait_for,
    write_params,
)

# --------------------------------------------------------------------------- divergence


def test_a_diverging_erm_stops_at_once_naming_epoch_step_and_the_lr(prepared_workspace: Path, monkeypatch,
                                                                    capsys) -> None:
    """erm.lr = 10: the loss turns NaN within the first steps; the stage exits 2 there, writing no model."""
    ws = prepared_workspace
    write_params(ws, {"erm": {"lr": 10.0, "epochs": 3}})
    (ws / "models/erm.pt").unlink()
    done = run_entrypoint_in_process(ws, "train_erm", monkeypatch, capsys)
    assert_clean_failure(done, "the training loss became nan at epoch", ", step ", "training diverged",
                         "lower erm.lr (now 10)", stage="train_erm")
    assert not (ws / "models/erm.pt").exists()


def test_non_finite_erm_embeddings_are_refused_by_infer_groups(prepared_workspace: Path, monkeypatch,
                                                               capsys) -> None:
    ws = prepared_workspace
    path = ws / "data/erm/embeddings_train.pt"
    payload = torch.load(path, weights_only=True)
    payload["z"][3, 0] = float("nan")
    save_torch(path, {k: v for k, v in payload.items() if not k.startswith("__")}, kind="embeddings")
    done = run_entrypoint_in_process(ws, "infer_groups", monkeypatch, capsys)
    assert_clean_failure(done, "embeddings_train.pt: z holds NaN or infinite values", "diverged",
                         stage="infer_groups")


# --------------------------------------------------------------------------- resuming with changed inputs


def _start_erm(ws: Path) -> subprocess.Popen:
    return subprocess.Popen([PYTHON, "pipeline/train_erm.py"], cwd=ws, env=stage_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _kill_after_first_epoch(ws: Path) -> None:
    """Start train_erm and SIGKILL it as soon as its first epoch's resume state is on disk."""
    process = _start_erm(ws)
    wait_for(lambda: (ws / "models/.resume/erm.pt").exists(), process, what="the first resume state")
    sigkill(process)


def test_a_resume_state_of_other_training_data_is_ignored_and_a_matching_one_is_used(prepared_workspace: Path) -> None:
    """Kill train_erm and rerun it unchanged: it resumes, saying so (log and run record). Kill it again, change
    bias.foreground.p_corr (not a train_erm param: only its training data changes) and rerun: the stale state
    is ignored, saying so, and training starts over."""
    ws = prepared_workspace
    write_params(ws, {"erm": {"epochs": 30}})  # 29 epochs of margin: the kill must land mid-training on a loaded machine
    _kill_after_first_epoch(ws)
    done = run_stage(ws, "train_erm")
    assert done.returncode == 0, done.stderr
    assert "resuming an interrupted run from epoch" in done.stdout, done.stdout
    assert json.loads((ws / "reports/runs/train_erm.json").read_text())["resumed_from_epoch"] >= 1
    assert not (ws / "models/.resume/erm.pt").exists()  # deleted on success
    _kill_after_first_epoch(ws)
    write_params(ws, {"erm": {"epochs": 30}, "bias": {"foreground": {"p_corr": 0.8}}})
    run_stages_in_one_process(ws, ["inject_bias"])
    done = run_stage(ws, "train_erm")
    assert done.returncode == 0, done.stderr
    assert "ignoring the resume state" in done.stdout and "other data" in done.stdout, done.stdout
    assert "resuming" not in done.stdout
    assert "resumed_from_epoch" not in json.loads((ws / "reports/runs/train_erm.json").read_text())


# --------------------------------------------------------------------------- external data under DVC


def _write_npz(path: Path, seed: int) -> None:
    x, y = tiny_grey_digits(n_per_class=24, seed=seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x=x, y=y)


@pytest.fixture(scope="module")
def npz_clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC clone whose data is an untracked npz at a relative path (external/digits.npz)."""
    clone = make_clone(tmp_path_factory.mktemp("npz") / "clone",
                       {"data": {"source": "npz", "path": "external/digits.npz", "max_per_split": None}})
    (clone / ".gitignore").write_text((clone / ".gitignore").read_text() + "/external/\n")
    git_commit_all(clone, "npz source")
    _write_npz(clone / "external/digits.npz", seed=0)
    return clone


def ran(done: subprocess.CompletedProcess) -> list[str]:
    return [line.split("'")[1] for line in done.stdout.splitlines() if line.startswith("Running stage '")]


def test_an_npz_overwritten_in_place_reruns_download(npz_clone: Path) -> None:
    clone = npz_clone
    assert ran(dvc(clone, "repro", "download")) == ["source", "download"]
    assert ran(dvc(clone, "repro", "download")) == ["source"]  # fingerprinted, unchanged: download is skipped
    splits_before = (clone / "data/raw/splits.pt").read_bytes()
    _write_npz(clone / "external/digits.npz", seed=1)  # same path, other content
    assert ran(dvc(clone, "repro", "download")) == ["source", "download"]
    assert (clone / "data/raw/splits.pt").read_bytes() != splits_before
    fingerprint = json.loads((clone / "data/source.json").read_text())
    assert fingerprint["files"]["data.path"]["value"] == "external/digits.npz"  # as in params: no machine path


def test_a_relative_data_path_means_the_repository_root_under_exp_run_temp(npz_clone: Path) -> None:
    """--temp runs in a copy without untracked files (external/ is not there): the path still resolves."""
    done = dvc(npz_clone, "exp", "run", "--temp", "download", "-S", "seed=3")
    assert "Running stage 'download'" in done.stdout, done.stdout


def test_a_missing_npz_is_named_by_the_source_stage(npz_clone: Path, tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(npz_clone, clone, symlinks=True)
    (clone / "external/digits.npz").unlink()
    done = dvc(clone, "repro", "download", check=False)
    assert done.returncode != 0
    assert "[source] error: data.path = " in done.stderr and "digits.npz' does not exist" in done.stderr


def test_dvc_checkout_brings_back_the_outputs_a_failed_stage_lost(npz_clone: Path, tmp_path: Path) -> None:
    """README's advice: DVC deletes a stage's outputs before running it; `dvc checkout` restores them."""
    clone = tmp_path / "clone"
    shutil.copytree(npz_clone, clone, symlinks=True)
    dvc(clone, "repro", "download")
    record = (clone / "reports/runs/download.json").read_bytes()
    params = (clone / "params.yaml").read_text()
    (clone / "params.yaml").write_text(params.replace("max_per_split: null", "max_per_split: 2"))
    failed = dvc(clone, "repro", "download", check=False)
    assert failed.returncode != 0 and "data.max_per_split = 2 leaves split" in failed.stderr, failed.stderr
    assert not (clone / "reports/runs/download.json").exists()  # deleted by DVC before the stage ran
    # the message says so, and how to get them back (never "the previous outputs are intact")
    assert ("DVC removed this stage's previous outputs before running it (persist: true ones excepted); "
            "`dvc checkout download` restores the ones dvc.lock records") in failed.stderr, failed.stderr
    assert "intact" not in failed.stderr
    (clone / "params.yaml").write_text(params)
    dvc(clone, "checkout", "download")
    assert (clone / "reports/runs/download.json").read_bytes() == record


# --------------------------------------------------------------------------- meaningless inputs, refused first


def test_images_the_colour_cannot_show_on_are_refused_naming_the_threshold(tmp_path: Path, monkeypatch,
                                                                           capsys) -> None:
    """0/1 images (a binarised MNIST) under the foreground protocol: no pixel reaches stroke_threshold 120."""
    x, y = tiny_grey_digits()
    np.savez(tmp_path / "binary.npz", x=(x > 100).astype(np.uint8), y=y)
    ws = make_workspace(tmp_path / "ws", {"data": {"source": "npz", "path": str(tmp_path / "binary.npz"),
                                                   "max_per_split": None}})
    assert run_entrypoint_in_process(ws, "download", monkeypatch, capsys).returncode == 0
    before = snapshot(ws)
    done = run_entrypoint_in_process(ws, "inject_bias", monkeypatch, capsys)
    assert_clean_failure(done, "no pixel with grey >= bias.foreground.stroke_threshold = 120",
                         "the brightest pixel of the split is 1", "lower bias.foreground.stroke_threshold",
                         stage="inject_bias")
    assert snapshot(ws) == before


def test_a_class_emptied_by_max_per_split_is_refused_naming_it(tmp_path: Path, monkeypatch, capsys) -> None:
    ws = make_workspace(tmp_path / "ws", {"data": {"max_per_split": 4}})
    done = run_entrypoint_in_process(ws, "download", monkeypatch, capsys)
    assert_clean_failure(done, "data.max_per_split = 4 leaves split", "without labels", stage="download")
    assert not (ws / "data/raw/splits.pt").exists()


@pytest.mark.slow
@pytest.mark.parametrize(("text", "fragments"), [
    ("erm:\n  lr: true\n", ["erm.lr = True: a boolean where a number is expected"]),
    ("erm:\n  lr: 0.1\nerm:\n  lr: 0.2\n", ["DuplicateKeyError", 'duplicate key "erm"']),
    ("probe:\n  c_grid: [0.1, .nan]\n", ["probe.c_grid.1 = nan", "finite number"]),
    ("bias:\n  background:\n    colours: [[0, 0, 0], [0, 0, 1], [0, 0, 90], [0, 0, 130], [0, 0, 170], [0, 0, 210],"
     " [0, 90, 0], [0, 130, 0], [0, 170, 0], [0, 210, 0]]\n", ["cannot be told apart"]),
], ids=["bool-for-number", "duplicate-key", "nan-in-list", "indistinguishable-colours"])
def test_check_params_refuses_what_dvc_or_the_experiment_would_not_survive(text: str, fragments: list[str],
                                                                          tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    done = subprocess.run(["debias", "check-params", str(path)], capture_output=True, text=True, env=stage_env(),
                          timeout=60)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done
    for fragment in fragments:
        assert fragment in done.stderr, done.stderr


@pytest.mark.slow
def test_an_alias_bomb_in_params_yaml_gives_a_short_message_through_a_stage(tmp_path: Path) -> None:
    """Nine lines of YAML aliases name 10^9 values; the stage's one message stays short (it was 28 MB)."""
    ws = make_workspace(tmp_path / "ws")
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    (ws / "params.yaml").write_text("\n".join(levels) + "\nprobe:\n  c_grid: *a8\n")
    done = run_stage(ws, "download", timeout=60)
    assert_clean_failure(done, "unknown parameter 'a0'", "probe.c_grid.0", stage="download")
    assert len(done.stderr) < 5000, len(done.stderr)
