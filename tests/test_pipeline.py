"""End to end: `dvc repro` in a temporary git clone on a tiny configuration, and what every stage wrote.

Also: `dvc plots show` draws each declared plot once from the CSVs the stages wrote, offline; a second
repro reruns nothing, a training param reruns only its stage and those after it, and `dvc exp run --temp`
logs into the main repository's MLflow store.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from tests.conftest import REPO, copy_worktree, fresh_store

pytestmark = pytest.mark.slow

TINY = {
    "data": {"max_per_split": 240},
    "erm": {"epochs": 2},
    "stage2": {"epochs": 2},
    "probe": {"c_grid": [0.1, 1.0]},
    "evaluate": {"splits": ["test"], "umap": {"max_points": 150}},
}
STAGES = ["download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe", "evaluate",
          "report"]


def _deep_update(base: dict, changes: dict) -> dict:
    for key, value in changes.items():
        if isinstance(value, dict):
            _deep_update(base.setdefault(key, {}), value)
        else:
            base[key] = value
    return base


def make_clone(target: Path) -> Path:
    """Copy the working tree's tracked and unignored files into a fresh git repository and commit."""
    copy_worktree(target)
    params = yaml.safe_load((target / "params.yaml").read_text())
    (target / "params.yaml").write_text(yaml.safe_dump(_deep_update(params, TINY), sort_keys=False))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "tiny"]):
        subprocess.run(command, cwd=target, check=True)
    return target


def dvc(clone: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_"))}
    env.update(DEBIAS_TRACKING="required", DEBIAS_THREADS="1", GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t",
               GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    done = subprocess.run(["dvc", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"dvc {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout + done.stderr


def ran(output: str) -> list[str]:
    """The stages a dvc command ran, without ``source`` (always_changed: it fingerprints data.path on every run)."""
    stages = [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")]
    return [stage for stage in stages if stage != "source"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> tuple[Path, str]:
    clone = make_clone(tmp_path_factory.mktemp("clone"))
    fresh_store(mlflow_template, clone)
    return clone, dvc(clone, "repro")


def test_every_stage_runs_and_writes_its_outputs(pipeline) -> None:
    from debias.data.store import load_split
    from debias.models import load_network

    clone, output = pipeline
    assert ran(output) == STAGES
    summary = json.loads((clone / "data/biased/summary.json").read_text())
    assert summary["protocol"] == "foreground"
    assert abs(summary["splits"]["train"]["realised_correlation"] - 0.9) < 0.06
    for name in ("train", "val", "test"):
        split = load_split(clone / f"data/biased/{name}.pt")
        assert split.x.shape[1:] == (3, 28, 28) and len(split) <= 240
        embeddings = torch.load(clone / f"data/erm/embeddings_{name}.pt", weights_only=True)
        assert embeddings["z"].shape == (len(split), 84) and embeddings["logits"].shape == (len(split), 5)
    assert (clone / "reports/figures/samples.png").stat().st_size > 1000
    model, payload = load_network(str(clone / "models/erm.pt"))
    assert payload["model_name"] == "lenet5"
    metrics = json.loads((clone / "reports/metrics/erm.json").read_text())
    assert set(metrics["test"]) >= {"avg", "unbiased", "worst_group", "aligned"}
    curves = (clone / "reports/plots/erm_curves.csv").read_text().splitlines()
    assert curves[0].startswith("epoch") and len(curves) == 1 + TINY["erm"]["epochs"]
    assert not (clone / "models/.resume/erm.pt").exists()  # resume state removed on success

    groups = pd.read_parquet(clone / "data/groups/train.parquet")
    assert list(groups.columns)[:5] == ["index", "y", "inferred_label", "inferred_group", "minority"]
    assert json.loads((clone / "reports/metrics/groups.json").read_text())["method"] == "cluster"  # the card's default
    stage2, payload = load_network(str(clone / "models/stage2.pt"))
    assert payload["meta"]["method"] == "eps_supinfonce" and payload["options"]["feature_activation"] == "tanh"
    stage2_metrics = json.loads((clone / "reports/metrics/stage2_train.json").read_text())
    assert stage2_metrics["method"] == "eps_supinfonce" and 0 <= stage2_metrics["test"]["worst_group"] <= 1
    assert stage2_metrics["selection"]["rule"] == "best_worst_group" and isinstance(stage2_metrics["warnings"], list)
    fairkl = json.loads((clone / "reports/metrics/stage2_train_info.json").read_text())["fairkl"]
    assert len(fairkl["epochs"]) == TINY["stage2"]["epochs"] and 0 <= fairkl["pos_active"] <= 1
    probe = json.loads((clone / "reports/metrics/probe.json").read_text())
    assert probe["erm"]["probe"]["c"] in (0.1, 1.0) and probe["stage2"]["trained"]
    representation = json.loads((clone / "reports/metrics/representation.json").read_text())
    assert representation["stage2"]["test"]["mi_y"] >= 0
    umap = torch.load(clone / "data/evaluate/umap_stage2_test.pt", weights_only=True)
    assert umap["coords"].shape == (150, 2)
    report = (clone / "reports/report.md").read_text()
    for heading in ("Provenance", "Dataset", "Results", "Per-group accuracy", "Training curves", "Group inference"):
        assert heading in report
    html = (clone / "reports/report.html").read_text()
    assert "data:image/png;base64," in html and 'src="http' not in html


def _find_chromium() -> str | None:
    spec = importlib.util.spec_from_file_location("check_report", REPO / "scripts" / "check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.find_chromium()


def test_dvc_plots_show_draws_each_declared_plot_once_offline(pipeline, tmp_path: Path) -> None:
    """Every declared column is in the CSV its stage wrote; the page has one plot per declaration, Vega inline,
    no remote script; with Chromium installed, vega-embed draws all of them from a file:// page."""
    from debias.report.plots_page import GLOBALS, PLOTS_TEMPLATE

    clone, _ = pipeline
    declared = [next(iter(entry.items())) for entry in yaml.safe_load((clone / "dvc.yaml").read_text())["plots"]]
    for name, spec in declared:
        for file, columns in spec["y"].items():
            header = (clone / file).read_text().splitlines()[0].split(",")
            missing = {spec["x"], *([columns] if isinstance(columns, str) else columns)} - set(header)
            assert not missing, f"plot {name!r}: {file} has no column {sorted(missing)} (header: {header})"
    assert (clone / PLOTS_TEMPLATE).is_file()  # written by the report stage, where .dvc/config points DVC
    dvc(clone, "plots", "show", "-o", str(tmp_path / "plots"))
    page = (tmp_path / "plots" / "index.html").read_text(encoding="utf-8")
    ids = re.findall(r'<div id = "([^"]+)"', page)
    assert len(ids) == len(set(ids)) == len(declared), ids  # no second plot of a file from a stage entry
    assert not re.search(r"<script[^>]*\bsrc\s*=", page, re.IGNORECASE) and all(g in page for g in GLOBALS)

    chromium = _find_chromium()
    if chromium is None:
        return  # the drawing itself is checked where Chromium is installed (apt-get install -y chromium)
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        dom = subprocess.run([chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                              "--no-first-run", "--disable-background-networking", "--disable-component-update",
                              "--disable-sync", f"--user-data-dir={profile}", "--virtual-time-budget=10000",
                              "--dump-dom", (tmp_path / "plots" / "index.html").as_uri()],
                             capture_output=True, text=True, timeout=120).stdout
    assert dom.count('class="vega-embed') == len(declared), "vega-embed did not draw every plot offline"


def test_one_mlflow_run_per_stage_with_provenance_tags(pipeline) -> None:
    from mlflow.tracking import MlflowClient

    clone, _ = pipeline
    client = MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()])
    by_stage = {r.data.tags["debias.stage"]: r for r in runs}
    assert set(by_stage) == set(STAGES)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    for stage, run in by_stage.items():
        assert run.data.tags["debias.git_commit"] == head
        record = json.loads((clone / f"reports/runs/{stage}.json").read_text())
        assert record["run_id"] == run.info.run_id
        assert run.data.tags["debias.params_hash"] == record["params_hash"]
    assert "model" in {a.path for a in client.list_artifacts(by_stage["train_erm"].info.run_id)}


def test_second_repro_reruns_nothing_and_params_rerun_only_downstream(pipeline) -> None:
    clone, _ = pipeline
    assert ran(dvc(clone, "repro")) == []
    params = yaml.safe_load((clone / "params.yaml").read_text())
    original = (clone / "params.yaml").read_text()
    try:
        params["bias"]["foreground"]["p_corr"] = 0.8
        (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        assert ran(dvc(clone, "repro", "--dry", "inject_bias")) == ["inject_bias"]  # download is not rerun
    finally:
        (clone / "params.yaml").write_text(original)
    for key, stages in (("stage2.epochs=3", STAGES[4:]), ("loss.epsilon=0.3", STAGES[4:]),
                        ("groups.method=true", STAGES[3:]), ("report.dpi=90", ["report"])):
        section, value = key.split("=")
        outer, inner = section.split(".")
        changed = yaml.safe_load(original)
        changed[outer][inner] = type(changed[outer][inner])(value) if not isinstance(changed[outer][inner], str) else value
        (clone / "params.yaml").write_text(yaml.safe_dump(changed, sort_keys=False))
        status = dvc(clone, "status", "--json")
        (clone / "params.yaml").write_text(original)
        # the first stage that reads the param, and the report (it shows every changed param)
        stale = set(json.loads(status.strip().splitlines()[-1])) - {"source"}  # source: always_changed
        assert stale == {stages[0], "report"}, key


def test_temp_experiment_reruns_only_downstream_and_logs_to_the_main_store(pipeline) -> None:
    from mlflow.tracking import MlflowClient

    clone, _ = pipeline
    output = dvc(clone, "exp", "run", "--temp", "-S", "probe.max_iter=500", "-n", "lr002")
    assert ran(output) == ["linear_probe", "report"]
    client = MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`debias.dvc_experiment` = 'lr002'")
    assert sorted(r.data.tags["debias.stage"] for r in runs) == ["linear_probe", "report"]
    probe_run = next(r for r in runs if r.data.tags["debias.stage"] == "linear_probe")
    assert probe_run.data.params["probe.max_iter"] == "500"
    artifact_root = client.get_experiment(runs[0].info.experiment_id).artifact_location
    assert artifact_root == (clone / "mlruns").as_uri()  # not inside the deleted temp workspace
    shown = subprocess.run(["dvc", "exp", "show", "--json"], cwd=clone, capture_output=True, text=True).stdout
    assert "lr002" in shown


def test_queued_experiments_on_two_workers_lose_no_run(pipeline) -> None:
    """`dvc exp run --queue` x 4 and `dvc queue start -j 2`: four runs, each with its metrics, in one store."""
    from mlflow.tracking import MlflowClient

    clone, _ = pipeline
    for dpi in (81, 82, 83, 84):
        dvc(clone, "exp", "run", "--queue", "-S", f"report.dpi={dpi}", "-n", f"q{dpi}")
    dvc(clone, "queue", "start", "-j", "2")
    client = MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    deadline = time.time() + 600
    while time.time() < deadline:
        status = subprocess.run(["dvc", "queue", "status"], cwd=clone, capture_output=True, text=True).stdout
        if not any(word in status for word in ("Queued", "Running")):
            break
        time.sleep(3)
    assert "Failed" not in status, status
    runs = client.search_runs(experiments, filter_string="tags.`debias.stage` = 'report'")
    by_experiment = {r.data.tags.get("debias.dvc_experiment"): r for r in runs}
    assert {"q81", "q82", "q83", "q84"} <= set(by_experiment), sorted(filter(None, by_experiment))
    for dpi in (81, 82, 83, 84):
        run = by_experiment[f"q{dpi}"]
        assert run.info.status == "FINISHED" and run.data.params["report.dpi"] == str(dpi)
