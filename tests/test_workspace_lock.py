"""One DVC run at a time in a workspace: the first stage command of a second ``dvc exp run`` started where another
one runs is refused, naming the running one, and params.yaml is put back to the running one's values, so it finishes;
the stages of one run, queued and ``--temp`` runs (workspaces of their own) and a run after a dead one are not
refused."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from debias.harness import workspace

A_PARAMS = "seed: 0\nstage2:\n  epochs: 8\n"


@pytest.fixture
def table(monkeypatch: pytest.MonkeyPatch) -> dict:
    """A process table: a shell (900) under ``dvc exp run`` (800), another shell (901) under a second ``dvc exp
    run`` (801), a stage run by hand (902, under bash 700)."""
    processes = {900: (["/bin/sh", "-c", "python -m debias.harness.launch pipeline/source.py"], 800, "7"),
                 800: (["/venv/bin/python", "/venv/bin/dvc", "exp", "run", "-S", "stage2.epochs=8"], 700, "1000"),
                 901: (["/bin/sh", "-c", "python -m debias.harness.launch pipeline/source.py"], 801, "9"),
                 801: (["/venv/bin/python", "/venv/bin/dvc", "exp", "run", "-S", "stage2.lr=0.004"], 700, "1200"),
                 902: (["python", "pipeline/train_erm.py"], 700, "11"),
                 700: (["/bin/bash"], 1, "5")}
    monkeypatch.setattr(workspace, "process_info", lambda pid: processes.get(pid))
    return processes


@pytest.fixture
def repo(tmp_path: Path, table: dict) -> Path:
    """A DVC repository folder holding params.yaml."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "params.yaml").write_text(A_PARAMS)
    return tmp_path


def test_a_second_dvc_run_is_refused_naming_the_running_one_and_its_params_are_undone(repo: Path) -> None:
    assert workspace.claim(repo, start=900) is None  # the first run's first stage claims the workspace
    record = json.loads((repo / workspace.CLAIM).read_text())
    assert (record["pid"], record["started"], record["params"]) == (800, "1000", A_PARAMS)
    assert workspace.claim(repo, start=900) is None  # a later stage of the same run (a new process under it)
    (repo / "params.yaml").write_text("seed: 0\nstage2:\n  epochs: 8\n  lr: 0.004\n")  # the second run's -S
    message = workspace.claim(repo, start=901)
    assert message is not None and message.startswith(
        "another `dvc exp run -S stage2.epochs=8` (pid 800, started "), message
    assert "is running in this workspace: wait for it to end" in message and "--queue" in message and "--temp" in message
    assert (repo / "params.yaml").read_text() == A_PARAMS  # the running one finishes under its own values
    assert json.loads((repo / workspace.CLAIM).read_text())["pid"] == 800  # the claim stays the running one's


def test_a_claim_of_a_process_that_ended_or_whose_pid_was_reused_is_taken_over(repo: Path, table: dict) -> None:
    assert workspace.claim(repo, start=900) is None
    first = table.pop(800)  # the first run ended
    assert workspace.claim(repo, start=901) is None
    assert json.loads((repo / workspace.CLAIM).read_text())["pid"] == 801
    table[801] = (["/venv/bin/python", "/venv/bin/dvc", "repro"], 700, "5000")  # pid 801 now another run's
    table[800] = first  # a third run under pid 800 again
    assert workspace.claim(repo, start=900) is None and json.loads((repo / workspace.CLAIM).read_text())["pid"] == 800


def test_nothing_is_claimed_outside_dvc_or_outside_a_dvc_repository(repo: Path, tmp_path_factory) -> None:
    assert workspace.claim(repo, start=902) is None  # a stage run by hand
    assert not (repo / workspace.CLAIM).exists()
    plain = tmp_path_factory.mktemp("plain")
    assert workspace.claim(plain, start=900) is None and not (plain / ".dvc").exists()


# --------------------------------------------------------------------------- two real `dvc exp run`

# Put on the first run's PYTHONPATH: its train_contrastive command waits (before the stage starts) until the test
# creates the file $HOLD_RELEASE, so the second run starts while the first one holds the workspace, whatever the speed.
HOLD = '''
import os, sys, time
DEBIAS_SIDE_CHANNEL = "holds a test's first run at train_contrastive until the test releases it; changes nothing"
if "pipeline/train_contrastive.py" in sys.orig_argv and "debias.harness.launch" in sys.orig_argv:
    open(os.environ["HOLD_READY"], "w").close()
    deadline = time.monotonic() + 300
    while not os.path.exists(os.environ["HOLD_RELEASE"]) and time.monotonic() < deadline:
        time.sleep(0.05)
'''


@pytest.mark.slow
def test_two_real_dvc_exp_runs_in_one_workspace(tmp_path: Path) -> None:
    """While a `dvc exp run` trains, a second one in the same workspace is refused at its first command, naming the
    first; params.yaml keeps the first one's values and the first one finishes and is saved; a `--temp` run at the
    same time is not refused; a later run after the first ended is not refused by its stale claim."""
    from tests.faults.conftest import dvc, git_commit_all, make_clone, stage_env

    clone = make_clone(tmp_path / "clone")
    dvc(clone, "repro")
    git_commit_all(clone, "repro")
    hold = tmp_path / "hold"
    hold.mkdir()
    (hold / "sitecustomize.py").write_text(HOLD)
    ready, release = tmp_path / "ready", tmp_path / "release"
    path = os.pathsep.join([str(hold), os.environ.get("PYTHONPATH", "")])
    first = subprocess.Popen(["dvc", "exp", "run", "-S", "stage2.epochs=2"], cwd=clone, text=True,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             env=stage_env(DVC_NO_ANALYTICS="1", PYTHONPATH=path, HOLD_READY=str(ready),
                                           HOLD_RELEASE=str(release)))
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert first.poll() is None, first.communicate()[0]
            assert time.monotonic() < deadline, "the first run never reached train_contrastive"
            time.sleep(0.1)
        first_params = (clone / "params.yaml").read_text()
        second = dvc(clone, "exp", "run", "-S", "stage2.lr=0.004", check=False)
        temp = dvc(clone, "exp", "run", "--temp", "-S", "stage2.lr=0.002", check=False)
    finally:
        release.touch()
        out = first.communicate(timeout=600)[0]
    assert second.returncode != 0, second.stdout + second.stderr
    assert (f"[source] error: another `dvc exp run -S stage2.epochs=2` (pid {first.pid}, started "
            in second.stderr), second.stderr
    assert "is running in this workspace: wait for it to end" in second.stderr
    assert "Running stage 'train_contrastive'" not in second.stdout  # refused at its first command
    assert temp.returncode == 0, temp.stdout + temp.stderr  # a workspace of its own
    assert first.returncode == 0, out  # the first run finished with its own values ...
    assert (clone / "params.yaml").read_text() == first_params
    shown = json.loads(dvc(clone, "exp", "show", "--json").stdout)
    experiments = [exp for rev in shown for entry in rev.get("experiments") or [] for exp in entry.get("revs") or []]
    values = [exp["data"]["params"]["params.yaml"]["data"]["stage2"] for exp in experiments]
    assert {"epochs": 2, "lr": 0.004} not in [{k: v[k] for k in ("epochs", "lr")} for v in values]
    assert any(value["epochs"] == 2 for value in values), values  # ... and was saved as an experiment
    assert any(value["lr"] == 0.002 for value in values), values  # the --temp one too
    done = dvc(clone, "repro", check=False)  # the first run's claim is stale now
    assert done.returncode == 0, done.stdout + done.stderr
