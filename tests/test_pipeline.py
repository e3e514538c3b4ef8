"""End to end: `dvc repro` in a temporary git clone on a tiny configuration, and what every stage wrote.

Also: `dvc plots show` draws each declared plot once from the CSVs the stages wrote, offline; a second
repro reruns nothing, a training param reruns only its stage and those after it, and `dvc exp run --temp`
logs into the main repository's MLflow store; every pipeline run (the repro, the temp run, each of two
queue workers' experiments) is one MLflow parent run with its stage runs nested under it and the logged
models; README's `dvc exp show` invocation fits 150 columns; `debias compare` reports what the metrics files
and MLflow hold.
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
    """The stages DVC ran, but `source`, which runs every time by design (always_changed: it fingerprints the
    external data files in well under a second and reruns `download` only when they change)."""
    return [line.split("'")[1] for line in output.splitlines()
            if line.startswith("Running stage '") and line.split("'")[1] != "source"]


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory: pytest.TempPathFactory, mlflow_template: Path) -> tuple[Path, str]:
    clone = make_clone(tmp_path_factory.mktemp("clone"))
    fresh_store(mlflow_template, clone)
    output = dvc(clone, "repro")
    # as README says before `dvc exp run --temp` / `--queue` (autostage is off): DVC copies tracked files only
    subprocess.run(["git", "add", "dvc.lock"], cwd=clone, check=True)
    return clone, output


def test_every_stage_runs_and_writes_its_outputs(pipeline) -> None:
    from debias.data.store import load_split
    from debias.models import load_network

    clone, output = pipeline
    assert ran(output) == STAGES
    assert "is empty" not in output  # DVC warns about every empty file listed as a dep (package __init__.py files)
    # progress in DVC's log (not a terminal): one plain line per training epoch, no bar redraws
    for stage, epochs in (("train_erm", TINY["erm"]["epochs"]), ("train_contrastive", TINY["stage2"]["epochs"])):
        lines = [line for line in output.splitlines() if re.match(rf"\[{stage}\] epoch \d+ \(\d+/{epochs}\): ", line)]
        assert len(lines) == epochs and all("val avg" in line and "worst-group" in line for line in lines), stage
    assert "\r" not in output
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
    committed = yaml.safe_load((clone / "params.yaml").read_text())
    method = committed["stage2"]["method"]  # the card's default (CNC), as the committed params.yaml says
    assert payload["meta"]["method"] == method and payload["options"]["feature_activation"] == "relu"
    stage2_metrics = json.loads((clone / "reports/metrics/stage2_train.json").read_text())
    assert stage2_metrics["method"] == method and 0 <= stage2_metrics["test"]["worst_group"] <= 1
    assert stage2_metrics["selection"]["rule"] == committed["stage2"]["selection"]
    assert isinstance(stage2_metrics["warnings"], list)
    sampler = json.loads((clone / "reports/metrics/stage2_train_info.json").read_text())["sampler"]
    assert sampler["batches_drawn"] == TINY["stage2"]["epochs"] * sampler["batches_per_epoch"] > 0
    probe = json.loads((clone / "reports/metrics/probe.json").read_text())
    assert probe["erm"]["probe"]["c"] in (0.1, 1.0) and probe["stage2"]["trained"]
    representation = json.loads((clone / "reports/metrics/representation.json").read_text())
    assert representation["stage2"]["test"]["mi_y"] >= 0
    umap = torch.load(clone / "data/evaluate/umap_stage2_test.pt", weights_only=True)
    assert umap["coords"].shape == (150, 2)
    report = (clone / "reports/report.md").read_text()
    for heading in ("Warnings", "Provenance", "Dataset", "Results", "Per-group accuracy", "Training curves",
                    "Group inference"):
        assert heading in report
    from debias.core.headline import DETAILED, headline, headline_path

    for stage, detailed in DETAILED.items():  # the DVC metrics: the headline of each stage's detailed file
        written = json.loads((clone / headline_path(stage)).read_text())
        assert written and written == headline(stage, json.loads((clone / detailed).read_text())), stage
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


def _client(clone: Path):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")


def _runs(clone: Path, filter_string: str = "") -> list:
    client = _client(clone)
    return client.search_runs([e.experiment_id for e in client.search_experiments()], filter_string=filter_string,
                              max_results=1000)


def test_one_parent_run_per_pipeline_run_with_its_stages_and_logged_models(pipeline) -> None:
    """The repro is one parent run (kind pipeline) holding every headline metric, the params, the logged models
    and the report; each stage is one run nested under it, with provenance tags and its run record."""
    import mlflow

    from debias.core.headline import read_headlines

    clone, _ = pipeline
    client = _client(clone)
    runs = _runs(clone)
    [parent] = [r for r in runs if r.data.tags.get("debias.kind") == "pipeline"]
    by_stage = {r.data.tags["debias.stage"]: r for r in runs if "debias.stage" in r.data.tags}
    assert set(by_stage) == set(STAGES) and len(runs) == len(STAGES) + 1
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    for stage, run in by_stage.items():
        assert run.data.tags["debias.git_commit"] == head
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        record = json.loads((clone / f"reports/runs/{stage}.json").read_text())
        assert record["run_id"] == run.info.run_id and record["parent_run_id"] == parent.info.run_id
        assert run.data.tags["debias.params_hash"] == record["params_hash"]
    method = yaml.safe_load((clone / "params.yaml").read_text())["stage2"]["method"]  # the clone's params
    assert parent.info.status == "FINISHED" and parent.data.params["stage2.method"] == method
    headline = read_headlines(clone)
    assert {k: parent.data.metrics[k] for k in headline} == pytest.approx(headline)
    assert parent.data.tags["debias.warnings"] and "report" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    from debias.harness.tracking.store import _tracking_uri_set

    with _tracking_uri_set(f"sqlite:///{clone / 'mlflow.db'}"):
        models = mlflow.search_logged_models(experiment_ids=[parent.info.experiment_id], output_format="list")
    assert {(m.name, m.source_run_id) for m in models} == {  # named by checkpoint, method and pipeline run
        ("erm-lenet5-workspace", by_stage["train_erm"].info.run_id),
        ("stage2-cnc-workspace", by_stage["train_contrastive"].info.run_id)}
    assert {o.model_id for o in parent.outputs.model_outputs} == {m.model_id for m in models}
    with _tracking_uri_set(f"sqlite:///{clone / 'mlflow.db'}"):
        info = mlflow.models.get_model_info(f"models:/{models[0].model_id}")
    assert info.signature is not None and info.saved_input_example_info["type"] == "ndarray"


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
        # the first stage that reads the param, and the report (it shows every changed param); `source` is
        # always changed by design (see ran())
        assert set(json.loads(status.strip().splitlines()[-1])) - {"source"} == {stages[0], "report"}, key


def test_temp_experiment_reruns_only_downstream_and_logs_to_the_main_store(pipeline) -> None:
    from mlflow.tracking import MlflowClient

    clone, _ = pipeline
    output = dvc(clone, "exp", "run", "--temp", "-S", "probe.max_iter=500", "-n", "lr002")
    assert ran(output) == ["linear_probe", "report"]
    client = MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")
    runs = client.search_runs([e.experiment_id for e in client.search_experiments()],
                              filter_string="tags.`debias.dvc_experiment` = 'lr002'")
    [parent] = [r for r in runs if r.data.tags.get("debias.kind") == "pipeline"]  # the temp run: one parent ...
    stages = [r for r in runs if r is not parent]
    assert sorted(r.data.tags["debias.stage"] for r in stages) == ["linear_probe", "report"]
    assert {r.data.tags["mlflow.parentRunId"] for r in stages} == {parent.info.run_id}  # ... with its two stages
    assert parent.info.run_name == "lr002 (probe.max_iter=500)" and parent.data.params["probe.max_iter"] == "500"
    assert parent.data.metrics["s2_worst"] == json.loads((clone / "reports/metrics/train_contrastive.json").read_text())[
        "s2_worst"]  # upstream headline metrics too, from the stages restored from the workspace's outputs
    probe_run = next(r for r in stages if r.data.tags["debias.stage"] == "linear_probe")
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
        time.sleep(5)  # each poll is a `dvc queue status`: ~1.3 s of CPU
    assert "Failed" not in status, status
    runs = client.search_runs(experiments, filter_string="tags.`debias.stage` = 'report'")
    by_experiment = {r.data.tags.get("debias.dvc_experiment"): r for r in runs}
    assert {"q81", "q82", "q83", "q84"} <= set(by_experiment), sorted(filter(None, by_experiment))
    parents = {r.data.tags["debias.dvc_experiment"]: r for r in client.search_runs(
        experiments, filter_string="tags.`debias.kind` = 'pipeline'") if r.data.tags.get("debias.dvc_experiment")}
    assert len({parents[f"q{dpi}"].info.run_id for dpi in (81, 82, 83, 84)}) == 4  # one parent per experiment
    for dpi in (81, 82, 83, 84):
        run = by_experiment[f"q{dpi}"]
        assert run.info.status == "FINISHED" and run.data.params["report.dpi"] == str(dpi)
        # the two workers never attach a stage to the other experiment's parent
        assert run.data.tags["mlflow.parentRunId"] == parents[f"q{dpi}"].info.run_id
        assert parents[f"q{dpi}"].data.tags["debias.params_diff"] == f"report.dpi={dpi}"


def readme_exp_show() -> list[str]:
    """README's `dvc exp show` invocation for comparing experiments (the line that starts with it)."""
    import shlex

    lines = [line.strip() for line in (REPO / "README.md").read_text().splitlines()
             if line.strip().startswith("dvc exp show --only-changed")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].split("  #")[0])


def test_readme_exp_show_invocation_fits_150_columns(pipeline) -> None:
    """On the experiments above (the temp run and four queued ones) README's invocation prints every column in
    full within 150 characters, the stage-2 headline among them, no dependency hash and no params.yaml column."""
    clone, _ = pipeline
    command = readme_exp_show()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_"))}
    natural = subprocess.run(command, cwd=clone, capture_output=True, text=True, env={**env, "COLUMNS": "150"},
                             timeout=300).stdout  # piped, DVC prints the table at its full width
    lines = natural.splitlines()
    assert max(map(len, lines)) <= 150, natural
    header = next(line for line in lines if "Experiment" in line)
    for column in ("s2_avg", "s2_unbiased", "s2_worst", "probe_s2_worst", "align_s2", "mi_a_s2", "report.dpi"):
        assert column in header, header
    assert "/" not in header and "params.yaml" not in header and "Created" not in header
    assert sum("[q8" in line for line in lines) == 4 and any("[lr002]" in line for line in lines)
    squeezed = subprocess.run([*command, "--no-pager"], cwd=clone, capture_output=True, text=True,
                              env={**env, "COLUMNS": "150"}, timeout=300).stdout
    assert "…" not in squeezed, squeezed  # a 150-column terminal cuts nothing


def test_compare_reports_the_metrics_files_and_mlflow_numbers(pipeline, tmp_path: Path, monkeypatch) -> None:
    """`debias compare` on the workspace and the five experiments: a table at most 160 characters wide whose
    numbers are the headline files' (the workspace) and MLflow's (the temp run's probe), grouped by the
    params that differ; a self-contained page that Chromium renders; the page logged to MLflow."""
    from debias.tools.compare import compare

    clone, _ = pipeline
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    comparison, written, text = compare(clone, out=tmp_path / "page")
    assert max(map(len, text.splitlines())) <= 160, text
    assert {"workspace", "lr002", "q81", "q82", "q83", "q84"} == set(comparison.frame["experiment"])
    assert comparison.params == ["probe.max_iter", "report.dpi"] and len(comparison.groups) == 6
    frame = comparison.frame.set_index("experiment")
    headline = {}
    for stage in ("train_erm", "train_contrastive", "linear_probe", "evaluate"):
        headline.update(json.loads((clone / f"reports/metrics/{stage}.json").read_text()))
    assert {k: frame.loc["workspace", k] for k in headline} == pytest.approx(headline)
    detailed = json.loads((clone / "reports/metrics/stage2_train.json").read_text())["test"]
    assert frame.loc["workspace", "s2_worst"] == pytest.approx(detailed["worst_group"], abs=5e-5)
    probe_run = _runs(clone, "tags.`debias.dvc_experiment` = 'lr002' and tags.`debias.stage` = 'linear_probe'")[0]
    assert frame.loc["lr002", "probe_s2_avg"] == pytest.approx(
        probe_run.data.metrics["stage2.probe.test.avg"], abs=5e-5)
    assert f"{100 * headline['s2_avg']:.1f}" in text
    page = written["html"].read_text(encoding="utf-8")
    assert page.count('src="data:image/png;base64,') >= 3 and "<script" not in page
    chromium = _find_chromium()
    if chromium is not None:
        spec = importlib.util.spec_from_file_location("check_report", REPO / "scripts" / "check_report.py")
        check = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(check)
        assert check.main([str(written["html"]), "--out", str(tmp_path / "compare.png"), "--window-size", "1400,2400"]) == 0
    [logged] = _runs(clone, "tags.`debias.kind` = 'compare'")
    assert "compare" in {a.path for a in _client(clone).list_artifacts(logged.info.run_id)}


def test_the_report_opens_on_the_headline_card(pipeline) -> None:
    """Issue 27's acceptance: the report of a real (tiny) pipeline puts the headline card before every other section,
    with ERM's and stage 2's three test metrics, the worst group (its n and Wilson interval) and the params table
    against the committed params.yaml."""
    from debias.metrics import group_accuracies, wilson_interval, worst_group_of

    clone, _ = pipeline
    md, page = (clone / "reports/report.md").read_text(), (clone / "reports/report.html").read_text()
    sections = [line[3:] for line in md.splitlines() if line.startswith("## ")]
    assert sections[0] == "Headline" and len(sections) > 5
    card = md.split("\n## ")[1]
    erm = json.loads((clone / "reports/metrics/erm.json").read_text())["test"]
    s2 = json.loads((clone / "reports/metrics/stage2_train.json").read_text())["test"]
    rows = {line.split(" | ")[0].lstrip("| "): line.rstrip(" |") for line in card.splitlines() if line.startswith("| ")}
    for label, key in (("average % [95 % interval]", "avg"), ("unbiased % (mean over groups)", "unbiased"),
                       ("worst-group %", "worst_group")):
        cells = rows[label].split(" | ")
        assert cells[1].startswith(f"{100 * erm[key]:.1f}") and cells[2].startswith(f"{100 * s2[key]:.1f}"), rows[label]
    groups = json.loads((clone / "reports/metrics/stage2_train_groups.json").read_text())["test"]
    worst = worst_group_of(group_accuracies(groups["per_group"], groups["group_counts"], 0.95))
    assert worst.accuracy == s2["worst_group"]
    assert rows["worst group (class y, attribute a)"].split(" | ")[2] == f"y={worst.y}, a={worst.a}"
    n_cell = rows["its test images n"].split(" | ")[2]
    assert n_cell.startswith(str(worst.n)) and ("fewer than 30" in n_cell) == (worst.n < 30)
    low, high = wilson_interval(worst.correct, worst.n, 0.95)
    assert rows["its 95 % interval (Wilson)"].split(" | ")[2] == f"[{100 * low:.1f}, {100 * high:.1f}]"
    assert "**Next: " in card
    starts = [m.start() for m in re.finditer(r"<section id=", page)]
    assert page.index('<section id="headline" class="card">') == starts[0] < page.index("<nav>")
    assert "None: this run used the committed params.yaml" in md  # the clone's commit holds the tiny params


def test_after_repro_then_an_experiment_compare_shows_the_baseline_beside_it(pipeline, tmp_path: Path,
                                                                             monkeypatch) -> None:
    """README's canonical flow, `dvc repro` then `dvc exp run -S stage2.cnc.temperature=...` in the workspace: the committed
    dvc.lock names outputs computed elsewhere and the workspace now holds the experiment's, yet compare shows the
    baseline's results (this machine's `dvc repro` run, from MLflow) beside the experiment, says where they come
    from, and never hints at rerunning the workspace's own params as the baseline. Runs last: it changes the
    workspace."""
    from debias.tools.compare import collect
    from debias.tools.compare import compare

    clone, _ = pipeline
    [repro_run] = [r for r in _runs(clone, "tags.`debias.kind` = 'pipeline'")
                   if r.data.tags.get("debias.params_diff") == collect.BASELINE_DIFF]
    dvc(clone, "exp", "run", "-S", "stage2.cnc.temperature=0.1", "-n", "temp01")
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    comparison, _, text = compare(clone, out=tmp_path / "page", param_filters=["report.dpi=110"])
    frame = comparison.frame.set_index("experiment")
    [baseline] = [e for e in comparison.experiments if e.kind == "baseline"]
    assert {baseline.name, "temp01"} <= set(frame.index)
    assert frame.loc[baseline.name, "s2_worst"] == pytest.approx(repro_run.data.metrics["s2_worst"])
    assert frame.loc["temp01", "s2_worst"] == pytest.approx(
        json.loads((clone / "reports/metrics/train_contrastive.json").read_text())["s2_worst"])
    assert "stage2.cnc.temperature" in comparison.params and frame.loc[baseline.name, "stage2.cnc.temperature"] != "0.1"
    assert f"results of this machine's pipeline run {repro_run.info.run_id} in MLflow" in " ".join(text.split())
    # without MLflow the baseline has no results, and its fix reruns the baseline's params, not the workspace's
    [dvc_baseline] = [e for e in collect.from_dvc(clone) if e.kind == "baseline"]
    committed = yaml.safe_load(subprocess.run(["git", "show", "HEAD:params.yaml"], cwd=clone, capture_output=True,
                                              text=True, check=True).stdout)["stage2"]["cnc"]["temperature"]
    assert dvc_baseline.fix == f"dvc exp run -S stage2.cnc.temperature={committed}", dvc_baseline.fix
