"""benchmarks/quality.py: its plan and its ``-S`` arguments are what the DVC queue runs, so they are checked
offline here (every experiment's params pass the schema; ``-S`` values parse back to the planned ones)."""

from __future__ import annotations

import pytest
import yaml

from benchmarks import dvc_queue, pages, quality
from debias.core.trees import flatten, merge
from debias.schema import validate
from tests.conftest import REPO, committed_text
CONFIG = yaml.safe_load((REPO / "benchmarks" / "quality.yaml").read_text())


def _plan(seeds=(0, 1, 2), forced=None):
    return dvc_queue.plan(CONFIG, list(CONFIG["settings"]), list(seeds), list(CONFIG["methods"]), forced)


@pytest.mark.slow
def test_plan_is_seed_major_with_each_upstream_before_its_methods() -> None:
    jobs = _plan()
    per_seed = len(CONFIG["settings"]) * (1 + len(CONFIG["methods"]))
    assert len(jobs) == 3 * per_seed == 156
    assert [job["seed"] for job in jobs] == [s for s in (0, 1, 2) for _ in range(per_seed)]
    assert len({job["name"] for job in jobs}) == len(jobs)
    seen_upstream = set()
    for job in jobs:
        key = (job["setting"], job["seed"])
        if job["method"] == dvc_queue.UPSTREAM:
            seen_upstream.add(key)
            assert job["targets"] == ["infer_groups"]
        else:
            assert key in seen_upstream, job["name"]
            assert job["targets"] == CONFIG["methods"][job["method"]].get("targets", ["linear_probe", "evaluate"])
            assert not set(dvc_queue.JOB_KEYS) & set(job["overrides"])  # never passed to dvc as params


def test_every_planned_experiment_passes_the_params_schema() -> None:
    base_params = yaml.safe_load(committed_text("params.yaml"))
    base = merge(base_params, merge(CONFIG["base"], {"data": {"path": "mnist10k.npz"}}))
    for job in _plan(seeds=(0,)):
        params = validate(merge(base, job["overrides"]))
        assert params.seed == 0
        if job["method"] not in (dvc_queue.UPSTREAM, "erm"):
            assert params.stage2.method == CONFIG["methods"][job["method"]]["stage2"]["method"]
    assert set(CONFIG["labels"]) == {"erm", *CONFIG["methods"]}


def test_set_param_args_parse_back_to_the_planned_values() -> None:
    overrides = {"groups": {"method": "true"}, "probe": {"c_grid": [0.01, 1.0]}, "stage2": {"lr": 0.001,
                 "cnc": {"anchor_fraction": 0.25}}, "bias": {"protocol": "background"}}
    args = dvc_queue.set_param_args(overrides)
    assert args[::2] == ["-S"] * 5
    parsed = {}
    for item in args[1::2]:
        key, _, text = item.partition("=")
        parsed[key] = yaml.safe_load(text)
    assert parsed == flatten(overrides)
    assert isinstance(parsed["groups.method"], str)  # "true" the group source, not the boolean


def test_a_value_longer_than_a_yaml_line_stays_on_one_line() -> None:
    """yaml.safe_dump wraps at 80 characters by default; DVC's -S parser rejects the newline."""
    palette = [[255, 0, 0], [0, 255, 0], [0, 0, 255], [225, 225, 0], [225, 0, 225], [0, 255, 255], [255, 128, 0],
               [255, 0, 128], [128, 0, 255], [128, 128, 128]]
    (argument,) = dvc_queue.set_param_args({"bias": {"background": {"colours": palette}}})[1::2]
    assert "\n" not in argument and len(argument) > 80
    assert yaml.safe_load(argument.partition("=")[2]) == palette


def test_forced_overrides_win_over_setting_and_method() -> None:
    jobs = _plan(seeds=(1,), forced={"stage2": {"epochs": 1}, "seed": 7})
    assert all(job["overrides"]["seed"] == 7 for job in jobs)
    assert all(job["overrides"]["stage2"]["epochs"] == 1 for job in jobs if job["method"] != dvc_queue.UPSTREAM)


def test_markdown_reports_mean_and_sample_std_over_seeds_in_percent() -> None:
    rows = [{"setting": "cmnist_096", "seed": s, "method": "erm", "n_train": 100, "n_conflicting": 4,
             "test_avg": a, "test_unbiased": a, "test_worst_group": 0.0, "alignment_loss": 1.0, "mi_a": 0.5,
             "train_seconds": 10.0, "experiment_seconds": 20.0} for s, a in ((0, 0.2), (1, 0.3), (2, 0.4))]
    table = quality.markdown(rows, CONFIG, ["cmnist_096"], [])
    line = next(line for line in table.splitlines() if line.startswith("| cmnist_096 | ERM |"))
    assert "| 30.0 ± 10.0 |" in line and "| 1.000 ± 0.000 |" in line and "| 3 |" in line
    assert "cmnist_096: 4 of 100" in table
    assert pages.mean_std([0.5], 100) == "50.0" and pages.mean_std([None]) == "–"


def test_rows_carry_their_stages_warnings_and_degenerate_selections_are_flagged() -> None:
    base = {"setting": "cmnist_096", "n_train": 100, "n_conflicting": 4, "test_avg": 0.5, "test_unbiased": 0.5,
            "test_worst_group": 0.0, "alignment_loss": 1.0, "mi_a": 0.5, "train_seconds": 1.0, "experiment_seconds": 2.0}
    rows = [{**base, "seed": s, "method": m, "experiment": f"{m}-{s}"} for m in ("erm", "supcon") for s in (0, 1)]
    warnings = {"supcon-0": {"train_contrastive": ["degenerate-selection"], "train_erm": ["chance-level"]},
                "erm-1": {"train_erm": ["chance-level"], "train_contrastive": ["degenerate-selection"]}}
    rows = quality.add_warnings(rows, warnings)
    assert [r["warnings"] for r in rows] == ["", "chance-level", "degenerate-selection", ""]  # each row's own stage
    table = quality.markdown(rows, CONFIG, ["cmnist_096"], ["supcon"])
    assert "| SupCon ⚠ degenerate-selection in 1 of 2 seeds |" in table
    assert "| ERM ⚠ chance-level in 1 of 2 seeds |" in table  # every code is flagged, not only degenerate selection
    assert "*chance-level*: accuracy no better than" in table and "*degenerate-selection*: " in table


def test_unknown_method_is_refused_before_any_work(tmp_path, capsys) -> None:
    npz = tmp_path / "x.npz"
    npz.write_bytes(b"")
    with pytest.raises(SystemExit):
        quality.main(["--npz", str(npz), "--methods", "nope", "--workdir", str(tmp_path / "w")])
    assert "unknown settings/methods ['nope']" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()
    with pytest.raises(SystemExit):  # a --set without '=' would silently set the key to None
        quality.main(["--npz", str(npz), "--set", "stage2.epochs", "--workdir", str(tmp_path / "w")])
    assert "--set 'stage2.epochs': expected KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_set_overrides_parse_as_yaml_into_nested_keys() -> None:
    assert dvc_queue.parse_sets(["stage2.epochs=1", "stage2.lff.q=0.4", "groups.method=true", "x=[1, 2]"]) == {
        "stage2": {"epochs": 1, "lff": {"q": 0.4}}, "groups": {"method": True}, "x": [1, 2]}
    with pytest.raises(ValueError, match="expected KEY=VALUE"):
        dvc_queue.parse_sets(["=3"])


@pytest.mark.slow
@pytest.mark.parametrize("profile", [None, "cpu"])
def test_fullsize_profiles_plan_experiments_that_pass_the_params_schema(profile) -> None:
    config = dvc_queue.apply_profile(yaml.safe_load((REPO / "benchmarks" / "fullsize.yaml").read_text()), profile)
    base = merge(yaml.safe_load(committed_text("params.yaml")), config["base"])
    jobs = dvc_queue.plan(config, list(config["settings"]), [0], list(config["methods"]))
    for job in jobs:  # the FairKL rows carry the released objective (presets), which the schema may not take yet
        params = validate(merge(base, job["overrides"]))
        assert params.data.source == "fashion_mnist" and params.data.mnist_val_size == 6000
    cnc = validate(merge(base, next(j for j in jobs if j["method"] == "cnc")["overrides"])).stage2
    fairkl_job = next(j for j in jobs if j["method"] == "eps_supinfonce_fairkl_true" and j["setting"] == "bmnist_0997")
    assert fairkl_job["overrides"]["loss"]["fairkl"]["variant"] == "released"
    assert fairkl_job["overrides"]["bias"]["background"]["rho"] == 0.997  # the setting's preset
    fairkl = validate(merge(base, fairkl_job["overrides"])).stage2
    if profile is None:  # the papers' protocols: CNC Alg. 3 epochs with SGD and 32-batch steps, FairKL 80 epochs
        assert (cnc.cnc.anchor_fraction, cnc.cnc.accumulation, cnc.optimizer, cnc.epochs) == (1.0, 32, "sgd", 3)
        assert (fairkl.epochs, fairkl.lr_milestones) == (80, [26, 53])
    else:  # cut, and only what the profile names
        assert (cnc.cnc.anchor_fraction, cnc.cnc.accumulation, cnc.optimizer, cnc.epochs) == (0.1, 1, "adam", 1)
        assert (fairkl.epochs, fairkl.lr_milestones, fairkl.lr) == (5, [], 0.001)
        assert cnc.cnc.temperature == 0.05 and cnc.cnc.num_positives == 32


def test_profile_and_data_arguments_are_checked_before_any_work(tmp_path, capsys) -> None:
    (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(b"")  # 1 of the 4 idx files
    for argv, message in ((["--raw", str(tmp_path / "none")], "--raw"), (["--profile", "gpu"], "--profile gpu"),
                          (["--raw", str(tmp_path)], "not a folder holding train-images-idx3-ubyte"),
                          ([], "give --npz"), (["--npz", "a.npz", "--raw", str(tmp_path)], "not allowed with")):
        with pytest.raises(SystemExit):
            quality.main([*argv, "--config", str(REPO / "benchmarks" / "fullsize.yaml"), "--workdir", str(tmp_path / "w")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_rows_read_back_from_csv_files_let_a_rerun_replace_its_row(tmp_path) -> None:
    fields = ["setting", "seed", "method", "n_train", "test_avg", "warnings"]
    for name, rows in (("a.csv", [["s", 0, "erm", 10, 0.2, ""], ["s", 0, "jtt", 10, 0.5, "degenerate-selection"]]),
                       ("b.csv", [["s", 0, "jtt", 10, 0.9, ""], ["s", 1, "jtt", 10, 0.7, ""]])):
        (tmp_path / name).write_text("\n".join(",".join(map(str, r)) for r in [fields, *rows]) + "\n")
    rows = quality.read_rows([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")])
    assert [(r["method"], r["seed"], r["test_avg"], r["warnings"]) for r in rows] == [
        ("erm", 0, 0.2, None), ("jtt", 0, 0.9, None), ("jtt", 1, 0.7, None)]


def test_raw_files_are_linked_gz_or_not_and_a_missing_one_is_named(tmp_path) -> None:
    raw = tmp_path / "raw"
    raw.mkdir()
    for i, name in enumerate(dvc_queue.RAW_FILES):
        (raw / (name + (".gz" if i % 2 else ""))).write_bytes(bytes([i]))
    clone = tmp_path / "clone"
    dvc_queue.link_raw_files(clone, raw)
    linked = clone / "data" / "raw" / "fashion_mnist" / "FashionMNIST" / "raw"
    assert sorted(p.name for p in linked.iterdir()) == sorted(p.name for p in raw.iterdir())
    assert (linked / "train-labels-idx1-ubyte.gz").read_bytes() == bytes([1])
    (raw / "t10k-labels-idx1-ubyte.gz").unlink()
    assert dvc_queue.missing_raw_files(raw) == ["t10k-labels-idx1-ubyte"]
    with pytest.raises(SystemExit, match="lacks t10k-labels-idx1-ubyte"):
        dvc_queue.link_raw_files(tmp_path / "other", raw)


def test_the_grid_written_as_a_sweep_file_passes_debias_sweeps_checks(tmp_path) -> None:
    """``--sweep-file``: the quality grid as ``debias sweep --file`` runs it on a cluster (names, targets, params)."""
    from debias.tools.sweep import grid

    root = tmp_path / "repo"
    root.mkdir()
    (root / "params.yaml").write_text(committed_text("params.yaml"))
    (root / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    npz = tmp_path / "mnist10k.npz"
    npz.write_bytes(b"")
    out = tmp_path / "grid.yaml"
    assert quality.main(["--npz", str(npz), "--seeds", "0", "--settings", "cmnist_096", "--sweep-file", str(out)]) == 0
    name, jobs, upstream = grid.jobs_from_file(out, "x")
    planned = _plan(seeds=(0,))
    planned = [j for j in planned if j["setting"] == "cmnist_096"]
    assert (name, upstream) == ("grid", "infer_groups")
    assert [j.name for j in jobs] == [j["name"] for j in planned]
    assert [j.targets for j in jobs] == [j["targets"] for j in planned]
    merged = grid.check_grid(root, jobs, upstream)
    assert all(m["data"]["path"] == str(npz.resolve()) for m in merged)
    assert all(m["seed"] == 0 for m in merged)


def test_upstream_only_plans_each_setting_and_seeds_upstream_and_nothing_else(tmp_path) -> None:
    """``--upstream-only``: only the (setting, seed) upstreams (their ERM rows), none of the methods."""
    npz = tmp_path / "mnist10k.npz"
    npz.write_bytes(b"")
    out = tmp_path / "grid.yaml"
    assert quality.main(["--npz", str(npz), "--seeds", "0", "1", "--settings", "cmnist_096", "--upstream-only",
                         "--sweep-file", str(out)]) == 0
    names = [e["name"] for e in yaml.safe_load(out.read_text())["experiments"]]
    assert names == ["cmnist-096-s0-upstream", "cmnist-096-s1-upstream"]


def test_an_experiments_timeline_splits_into_dvc_before_between_after_and_its_stage_commands(tmp_path) -> None:
    """benchmarks/overhead.py: the hook's lines per process -> per ``dvc exp exec-run``, DVC's time before its first
    stage command, between them and after its last; processes of another parent and unfinished ones are left out."""
    from benchmarks.overhead import TIMELINE_HOOK, experiment_split, read_timeline

    assert "DEBIAS_SIDE_CHANNEL" in TIMELINE_HOOK  # the stages accept the hook, saying it changes no result
    lines = ["start 100.0 10 1 dvc exp exec-run --infofile x",
             "start 101.5 11 10 -m --single pipeline/source.py", "exit 102.0 11 10 -m --single pipeline/source.py",
             "start 103.0 12 10 -m pipeline/train_contrastive.py", "exit 110.0 12 10 -m pipeline/train_contrastive.py",
             "start 104.0 13 99 -m --single pipeline/evaluate.py", "exit 105.0 13 99 -m --single pipeline/evaluate.py",
             "exit 112.5 10 1 dvc exp exec-run --infofile x",
             "start 120.0 20 1 dvc exp exec-run --infofile y"]  # still running: no exit
    timeline = tmp_path / "timeline.txt"
    timeline.write_text("\n".join(lines) + "\n")
    processes = read_timeline(timeline)
    assert processes[10] == {"ppid": 1, "argv": "dvc exp exec-run --infofile x", "start": 100.0, "exit": 112.5}
    (split,) = experiment_split(processes)
    assert split["commands"] == {"source": 0.5, "train_contrastive": 7.0}
    assert (split["wall_s"], split["before_s"], split["after_s"]) == (12.5, 1.5, 2.5)
    assert split["between_s"] == pytest.approx(1.0)  # 12.5 - 1.5 - 2.5 - 7.5
