"""Tracking-store resolution (incl. DVC's temporary workspaces), run tags, records and failures."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from debias import tracking
from debias.tracking import TrackingError, repo_root, stage_run, tracking_uri
from tests.conftest import fresh_store


def test_store_resolves_to_dvc_root_even_from_a_temp_workspace(tmp_path, monkeypatch) -> None:
    main_repo, temp_ws = tmp_path / "repo", tmp_path / "repo" / ".dvc" / "tmp" / "exps" / "tmpabc"
    temp_ws.mkdir(parents=True)
    (temp_ws / ".dvc").mkdir()  # a temp workspace is itself a DVC repo
    monkeypatch.chdir(temp_ws)
    assert repo_root() == temp_ws  # without DVC_ROOT the nearest .dvc wins ...
    monkeypatch.setenv("DVC_ROOT", str(main_repo))
    assert repo_root() == main_repo  # ... but DVC sets DVC_ROOT to the main repository
    assert tracking_uri() == f"sqlite:///{main_repo / 'mlflow.db'}"


def test_nearest_dvc_folder_and_explicit_uri(tmp_path, monkeypatch) -> None:
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "pipeline").mkdir()
    monkeypatch.chdir(tmp_path / "pipeline")
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    assert tracking_uri() == "http://tracking.example:5000"


def test_stage_run_logs_tags_params_and_a_record(tmp_path, monkeypatch, mlflow_template) -> None:
    from mlflow.tracking import MlflowClient

    (tmp_path / ".dvc").mkdir()
    fresh_store(mlflow_template, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    monkeypatch.setenv("DVC_EXP_NAME", "exp-abc")
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    with stage_run("train_erm", {"erm": {"lr": 0.01}}, record_path=tmp_path / "rec.json") as run:
        run.log_metrics({"val/avg": 0.5}, step=1)
    record = json.loads((tmp_path / "rec.json").read_text())
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    stored = client.get_run(record["run_id"])
    assert stored.info.status == "FINISHED"
    assert stored.data.tags["debias.stage"] == "train_erm"
    assert stored.data.tags["debias.dvc_experiment"] == "exp-abc"
    assert stored.data.tags["debias.params_hash"] == record["params_hash"]
    assert stored.data.params["erm.lr"] == "0.01"
    assert stored.data.metrics["val.avg"] == 0.5
    experiment = client.get_experiment(stored.info.experiment_id)
    assert experiment.artifact_location == (tmp_path / "mlruns").as_uri()
    assert "provenance" in {a.path for a in client.list_artifacts(record["run_id"])}


def test_failed_stage_marks_the_run_failed_and_writes_no_record(tmp_path, monkeypatch, mlflow_template) -> None:
    from mlflow.tracking import MlflowClient

    (tmp_path / ".dvc").mkdir()
    fresh_store(mlflow_template, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    with pytest.raises(RuntimeError, match="boom"):
        with stage_run("download", {}, record_path=tmp_path / "rec.json"):
            raise RuntimeError("boom")
    assert not (tmp_path / "rec.json").exists()
    runs = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").search_runs(
        [e.experiment_id for e in MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").search_experiments()])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_unreachable_server_fails_fast_naming_the_uri(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(TrackingError, match=r"http://127\.0\.0\.1:9 is unreachable"):
        with stage_run("download", {}):
            pass


def test_optional_tracking_continues_and_says_so(tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "optional")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    with pytest.warns(UserWarning, match="NOT logged"):
        with stage_run("download", {}, record_path=tmp_path / "rec.json") as run:
            assert not run.active
    assert json.loads((tmp_path / "rec.json").read_text())["run_id"] is None


def test_bad_tracking_mode_is_named(monkeypatch) -> None:
    monkeypatch.setenv("DEBIAS_TRACKING", "sometimes")
    with pytest.raises(TrackingError, match="DEBIAS_TRACKING = 'sometimes'; allowed"):
        tracking.tracking_mode()


def _log_one(root: str, index: int) -> None:
    os.chdir(root)
    os.environ["DEBIAS_TRACKING"] = "required"
    os.environ.pop("MLFLOW_TRACKING_URI", None)
    with stage_run(f"worker{index}", {"i": index}, record_path=Path(root) / f"rec{index}.json") as run:
        run.log_metrics({"value": float(index)})


def test_concurrent_loggers_on_a_fresh_store_lose_no_run(tmp_path) -> None:
    """Two processes creating and writing the same new SQLite store at once: both runs are kept."""
    from mlflow.tracking import MlflowClient

    (tmp_path / ".dvc").mkdir()
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=_log_one, args=(str(tmp_path), i)) for i in range(2)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(120)
    assert [w.exitcode for w in workers] == [0, 0]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert sorted(r.data.metrics["value"] for r in runs) == [0.0, 1.0]


def test_model_requirements_are_what_mlflow_infers(tmp_path) -> None:
    """log_model pins the requirements itself: the same requirements.txt as MLflow's (slow, subprocess) inference."""
    import mlflow.pytorch

    from debias.models import build_model
    from debias.tracking import model_requirements

    model = build_model("lenet5", 5, 28)
    mlflow.pytorch.save_model(model, str(tmp_path / "inferred"), serialization_format="pickle")
    mlflow.pytorch.save_model(model, str(tmp_path / "pinned"), serialization_format="pickle",
                              pip_requirements=model_requirements(model))
    inferred, pinned = ((tmp_path / name / "requirements.txt").read_text() for name in ("inferred", "pinned"))
    assert "debias==" in pinned and pinned == inferred
