"""Tracking faults through real stages: an unreachable or unusable store fails fast naming the URI;
``DEBIAS_TRACKING=optional`` goes on and says results were not logged; concurrent stage processes
writing one SQLite store lose no run, metric or artifact."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from debias.core.errors import TrackingError
from debias.harness.tracking import check_reachable
from tests.conftest import fresh_store
from tests.faults.conftest import (
    PYTHON,
    assert_clean_failure,
    make_workspace,
    run_parallel,
    run_stage,
    stage_env,
    write_driver,
)


def free_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@contextlib.contextmanager
def black_hole_server() -> Iterator[str]:
    """A server that accepts TCP connections (kernel backlog) and never answers a request."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield f"http://127.0.0.1:{server.getsockname()[1]}"


# --------------------------------------------------------------------------- how fast the check gives up


def test_check_gives_up_at_once_on_a_refused_connection() -> None:
    uri = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(TrackingError, match=f"{uri} is unreachable"):
        check_reachable(uri)
    assert time.monotonic() - started < 2


@pytest.mark.slow
def test_check_gives_up_within_its_timeout_on_a_silent_server() -> None:
    with black_hole_server() as uri:
        started = time.monotonic()
        with pytest.raises(TrackingError, match=f"{uri} is unreachable"):
            check_reachable(uri, timeout_s=2.0)
        assert time.monotonic() - started < 4


# --------------------------------------------------------------------------- through a real stage


@pytest.fixture(scope="module")
def stage_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """``python pipeline/download.py`` against a refused, a silent and an unusable store, and with
    ``optional`` tracking against the refused one (two processes at a time), with their wall times."""
    root = tmp_path_factory.mktemp("tracking")
    refused = f"http://127.0.0.1:{free_port()}"
    (root / "a-file").write_text("a file where the store's folder should be")
    unusable = f"sqlite:///{root / 'a-file' / 'mlflow.db'}"
    with black_hole_server() as silent:
        cases = {
            "refused": {"MLFLOW_TRACKING_URI": refused, "DEBIAS_TRACKING": "required"},
            "silent": {"MLFLOW_TRACKING_URI": silent, "DEBIAS_TRACKING": "required"},
            "unusable-sqlite": {"MLFLOW_TRACKING_URI": unusable, "DEBIAS_TRACKING": "required"},
            "optional": {"MLFLOW_TRACKING_URI": refused, "DEBIAS_TRACKING": "optional"},
        }
        workspaces = {name: make_workspace(root / name) for name in cases}

        def timed(name: str):
            started = time.monotonic()
            done = run_stage(workspaces[name], "download", timeout=120, **cases[name])
            return done, time.monotonic() - started

        results = run_parallel({name: (lambda name=name: timed(name)) for name in cases})
    return {name: (workspaces[name], cases[name]["MLFLOW_TRACKING_URI"], *results[name]) for name in cases}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["refused", "silent", "unusable-sqlite"])
def test_unusable_store_fails_the_stage_fast_naming_the_uri(name: str, stage_results) -> None:
    workspace, uri, done, seconds = stage_results[name]
    assert_clean_failure(done, uri, "DEBIAS_TRACKING=optional", stage="download")
    # imports (3-10 s on a loaded 2-core machine) + at most the 5 s health-check timeout, and no retries
    # (MLflow's own HTTP retries with backoff would take minutes); the precise bounds are tested above
    assert seconds < 45, f"took {seconds:.1f} s"
    assert not (workspace / "data/raw/splits.pt").exists()  # failed before the body ran
    assert not (workspace / "reports/runs/download.json").exists()


@pytest.mark.slow
def test_optional_tracking_runs_the_stage_and_says_nothing_was_logged(stage_results) -> None:
    workspace, uri, done, _ = stage_results["optional"]
    assert done.returncode == 0, done.stderr
    assert "NOT logged" in done.stderr and uri in done.stderr
    assert (workspace / "data/raw/splits.pt").exists()
    record = json.loads((workspace / "reports/runs/download.json").read_text())
    assert record["run_id"] is None and record["tracking_uri"] is None


# --------------------------------------------------------------------------- two writers, one store

WORKER = """
import os, sys, time
from pathlib import Path

from debias.harness.stage import main

stage, runs, steps, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])
while not start.exists():  # both workers begin together
    time.sleep(0.005)


def body(params, run):
    for step in range(steps):
        run.log_metrics({"train/loss": 1.0 / (step + 1), "step_id": float(step)}, step=step)
    note = Path("note.txt")
    note.write_text(os.environ["DVC_EXP_NAME"])
    run.log_artifact(note)
    run.log_metrics({"done": 1.0})


for _ in range(runs):
    main(stage, body)
print("worker finished", flush=True)
"""


@pytest.mark.slow
def test_two_stage_processes_writing_one_sqlite_store_lose_nothing(tmp_path: Path, mlflow_template: Path) -> None:
    """Two stage processes (as two queued ``dvc exp run`` tasks: DVC_ROOT is the main repository)
    each run 3 stages into the same SQLite store, at the same time; the experiment does not exist
    yet, so both race to create it. Every run is there, FINISHED, with all its metric steps, params,
    tags and artifacts, nested under its own worker's parent run."""
    from mlflow.tracking import MlflowClient

    root = tmp_path / "main-repo"
    (root / ".dvc").mkdir(parents=True)
    fresh_store(mlflow_template, root)
    driver = write_driver(tmp_path, "worker.py", WORKER)
    start = tmp_path / "go"
    runs, steps = 3, 12
    workers = {}
    for name, stage in (("worker-a", "download"), ("worker-b", "inject_bias")):
        ws = make_workspace(tmp_path / name)
        env = stage_env(DVC_ROOT=str(root), DVC_EXP_NAME=name, DEBIAS_TRACKING="required")
        workers[name] = subprocess.Popen([PYTHON, str(driver), stage, str(runs), str(steps), str(start)], cwd=ws,
                                         env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(2.5)  # let both get through their imports
    start.write_text("go")
    for name, process in workers.items():
        out, err = process.communicate(timeout=300)
        assert process.returncode == 0 and "worker finished" in out, f"{name}:\n{out}\n{err}"

    client = MlflowClient(tracking_uri=f"sqlite:///{root / 'mlflow.db'}")
    experiments = [e for e in client.search_experiments() if e.name == "debias"]
    assert len(experiments) == 1  # created once, despite the race
    found = client.search_runs([experiments[0].experiment_id], max_results=1000)
    by_worker: dict[str, list] = {}
    parents: dict[str, list] = {}
    for run in found:  # each worker's pipeline run is one parent run holding its stage runs
        group = parents if run.data.tags.get("debias.kind") == "pipeline" else by_worker
        group.setdefault(run.data.tags.get("debias.dvc_experiment"), []).append(run)
    assert sorted(by_worker) == sorted(parents) == ["worker-a", "worker-b"]
    for name, stage in (("worker-a", "download"), ("worker-b", "inject_bias")):
        assert len(by_worker[name]) == runs, f"{name}: {len(by_worker[name])} of {runs} runs"
        [parent] = parents[name]
        assert {r.data.tags["mlflow.parentRunId"] for r in by_worker[name]} == {parent.info.run_id}  # never the other's
        for run in by_worker[name]:
            assert run.info.status == "FINISHED"
            assert run.data.tags["debias.stage"] == stage
            history = client.get_metric_history(run.info.run_id, "train.loss")
            assert sorted(m.step for m in history) == list(range(steps))
            assert run.data.metrics["done"] == 1.0
            assert "seed" in run.data.params
            assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"note.txt", "provenance"}
    assert experiments[0].artifact_location == (root / "mlruns").as_uri()


# --------------------------------------------------------------------------- a stage stopped with SIGTERM


def test_sigterm_ends_the_stage_run_as_killed_and_keeps_previous_outputs(prepared_workspace: Path,
                                                                          mlflow_template: Path) -> None:
    """``dvc queue kill``, a scheduler or ``kill`` send SIGTERM: the MLflow run ends KILLED (not RUNNING,
    not FAILED), the process exits 143, no run record is written and earlier outputs are untouched."""
    from mlflow.tracking import MlflowClient

    from tests.faults.conftest import snapshot, wait_for, write_params

    ws = prepared_workspace
    (ws / ".dvc").mkdir()
    fresh_store(mlflow_template, ws)
    write_params(ws, {"erm": {"epochs": 30}})
    before = snapshot(ws)
    resume = ws / "models/.resume/erm.pt"
    process = subprocess.Popen([PYTHON, "pipeline/train_erm.py"], cwd=ws, env=stage_env(DEBIAS_TRACKING="required"),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(resume.exists, process, what="training to start")
    process.terminate()  # SIGTERM, to the process we started
    process.communicate(timeout=60)
    assert process.returncode == 143
    after = snapshot(ws)
    assert {k: v for k, v in after.items() if not k.startswith("models/.resume/")} == before
    client = MlflowClient(tracking_uri=f"sqlite:///{ws / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert [(r.data.tags["debias.stage"], r.info.status) for r in runs] == [("train_erm", "KILLED")]
