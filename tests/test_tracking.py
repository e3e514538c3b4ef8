"""Tracking-store resolution (incl. DVC's temporary workspaces), run tags, records and failures."""

from __future__ import annotations

import json
import multiprocessing
import os
from pathlib import Path

import pytest

from debias.core.errors import TrackingError
from debias.core.paths import repo_root
from debias.harness import tracking, workspace
from debias.harness.tracking import runs, stage_run, store, tracking_uri
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_logged_model_has_a_signature_an_input_example_and_loads_without_pickle(tmp_path, monkeypatch,
                                                                                  mlflow_template) -> None:
    """StageRun.log_model: an MLflow 3 logged model (search_logged_models finds it, READY, linked to its run and
    to the pipeline's parent run) with a signature and an input example, whose pyfunc rebuilds the network from
    the checkpoint and predicts its logits; no pickle warning; pinned requirements name debias and torch."""
    import logging

    import mlflow
    import numpy as np
    import torch
    from mlflow.tracking import MlflowClient

    from debias.harness.tracking import MODEL_CODE, model_requirements
    from debias.models import build_model, save_network

    (tmp_path / ".dvc").mkdir()
    fresh_store(mlflow_template, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    monkeypatch.setattr(runs, "pipeline_run_key", lambda: "exp-a@host:1-1")
    monkeypatch.setenv("DEBIAS_RUN_NAME", "temp-temperature0.05-upstream")  # a sweep's shared upstream: no experiment
    model = build_model("lenet5", 5, 28)
    save_network(str(tmp_path / "erm.pt"), model, "lenet5", 5, 28)
    x = torch.randint(0, 256, (4, 3, 28, 28), dtype=torch.uint8)
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("mlflow").addHandler(handler)
    try:
        with stage_run("train_erm", {"erm": {"lr": 0.01}, "model": {"name": "lenet5"}},
                       record_path=tmp_path / "rec.json") as run:
            model_id = run.log_model(model, checkpoint=tmp_path / "erm.pt", input_example=x)
    finally:
        logging.getLogger("mlflow").removeHandler(handler)
    assert not [r for r in records if "Pickle" in r.getMessage()]
    record = json.loads((tmp_path / "rec.json").read_text())
    assert record["model_id"] == model_id
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_run(record["run_id"]).info.experiment_id
    [logged] = client.search_logged_models(experiment_ids=[experiment])
    assert (logged.model_id, logged.name, logged.source_run_id, str(logged.status)) == (
        model_id, "erm-lenet5-temp-temperature0_05-upstream", record["run_id"], "READY")  # what it is, MLflow's charset
    parent = client.get_run(record["parent_run_id"])
    assert parent.data.tags["mlflow.runName"].startswith("temp-temperature0.05-upstream")
    assert client.get_run(record["run_id"]).data.tags["mlflow.runName"] == "train_erm-temp-temperature0.05-upstream"
    assert [o.model_id for o in parent.outputs.model_outputs] == [model_id]
    with store._tracking_uri_set(f"sqlite:///{tmp_path / 'mlflow.db'}"):
        info = mlflow.models.get_model_info(f"models:/{model_id}")
        loaded = mlflow.pyfunc.load_model(f"models:/{model_id}")
    assert str(info.signature.inputs) == "[Tensor('uint8', (-1, 3, 28, 28))]"
    assert info.saved_input_example_info["type"] == "ndarray"
    with torch.no_grad():
        assert np.allclose(loaded.predict(x.numpy()), model.eval()(x).numpy(), atol=1e-5)
    assert MODEL_CODE.name in {a.path for a in client.list_logged_model_artifacts(model_id)}
    pinned = {line.split("==")[0] for line in model_requirements(model)}
    assert {"debias", "torch", "numpy"} <= pinned


def test_a_models_requirements_are_those_of_the_standard_librarys_map_of_installed_distributions() -> None:
    """The requirements read from MLflow's map of modules to distributions (built once for ``Model.log``'s check)
    are the pins the standard library's ``packages_distributions`` gives for the model's modules and the loader's,
    for a LeNet and a torchvision ResNet."""
    from importlib.metadata import packages_distributions

    from mlflow.utils.requirements_utils import _get_pinned_requirement

    from debias.harness.tracking import model_requirements
    from debias.harness.tracking.artifacts import MODEL_LOADER_MODULES
    from debias.models import build_model

    distributions = packages_distributions()
    for name, size in (("lenet5", 28), ("resnet18", 32)):
        model = build_model(name, 5, size)
        modules = {type(m).__module__.split(".")[0] for m in model.modules()} | set(MODEL_LOADER_MODULES)
        expected = [_get_pinned_requirement(d) for d in sorted({d for m in modules for d in distributions[m]})]
        assert model_requirements(model) == expected, name
        assert any(line.startswith("torch==") for line in expected)


def test_pipeline_run_key_is_the_experiment_and_the_dvc_process(monkeypatch) -> None:
    """The key names the DVC experiment and the nearest `dvc` ancestor process (pid and start time); outside
    DVC there is none, so a stage started by hand gets no parent."""
    tree = {900: (["/bin/bash", "-c", "python pipeline/x.py"], 800, "7"),
            800: (["/venv/bin/python", "/venv/bin/dvc", "exp", "exec-run", "--infofile", "x"], 700, "12345"),
            700: (["celery", "worker"], 1, "5")}
    monkeypatch.setattr(runs.os, "getppid", lambda: 900)
    monkeypatch.setattr(workspace, "process_info", lambda pid: tree.get(pid))
    assert runs.dvc_invocation() == "800-12345"
    monkeypatch.setenv("DVC_EXP_NAME", "q81")
    key = runs.pipeline_run_key()
    assert key.startswith("q81@") and key.endswith(":800-12345")
    monkeypatch.delenv("DVC_EXP_NAME")
    assert runs.pipeline_run_key().startswith("workspace@")
    tree[800] = (["/venv/bin/python", "-m", "pytest"], 700, "12345")
    assert runs.dvc_invocation() is None and runs.pipeline_run_key() is None
    assert workspace.is_dvc_command(["dvc", "repro"]) and workspace.is_dvc_command(["python", "-m", "dvc", "repro"])
    assert not workspace.is_dvc_command(["python", "pipeline/dvc_helper.py"])


def tracked_workspace(root: Path, monkeypatch, template: Path, committed: str, workspace: str) -> None:
    """``root`` made a DVC workspace with a fresh MLflow store and tracking required, the working folder: a git
    repository whose baseline commit holds params.yaml as ``committed``, the workspace's as ``workspace``."""
    import subprocess

    (root / ".dvc").mkdir()
    fresh_store(template, root)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    (root / "params.yaml").write_text(committed)
    for command in (["git", "init", "-q"], ["git", "add", "params.yaml"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base"]):
        subprocess.run(command, cwd=root, check=True)
    (root / "params.yaml").write_text(workspace)


def test_stage_runs_nest_under_one_parent_per_pipeline_run(tmp_path, monkeypatch, mlflow_template) -> None:
    """Stages of one pipeline run share a parent (found again by its key, reopened, ended with the last stage's
    status); another key (another experiment, another queue worker) gets its own parent. The parent holds
    the full params, the difference from the baseline commit's params.yaml, the headline metrics."""
    from mlflow.tracking import MlflowClient

    tracked_workspace(tmp_path, monkeypatch, mlflow_template, committed="seed: 0\nloss:\n  epsilon: 0.25\n",
                      workspace="seed: 0\nloss:\n  epsilon: 0.5\n")
    records = []
    for i, (key, stage) in enumerate((("a", "train_erm"), ("a", "evaluate"), ("b", "train_erm"))):
        monkeypatch.setattr(runs, "pipeline_run_key", lambda key=key: f"{key}@host:1-1")
        with stage_run(stage, {"seed": 0}, record_path=tmp_path / f"rec{i}.json") as run:
            run.log_parent({"s2_worst": 0.1 * (i + 1)}, {"debias.warnings": "none"})
        records.append(json.loads((tmp_path / f"rec{i}.json").read_text()))
    assert records[0]["parent_run_id"] == records[1]["parent_run_id"] != records[2]["parent_run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    for record in records:
        assert client.get_run(record["run_id"]).data.tags["mlflow.parentRunId"] == record["parent_run_id"]
    parent = client.get_run(records[0]["parent_run_id"])
    assert parent.info.status == "FINISHED" and parent.data.tags["debias.kind"] == "pipeline"
    assert parent.data.tags["debias.params_diff"] == "loss.epsilon=0.5"
    assert parent.info.run_name == "workspace (loss.epsilon=0.5)"
    assert parent.data.params["loss.epsilon"] == "0.5" and parent.data.params["erm.lr"]  # every param, defaults too
    assert parent.data.metrics["s2_worst"] == pytest.approx(0.2)  # the later stage's value
    parents = client.search_runs([parent.info.experiment_id], filter_string="tags.`debias.kind` = 'pipeline'")
    assert len(parents) == 2


def test_the_parent_reads_params_yaml_as_dvc_does(tmp_path, monkeypatch, mlflow_template) -> None:
    """A value written ``1e-2`` in the workspace and ``0.01`` in the baseline commit is one number (YAML 1.2, as DVC
    and the stages read params.yaml): no difference in the parent's name or tag, and the parent's params are the
    validated ones, defaults filled in (not the file's text, as a YAML 1.1 reader would leave a string there)."""
    from mlflow.tracking import MlflowClient

    tracked_workspace(tmp_path, monkeypatch, mlflow_template,
                      committed="seed: 0\nerm:\n  lr: 0.01\nloss:\n  epsilon: 0.25\n",
                      workspace="seed: 0\nerm:\n  lr: 1e-2\nloss:\n  epsilon: 5.0e-1\n")
    monkeypatch.setattr(runs, "pipeline_run_key", lambda: "a@host:1-1")
    with stage_run("train_erm", {"seed": 0}, record_path=tmp_path / "rec.json"):
        pass
    record = json.loads((tmp_path / "rec.json").read_text())
    parent = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(record["parent_run_id"])
    assert parent.data.tags["debias.params_diff"] == "loss.epsilon=0.5"
    assert parent.info.run_name == "workspace (loss.epsilon=0.5)"
    assert parent.data.params["erm.lr"] == "0.01" and parent.data.params["stage2.method"]  # validated, defaults in


def test_experiments_open_on_their_training_runs(tmp_path, mlflow_template) -> None:
    """MLflow 3's UI opens an experiment on GenAI traces unless mlflow.experimentKind says machine learning."""
    from mlflow.tracking import MlflowClient

    from debias.harness.tracking import EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, ensure_experiment

    fresh_store(mlflow_template, tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    created = ensure_experiment(uri, "debias", tmp_path)
    assert client.get_experiment(created).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND == "custom_model_development"
    older = client.create_experiment("older")  # a store from before the tag: tagged on its next use
    assert ensure_experiment(uri, "older", tmp_path) == older
    assert client.get_experiment(older).tags[EXPERIMENT_KIND_TAG] == EXPERIMENT_KIND
    chosen = client.create_experiment("chosen", tags={EXPERIMENT_KIND_TAG: "genai_development"})  # the user's choice
    ensure_experiment(uri, "chosen", tmp_path)
    assert client.get_experiment(chosen).tags[EXPERIMENT_KIND_TAG] == "genai_development"


def test_a_training_stage_logs_the_selected_epochs_validation_metrics(tmp_path) -> None:
    """The per-epoch series' last value is the last epoch's; the selected epoch's get their own keys."""
    import torch

    from debias.harness.tracking import StageRun
    from debias.training.outputs import StageOutputs, write_outputs
    from tests.test_training import run, tiny_split

    class Recorder(StageRun):
        def log_metrics(self, values, step=None) -> None:
            self.logged.update({k: v for k, v in values.items() if step is None})

    model, result = run(3)
    result.selected_epoch = 1  # as if the selection had kept the middle epoch
    for row, worst in zip(result.history, (0.1, 0.273, 0.18)):
        row["val/worst_group"] = worst
    out = StageOutputs(model=tmp_path / "m.pt", embeddings_dir=tmp_path / "emb", metrics=tmp_path / "metrics.json",
                       curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    splits = {"train": tiny_split(), "val": tiny_split(seed=1), "test": tiny_split(seed=2)}
    recorder = Recorder(None, None)
    recorder.logged = {}
    write_outputs(model, "lenet5", result, splits, recorder, out, 64, torch.device("cpu"), "erm")
    assert recorder.logged["selected.val.worst_group"] == 0.273
    assert recorder.logged["selected.val.avg"] == result.history[1]["val/avg"]
    assert not any(key.startswith("selected.train") for key in recorder.logged)


@pytest.mark.slow
def test_every_per_epoch_series_has_strictly_increasing_steps(tmp_path, monkeypatch, mlflow_template) -> None:
    """A real training stage logged to a real store: each metric key is one series whose steps strictly increase
    (the kept model's val.* go under selected.val.*, never a second point at step 0 of the per-epoch series), the
    series' last point is the last epoch's, and selected.val.worst_group is the kept epoch's row."""
    from mlflow.tracking import MlflowClient

    from debias.params import ErmParams
    from debias.training.erm import train_erm
    from debias.training.outputs import StageOutputs
    from tests.test_training import tiny_split

    (tmp_path / ".dvc").mkdir()
    fresh_store(mlflow_template, tmp_path)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    (tmp_path / "params.yaml").write_text("seed: 0\n")
    splits = {"train": tiny_split(), "val": tiny_split(seed=1), "test": tiny_split(seed=2)}
    out = StageOutputs(model=tmp_path / "m.pt", embeddings_dir=tmp_path / "emb", metrics=tmp_path / "metrics.json",
                       curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    optim = ErmParams(epochs=3, batch_size=32, lr=0.003, optimizer="adam", selection="best_worst_group")
    with stage_run("train_erm", {}, record_path=tmp_path / "rec.json") as run:
        train_erm(splits, "lenet5", optim, 0, run, out)
    run_id = json.loads((tmp_path / "rec.json").read_text())["run_id"]
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    metrics = client.get_run(run_id).data.metrics
    histories = {key: client.get_metric_history(run_id, key) for key in metrics}
    for key, points in histories.items():
        steps = [point.step for point in sorted(points, key=lambda p: (p.timestamp, p.step))]
        assert all(a < b for a, b in zip(steps, steps[1:])), (key, steps)
    assert [p.step for p in histories["val.worst_group"]] == [0, 1, 2]
    saved = json.loads(out.metrics.read_text())
    kept = saved["selected_epoch"]
    by_step = {p.step: p.value for p in histories["val.worst_group"]}
    assert metrics["val.worst_group"] == by_step[2]  # the series' latest value is the last epoch's
    assert metrics["selected.val.worst_group"] == pytest.approx(by_step[kept])
    assert metrics["test.worst_group"] == pytest.approx(saved["test"]["worst_group"])  # no series: its own key
