"""Failures a user can act on, done for real: one line naming the cause and what to do, a non-zero exit
code, no traceback, and the previous outputs intact.

The tracking store deleted or corrupted while train_erm runs (required and optional tracking); a full disk
and a file-size limit while a checkpoint is written; a read-only reports/ (refused before any work);
DEBIAS_DEVICE naming a device the machine lacks; stage2.cnc.init = erm with a checkpoint of another model;
a params.yaml that is not UTF-8; Ctrl-C (the MLflow run ends KILLED, as with SIGTERM).

A full disk and a read-only folder are made with a private mount (``unshare --user --map-root-user
--mount``: a tmpfs of a few KiB, a read-only bind mount) around the stage process only; machines without
unprivileged user namespaces skip those two tests, and the file-size limit (``setrlimit``) covers the
same write path everywhere.
"""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
from pathlib import Path

import pytest

from debias.models import build_model, save_network
from tests.conftest import fresh_store
from tests.faults.conftest import (
    PYTHON,
    assert_clean_failure,
    run_entrypoint_in_process,
    run_stage,
    snapshot,
    stage_command,
    stage_env,
    wait_for,
    write_params,
)

LONG_ERM = {"erm": {"epochs": 8}}  # long enough to break something between two epochs
# Far longer than any machine reaches before the interrupt lands (a Ctrl-C ends it at once).
ENDLESS_ERM = {"erm": {"epochs": 200}}


def _namespaces_work() -> bool:
    try:
        return subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "true"], capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_namespaces = pytest.mark.skipif(not _namespaces_work(), reason="unprivileged user namespaces are unavailable")


def in_private_mount(setup: str, stage: str) -> list[str]:
    """A command running ``setup`` (mount commands) then the stage, in a private user + mount namespace."""
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", f"{setup} && exec {PYTHON} pipeline/{stage}.py"]


def _default_sigint() -> None:
    """In the child: Ctrl-C's default disposition, as in a terminal. A shell starts background jobs with SIGINT
    ignored and that is inherited, so a suite run as `pytest &` (or by a CI runner doing so) would otherwise start
    stages that cannot be interrupted at all (the Ctrl-C test then saw a run finish and exit 0)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(ws: Path, stage: str, plain: bool = False, **env: str) -> subprocess.Popen:
    """The stage as DVC runs it (:func:`stage_command`), or with ``plain`` as ``python pipeline/<stage>.py``."""
    command = [PYTHON, f"pipeline/{stage}.py"] if plain else stage_command(stage, env)
    return subprocess.Popen(command, cwd=ws, env=stage_env(**env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_default_sigint)


def _finish(process: subprocess.Popen) -> subprocess.CompletedProcess:
    out, err = process.communicate(timeout=300)
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


# --------------------------------------------------------------------------- the tracking store breaks mid-run


@pytest.mark.parametrize("mode", ["required", "optional"])
@pytest.mark.parametrize("damage", ["deleted", "corrupted"])
def test_a_store_broken_while_train_erm_runs(mode: str, damage: str, prepared_workspace: Path,
                                             mlflow_template: Path) -> None:
    """After the first epoch the SQLite store is deleted, or overwritten with garbage in place. required: exit 2
    naming the store; optional: a warning, the stage finishes, and its run record says the run was lost."""
    ws = prepared_workspace
    write_params(ws, LONG_ERM)
    store = fresh_store(mlflow_template, ws)
    process = _start(ws, "train_erm", DEBIAS_TRACKING=mode, MLFLOW_TRACKING_URI=f"sqlite:///{store}")
    wait_for(lambda: (ws / "models/.resume/erm.pt").exists(), process, what="the first epoch")
    if damage == "deleted":
        store.unlink()
    else:
        with open(store, "r+b") as handle:  # the same file, its pages overwritten
            handle.write(b"\0garbage" * 4096)
    done = _finish(process)
    if mode == "required":
        assert_clean_failure(done, f"MLflow tracking store sqlite:///{store} broke while", "DEBIAS_TRACKING=optional",
                             stage="train_erm")
        assert (ws / "models/erm.pt").exists()  # the previous model is intact
    else:
        assert done.returncode == 0, done.stderr
        assert "going on without logging" in done.stderr and "Traceback" not in done.stderr, done.stderr
        record = json.loads((ws / "reports/runs/train_erm.json").read_text())
        assert "broke while" in record["tracking_lost"]


# --------------------------------------------------------------------------- the disk


def test_a_file_size_limit_while_writing_a_checkpoint_is_one_line(prepared_workspace: Path) -> None:
    """RLIMIT_FSIZE below a LeNet checkpoint: the first resume state cannot be written (EFBIG)."""
    ws = prepared_workspace
    before = snapshot(ws)

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failing write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, 64 * 1024))

    done = subprocess.run([PYTHON, "pipeline/train_erm.py"], cwd=ws, env=stage_env(), capture_output=True, text=True,
                          timeout=120, preexec_fn=limit)
    assert_clean_failure(done, "File too large writing", "a file-size limit (ulimit -f) stopped the write",
                         "the previous outputs are intact", stage="train_erm")
    assert snapshot(ws, ("models",)) == {k: v for k, v in before.items() if k.startswith("models/")}
    assert not [p for p in (ws / "models").rglob("*.tmp")]  # no torn temporary left


@needs_namespaces
def test_a_full_disk_while_writing_a_checkpoint_is_one_line(prepared_workspace: Path) -> None:
    """models/.resume on a 16 KiB tmpfs: the resume state (~0.7 MB) does not fit (ENOSPC)."""
    ws = prepared_workspace
    (ws / "models/.resume").mkdir(parents=True, exist_ok=True)
    done = subprocess.run(in_private_mount("mount -t tmpfs -o size=16k tmpfs models/.resume", "train_erm"), cwd=ws,
                          env=stage_env(), capture_output=True, text=True, timeout=120)
    assert_clean_failure(done, "No space left on device writing", "the disk is full", stage="train_erm")
    assert (ws / "models/erm.pt").exists()


@needs_namespaces
def test_a_read_only_reports_folder_is_refused_before_any_work(prepared_workspace: Path) -> None:
    ws = prepared_workspace
    before = snapshot(ws)
    done = subprocess.run(in_private_mount("mount --bind reports reports && mount -o remount,bind,ro reports",
                                           "train_erm"), cwd=ws, env=stage_env(), capture_output=True, text=True,
                          timeout=120)
    assert_clean_failure(done, "cannot write into reports/", "Read-only file system", "nothing was run",
                         stage="train_erm")
    assert "epoch" not in done.stdout + done.stderr
    assert snapshot(ws) == before


# --------------------------------------------------------------------------- settings and inputs


@pytest.mark.parametrize("device", ["cuda", "mps"])
def test_a_device_the_machine_lacks_is_one_line(device: str, prepared_workspace: Path) -> None:
    import torch

    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    if device == "mps" and torch.backends.mps.is_available():
        pytest.skip("this machine has MPS")
    done = run_stage(prepared_workspace, "train_erm", DEBIAS_DEVICE=device)
    assert_clean_failure(done, f"DEBIAS_DEVICE = '{device}' but this machine has no usable", "set it to cpu",
                         stage="train_erm")


def test_cnc_init_from_a_checkpoint_of_another_model_is_refused(prepared_workspace: Path, monkeypatch,
                                                                capsys) -> None:
    ws = prepared_workspace
    other = build_model("simpleconv", 5, 28)
    save_network(str(ws / "models/erm.pt"), other, "simpleconv", 5, 28)
    write_params(ws, {"stage2": {"method": "cnc", "cnc": {"init": "erm"}}})
    done = run_entrypoint_in_process(ws, "train_contrastive", monkeypatch, capsys)
    assert_clean_failure(done, "models/erm.pt holds a simpleconv", "this run trains a lenet5", "rerun train_erm",
                         stage="train_contrastive")


def test_a_params_yaml_that_is_not_utf8_is_one_line(prepared_workspace: Path) -> None:
    ws = prepared_workspace
    text = (ws / "params.yaml").read_text().replace("title: debias report", "title: r\u00e9sultats")
    (ws / "params.yaml").write_bytes(text.encode("latin-1"))
    done = run_stage(ws, "report")
    assert_clean_failure(done, "params.yaml is not UTF-8 text (byte 0xe9 at line", "save it as UTF-8", stage="report")


def test_ctrl_c_ends_the_run_killed_without_a_traceback(prepared_workspace: Path, mlflow_template: Path) -> None:
    from mlflow.tracking import MlflowClient

    ws = prepared_workspace
    write_params(ws, ENDLESS_ERM)
    store = fresh_store(mlflow_template, ws)
    uri = f"sqlite:///{store}"
    # a plain process: Ctrl-C reaches the stage itself (the launcher passing it on is tests/test_forkserver.py's)
    process = _start(ws, "train_erm", plain=True, DEBIAS_TRACKING="required", MLFLOW_TRACKING_URI=uri)
    wait_for(lambda: (ws / "models/.resume/erm.pt").exists(), process, what="the first epoch")
    os.kill(process.pid, signal.SIGINT)
    done = _finish(process)
    assert done.returncode == 130, done.stderr
    assert "interrupted (Ctrl-C)" in done.stderr and "Traceback" not in done.stderr, done.stderr
    runs = MlflowClient(tracking_uri=uri).search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=uri).search_experiments()])
    assert [run.info.status for run in runs] == ["KILLED"]
