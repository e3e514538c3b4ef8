"""debias compare on synthetic experiments (fast): selection and filters, grouping by everything but the seed
(mean ± sample std, seed count), the Welch test, the terminal table's width, the self-contained page, the
headline files and DVC's `exp show --json` as parsed. The real thing runs in tests/test_pipeline.py."""

from __future__ import annotations

import base64
import json
import math
from pathlib import Path

import pandas as pd
import pytest

from debias.metrics.paired import welch
from debias.core import headline
from debias.tools.compare.collect import CURVE_FILES, GROUP_FILES, Experiment, parse_exp_show
from debias.tools.compare import data as compare_data, page as compare_page, terminal as compare_terminal

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def metrics(worst: float, shift: float = 0.0) -> dict[str, float]:
    values = {key: 0.5 + shift for key in compare_data.METRIC_KEYS}
    values.update(s2_worst=worst, align_s2=0.4 + shift, mi_a_s2=1.2 + shift)
    return values


def files(worst: float) -> dict[str, str]:
    table = {"test": {"per_group": [[worst, 0.9], [0.8, None]], "group_counts": [[5, 1], [2, 0]]}}
    curves = "epoch,train/loss,val/avg,val/worst_group\n0,1.0,0.5,0.1\n1,0.8,0.6,0.2\n"
    return {str(GROUP_FILES["stage2"]): json.dumps(table), str(GROUP_FILES["erm"]): json.dumps(table),
            str(CURVE_FILES["stage2"]): curves, str(CURVE_FILES["erm"]): curves,
            "data/biased/summary.json": json.dumps({"splits": {"train": {"group_counts": [[9, 1], [1, 9]]}}}),
            str(headline.DETAILED["train_erm"]): json.dumps(
                {"warnings": ["degenerate-selection: every epoch has worst-group 0"] if worst < 0.55 else [],
                 "selection": {"rule": "last", "selected_epoch": 1, "degenerate": worst < 0.55, "reason": None}})}


def experiment(name: str, seed: int, method: str, worst: float, when: str, kind: str = "experiment",
               epsilon: float = 0.25) -> Experiment:
    found = files(worst)
    return Experiment(name, kind, {"seed": seed, "stage2.method": method, "loss.epsilon": epsilon,
                                   "probe.c_grid": "[0.1, 1.0]"}, metrics(worst), rev=f"rev-{name}",
                      timestamp=f"2026-11-23T10:{when}:00", reader=lambda path: found.get(str(path)))


@pytest.fixture
def sweep() -> list[Experiment]:
    """Three seeds of cnc, one eps_supinfonce, and the workspace holding seed2's results again."""
    runs = [experiment("cnc-s0", 0, "cnc", 0.5, "01"), experiment("cnc-s1", 1, "cnc", 0.6, "02"),
            experiment("cnc-s2", 2, "cnc", 0.7, "03"), experiment("eps", 0, "eps_supinfonce", 0.3, "04")]
    workspace = experiment("workspace", 2, "cnc", 0.7, "03", kind="workspace")
    workspace.metrics["bias_n"] = 240  # a key cnc-s2's files lack (written by a newer version): still the same run
    queued = Experiment("q9", "experiment", {"seed": 9}, {}, status="queued")
    running = experiment("r7", 7, "cnc", 0.9, "05")  # a running experiment shows its baseline's metrics
    running.status = "running"
    return [workspace, *runs, queued, running]


def test_duplicates_go_queued_are_left_out_and_filters_choose(sweep) -> None:
    chosen = compare_data.select(sweep)
    assert [e.name for e in chosen] == ["cnc-s0", "cnc-s1", "cnc-s2", "eps"]  # workspace = cnc-s2, q9 and r7 unfinished
    assert [e.name for e in compare_data.select(sweep, method="cnc")] == ["cnc-s0", "cnc-s1", "cnc-s2"]
    assert [e.name for e in compare_data.select(sweep, param_filters=["seed=0"])] == ["cnc-s0", "eps"]
    assert [e.name for e in compare_data.select(sweep, param_filters=["probe.c_grid=[0.1, 1.0]", "loss.epsilon=0.25"],
                                           last=2)] == ["cnc-s2", "eps"]
    assert compare_data.select(sweep, param_filters=["loss.epsilon=0.5"]) == []
    with pytest.raises(ValueError, match="expected key=value"):
        compare_data.select(sweep, param_filters=["seed"])
    assert compare_data.varying_params(compare_data.select(sweep)) == ["seed", "stage2.method"]


def test_groups_by_everything_but_the_seed_with_mean_std_and_seed_count(sweep) -> None:
    comparison = compare_data.build_comparison(compare_data.select(sweep), sweep)
    assert comparison.group_params == ["stage2.method"]
    groups = comparison.groups.set_index("stage2.method")
    assert list(groups.index) == ["cnc", "eps_supinfonce"]  # ranked by stage-2 worst-group, best first
    assert groups.loc["cnc", "seeds"] == 3 and groups.loc["eps_supinfonce", "seeds"] == 1
    assert groups.loc["cnc", "s2_worst_mean"] == pytest.approx(0.6)
    assert groups.loc["cnc", "s2_worst_std"] == pytest.approx(0.1)  # sample std (ddof 1)
    assert math.isnan(groups.loc["eps_supinfonce", "s2_worst_std"])
    assert groups.loc["cnc", "experiments"] == "cnc-s0, cnc-s1, cnc-s2"
    [difference] = comparison.differences
    assert difference.rank.difference == pytest.approx(-30.0) and difference.rank.p is None  # one eps seed: no test
    assert [e.name for e in comparison.without_results] == ["q9", "r7"]


def test_welch_p_value_says_whether_seeds_explain_a_difference() -> None:
    assert welch([0.5, 0.6, 0.7], [0.1, 0.2, 0.15]) == pytest.approx(0.0064576, rel=1e-4)  # scipy's ttest_ind
    assert welch([0.5, 0.6, 0.7], [0.55, 0.65, 0.6]) > 0.5
    assert welch([0.5], [0.1, 0.2]) is None


def test_terminal_table_is_at_most_160_characters_and_shows_mean_and_std(sweep) -> None:
    narrow = compare_terminal.terminal_text(compare_data.build_comparison(compare_data.select(sweep), sweep))
    assert max(map(len, narrow.splitlines())) <= 160 and "not shown here" not in narrow
    assert "60.0±10.0" in narrow and "   30.0" in narrow  # cnc's mean±std over 3 seeds; one eps seed: its value
    assert "the same in every experiment: ERM avg 50.0" in narrow  # constant columns leave the table
    assert "not finished or without results: queued: q9; running: r7" in narrow
    runs = compare_data.select(sweep)
    for i, run in enumerate(runs):  # long names, params and differing metrics: the table must still fit
        run.name = f"an-experiment-with-a-very-long-generated-name-{i}"
        run.params["data.imagefolder.attribute_column"] = f"a_long_column_name_{run.params['stage2.method']}" * 2
        run.metrics = {key: value + 0.01 * i for key, value in run.metrics.items()}
    text = compare_terminal.terminal_text(compare_data.build_comparison(runs, sweep))
    assert max(map(len, text.splitlines())) <= 160
    assert "an-experiment-with-a-ve…" in text and "not shown here for width (see the page): ERM probe avg" in text
    assert "61.0±11.0" in text  # the stage-2 worst-group column is never the one dropped


@pytest.mark.slow
def test_the_page_is_self_contained_with_every_figure(sweep, tmp_path: Path) -> None:
    comparison = compare_data.build_comparison(compare_data.select(sweep), sweep)
    for run in comparison.experiments:
        run.load_notes()
    written = compare_page.write_page(comparison, tmp_path / "page")
    page = written["html"].read_text(encoding="utf-8")
    images = [src for src in page.split('src="')[1:]]
    assert len(images) == 3  # groups summary, per-group heatmaps (4 runs: one row), validation curves
    for src in images:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1].split('"', 1)[0])[:8] == PNG_MAGIC
    assert "<script" not in page and "http" not in page.replace("http-equiv", "")
    for title in ("Summary", "Warnings", "Grouped by everything but the seed", "Experiments", "Per-group accuracy",
                  "Validation curves"):
        assert f"<h2>{title}</h2>" in page
    assert "degenerate-selection" in page  # cnc-s0 and eps warn
    frame = pd.read_csv(written["experiments"])
    assert list(frame["experiment"]) == ["cnc-s0", "cnc-s1", "cnc-s2", "eps"]
    assert pd.read_csv(written["groups"])["seeds"].tolist() == [3, 1]


def test_parse_exp_show_json() -> None:
    """The layout of `dvc exp show --json` (DVC 3): the workspace, the baseline and its experiments."""
    def data(worst: float | None) -> dict:
        metrics = {} if worst is None else {"reports/metrics/train_contrastive.json": {"data": {"s2_worst": worst}},
                                            "reports/metrics/erm.json": {"data": {"test": {"avg": 0.1}}}}
        return {"rev": "x", "timestamp": "2026-11-23T10:00:00", "metrics": metrics,
                "params": {"params.yaml": {"data": {"seed": 0, "loss": {"epsilon": 0.25}, "probe": {"c_grid": [1]}}}}}

    shown = [
        {"rev": "workspace", "name": None, "data": data(0.5), "error": None, "experiments": None},
        {"rev": "abc123", "name": "main", "data": data(None), "error": None, "experiments": [
            {"name": "seed1", "revs": [{"rev": "def456", "name": "seed1", "data": data(0.7), "error": None,
                                        "experiments": None}]},
            {"name": "q", "executor": {"state": "queued", "name": "dvc-task", "local": None},
             "revs": [{"rev": "aaa111", "name": "q", "data": data(None), "error": None, "experiments": None}]}]}]
    found = parse_exp_show(shown)
    assert [(e.name, e.kind, e.status) for e in found] == [
        ("workspace", "workspace", "done"), ("main", "baseline", "no results"), ("seed1", "experiment", "done"),
        ("q", "experiment", "queued")]
    assert found[2].metrics == {"s2_worst": 0.7}  # headline files only
    assert found[2].params == {"seed": 0, "loss.epsilon": 0.25, "probe.c_grid": "[1]"}
    assert found[2].rev == "def456"


def test_headline_files_hold_the_flat_rounded_scalars_and_skip_what_is_missing(tmp_path: Path) -> None:
    accuracy = {"avg": 0.123456, "unbiased": 0.2, "worst_group": 0.0, "aligned": 0.9}
    assert headline.headline("train_erm", {"test": accuracy}) == {"erm_avg": 0.1235, "erm_unbiased": 0.2, "erm_worst": 0.0}
    probe = {"erm": {"trained": True, "probe": {"test": accuracy}}, "stage2": {"trained": False}}
    assert set(headline.headline("linear_probe", probe)) == {"probe_erm_avg", "probe_erm_unbiased", "probe_erm_worst"}
    representation = {"erm": {"trained": True, "test": {"alignment_loss": 12.5, "mi_a": float("nan")}}}
    assert headline.headline("evaluate", representation) == {"align_erm": 12.5}
    assert set(headline.LABELS) >= set(compare_data.METRIC_KEYS)
    keys = [k for stage in headline.STAGES for k in headline.EXTRACT[stage]({})]
    assert len(keys) == len(set(keys)) and not any("." in k for k in keys)  # unique, flat: short dvc exp show columns
    (tmp_path / headline.DETAILED["train_erm"]).parent.mkdir(parents=True)
    (tmp_path / headline.DETAILED["train_erm"]).write_text(json.dumps(
        {"test": accuracy, "warnings": ["degenerate-selection: ties"], "selection": {"rule": "last"}}))
    assert headline.write_headline("train_erm", tmp_path) == {"erm_avg": 0.1235, "erm_unbiased": 0.2, "erm_worst": 0.0}
    assert json.loads((tmp_path / "reports/metrics/train_erm.json").read_text())["erm_avg"] == 0.1235
    assert headline.write_headline("train_contrastive", tmp_path) is None  # its detailed file is missing
    assert headline.local_warnings(tmp_path) == {"train_erm": ["degenerate-selection: ties"]}
    assert headline.warnings_summary(headline.local_warnings(tmp_path)) == "1 warning: degenerate-selection (train_erm)"
    assert headline.upstream_stages("linear_probe")[-1] == "linear_probe" and headline.upstream_stages("download") == ()


# --------------------------------------------------------------------------- second round (issue 23)


def _page(sweep: list[Experiment]) -> compare_data.Comparison:
    return compare_data.build_comparison(compare_data.select(sweep), sweep)


@pytest.mark.slow
def test_out_replaces_only_what_compare_wrote_there(sweep, tmp_path: Path) -> None:
    """A user's own figure in --out/figures survives; a figure an earlier comparison wrote and this one does not is
    removed; a file of the page's names that compare did not write (a pipeline report's index.html) is refused."""
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    (out / "figures" / "my_plot.png").write_bytes(b"mine")
    (out / "notes.md").write_text("mine")
    compare_page.write_page(_page(sweep), out)
    assert (out / "figures" / "my_plot.png").read_bytes() == b"mine" and (out / "notes.md").read_text() == "mine"
    listed = json.loads((out / compare_page.MANIFEST).read_text())["files"]
    assert "figures/my_plot.png" not in listed and "index.html" in listed and "figures/per_group_1.png" in listed
    (out / "figures" / "per_group_2.png").write_bytes(b"an older comparison's")  # as if it had drawn 5+ runs
    (out / compare_page.MANIFEST).write_text(json.dumps({"files": [*listed, "figures/per_group_2.png"]}))
    compare_page.write_page(_page(sweep), out)
    assert not (out / "figures" / "per_group_2.png").exists() and (out / "figures" / "my_plot.png").exists()

    reports = tmp_path / "reports"  # a pipeline's reports/: its own index.html and figures
    (reports / "figures").mkdir(parents=True)
    (reports / "index.html").write_text("the pipeline's report")
    (reports / "figures" / "per_group.png").write_bytes(b"pipeline")
    with pytest.raises(ValueError, match=r"--out .*reports holds index.html, which debias compare did not write"):
        compare_page.write_page(_page(sweep), reports)
    assert (reports / "index.html").read_text() == "the pipeline's report"
    assert sorted(p.name for p in reports.rglob("*")) == ["figures", "index.html", "per_group.png"]


def test_out_that_is_a_file_or_unwritable_is_one_line(tmp_path: Path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    (tmp_path / "a_file").write_text("x")
    assert cli_main(["compare", "--out", str(tmp_path / "a_file"), "--no-mlflow"]) == 2
    started, error = capsys.readouterr().err.split("\n", 1)  # its first line comes before any import
    assert started.startswith("[compare] starting")
    assert error == f"debias compare: --out {tmp_path / 'a_file'} is a file; allowed: a folder (new, or one debias compare wrote)\n"
    assert cli_main(["compare", "--out", str(tmp_path / "a_file" / "sub"), "--no-mlflow"]) == 2
    assert "cannot write there (Not a directory)" in capsys.readouterr().err
    for args, message in ((["--last", "-2"], "--last -2; allowed: a whole number >= 1"),
                          (["--last", "0"], "--last 0; allowed"), (["--width", "0"], "--width 0; allowed: 40 or more")):
        assert cli_main(["compare", *args, "--out", str(tmp_path / "ok"), "--no-mlflow"]) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "ok").exists()  # refused before anything was written


@pytest.mark.slow
def test_out_on_a_read_only_folder_is_one_line(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.faults.conftest import stage_env
    from tests.faults.test_actionable_faults import _namespaces_work

    if not _namespaces_work():
        pytest.skip("unprivileged user namespaces are unavailable (a read-only bind mount needs one)")
    out = tmp_path / "ro"
    out.mkdir()
    done = subprocess.run(["unshare", "--user", "--map-root-user", "--mount", "sh", "-c",
                           f"mount --bind {out} {out} && mount -o remount,bind,ro {out} && exec {sys.executable} -m "
                           f"debias.tools.cli compare --out {out} --no-mlflow"], capture_output=True, text=True,
                          env=stage_env(), timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    started, error = done.stderr.strip().split("\n", 1)  # its first line comes before any import
    assert started.startswith("[compare] starting")
    assert error == f"debias compare: --out {out}: cannot write there (Read-only file system); choose a writable folder"


@pytest.mark.parametrize("methods", [["cnc", "eps_supinfonce"], ["cnc"]])
def test_one_seed_per_setting_is_said_in_the_terminal_to_answer_nothing(methods: list[str]) -> None:
    """One seed of each setting (or a single run): the terminal says one seed cannot answer, and draws no verdict;
    with three seeds of a setting it does not."""
    runs = [experiment(f"{method}-s0", 0, method, 0.5 + 0.1 * i, f"0{i}") for i, method in enumerate(methods)]
    text = " ".join(compare_terminal.terminal_text(compare_data.build_comparison(compare_data.select(runs), runs))
                    .split())
    what = "whether these settings differ" if len(methods) > 1 else "whether stage 2's gain over ERM holds"
    assert f"note: one seed cannot answer {what}" in text and "run 3 or more seeds of each" in text, text
    more = [*runs, experiment("cnc-s1", 1, "cnc", 0.6, "07"), experiment("cnc-s2", 2, "cnc", 0.7, "08")]
    text = compare_terminal.terminal_text(compare_data.build_comparison(compare_data.select(more), more))
    assert "one seed cannot answer" not in " ".join(text.split())


def test_a_repeat_of_the_same_params_is_not_another_seed(sweep) -> None:
    """The workspace holding the baseline's params (seed included) with other results counts once, with a note."""
    rerun = experiment("workspace", 2, "cnc", 0.1, "09", kind="workspace")  # cnc-s2's params, other metrics
    runs = [rerun, *[e for e in sweep if e.kind != "workspace"]]
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    groups = comparison.groups.set_index("stage2.method")
    assert groups.loc["cnc", "seeds"] == 3 and groups.loc["cnc", "s2_worst_mean"] == pytest.approx(0.6)
    assert [e.name for e in comparison.experiments].count("workspace") == 0
    text = compare_terminal.terminal_text(comparison)
    assert "note: workspace has the same params as cnc-s2 (seed included) but other results: not counted as another" \
           in " ".join(text.split())


def test_a_repeat_whose_numbers_are_left_out_is_not_said_to_have_other_results(sweep) -> None:
    """A clean workspace holding cnc-s2's params and results, whose stage-2 metrics file does not match dvc.lock
    (blanked): it counts once, and the note names the numbers left out and why, never "other results"."""
    workspace = next(e for e in sweep if e.kind == "workspace")
    reason = "reports/metrics/train_contrastive.json does not match dvc.lock: its numbers are left out"
    workspace.stale, workspace.reason = {"reports/metrics/train_contrastive.json": reason}, reason
    for key in [k for k in workspace.metrics if k.startswith("s2_")]:
        del workspace.metrics[key]
    runs = [e for e in sweep if e.status == "done"]
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    assert [e.name for e in comparison.experiments].count("workspace") == 0
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert "other results" not in text, text
    assert (f"note: workspace has the same params as cnc-s2 (seed included) and the same results where both have a "
            f"number (numbers left out: workspace: {reason}): not counted as another seed") in text


CONFLICTED_LOCK = """schema: '2.0'
stages:
  train_erm:
<<<<<<< HEAD
    cmd: python pipeline/train_erm.py
=======
    cmd: python pipeline/train_erm.py --fast
>>>>>>> other
"""


def test_a_workspace_whose_dvc_lock_holds_conflict_markers_is_said_to_be_that_not_missing_metrics_files(
        tmp_path: Path, monkeypatch) -> None:
    """DVC reads no metrics of a workspace whose dvc.lock a merge left with conflict markers: compare names the
    markers and the command that mends it, never "no metrics files"."""
    import dvc.repo

    from debias.tools.compare import collect

    (tmp_path / "dvc.lock").write_text(CONFLICTED_LOCK, encoding="utf-8")
    shown = [{"rev": "workspace", "data": {"params": {"params.yaml": {"data": {"seed": 0}}}}}]
    monkeypatch.setattr(collect, "dvc_exp_show", lambda root, all_commits=False: shown)
    monkeypatch.setattr(collect, "headline_bytes", lambda root, experiments: {})
    monkeypatch.setattr(collect, "dvc_reader", lambda root, experiment, repo, lock=None: None)
    monkeypatch.setattr(dvc.repo, "Repo", lambda root: None)
    [workspace] = collect.from_dvc(tmp_path)
    reason = compare_data.missing_reason(workspace)
    assert "no metrics files" not in reason, reason
    assert reason == ("dvc.lock holds git's merge conflict markers (<<<<<<< at line 4): a merge left it unresolved; "
                      "DVC reads no metrics of it; run `git checkout HEAD -- dvc.lock` (or resolve the conflict by "
                      "hand), then `dvc repro`")
    (tmp_path / "dvc.lock").unlink()  # no dvc.lock at all: no metrics files, as before
    [workspace] = collect.from_dvc(tmp_path)
    assert compare_data.missing_reason(workspace) == "no metrics files in the workspace; run `dvc repro`"


def test_a_metric_that_is_not_a_number_is_left_out_of_the_mean_with_a_note(sweep) -> None:
    from debias.tools.compare.collect import rejected_values

    runs = [e for e in sweep if e.kind != "workspace"]
    s1 = next(e for e in runs if e.name == "cnc-s1")
    s1.rejected = rejected_values({"s2_worst": float("nan"), "s2_avg": "n/a", "erm_avg": 0.5})
    del s1.metrics["s2_worst"], s1.metrics["s2_avg"]
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    groups = comparison.groups.set_index("stage2.method")
    assert groups.loc["cnc", "s2_worst_mean"] == pytest.approx(0.6)  # (0.5 + 0.7) / 2: the NaN left out
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert "note: cnc-s1: " in text and "= NaN" in text and "= 'n/a' is not a number: left out of its group's mean" in text
    assert rejected_values({"a": True, "b": None, "c": 1.0}) == {"a": "True", "b": "None"}


@pytest.mark.slow
def test_the_page_opens_on_a_headline_card_with_each_seeds_worst_group(sweep, tmp_path: Path) -> None:
    """ERM vs stage 2 for the best group (mean ± std over its 3 seeds), the worst group named with n and its Wilson
    interval per seed, the warnings linked and the next step, before every other section."""
    from debias.metrics import wilson_interval

    comparison = compare_data.build_comparison(compare_data.select(sweep), sweep)
    for run in comparison.experiments:
        run.load_notes()
    md = compare_page.write_page(comparison, tmp_path / "page")["md"].read_text(encoding="utf-8")
    assert [line for line in md.splitlines() if line.startswith("## ")][0] == "## Headline"
    card_md = md.split("\n## ")[1]
    assert "| highest mean: stage2.method=cnc (3 seeds) | ERM | stage 2 |" in card_md  # one eps seed: no evidence
    assert "| worst-group % | 50.0 ± 0.0 | 60.0 ± 10.0 |" in card_md
    # every cnc seed's lowest cell is y=0, a=0 (its worst-group value of 5 test images; the others are 0.8, 0.9)
    assert "| worst group (class y, attribute a) | y=0, a=0 (every run) | y=0, a=0 (every run) |" in card_md
    assert "| its test images n | 5 (< 30) (every run) |" in card_md
    intervals = "; ".join(f"[{100 * lo:.1f}, {100 * hi:.1f}]" for lo, hi in
                          (wilson_interval(round(w * 5), 5, 0.95) for w in (0.5, 0.6, 0.7)))
    assert f"| {intervals} |" in card_md
    assert "2 warnings: [degenerate-selection](#warnings) × 2 (train_erm; 2 experiments)." in card_md
    assert "**Next: Read the warning `degenerate-selection` of cnc-s0/train_erm first" in card_md
    assert "| worst group: y, a · n · interval |" in md.replace(" warnings |", " |")  # per-experiment column


# --------------------------------------------------------------------------- what cannot be measured is never ranked


NAN = __import__("re").compile(r"\bnan\b", __import__("re").IGNORECASE)


def _everything(comparison: compare_data.Comparison, out: Path) -> str:
    """The terminal table, the page (HTML and markdown) and its CSVs, as one text."""
    written = compare_page.write_page(comparison, out)
    return "\n".join([compare_terminal.terminal_text(comparison), written["html"].read_text(encoding="utf-8"),
                      written["md"].read_text(encoding="utf-8"), written["experiments"].read_text(encoding="utf-8"),
                      written["groups"].read_text(encoding="utf-8")])


@pytest.mark.slow
def test_a_run_without_metrics_is_listed_with_its_reason_and_never_ranked(tmp_path: Path) -> None:
    """README's flow: the baseline commit's outputs are not in this clone's cache (only the data's numbers came
    back), one experiment has results. The baseline is listed as without results, with why and `dvc exp run`; the
    headline does not call the one comparable run "best"; no NaN reaches the terminal or the page."""
    from debias.tools.compare.collect import explain_missing

    main = Experiment("main", "baseline", {"seed": 0, "loss.epsilon": 0.5}, {"bias_corr": 0.99, "bias_n": 240},
                      rev="abc", timestamp="2026-11-23T10:00:00")
    explain_missing(main)
    eps = experiment("eps-0.25", 0, "eps_supinfonce", 0.4, "05")
    runs = [main, eps]
    chosen = compare_data.select(runs)
    assert [e.name for e in chosen] == ["eps-0.25"]
    comparison = compare_data.build_comparison(chosen, runs)
    assert [e.name for e in comparison.without_results] == ["main"] and comparison.differences == []
    text = _everything(comparison, tmp_path / "page")
    assert not NAN.search(text), NAN.search(text)
    flat = " ".join(text.split())
    assert ("main: its metrics files are not in this clone's DVC cache (the dvc.lock committed there names outputs "
            "computed elsewhere; `dvc pull` fetches them where a DVC remote holds them); run `dvc exp run`") in flat
    md = (tmp_path / "page" / "compare.md").read_text(encoding="utf-8")
    card_md = md.split("\n## ")[1]
    assert "best:" not in card_md and "| every experiment (1 seed) | ERM | stage 2 |" in card_md
    assert "the only group with stage-2 worst-group: nothing to rank it against" in card_md
    assert "best by" not in text and "+nan" not in text


@pytest.mark.slow
def test_a_group_without_the_rank_metric_is_listed_but_not_ranked_or_tested(tmp_path: Path) -> None:
    """Two groups, one of which has ERM's numbers only (its stage 2 blank): it stays in the tables, is named as not
    ranked, and no difference, t-test or 'best' is drawn from a single ranked group."""
    full = [experiment(f"eps-s{s}", s, "eps_supinfonce", 0.4 + 0.1 * s, f"0{s}", epsilon=0.25) for s in (0, 1)]
    partial = [experiment(f"half-s{s}", s, "eps_supinfonce", 0.9, f"1{s}", epsilon=0.5) for s in (0, 1)]
    for run in partial:
        run.metrics = {k: v for k, v in run.metrics.items() if k.startswith("erm_")}
    runs = full + partial
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    assert comparison.ranked == 1 and len(comparison.groups) == 2 and comparison.differences == []
    assert comparison.groups.iloc[0]["loss.epsilon"] == "0.25"  # the ranked group first, whatever the other's values
    text = _everything(comparison, tmp_path / "page")
    assert not NAN.search(text)
    flat = " ".join(text.split())
    assert "loss.epsilon=0.5 is not ranked: no stage-2 worst-group in its experiments (half-s0, half-s1)" in flat
    card_md = (tmp_path / "page" / "compare.md").read_text(encoding="utf-8").split("\n## ")[1]
    assert "| loss.epsilon=0.25 (2 seeds) | ERM | stage 2 |" in card_md and "best:" not in card_md
    # with a second ranked group the ranking, the difference and the test come back
    other = [experiment(f"z-s{s}", s, "eps_supinfonce", 0.2, f"2{s}", epsilon=0.0) for s in (0, 1)]
    runs = full + partial + other
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    assert comparison.ranked == 2 and [d.group for d in comparison.differences] == ["loss.epsilon=0.0"]
    assert not NAN.search(_everything(comparison, tmp_path / "page2"))


# --------------------------------------------------------------------------- stages of another run are blanked

TWO_STAGES = """stages:
  train_erm:
    cmd: python run.py train_erm
    deps: [run.py]
    params: [seed, erm]
    outs: [data/erm.txt]
    metrics: [reports/metrics/train_erm.json]
  train_contrastive:
    cmd: python run.py train_contrastive
    deps: [run.py, data/erm.txt]
    params: [seed, stage2]
    outs: [reports/metrics/stage2_train_groups.json]
    metrics: [reports/metrics/train_contrastive.json]
"""
RUN = """import json, os, sys, yaml
p = yaml.safe_load(open("params.yaml"))
os.makedirs("reports/metrics", exist_ok=True); os.makedirs("data", exist_ok=True)
if sys.argv[1] == "train_erm":
    open("data/erm.txt", "w").write(str(p["seed"]))
    json.dump({"erm_worst": 0.1 + p["seed"] / 100}, open("reports/metrics/train_erm.json", "w"))
else:
    seed = open("data/erm.txt").read()
    json.dump({"s2_worst": 0.5 + p["seed"] / 100}, open("reports/metrics/train_contrastive.json", "w"))
    json.dump({"test": {"per_group": [[0.5]]}, "from_erm_seed": seed}, open("reports/metrics/stage2_train_groups.json", "w"))
"""


@pytest.mark.slow
def test_a_partial_experiment_shows_no_stage_of_another_run(tmp_path: Path) -> None:
    """For real, in a two-stage DVC repository: `dvc exp run -S seed=3 train_erm` reruns ERM only, its dvc.lock keeps
    seed 0's stage-2 entry. compare shows seed 3's ERM, blanks the stage-2 metrics and files (they are seed 0's),
    says why and how to rerun it whole; nothing averages them into seed means. A workspace whose params.yaml
    changed after its run is without results, with `dvc repro`."""
    import os
    import subprocess

    from debias.tools.compare.collect import from_dvc

    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")

    def sh(*command: str) -> None:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"

    (tmp_path / "params.yaml").write_text("seed: 0\nerm:\n  lr: 0.1\nstage2:\n  epochs: 2\n")
    (tmp_path / "run.py").write_text(RUN)
    (tmp_path / "dvc.yaml").write_text(TWO_STAGES)
    sh("git", "init", "-q")
    sh("dvc", "init", "-q")
    sh("dvc", "config", "core.analytics", "false")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "pipeline")
    sh("dvc", "repro", "-q")
    sh("git", "add", "-A")
    sh("git", "commit", "-qm", "results")
    sh("dvc", "exp", "run", "-q", "-n", "exp-partial", "-S", "seed=3", "train_erm")

    found = {e.name: e for e in from_dvc(tmp_path)}
    partial, workspace = found["exp-partial"], found["workspace"]
    baseline = next(e for e in found.values() if e.kind == "baseline")
    assert baseline.metrics == {"erm_worst": 0.1, "s2_worst": 0.5} and not baseline.stale
    assert partial.metrics == {"erm_worst": 0.13}  # seed 3's ERM; seed 0's stage 2 left blank
    assert partial.stale == {"train_contrastive": "ran with seed=0 (the experiment's: 3)"}
    assert partial.fix == "dvc exp run -S seed=3"
    assert partial.reader is not None and partial.reader(GROUP_FILES["stage2"]) is None  # its files too
    assert baseline.reader is not None and json.loads(baseline.reader(GROUP_FILES["stage2"]))["from_erm_seed"] == "0"

    runs = list(found.values())
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    frame = comparison.frame.set_index("experiment")
    assert math.isnan(frame.loc["exp-partial", "s2_worst"]) and frame.loc["exp-partial", "erm_worst"] == 0.13
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert ("note: exp-partial: stale: train_contrastive ran with seed=0 (the experiment's: 3); its metrics are "
            "another run's, left blank; run `dvc exp run -S seed=3`") in text

    (tmp_path / "params.yaml").write_text("seed: 3\nerm:\n  lr: 0.5\nstage2:\n  epochs: 2\n")  # edited, not run
    found = {e.name: e for e in from_dvc(tmp_path)}
    workspace = found["workspace"]
    assert workspace.metrics == {} and workspace.fix == "dvc repro" and set(workspace.stale) == {"train_erm",
                                                                                                  "train_contrastive"}
    assert workspace.stale["train_erm"] == "ran with erm.lr=0.1 (the experiment's: 0.5)"
    runs = list(found.values())
    assert "workspace" in [e.name for e in compare_data.build_comparison(compare_data.select(runs), runs).without_results]


def test_stale_stages_follow_inputs_that_another_run_wrote() -> None:
    """A stage whose input is not what its producer last wrote is stale, and so is everything downstream of it."""
    from debias.tools.compare.stale import stale_stages

    lock = {"stages": {
        "a": {"params": {"params.yaml": {"seed": 0}}, "outs": [{"path": "data/a", "md5": "new.dir"}]},
        "b": {"params": {"params.yaml": {"seed": 0}}, "deps": [{"path": "data/a", "md5": "old.dir"}],
              "outs": [{"path": "data/b.pt", "md5": "b"}]},
        "c": {"deps": [{"path": "data/b.pt", "md5": "b"}], "outs": [{"path": "m.json", "md5": "c"}]},
        "d": {"params": {"params.yaml": {"loss.epsilon": 0.25}}, "deps": [{"path": "data/a", "md5": "new.dir"}]}}}
    stale = stale_stages(lock, {"seed": 0, "loss.epsilon": 0.25, "loss.alpha": 1.0})
    assert stale == {"b": "its input data/a is not the one a wrote last (another run of a)",
                     "c": "its input data/b.pt comes from b, which is stale"}
    assert stale_stages(lock, {"seed": 0, "loss.epsilon": 0.5})["d"] == "ran with loss.epsilon=0.25 (the experiment's: 0.5)"
    assert stale_stages(None, {"seed": 1}) == {}



def test_a_number_written_0_is_the_0_0_dvc_lock_records_but_a_bool_is_no_number() -> None:
    """A sweep's ``-S loss.epsilon=0`` and ``dvc repro``'s ``0.0`` are one value, as DVC's run-cache treats them: the
    restored run is not stale, the two group together, and a ``--param`` filter finds both; ``true`` is not ``1``."""
    from debias.tools.compare.stale import stale_stages

    lock = {"stages": {"s": {"params": {"params.yaml": {"loss.epsilon": 0.0, "flag": True}}}}}
    assert stale_stages(lock, {"loss.epsilon": 0, "flag": True}) == {}
    assert stale_stages(lock, {"loss.epsilon": "0", "flag": True}) == {}  # MLflow's params are text
    assert stale_stages(lock, {"loss.epsilon": 0, "flag": 1})["s"] == "ran with flag=true (the experiment's: 1)"
    assert stale_stages(lock, {"loss.epsilon": 1e-9, "flag": True})["s"].startswith("ran with loss.epsilon=0.0")
    runs = eps_seeds({0.0: [0.5, 0.6, 0.7], 0.25: [0.3, 0.41, 0.49]})
    for run in runs[1:3]:
        run.params["loss.epsilon"] = 0  # seeds 1 and 2 of ε 0 written as the sweep writes them
    comparison = compare_data.build_comparison(runs, runs)
    [d] = comparison.differences
    assert d.rank.pairs == 3
    assert len(compare_data.select(runs, param_filters=["loss.epsilon=0"])) == 3

def eps_seeds(worsts: dict[float, list[float]], extra: dict | None = None) -> list[Experiment]:
    """Hand-made seeds 0, 1, 2 of each ε with the given stage-2 worst-group accuracies."""
    runs = []
    for epsilon, values in worsts.items():
        for seed, worst in enumerate(values):
            run = experiment(f"eps{epsilon}-s{seed}", seed, "eps_supinfonce", worst, f"{10 + seed}", epsilon=epsilon)
            run.params.update(extra or {})
            runs.append(run)
    return runs


def test_the_verdict_pairs_seeds_and_calls_a_best_only_on_evidence() -> None:
    # the same seed's data favour both settings alike: paired, the 0.25 lead is 20 ± 1 points, evidence
    runs = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.3, 0.41, 0.49]})
    comparison = compare_data.build_comparison(runs, runs)
    [d] = comparison.differences
    mean, low, high = d.rank.paired.mean, d.rank.paired.low, d.rank.paired.high
    assert d.rank.pairs == 3 and mean == pytest.approx(-20.0) and high < 0 and d.rank.verdict == "evidence"
    from scipy.stats import t as student_t

    assert low == pytest.approx(-20.0 - student_t.ppf(0.975, 2) * 1.0 / math.sqrt(3))  # sd of (-20, -19, -21): 1 point
    text = " ".join(compare_terminal.terminal_text(comparison).split())  # lines wrap at the width
    assert "best by stage-2 worst-group: loss.epsilon=0.25 (60.0 ± 10.0 %, 3 seeds)" in text
    assert "evidence of a difference" in text
    # the same means, but the seeds disagree: the paired interval holds 0, so no "best"
    runs = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.6, 0.4, 0.2]})
    comparison = compare_data.build_comparison(runs, runs)
    [d] = comparison.differences
    assert d.rank.verdict == "not distinguishable" and d.rank.paired.low < 0 < d.rank.paired.high
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert "best by" not in text.replace("no best by", "") and "no best by stage-2 worst-group" in text
    assert "not distinguishable (the interval holds 0)" in text


@pytest.mark.slow
def test_the_page_headline_says_highest_mean_without_evidence(tmp_path: Path) -> None:
    runs = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.6, 0.4, 0.2]})
    comparison = compare_data.build_comparison(runs, runs)
    for run in comparison.experiments:
        run.load_notes()
    md = compare_page.write_page(comparison, tmp_path / "page")["md"].read_text(encoding="utf-8")
    assert "| highest mean: loss.epsilon=0.25 (3 seeds) | ERM | stage 2 |" in md
    assert "not distinguishable" in md and "| best:" not in md


def test_fewer_than_two_common_seeds_is_not_a_verdict() -> None:
    runs = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.1]})
    [d] = compare_data.build_comparison(runs, runs).differences
    assert d.rank.pairs == 1 and d.rank.verdict == "unpaired"
    assert "nothing to pair" in " ".join(compare_terminal.terminal_text(compare_data.build_comparison(runs, runs)).split())


def test_groups_on_different_data_are_never_ranked_together() -> None:
    digits = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.3, 0.41, 0.49]}, {"bias.foreground.p_corr": 0.9})
    harder = eps_seeds({0.25: [0.1, 0.2, 0.3], 0.5: [0.15, 0.2, 0.22]}, {"bias.foreground.p_corr": 0.99})
    for run in harder:
        run.name += "-hard"
    runs = digits + harder
    comparison = compare_data.build_comparison(runs, runs)
    assert {d.family for d in comparison.differences} == {"bias.foreground.p_corr=0.9",
                                                               "bias.foreground.p_corr=0.99"}
    for d in comparison.differences:  # each compared with the top of its own data only
        assert d.group.split(", ")[1] == d.best.split(", ")[1]
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert "on data bias.foreground.p_corr=0.9:" in text and "on data bias.foreground.p_corr=0.99" in text
    assert "not ranked against each other" in text


def test_many_differing_params_never_push_the_headline_metrics_out_of_the_table(sweep) -> None:
    runs = compare_data.select(sweep)
    for i, run in enumerate(runs):  # seven params differ, each with a long value
        for k in range(7):
            run.params[f"stage2.a_rather_long_param_name_{k}"] = f"value-{i}-" + "x" * 30
        run.metrics = {key: value + 0.01 * i for key, value in run.metrics.items()}
    text = compare_terminal.terminal_text(compare_data.build_comparison(runs, sweep))
    assert max(map(len, text.splitlines())) <= 160
    table = text.split("\n\n")[1]
    assert "stage 2" in table and " wg " in table and " unb " in table  # the stage-2 headline columns ...
    assert "72.0" in table and "33.0" in table  # ... with their numbers (cnc-s2's, eps's worst-group)
    assert "name_0" in table and "name_1" in table and "stage2.a_rat…" not in table  # cut keys keep their ends
    assert "not shown here for width (see the page):" in text and "a_rather_long_param_name_6" in text


def test_a_duplicate_run_is_shown_once_with_a_note_naming_the_one_kept(sweep) -> None:
    notes = compare_data.duplicate_notes(sweep)
    assert notes == ["workspace holds the same params and results as cnc-s2: shown once, as cnc-s2"]
    assert compare_data.duplicate_notes(sweep, method="eps_supinfonce") == []


def test_bar_labels_keep_what_tells_the_groups_apart() -> None:
    from debias.report.figures import compact_label

    labels = [f"stage2.cnc.temperature=0.05, stage2.cnc.num_positives={m}, loss.fairkl.weight=0.5" for m in (8, 32)]
    compact = [compact_label(label)[:40] for label in labels]  # the figure cuts at 40 characters
    assert compact == ["temperature=0.05, num_positives=8, weigh", "temperature=0.05, num_positives=32, weig"]
    assert len({label[:40] for label in labels}) == 1  # cut as they were, the two labels were one


def test_tag_values_are_quoted_for_mlflows_filter() -> None:
    from debias.tools.compare import collect

    assert collect.quoted("pipeline") == "'pipeline'"
    assert collect.quoted(collect.BASELINE_DIFF) == "\"none (the baseline's params)\""  # its apostrophe broke it
    with pytest.raises(ValueError, match="both quote characters"):
        collect.quoted("a'b\"c")


def test_the_best_groups_seed_count_is_of_the_seeds_that_have_the_rank_metric(sweep) -> None:
    """cnc has 3 experiments, one without a stage-2 worst-group (a NaN left out of the mean): its mean is over 2
    seeds, and the headline and the t-test's counts say 2, not 3."""
    from debias.tools.compare.collect import rejected_values

    runs = [e for e in sweep if e.kind != "workspace"]
    runs.append(experiment("eps-s1", 1, "eps_supinfonce", 0.2, "06"))
    s1 = next(e for e in runs if e.name == "cnc-s1")
    s1.rejected = rejected_values({"s2_worst": float("nan")})
    del s1.metrics["s2_worst"]
    comparison = compare_data.build_comparison(compare_data.select(runs), runs)
    [difference] = comparison.differences
    assert difference.rank.n == (2, 2)  # cnc-s0 and cnc-s2 against eps and eps-s1
    text = " ".join(compare_terminal.terminal_text(comparison).split())
    assert "stage2.method=cnc (60.0 ± 14.1 %, 2 seeds of 3: the other lacks it)" in text
    # seeds 0 and 1 in both groups, but cnc-s1 has no metric: one pair, said as one (not the 2 seeds in common)
    assert difference.rank.pairs == 1 and difference.rank.verdict == "unpaired"


def test_a_misspelt_param_filter_says_which_key_and_the_closest_one(sweep, tmp_path: Path, monkeypatch) -> None:
    """--param with a key no experiment has is named, with the closest key the experiments have, before
    'no experiment to compare'; a key some experiment has but whose value none matches stays the plain refusal."""
    from debias.tools.compare import collect
    from debias.tools.compare import compare

    monkeypatch.setattr(collect, "from_dvc", lambda root: sweep)
    monkeypatch.setattr(collect, "experiments_by_commit", lambda root: {})
    with pytest.raises(ValueError) as refused:
        compare(tmp_path, param_filters=["loss.epsiln=0.25"], mlflow=False)
    assert str(refused.value).startswith("--param loss.epsiln=0.25: no experiment has the param 'loss.epsiln'; did "
                                         "you mean 'loss.epsilon'?")
    with pytest.raises(ValueError, match="^no experiment to compare"):
        compare(tmp_path, param_filters=["loss.epsilon=0.75"], mlflow=False)


def test_a_param_none_of_the_experiments_reads_is_an_unread_param_warning() -> None:
    """ε differing between SupCon runs (whose loss has no margin) cannot explain their differences: compare says so;
    between eps-SupInfoNCE runs, and between CNC runs, ε is read, and no such warning is given."""
    supcon = [experiment(f"supcon-e{epsilon}-s{seed}", seed, "supcon", 0.5 + seed / 10, f"1{seed}", epsilon=epsilon)
              for epsilon in (0.25, 0.5) for seed in range(3)]
    notes = compare_data.build_comparison(supcon, supcon).notes
    assert [n for n in notes if "unread-param" in n] == [
        "WARNING unread-param: loss.epsilon differs between the experiments, but none of them reads it (not read under "
        "stage2.method supcon): their differences do not come from it"]
    cnc = [experiment(f"cnc-e{epsilon}-s{seed}", seed, "cnc", 0.5 + seed / 10, f"1{seed}", epsilon=epsilon)
           for epsilon in (0.25, 0.5) for seed in range(3)]
    assert not [n for n in compare_data.build_comparison(cnc, cnc).notes if "unread-param" in n]
    eps = eps_seeds({0.25: [0.5, 0.6, 0.7], 0.5: [0.3, 0.41, 0.49]})
    assert not [n for n in compare_data.build_comparison(eps, eps).notes if "unread-param" in n]


def test_two_seeds_or_a_zero_width_interval_are_no_evidence_and_no_best() -> None:
    """Worst-group accuracy is quantised: two seeds whose differences are equal give a zero-width interval that
    excludes 0. That is no evidence and names no "best"; neither do 2 seeds however they differ; 3 seeds with
    differences of some spread that exclude 0 are."""
    for values, expected in (({0.25: [0.5, 0.6], 0.5: [0.3, 0.4]}, "too few seeds"),
                             ({0.25: [0.5, 0.6, 0.7], 0.5: [0.3, 0.4, 0.5]}, "not distinguishable"),
                             ({0.25: [0.5, 0.62, 0.7], 0.5: [0.3, 0.4, 0.51]}, "evidence")):
        runs = eps_seeds(values)
        comparison = compare_data.build_comparison(runs, runs)
        (difference,) = comparison.differences
        assert difference.rank.verdict == expected, (values, difference)
        assert compare_data.evidence_of_best(comparison.differences) is (expected == "evidence")
        text = " ".join(compare_terminal.terminal_text(comparison).split())
        if expected == "too few seeds":
            assert "no verdict: 2 seeds (evidence needs 3 or more)" in text and "evidence of" not in text
        elif expected == "not distinguishable":
            assert "every seed differs by the same amount" in text and "evidence of" not in text


def test_a_workspace_whose_results_are_blanked_as_stale_is_nobodys_twin(sweep) -> None:
    """The workspace after `git checkout params.yaml` holds the committed params and another run's outputs, which
    compare blanks as stale: it is not "the same params and results" as the sweep's run of those params."""
    workspace = next(e for e in sweep if e.kind == "workspace")
    twin = next(e for e in sweep if e.name == "cnc-s2")
    assert compare_data.duplicates([twin, workspace]) == [(workspace, twin)]  # the same run again: shown once
    workspace.stale = {"train_contrastive": "ran with stage2.cnc.temperature=0.1 (the experiment's: 0.05)"}
    workspace.metrics = {}
    assert compare_data.duplicates([twin, workspace]) == []
    assert not [n for n in compare_data.duplicate_notes([twin, workspace]) if "holds the same" in n]


READER_STAGE = """stages:
  make:
    cmd: python make.py ${x}
    deps: [make.py]
    params: [x]
    outs: [out.json, folder]
    metrics: [{metric.json: {cache: false}}]
"""
READER_SCRIPT = """import json, os, sys
os.makedirs("folder/sub", exist_ok=True)
for path in ("out.json", "folder/a.json", "folder/sub/b.json", "metric.json"):
    with open(path, "w") as handle:
        json.dump({"x": sys.argv[1], "file": path}, handle)
"""


@pytest.mark.slow
def test_an_experiments_files_are_read_from_the_cache_as_dvc_s_filesystem_reads_them(tmp_path: Path, monkeypatch) -> None:
    """DvcReader of a real experiment: a file output, files inside a folder output (nested too) and a `cache: false`
    output (its object in the cache: DVC's run-cache keeps it) read from the local cache by dvc.lock's hashes, with
    no switch of DVC's filesystem to the revision; a file no output holds through DVC's filesystem, as before; each
    the text DVC's filesystem gives at the revision. A file whose object left the cache is read as DVC reads it."""
    import os
    import subprocess

    from dvc.repo import Repo

    from debias.tools.compare import collect

    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    (tmp_path / "params.yaml").write_text("x: 1\n")
    (tmp_path / "dvc.yaml").write_text(READER_STAGE)
    (tmp_path / "make.py").write_text(READER_SCRIPT)
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "config", "core.analytics", "false"],
                    ["dvc", "repro", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "base"],
                    ["dvc", "exp", "run", "-q", "-n", "two", "-S", "x=2"]):
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
        assert done.returncode == 0, f"{command}: {done.stderr}"
    ref = next(line.split()[1] for line in subprocess.run(["git", "show-ref"], cwd=tmp_path, capture_output=True,
                                                          text=True).stdout.splitlines() if line.endswith("/two"))
    experiment = Experiment("two", "experiment", {"x": 2}, {}, rev=ref)
    lock = collect.read_lock(tmp_path, experiment)
    keys = ["out.json", "folder/a.json", "folder/sub/b.json", "metric.json", "nowhere.json"]
    with Repo(str(tmp_path)) as repo, repo.switch(ref):
        expected = {key: repo.dvcfs.read_text(key) if repo.dvcfs.exists(key) else None for key in keys}
    assert json.loads(expected["folder/sub/b.json"]) == {"x": "2", "file": "folder/sub/b.json"}
    assert json.loads(expected["metric.json"]) == {"x": "2", "file": "metric.json"}
    with Repo(str(tmp_path)) as repo:
        reader = collect.dvc_reader(tmp_path, experiment, repo, lock)
        assert [reader._cached(key) for key in keys] == [*(expected[key] for key in keys[:4]), None]
        switched: list[str] = []
        real = repo.switch
        monkeypatch.setattr(repo, "switch", lambda rev: switched.append(rev) or real(rev))
        reader.prefetch([Path(key) for key in keys[:4]])
        assert switched == []  # every one from the cache
        assert {key: reader(Path(key)) for key in keys} == expected and switched == [ref]
        Path(repo.cache.local.oid_to_path(str(headline.recorded_outputs(lock)["out.json"]["md5"]))).unlink()
        fresh = collect.dvc_reader(tmp_path, experiment, repo, lock)
        assert fresh._cached("out.json") is None and fresh(Path("out.json")) is None


def test_finding_repeated_runs_reads_each_runs_params_once_not_once_per_pair(monkeypatch) -> None:
    """duplicates and same_params over 200 runs of 40 params each, 10 of them repeats: the repeats found as before,
    each run's params turned into DVC's comparison keys a bounded number of times (quadratic in the runs before)."""
    runs = [Experiment(f"run{i}", "experiment", {**{f"p.k{j}": j for j in range(39)}, "seed": i % 190},
                       {"s2_worst": 50.0 + i % 190}, timestamp=f"2026-12-03T00:{i // 60:02d}:{i % 60:02d}")
            for i in range(200)]
    calls = []
    counted = compare_data.param_key
    monkeypatch.setattr(compare_data, "param_key", lambda value: calls.append(1) or counted(value))
    dropped = compare_data.duplicates(runs)
    assert sorted((gone.name, kept.name) for gone, kept in dropped) == sorted(
        (f"run{i}", f"run{i - 190}") for i in range(190, 200))
    kept, notes = compare_data.same_params(runs)
    assert len(kept) == 190 and len(notes) == 10
    assert len(calls) <= 2 * 200 * 40  # once per run and param in each function


@pytest.mark.slow
def test_a_sweep_is_compared_alone_when_named(tmp_path: Path, monkeypatch, capsys) -> None:
    """--sweep NAME keeps the experiments of that sweep's plan: another experiment (README's ε run beside the
    temperature sweep) is not folded into its comparison as a third group."""
    from debias.tools.compare import collect
    from debias.tools.compare import compare
    from debias.tools.sweep.workspace import SWEEPS

    runs = eps_seeds({0.25: [0.5, 0.62, 0.7], 0.5: [0.3, 0.4, 0.51]})
    other = experiment("eps-alone", 0, "cnc", 0.9, "30", epsilon=1.0)
    monkeypatch.setattr(collect, "from_dvc", lambda root: [*runs, other])
    monkeypatch.setattr(collect, "experiments_by_commit", lambda root: {})
    plan = tmp_path / SWEEPS / "eps" / "sweep.json"
    plan.parent.mkdir(parents=True)
    plan.write_text(json.dumps({"name": "eps", "jobs": [{"name": e.name} for e in runs]}))
    comparison, _, text = compare(tmp_path, mlflow=False, sweep="eps", out=tmp_path / "page")
    assert {e.name for e in comparison.experiments} == {e.name for e in runs}
    assert "--sweep eps" in comparison.filters and "eps-alone" not in text
    assert "[compare] reading the warnings and figures' files of 6 experiments ..." in capsys.readouterr().err
    everything, _, _ = compare(tmp_path, mlflow=False, out=tmp_path / "page")
    assert "eps-alone" in {e.name for e in everything.experiments}
    with pytest.raises(ValueError, match="no sweep named 'temp'"):
        compare(tmp_path, mlflow=False, sweep="temp", out=tmp_path / "page")


def test_a_baseline_with_committed_metrics_says_where_its_numbers_come_from(tmp_path: Path) -> None:
    """The headline metrics are git-tracked, so DVC shows the baseline commit's own numbers (computed where its
    dvc.lock was written); without this machine's MLflow run of the baseline's params, compare keeps them and says
    so; without them either, nothing is claimed."""
    from debias.tools.compare.collect import baseline_from_mlflow

    baseline = experiment("main", 0, "cnc", 0.5, "01", kind="baseline")
    note = baseline_from_mlflow([baseline], f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}", "debias")
    assert note is not None and "the commit's own numbers (its git-tracked reports/metrics" in note
    bare = experiment("main", 0, "cnc", 0.5, "01", kind="baseline")
    bare.metrics = {}
    assert baseline_from_mlflow([bare], f"sqlite:///{tmp_path / 'none' / 'mlflow.db'}", "debias") is None


def test_reading_a_missing_sqlite_store_finds_no_run_and_creates_no_database(tmp_path: Path) -> None:
    from debias.tools.compare.collect import from_mlflow

    assert from_mlflow(f"sqlite:///{tmp_path / 'mlflow.db'}", "debias") == []
    assert list(tmp_path.iterdir()) == []


def test_a_narrow_table_names_each_swept_param_by_its_shortest_unique_key_never_cut(sweep) -> None:
    """An 80-column terminal cut the swept params' names to '…ge2.method' and '…': each param column is labelled by
    the shortest dotted suffix no other differing param ends with, whole; its values are what gets shortened."""
    assert compare_terminal.short_keys(["stage2.method", "loss.epsilon", "seed"]) == {
        "stage2.method": "method", "loss.epsilon": "epsilon", "seed": "seed"}
    assert compare_terminal.short_keys(["stage2.cnc.temperature", "stage2.supcon.temperature", "temperature"]) == {
        "stage2.cnc.temperature": "cnc.temperature", "stage2.supcon.temperature": "supcon.temperature",
        "temperature": "temperature"}
    runs = compare_data.select(sweep)
    text = compare_terminal.terminal_text(compare_data.build_comparison(runs, sweep), max_width=80)
    comparison = compare_data.build_comparison(runs, sweep)
    table = text.split("\n\n")[1]
    assert max(map(len, text.splitlines())) <= 80
    for key in comparison.params:
        label = compare_terminal.short_keys(comparison.params)[key]
        assert f" {label} " in table.splitlines()[1] + " " or table.splitlines()[1].endswith(label), (label, table)
    assert "…" not in table.splitlines()[1]


def test_the_report_and_compare_print_one_accuracy_alike() -> None:
    """The report prints a stage's accuracy from its detailed file, compare from the headline file's rounded copy: one
    rule prints both, so 133 of 220 (0.604545..., headline 0.6045) reads 60.5 in each, and so does every k of n."""
    from debias.report.card import pct

    assert pct(133 / 220) == compare_data.fmt(headline._number(133 / 220), True) == "60.5"
    differ = [(k, n) for n in range(1, 400) for k in range(n + 1)
              if pct(k / n) != compare_data.fmt(headline._number(k / n), True)]
    assert not differ, differ[:5]
    assert [pct(v) for v in (0.6045, 0.60449, 0.5, 1.0, 0.0)] == ["60.5", "60.5", "50.0", "100.0", "0.0"]
    assert pct(0.12345, 0) == "12" and compare_data.fmt(math.nan, True) == "–"
