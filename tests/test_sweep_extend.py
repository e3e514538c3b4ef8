"""``debias sweep --resume --seeds`` and ``--until-decided`` offline (the plan extended, the sequential looks on
experiments made as git refs with their headline metrics), and the MLflow runs the sweep records for what DVC
restored from its run-cache (a SQLite store, run records in a cache folder). The real runs are in tests/test_sweep.py
(slow)."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import subprocess
from pathlib import Path

import pytest
import yaml

from debias.tools.sweep import command, extend, grid, records, workspace
from tests.conftest import committed_text

EPS = [0, 0.25]


def git(root: Path, *args: str, stdin: str | None = None) -> str:
    return subprocess.run(["git", *args], cwd=root, input=stdin, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A git repository holding the committed params.yaml and dvc.yaml."""
    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(committed_text("params.yaml"))
    (root / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "base")
    return root


def tree(root: Path, files: dict[str, str]) -> str:
    """A git tree object holding ``files`` (path -> text)."""
    entries: dict[str, dict | str] = {}
    for path, text in files.items():
        *folders, leaf = path.split("/")
        node = entries
        for folder in folders:
            node = node.setdefault(folder, {})  # type: ignore[assignment]
        node[leaf] = git(root, "hash-object", "-w", "--stdin", stdin=text)

    def write(node: dict) -> str:
        lines = [f"040000 tree {write(v)}\t{k}" if isinstance(v, dict) else f"100644 blob {v}\t{k}"
                 for k, v in sorted(node.items())]
        return git(root, "mktree", stdin="\n".join(lines) + "\n")

    return write(entries)


def make_experiment(root: Path, commit: str, name: str, files: dict[str, str]) -> None:
    """DVC experiment ``name`` of baseline ``commit``: a commit holding ``files`` at its ref."""
    made = git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit-tree", tree(root, files), "-p", commit,
               "-m", name)
    git(root, "update-ref", records.experiment_ref(commit, name), made)


def saved_sweep(root: Path, seeds: list[int], name: str = "eps") -> dict:
    """The state `debias sweep --name eps -S loss.epsilon=0,0.25 --seeds ... --upstream infer_groups` saves."""
    jobs = grid.grid(name, {"loss.epsilon": EPS}, seeds)
    merged = grid.check_grid(root, jobs, "infer_groups")
    state = {"name": name, "launcher": "local", "commit": git(root, "rev-parse", "HEAD"),
             "upstream_stage": "infer_groups", "jobs": [vars(j) for j in jobs],
             "options": {"jobs": 2, "tracking_uri": None, "mlflow_experiment": None, "dvc_remote": None},
             "phase1": grid.upstream_runs(root, jobs, merged, "infer_groups"), "launched": True}
    workspace.save_state(root, state)
    return state


def test_seeds_are_numbers_or_inclusive_ranges_each_once() -> None:
    assert grid.parse_seeds(["0-2", "5", "3,4", "1"]) == [0, 1, 2, 5, 3, 4]
    for bad in ("x", "5-2", "-1", "1.5"):
        with pytest.raises(grid.SweepError, match=r"expected whole numbers >= 0 or ranges FIRST-LAST"):
            grid.parse_seeds([bad])


def test_more_seeds_add_the_missing_seeds_of_every_setting_named_as_the_sweep_names_them() -> None:
    jobs = grid.grid("eps", {"loss.epsilon": EPS}, [0, 1, 2], {"erm.epochs": 2}, ["train_contrastive"])
    new = extend.extended_jobs(jobs, grid.parse_seeds(["0-5"]))
    assert [j.name for j in new] == [f"eps-epsilon{e}-seed{s}" for e in EPS for s in (3, 4, 5)]
    assert all(j.overrides["erm.epochs"] == 2 and j.targets == ["train_contrastive"] for j in new)
    assert [j.overrides["seed"] for j in new] == [3, 4, 5, 3, 4, 5]
    assert extend.extended_jobs(jobs, [0, 2]) == []  # seeds it has: nothing to add
    with pytest.raises(grid.SweepError, match="sets no seed: this sweep has no seed axis"):
        extend.extended_jobs([grid.Job("a", {"loss.epsilon": 0})], [1])


def test_adding_seeds_keeps_the_plans_runs_and_adds_only_the_new_seeds_upstream(repo: Path, capsys) -> None:
    state = saved_sweep(repo, [0, 1, 2])
    before = {u["key"]: u["name"] for u in state["phase1"]}
    assert len(before) == 3  # one per seed: the upstream reads the seed, not loss.epsilon
    new = command.add_seeds(repo, state, [0, 1, 2, 3, 4, 5])
    assert len(new) == 6 and len(state["jobs"]) == 12
    after = {u["key"]: u["name"] for u in state["phase1"]}
    assert {k: after[k] for k in before} == before and sorted(set(after.values()) - set(before.values())) == [
        "upstream-3", "upstream-4", "upstream-5"]
    assert workspace.load_state(repo, "eps")["jobs"] == state["jobs"]  # saved
    assert "6 new experiments (3 seed(s) x 2 setting(s)), 3 new shared upstream run(s)" in capsys.readouterr().out
    assert command.add_seeds(repo, state, [4]) == []


def test_looks_are_planned_up_to_max_and_another_plan_is_refused() -> None:
    assert extend.planned_looks(3, 3, 10) == [3, 6, 9, 10]
    assert extend.planned_looks(3, 3, 3) == [3] and extend.planned_looks(12, 3, 10) == [10]
    for maximum in (1, 2):  # compare gives no verdict below 3 seeds: neither does a look
        with pytest.raises(grid.SweepError, match=f"--until-decided {maximum}; allowed: 3 or more seeds .*"
                                                  "e.g. --until-decided 10"):
            extend.planned_looks(3, 3, maximum)
    assert extend.planned_looks(2, 2, 7) == [3, 5, 7]  # a 2-seed sweep's first look waits for the third seed
    plan = extend.Plan("s2_unbiased", 2.0, [3, 6, 9], 3)
    assert extend.check_plan(plan.as_state(), extend.Plan("s2_unbiased", 2, [3, 6, 9], 3)) == plan
    with pytest.raises(grid.SweepError, match=r"follows the sequential plan --until-decided 9 --margin 2.0 .*looks at "
                                              r"3, 6, 9 seeds, each test at alpha/3"):
        extend.check_plan(plan.as_state(), extend.Plan("s2_unbiased", 1.0, [3, 6, 9], 3))


def fake_runs(repo: Path, effect: dict[int, float], noise: float, seed: int = 0):
    """A stand-in for running the sweep's experiments: each job without a DVC experiment gets one whose stage-2
    headline holds 0.80 + its setting's effect (fraction) + seeded noise."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ran: list[str] = []

    def rerun(root: Path, state: dict, args, watch=None) -> int:
        done = workspace.finished_experiments(root, state["commit"])
        for job in state["jobs"]:
            if job["name"] not in done:
                value = 0.80 + effect[EPS.index(job["overrides"]["loss.epsilon"])] + noise * rng.normal()
                metrics = json.dumps({"s2_avg": 0.9, "s2_unbiased": round(value, 4), "s2_worst": 0.5})
                make_experiment(root, state["commit"], job["name"],
                                {"reports/metrics/train_contrastive.json": metrics})
                ran.append(job["name"])
        return 0

    return rerun, ran


def sequential_args(**given) -> argparse.Namespace:
    return argparse.Namespace(**{"until_decided": 12, "margin": 2.0, "metric": "s2_unbiased", "batch": None,
                                 "poll": 1, "wait": False, **given})


def run_until_decided(repo: Path, monkeypatch, effect: dict[int, float], noise: float, **given) -> tuple[int, list]:
    state = saved_sweep(repo, [0, 1, 2])
    rerun, ran = fake_runs(repo, effect, noise)
    rerun(repo, state, None)  # the finished 3-seed sweep
    ran.clear()
    monkeypatch.setattr(command, "rerun_unfinished", rerun)
    monkeypatch.setattr(command, "statuses", lambda root, state: {
        j["name"]: ("done" if j["name"] in workspace.finished_experiments(root, state["commit"]) else "failed", "")
        for j in state["jobs"]})
    return command.until_decided(repo, state, sequential_args(**given)), ran


def test_a_clear_difference_is_decided_at_the_first_look_without_new_seeds(repo: Path, monkeypatch, capsys) -> None:
    code, ran = run_until_decided(repo, monkeypatch, {0: 0.0, 1: 0.10}, 0.002)
    out = capsys.readouterr().out
    assert code == 0 and ran == []
    assert "looks at 3, 6, 9, 12 seeds, each test at alpha/4 = 0.0125 (Bonferroni" in out
    assert "look 1 of 4 at 3 seeds" in out and "s2_unbiased loss.epsilon=0.25 - loss.epsilon=0: +9.9" in out
    assert ": differs" in out and "decided at 3 seeds" in out


@pytest.mark.slow
def test_an_open_verdict_adds_batches_up_to_max_then_says_undecided(repo: Path, monkeypatch, capsys) -> None:
    code, ran = run_until_decided(repo, monkeypatch, {0: 0.0, 1: 0.0}, 0.05, until_decided=7, batch=2)
    out = capsys.readouterr().out
    assert code == 0
    assert sorted(ran) == sorted(f"eps-epsilon{e}-seed{s}" for e in EPS for s in (3, 4, 5, 6))  # 2 x 2 batches
    assert [line.split(" at ")[1].split(" seeds")[0] for line in out.splitlines() if "] look " in line] == [
        "3", "5", "7"]
    assert "undecided after 7 seeds" in out
    state = workspace.load_state(repo, "eps")
    assert sorted(state["sequential"]["seen"]) == ["3", "5", "7"] and state["sequential"]["looks"] == [3, 5, 7]
    with pytest.raises(grid.SweepError, match="follows the sequential plan --until-decided 7"):
        command.until_decided(repo, state, sequential_args(until_decided=9, batch=2))


def test_a_sweep_without_exactly_two_settings_or_a_margin_or_a_number_is_refused(repo: Path, monkeypatch) -> None:
    state = saved_sweep(repo, [0, 1])
    for margin in (None, 0.0, math.inf, math.nan, 100.0, 250.0):  # none, or one every accuracy difference is within
        with pytest.raises(grid.SweepError, match=r"needs --margin D > 0 \(got .*\), below 100 for an accuracy"):
            command.until_decided(repo, state, sequential_args(margin=margin))
    with pytest.raises(grid.SweepError, match="--metric 's2_unbiasd': not a headline metric"):
        command.until_decided(repo, state, sequential_args(metric="s2_unbiasd"))
    make_experiment(repo, state["commit"], "eps-epsilon0-seed0",
                    {"reports/metrics/train_contrastive.json": json.dumps({"s2_worst": "needs bias labels"})})
    with pytest.raises(grid.SweepError, match=r"eps-epsilon0-seed0: s2_worst is 'needs bias labels', not a number"):
        command.metric_values(repo, state, ["eps-epsilon0-seed0"], "s2_worst")
    three = saved_sweep(repo, [0], name="three")
    three["jobs"].append({"name": "three-x", "overrides": {"loss.epsilon": 0.5, "seed": 0}, "targets": []})
    with pytest.raises(grid.SweepError, match="compares two settings paired by seed; sweep 'three' has 3"):
        command.until_decided(repo, three, sequential_args())


# --------------------------------------------------------------------------- MLflow runs of restored stages


def record_in_cache(cache: Path, record: dict) -> str:
    """A run record stored in a DVC cache folder; its md5."""
    text = json.dumps(record)
    md5 = hashlib.md5(text.encode()).hexdigest()
    path = cache / "files" / "md5" / md5[:2] / md5[2:]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return md5


def lock_with(records_md5: dict[str, str], metrics: dict[str, str] | None = None) -> str:
    """A dvc.lock whose stages output their run records (md5s given) and, as DVC records them, ``metrics``'
    git-tracked files (path -> text)."""
    stages = {stage: {"outs": [{"path": f"reports/runs/{stage}.json", "md5": md5, "hash": "md5"},
                               {"path": "models/x.pt", "md5": "0" * 32, "hash": "md5"}]}
              for stage, md5 in records_md5.items()}
    for path, text in (metrics or {}).items():
        stages.setdefault(Path(path).stem, {"outs": []})["outs"].append(
            {"path": path, "md5": hashlib.md5(text.encode()).hexdigest(), "hash": "md5"})
    return yaml.safe_dump({"schema": "2.0", "stages": stages})


@pytest.mark.slow
def test_every_experiment_gets_its_mlflow_run_and_each_restored_stage_names_its_source(
        repo: Path, tmp_path: Path, monkeypatch, mlflow_template: Path) -> None:
    from mlflow.tracking import MlflowClient

    from tests.conftest import fresh_store

    store = fresh_store(mlflow_template, tmp_path)
    uri = f"sqlite:///{store}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    cache = tmp_path / "cache"
    monkeypatch.setattr(records, "cache_dir", lambda root: str(cache))
    client = MlflowClient(uri)
    state = saved_sweep(repo, [0])
    state["options"]["tracking_uri"] = uri
    experiment = client.create_experiment("debias", artifact_location=str(tmp_path / "artifacts"))
    # an earlier `dvc exp run` computed every stage of eps-epsilon0.25-seed0; eps-epsilon0-seed0 ran its last stage
    earlier = client.create_run(experiment, tags={"debias.kind": "pipeline", "debias.warnings": "w: one"}).info.run_id
    client.set_tag(earlier, "debias.warnings.train_erm", "w: one")
    sources = {}
    for stage in ("train_erm", "train_contrastive"):
        run = client.create_run(experiment, tags={"debias.stage": stage, "mlflow.parentRunId": earlier}).info.run_id
        client.log_param(run, "seed", "0")
        client.log_metric(run, "selected.val.avg", 0.7)
        (tmp_path / f"{stage}.json").write_text("{}")
        client.log_artifact(run, str(tmp_path / f"{stage}.json"), "outputs/reports/metrics")
        client.set_terminated(run)
        sources[stage] = run
    ran_here = client.create_run(experiment, tags={"debias.kind": "pipeline", "debias.dvc_experiment":
                                                   "eps-epsilon0-seed0"}).info.run_id
    own = client.create_run(experiment, tags={"debias.stage": "train_contrastive", "mlflow.parentRunId": ran_here})
    client.set_terminated(own.info.run_id)
    client.set_terminated(ran_here)
    metrics = json.dumps({"s2_unbiased": 0.8, "s2_worst": "needs bias labels"})
    restored = {stage: record_in_cache(cache, {"stage": stage, "run_id": run, "parent_run_id": earlier})
                for stage, run in sources.items()}
    make_experiment(repo, state["commit"], "eps-epsilon0.25-seed0", {
        "dvc.lock": lock_with(restored, {"reports/metrics/train_contrastive.json": metrics}), "params.yaml": committed_text("params.yaml").replace(
            "epsilon: 0.0", "epsilon: 0.25"), "reports/metrics/train_contrastive.json": metrics})
    mixed = {"train_erm": restored["train_erm"], "train_contrastive": record_in_cache(cache, {
        "stage": "train_contrastive", "run_id": own.info.run_id, "parent_run_id": ran_here})}
    erm = {"reports/metrics/train_erm.json": json.dumps({"erm_avg": 0.5})}
    make_experiment(repo, state["commit"], "eps-epsilon0-seed0", {"dvc.lock": lock_with(mixed, erm), **erm,
                                                                  "params.yaml": committed_text("params.yaml")})

    lines = records.record_restored(repo, state, ["eps-epsilon0-seed0", "eps-epsilon0.25-seed0"])
    assert lines == [
        "eps-epsilon0-seed0: 1 restored stage run(s) recorded in MLflow (train_erm), each tagged debias.restored_from "
        "with the run that computed it",
        "eps-epsilon0.25-seed0: its MLflow run (every stage restored) and 2 restored stage run(s) recorded in MLflow "
        "(train_contrastive, train_erm), each tagged debias.restored_from with the run that computed it"]  # lock order
    parents = {r.data.tags["debias.dvc_experiment"]: r for r in client.search_runs(
        [experiment], filter_string="tags.`debias.kind` = 'pipeline'") if "debias.dvc_experiment" in r.data.tags}
    assert sorted(parents) == ["eps-epsilon0-seed0", "eps-epsilon0.25-seed0"]  # one per experiment
    partial = parents["eps-epsilon0-seed0"]  # its restored stage's metrics and warnings, as if it had run there
    assert partial.info.run_id == ran_here and partial.data.metrics == {"erm_avg": 0.5}
    assert partial.data.tags["debias.warnings.train_erm"] == "w: one"
    made = parents["eps-epsilon0.25-seed0"]
    assert made.info.status == "FINISHED" and made.data.metrics == {"s2_unbiased": 0.8}
    assert made.data.tags["debias.warnings"] == "w: one" and "loss.epsilon=0.25" in made.data.tags["mlflow.runName"]
    assert made.data.params["loss.epsilon"] == "0.25" and "DVC restored every stage" in made.data.tags["debias.restored"]
    for name, parent in parents.items():
        children = client.search_runs([experiment], filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'")
        tagged = {r.data.tags["debias.stage"]: r for r in children if "debias.restored_from" in r.data.tags}
        expected = ["train_contrastive", "train_erm"] if name == "eps-epsilon0.25-seed0" else ["train_erm"]
        assert sorted(tagged) == expected
        for stage, child in tagged.items():
            assert child.data.tags["debias.restored_from"] == sources[stage] and child.info.status == "FINISHED"
            assert child.data.params == {"seed": "0"} and child.data.metrics == {"selected.val.avg": 0.7}
            assert [a.path for a in client.list_artifacts(child.info.run_id, "outputs/reports/metrics")] == [
                f"outputs/reports/metrics/{stage}.json"]  # what compare --source mlflow reads
    assert records.record_restored(repo, state, ["eps-epsilon0-seed0", "eps-epsilon0.25-seed0"]) == []  # once


def test_a_record_missing_from_every_cache_is_said_not_fatal(repo: Path, tmp_path: Path, monkeypatch,
                                                              mlflow_template: Path) -> None:
    from tests.conftest import fresh_store

    uri = f"sqlite:///{fresh_store(mlflow_template, tmp_path)}"
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    monkeypatch.setattr(records, "cache_dir", lambda root: str(tmp_path / "empty"))
    state = saved_sweep(repo, [0])
    state["options"]["tracking_uri"] = uri
    make_experiment(repo, state["commit"], "eps-epsilon0-seed0", {"dvc.lock": lock_with({"train_erm": "ab" * 16})})
    (line,) = records.record_restored(repo, state, ["eps-epsilon0-seed0"])
    assert line.startswith("WARNING eps-epsilon0-seed0: the run records of train_erm are in no DVC cache here")
    monkeypatch.setenv("DEBIAS_TRACKING", "off")
    assert records.record_restored(repo, state, ["eps-epsilon0-seed0"]) == []
