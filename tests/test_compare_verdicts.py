"""debias compare's verdicts: power beside every paired interval, on worst-group and unbiased accuracy, the step one
test image makes in a small worst group, --margin's equivalence verdicts, and the experiments of other commits.
Every number shown is checked against a computation that shares none of compare's code (scipy's one-sample
t-test, the noncentral t written out, Owen's exact TOST power: tests/test_paired.py's helpers)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

from debias.tools.compare import data as compare_data, page as compare_page, terminal as compare_terminal
from debias.tools.compare.collect import GROUP_FILES, Experiment
from tests.test_compare import experiment
from tests.test_paired import direct_power, exact_tost_power

# README's canonical sweep (benchmarks/results/canonical_flow.md): stage-2 test accuracies (%) of seeds 0, 1, 2
README_WORST = {0.0: [30.8, 50.0, 76.9], 0.25: [0.0, 50.0, 63.2]}
README_UNBIASED = {0.0: [84.0, 78.6, 92.1], 0.25: [77.4, 83.1, 91.5]}
WORST_N = {0.0: [13, 4, 13], 0.25: [6, 4, 19]}  # test images of each run's worst group (as the digits' are: few)


def sweep_runs(worst: dict[float, list[float]], unbiased: dict[float, list[float]],
               worst_n: dict[float, list[int]] | None = None) -> list[Experiment]:
    """One experiment per (ε, seed) with the given stage-2 worst-group and unbiased accuracies (%), and a per-group
    test table whose worst group holds ``worst_n`` images."""
    runs = []
    for epsilon, values in worst.items():
        for seed, value in enumerate(values):
            run = experiment(f"eps{epsilon}-s{seed}", seed, "eps_supinfonce", value / 100, f"{10 + seed}",
                             epsilon=epsilon)
            run.metrics["s2_unbiased"] = unbiased[epsilon][seed] / 100
            n = (worst_n or {}).get(epsilon, [200] * len(values))[seed]
            table = {"test": {"per_group": [[value / 100, 0.99], [0.995, 0.999]], "group_counts": [[n, 300], [300, 400]]}}
            found = {str(GROUP_FILES["stage2"]): json.dumps(table)}
            run.reader = lambda path, found=found: found.get(str(path))
            runs.append(run)
    return runs


def flat(text: str) -> str:
    return " ".join(text.split())


def independent(differences: list[float], margin: float = 2.0) -> dict[str, float]:
    """The interval (scipy's one-sample t), the detectable difference (the root of the noncentral t's power at 80 %)
    and the seeds that reach 80 % power for a 2-point difference and for equivalence within ±margin (Owen's exact
    power), all from the differences' own sd."""
    n, sd = len(differences), float(np.std(differences, ddof=1))
    interval = stats.ttest_1samp(differences, 0.0).confidence_interval(0.95)
    detectable = optimize.brentq(lambda d: direct_power(d, sd, n) - 0.8, 1e-9, 8 * sd / math.sqrt(n))  # n >= 3

    def first(reaches) -> int:  # power grows with n: bisect for the first count that reaches 80 %
        low, high = 2, 2
        while not reaches(high):
            low, high = high, 2 * high
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if reaches(middle) else (middle + 1, high)
        return low

    return {"mean": float(np.mean(differences)), "low": interval.low, "high": interval.high,
            "detectable": detectable, "differ": first(lambda k: direct_power(margin, sd, k) >= 0.8),
            "within": first(lambda k: exact_tost_power(margin, sd, k) >= 0.8)}


def test_readmes_sweep_shows_interval_power_and_seeds_for_worst_group_and_unbiased() -> None:
    runs = sweep_runs(README_WORST, README_UNBIASED, WORST_N)
    comparison = compare_data.build_comparison(runs, runs)
    text = flat(compare_terminal.terminal_text(comparison))
    [difference] = comparison.differences
    assert [v.metric for v in difference.verdicts] == ["s2_worst", "s2_unbiased"]
    for verdict, values, label in ((difference.verdicts[0], README_WORST, "stage-2 worst-group"),
                                   (difference.verdicts[1], README_UNBIASED, "stage-2 unbiased")):
        expected = independent([a - b for a, b in zip(values[0.25], values[0.0])])
        assert verdict.verdict == "not distinguishable" and verdict.pairs == 3
        assert verdict.detectable == pytest.approx(expected["detectable"], rel=1e-6)
        # large seed counts: the noncentral-t TOST power is exact there, so the counts are the exact ones
        assert (verdict.seeds_within, verdict.seeds_differ) == (expected["within"], expected["differ"])
        count = max(expected["within"], expected["differ"])
        which = ("for two one-sided tests to show ±2 at a true difference of 0; for the t-test to find a 2-point "
                 f"difference: about {expected['differ']} seeds" if expected["within"] >= expected["differ"] else
                 "for the t-test to find a 2-point difference; for two one-sided tests to show ±2 at a true "
                 f"difference of 0: about {expected['within']} seeds")
        assert (f"{label}: {expected['mean']:+.1f} points in the means; paired by seed (3 seeds): "
                f"{expected['mean']:+.1f} points, 95 % interval [{expected['low']:+.1f}, {expected['high']:+.1f}]: "
                f"not distinguishable (the interval holds 0): 3 seeds detect only differences of "
                f"{expected['detectable']:.1f} points or more (80 % power, two-sided paired t-test at alpha 0.05); "
                f"±2 points: about {count} seeds decide it ({which})") in text
    # README's numbers: -14.8 [-53.2, +23.5] worst-group, -0.9 [-14.7, +12.9] unbiased (from the rounded accuracies)
    assert "-14.8 points, 95 % interval [-53.2, +23.5]" in text and "-0.9 points, 95 % interval [-14.7, +12.9]" in text
    # the seed-0 runs' worst groups hold 4 test images: one image moves worst-group accuracy by 25 points
    assert "one image moves it by up to 25.0 points (its worst group holds as few as 4 test images)" in text
    assert text.count("one image moves it") == 1  # unbiased accuracy reads every test image: no step named



def test_a_sweeps_undecided_verdict_says_what_to_run_next_with_the_seeds_that_decide_it(tmp_path: Path) -> None:
    runs = sweep_runs(README_WORST, README_UNBIASED, WORST_N)
    comparison = compare_data.build_comparison(runs, runs)
    assert "next:" not in compare_terminal.terminal_text(comparison)  # not a sweep: nothing to extend
    comparison.sweep = "eps"
    expected = independent([a - b for a, b in zip(README_UNBIASED[0.25], README_UNBIASED[0.0])])
    seeds = max(expected["within"], expected["differ"])  # the seeds that decide ±2 points, computed independently
    text = flat(compare_terminal.terminal_text(comparison))
    assert (f"next: about {seeds} seeds decide ±2 points of stage-2 unbiased accuracy: `debias sweep --name eps "
            f"--resume --seeds 0-{seeds - 1}` adds the seeds it lacks (finished runs are kept), then `debias compare "
            f"--sweep eps --margin 2`; or `debias sweep --name eps --resume --until-decided {seeds} "
            "--margin 2`") in text
    md = compare_page.write_page(comparison, tmp_path / "page")["md"].read_text(encoding="utf-8")
    assert f"--resume --seeds 0-{seeds - 1}" in md
    # decided (a clear difference on every seed): nothing more to run
    clear = sweep_runs(README_WORST, {0.0: [80.0, 81.0, 82.0], 0.25: [90.0, 91.5, 92.0]}, WORST_N)
    decided = compare_data.build_comparison(clear, clear)
    decided.sweep = "eps"
    assert decided.differences[0].verdicts[1].verdict == "evidence"
    assert "next:" not in compare_terminal.terminal_text(decided)

def next_commands(worst: dict[float, list[float]], unbiased: dict[float, list[float]]) -> tuple[str, int, int | None]:
    """A sweep's compare text, the seeds its ``--resume --seeds FIRST-LAST`` adds to the sweep's own, and its
    ``--until-decided`` count (None where it offers none)."""
    runs = sweep_runs(worst, unbiased)
    comparison = compare_data.build_comparison(runs, runs)
    comparison.sweep = "eps"
    text = flat(compare_terminal.terminal_text(comparison))
    first, last = map(int, re.search(r"--resume --seeds (\d+)-(\d+)`", text).groups())
    have = {seed for values in unbiased.values() for seed in range(len(values))}
    until = re.search(r"--until-decided (\d+) ", text)
    return text, len(set(range(first, last + 1)) - have), int(until.group(1)) if until else None


def test_the_next_step_of_an_undecided_sweep_always_adds_seeds_and_only_commands_that_run() -> None:
    """Every command of the "next:" line adds seeds: at 2 seeds it asks for the 3 compare needs (never "about 2");
    3 seeds that did not decide though the estimate says 3 get more; seeds without the metric on one side count for
    nothing; --until-decided is offered only to a sweep of two settings (it refuses any other)."""
    flat_worst = {0.0: [50.0, 50.0], 0.25: [50.0, 50.0]}
    text, added, until = next_commands(flat_worst, {0.0: [80.0, 80.0], 0.25: [80.1, 80.3]})
    assert "next: about 3 seeds decide ±2 points" in text and (added, until) == (1, 3)
    three = {e: [50.0] * 3 for e in (0.0, 0.25)}
    text, added, until = next_commands(three, {0.0: [80.0, 80.0, 80.0], 0.25: [80.7, 81.2, 81.7]})
    assert "next: 3 seeds did not decide ±2 points" in text and added >= 1 and until == 3 + added
    four = {0.0: [30.8, 50.0, 76.9, 60.0], 0.25: [0.0, 50.0, 63.2, 60.0]}
    unbiased = {0.0: [*README_UNBIASED[0.0], 85.0], 0.25: [*README_UNBIASED[0.25], math.nan]}  # seed 3: no metric
    expected = independent([a - b for a, b in zip(README_UNBIASED[0.25], README_UNBIASED[0.0])])
    needed = max(expected["within"], expected["differ"])
    text, added, until = next_commands(four, unbiased)
    assert f"about {needed} seeds decide" in text and "1 of the sweep's 4 seeds lacks it" in text
    assert (3 + added, until) == (needed, 4 + added)  # the 3 paired seeds and the new ones reach the count named
    values = {**README_UNBIASED, 0.5: [80.0, 85.0, 88.0]}
    text, added, until = next_commands({e: README_WORST[0.0] for e in values}, values)
    assert "next: about" in text and added > 0 and until is None  # three settings: --until-decided would refuse


def test_a_worst_group_of_many_images_names_no_step_and_every_number_rests_on_its_own_pairs() -> None:
    many = {0.0: [30, 40, 50], 0.25: [25, 40, 60]}  # one image moves the worst group by 100 / 25 = 4 points
    runs = sweep_runs(README_WORST, README_UNBIASED, many)
    [difference] = compare_data.build_comparison(runs, runs).differences
    assert difference.rank.worst_n == 25 and difference.rank.step == pytest.approx(4.0)
    assert "one image moves" not in compare_terminal.terminal_text(compare_data.build_comparison(runs, runs))
    assert difference.verdicts[1].worst_n is None  # unbiased accuracy has no single group behind it


def test_not_distinguishable_never_stands_alone_in_the_terminal_or_the_page_table() -> None:
    """Every 'not distinguishable' says what the seeds could detect, or why that is unknown (no spread)."""
    for worst in (README_WORST, {0.0: [50.0, 60.0, 70.0], 0.25: [30.0, 40.0, 50.0]}):  # the second: no spread
        runs = sweep_runs(worst, README_UNBIASED)
        comparison = compare_data.build_comparison(runs, runs)
        text = flat(compare_terminal.terminal_text(comparison))
        pieces = text.split("not distinguishable")[1:]
        assert pieces and all(piece.startswith((" (the interval holds 0): 3 seeds detect only differences of ",
                                                " (every seed differs by the same amount: an interval without width "
                                                "is no evidence, and tells nothing of what more seeds would show)"))
                              for piece in pieces), pieces
        cells = [row[5] for row in compare_page.differences_table(comparison).rows]
        assert all(cell.startswith("not distinguishable: 3 seeds detect ≥ ") or "no spread" in cell for cell in cells)
    assert "every seed differs by the same amount" in text  # the second sweep's worst-group


def synthetic_sweep(true_difference: float, noise: float, seeds: int, seed: int) -> tuple[list[Experiment], list[float]]:
    """Two ε values over ``seeds`` seeds: a seed effect shared by both (the data's draw) and ε 0.25 ``true_difference``
    points from ε 0 with independent noise of sd ``noise``; returns the runs and the paired differences (points)."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(60, 80, size=seeds)
    worst = {0.0: list(np.round(base, 4)), 0.25: list(np.round(base + true_difference + rng.normal(0, noise, seeds), 4))}
    unbiased = {0.0: list(np.round(base + 20, 4)), 0.25: list(np.round(base + 20 + true_difference / 2, 4))}
    runs = sweep_runs({k: list(map(float, v)) for k, v in worst.items()},
                      {k: list(map(float, v)) for k, v in unbiased.items()})
    frame = compare_data.experiments_frame(runs, ["seed", "loss.epsilon"]).set_index(["loss.epsilon", "seed"])
    differences = [100 * (frame.loc[("0.25", str(s)), "s2_worst"] - frame.loc[("0.0", str(s)), "s2_worst"])
                   for s in range(seeds)]
    return runs, differences


@pytest.mark.parametrize("true_difference, noise, seeds, seed, expected", [
    (0.0, 0.8, 10, 1, "within"),  # ε does not matter: TOST at ±2 passes
    (5.0, 1.5, 10, 2, "differs"),  # 5 points: the interval excludes 0
    (0.0, 6.0, 4, 3, "undecided"),  # too noisy for 4 seeds: neither test passes
])
def test_margin_verdicts_agree_with_scipys_tost_and_t_test(true_difference: float, noise: float, seeds: int,
                                                            seed: int, expected: str) -> None:
    runs, differences = synthetic_sweep(true_difference, noise, seeds, seed)
    lower = stats.ttest_1samp(differences, -2.0, alternative="greater").pvalue
    upper = stats.ttest_1samp(differences, 2.0, alternative="less").pvalue
    within, differs = max(lower, upper) < 0.05, stats.ttest_1samp(differences, 0.0).pvalue < 0.05
    assert {"within": within, "differs": differs and not within, "undecided": not (within or differs)}[expected]

    comparison = compare_data.build_comparison(runs, runs, margin=2.0)
    worst = comparison.differences[0].rank
    if comparison.differences[0].group == "loss.epsilon=0.0":  # ε 0.25 ranked first: differences are ε 0 minus it
        differences = [-d for d in differences]
    assert worst.metric == "s2_worst" and worst.verdict == expected
    assert worst.tost_p == pytest.approx(max(lower, upper), rel=1e-9)
    text = flat(compare_terminal.terminal_text(comparison))
    mine = independent(differences)
    if expected == "within":
        p = max(lower, upper)
        shown = "p < 0.001" if p < 0.0005 else f"p = {p:.3f}"  # three decimals never print a p of 0.000
        assert f"within ±2 points (two one-sided tests at alpha 0.05: {shown})" in text and "p = 0.000" not in text
    elif expected == "differs":
        assert "differs (the interval excludes 0)" in text and "not distinguishable" not in text
        assert (worst.paired.low, worst.paired.high) == (pytest.approx(mine["low"], rel=1e-9),
                                                         pytest.approx(mine["high"], rel=1e-9))
        assert mine["high"] < 0  # ε 0.25 is 5 points better: ranked first, ε 0 behind it
    else:
        count = max(worst.seeds_within, worst.seeds_differ)
        assert f"undecided: about {count} seeds would decide it" in text
        assert worst.seeds_within >= mine["within"]  # never fewer than Owen's exact power needs ...
        assert worst.seeds_within <= mine["within"] + 1 and worst.seeds_differ == mine["differ"]  # ... nor many more
    assert worst.detectable == pytest.approx(mine["detectable"], rel=1e-6)
    assert "evidence of a difference" not in text  # with --margin the verdicts are within / differs / undecided


def test_margin_is_refused_in_one_line_before_anything_is_written(tmp_path: Path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    for value in ("0", "-2", "nan", "inf", "100", "250"):  # 100 points or more: every accuracy difference is within
        assert cli_main(["compare", "--margin", value, "--out", str(tmp_path / "page"), "--no-mlflow"]) == 2
        err = capsys.readouterr().err.splitlines()[-1]  # after compare's progress line
        assert err.startswith(f"debias compare: --margin {float(value):g}; allowed: a number of points above 0 and "
                              "below 100"), err
    assert not (tmp_path / "page").exists()


def test_compare_names_the_experiments_of_other_commits_and_all_commits_compares_them(tmp_path: Path,
                                                                                    monkeypatch) -> None:
    """After a new commit DVC shows the current commit's experiments only: compare says how many of the others it
    leaves out and how to show them; --all-commits asks DVC for every commit's (``dvc exp show -A``) and compares
    those with experiments, saying that their code may differ."""
    import debias.tools.compare as compare_module
    from debias.tools.compare import collect

    head, old, bare = "a" * 40, "b" * 40, "c" * 40
    now = sweep_runs({0.0: [30.8, 50.0, 76.9]}, {0.0: [84.0, 78.6, 92.1]})
    earlier = sweep_runs({0.25: [0.0, 50.0, 63.2]}, {0.25: [77.4, 83.1, 91.5]})
    for i, run in enumerate(now + earlier):
        run.rev = f"{i:040d}"
    baselines = [Experiment(name, "baseline", {"seed": 0}, {}, "no results", rev=rev) for name, rev in
                 (("main", head), ("b" * 7, old), ("c" * 7, bare))]
    by_commit = {head: [(e.name, e.rev) for e in now], old: [(e.name, e.rev) for e in earlier]}
    asked: list[bool] = []

    def from_dvc(root: Path, all_commits: bool = False) -> list[Experiment]:
        asked.append(all_commits)
        return [baselines[0], *now] + ([*baselines[1:], *earlier] if all_commits else [])

    monkeypatch.setattr(collect, "from_dvc", from_dvc)
    monkeypatch.setattr(collect, "experiments_by_commit", lambda root: by_commit)
    monkeypatch.setattr(compare_module, "head_commit", lambda root: head)
    monkeypatch.setenv("DEBIAS_TRACKING", "off")

    comparison, written, text = compare_module.compare(tmp_path, mlflow=False, out=tmp_path / "page")
    assert asked == [False] and {e.name for e in comparison.experiments} == {e.name for e in now}
    assert comparison.other_commits == {old[:7]: [e.name for e in earlier]}
    message = ("3 experiments of 1 other commit are not shown (DVC lists this commit's experiments only): `debias "
               "compare --all-commits` compares them too, `dvc exp show -A` lists them")
    assert message in flat(text) and message in flat(written["md"].read_text(encoding="utf-8"))
    with pytest.raises(ValueError, match="3 experiments of other commits are not shown: --all-commits compares them"):
        compare_module.compare(tmp_path, mlflow=False, out=tmp_path / "page", param_filters=["loss.epsilon=0.25"])

    comparison, _, text = compare_module.compare(tmp_path, mlflow=False, out=tmp_path / "page", all_commits=True)
    assert asked == [False, False, True] and comparison.other_commits == {}
    assert {e.name for e in comparison.experiments} == {e.name for e in now + earlier}
    assert "main" in {e.name for e in comparison.without_results} and "c" * 7 not in flat(text)
    assert "--all-commits: experiments of 2 commits compared together; the code may differ between commits" in flat(text)
    assert "--all-commits: 1 commit without experiments left out" in flat(text)
    assert len(comparison.differences) == 1  # ε 0.25 (the earlier commit's) against ε 0, paired by seed

    with pytest.raises(ValueError, match="^--all-commits reads DVC's experiments of every commit; allowed with "
                                         "--source dvc or both"):
        compare_module.compare(tmp_path, source="mlflow", all_commits=True, mlflow=False, out=tmp_path / "page")


def test_a_failing_experiment_list_is_said_and_compare_goes_on(tmp_path: Path, monkeypatch) -> None:
    import debias.tools.compare as compare_module
    from debias.tools.compare import collect

    def broken(root: Path) -> dict:
        raise RuntimeError("no git here")

    runs = sweep_runs(README_WORST, README_UNBIASED)
    monkeypatch.setattr(collect, "from_dvc", lambda root: runs)
    monkeypatch.setattr(collect, "experiments_by_commit", broken)
    monkeypatch.setenv("DEBIAS_TRACKING", "off")
    _, _, text = compare_module.compare(tmp_path, mlflow=False, out=tmp_path / "page")
    assert "note: other commits' experiments not counted (`dvc exp list -A` failed: RuntimeError: no git here)" in flat(text)


@pytest.mark.slow
def test_readmes_sweep_on_the_page_shows_both_metrics_with_power_and_seeds(tmp_path: Path) -> None:
    runs = sweep_runs(README_WORST, README_UNBIASED, WORST_N)
    comparison = compare_data.build_comparison(runs, runs)
    for run in comparison.experiments:
        run.load_notes()
    md = compare_page.write_page(comparison, tmp_path / "page")["md"].read_text(encoding="utf-8")
    for values, label in ((README_WORST, "stage-2 worst-group"), (README_UNBIASED, "stage-2 unbiased")):
        mine = independent([a - b for a, b in zip(values[0.25], values[0.0])])
        which = "equivalence; a difference" if mine["within"] >= mine["differ"] else "a difference; equivalence"
        other = min(mine["within"], mine["differ"])
        row = (f"| {label} | {mine['mean']:+.1f} | {mine['mean']:+.1f} [{mine['low']:+.1f}, {mine['high']:+.1f}] | "
               f"not distinguishable: 3 seeds detect ≥ {mine['detectable']:.1f} points | {mine['detectable']:.1f} | "
               f"about {max(mine['within'], mine['differ'])} seeds ({which}: about {other} seeds) |")
        assert row in md, row
    assert "| 25.0 points (n = 4) |" in md and "seeds to decide ±2 points" in md
    assert not any(math.isnan(v.detectable) for d in comparison.differences for v in d.verdicts)


@pytest.mark.slow
def test_all_commits_in_a_real_dvc_repository(tmp_path: Path, monkeypatch) -> None:
    """For real: an experiment of the first commit, then a new commit. compare counts it as left out and names
    --all-commits; with it, `dvc exp show -A` brings it back."""
    import os
    import subprocess

    from debias.tools.compare import compare
    from tests.test_compare import RUN, TWO_STAGES

    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    monkeypatch.setenv("DEBIAS_TRACKING", "off")

    def sh(*command: str) -> None:
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}: {done.stdout}{done.stderr}"

    (tmp_path / "params.yaml").write_text("seed: 0\nerm:\n  lr: 0.1\nstage2:\n  epochs: 2\n")
    (tmp_path / "run.py").write_text(RUN)
    (tmp_path / "dvc.yaml").write_text(TWO_STAGES)
    for command in (("git", "init", "-q"), ("dvc", "init", "-q"), ("dvc", "config", "core.analytics", "false"),
                    ("git", "add", "-A"), ("git", "commit", "-qm", "pipeline"), ("dvc", "repro", "-q"),
                    ("git", "add", "-A"), ("git", "commit", "-qm", "results"),
                    ("dvc", "exp", "run", "-q", "-n", "earlier-seed1", "-S", "seed=1")):
        sh(*command)
    (tmp_path / "notes.txt").write_text("a new commit\n")
    sh("git", "add", "notes.txt")
    sh("git", "commit", "-qm", "a new commit")

    monkeypatch.chdir(tmp_path)
    comparison, _, text = compare(tmp_path, mlflow=False, out=tmp_path / "page")
    assert "earlier-seed1" not in {e.name for e in comparison.experiments}
    assert "1 experiment of 1 other commit is not shown" in flat(text) and "--all-commits" in flat(text)
    comparison, _, text = compare(tmp_path, mlflow=False, out=tmp_path / "page", all_commits=True)
    assert "earlier-seed1" in {e.name for e in comparison.experiments} and "is not shown" not in flat(text)


def test_a_p_value_below_what_three_decimals_show_reads_p_below_0_001() -> None:
    assert compare_terminal.p_text(0.0001) == "p < 0.001"  # not "p = 0.000", which reads as impossible
    assert compare_terminal.p_text(0.0006) == "p = 0.001"
    assert compare_terminal.p_text(0.0123) == "p = 0.012"
