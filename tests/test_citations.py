"""README and docs/ quote measured numbers only where the results files they name hold them, row and column, sign
included; params.yaml's comments and the params' sources too; all of them speak in the present.

The rules are tests/citations.py's (its docstring states them). Here: the repository as it is passes them; each kind
of error they exist to catch, planted in a copy of a real page or file, is reported; and the pieces behave as stated.
"""

from __future__ import annotations

import csv
import functools
import math
import re
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.citations import (CHANGE_HISTORY, HISTORY, RESULTS, Cell, Number, block_problems, history_phrases,
                             named_rows, quoted_numbers, quotes, stands_in, uncited_measurements,
                             unsourced_measurements, unsupported_numbers)
from tests.conftest import REPO

# ------------------------------------------------------------------------------------------------ the repository


def test_every_number_quoted_beside_a_results_file_stands_where_it_says() -> None:
    missing = unsupported_numbers(REPO)
    assert not missing, "\n".join(missing)


def test_every_measurement_names_its_results_file() -> None:
    """docs/benchmarks.md and docs/gpu.md quote measurements: each paragraph, item or table quoting a decimal names
    the results file that holds it, so the test above checks it."""
    found = uncited_measurements(REPO)
    assert not found, "\n".join(found)


def test_every_measured_number_outside_the_pages_names_its_results_file() -> None:
    """params.yaml's comments, the params' source lines and docstrings saying "measured": each number they quote stands
    in the results file they name; a source line naming a results file says "measured"."""
    found = unsourced_measurements(REPO)
    assert not found, "\n".join(found)


def test_docs_params_comments_and_sources_speak_in_the_present() -> None:
    """README.md, docs/, params.yaml's comments and sources.py's strings describe what is, not how it came to be."""
    found = history_phrases(REPO)
    assert not found, "\n".join(found)


@pytest.mark.parametrize("bad", [
    "runs as before", "is no longer needed", "the earlier default", "once produced a 28 MB message",
    "no GPU was lent to this work", "each process now takes", "(before: Eq. 10)", "measured so far", "(not run yet)",
    "What a training step does now", "on an H100 with an older training step", "; before, it was silently skipped",
    "no preset has been run end to end here yet", "the default was q3 before this search changed it",
    "until this commit", "the default was switched to CNC", "the search replaced the objective",
    "epsilon 0.25 was dropped from the default", "the defaults were changed by the search"])
def test_a_history_phrase_is_found(bad: str) -> None:
    assert HISTORY.search(bad) or CHANGE_HISTORY.search(bad), bad


@pytest.mark.parametrize("fine", [
    "a new Python process", "waits until the end", "the previous epoch's head", "the epoch's sum so far",
    "the pid now belongs to another program", "validation peaks before the first lr drop",
    "looser tolerances changed them", "each kept an epoch before it", "the default data's weaker bias",
    "the search's starting default"])
def test_present_tense_prose_is_no_history(fine: str) -> None:
    assert not HISTORY.search(fine) and not CHANGE_HISTORY.search(fine), fine


# ------------------------------------------------------------------------------------------------ planted errors

def copy_repo(tmp_path: Path) -> Path:
    """A copy of what the check reads: README.md, docs/, benchmarks' results and notes, params.yaml and the params'
    sources (the copy's src/ holds no other module, so its docstrings are not read)."""
    for part in ("README.md", "docs", RESULTS, "benchmarks/LOSSES_PERF.md", "params.yaml",
                 "src/debias/schema/sources.py"):
        source, target = REPO / part, tmp_path / part
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            shutil.copytree(source, target, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(source, target)
    return tmp_path


# What each check reports on an unchanged copy: every copy holds the same files, so it is computed once per check
# (its function and pages) and kept, where no problem names the copy's folder.
_BEFORE: dict[tuple[str, tuple[str, ...]], frozenset[str]] = {}


def reported_before(repo: Path, check: Callable[[Path], list[str]]) -> frozenset[str]:
    """What ``check`` reports on ``repo``, an unchanged :func:`copy_repo`: computed once per check and kept."""
    function = getattr(check, "func", check)
    key = (f"{function.__module__}.{function.__qualname__}", tuple(getattr(check, "keywords", {}).get("pages") or ()))
    if key not in _BEFORE:
        found = frozenset(check(repo))
        assert not any(str(repo) in problem for problem in found), found  # then another copy's would differ
        _BEFORE[key] = found
    return _BEFORE[key]


def planted(tmp_path: Path, path: str, old: str, new: str, check: Callable[[Path], list[str]]) -> list[str]:
    """What ``check`` reports on a copy of the repository once ``old`` (found exactly once in ``path``) reads
    ``new``, that it did not report before."""
    repo = copy_repo(tmp_path)
    target = repo / path
    text = target.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"{path} no longer holds {old!r} once: plant the error elsewhere"
    before = reported_before(repo, check)
    target.write_text(text.replace(old, new), encoding="utf-8")
    return [problem for problem in check(repo) if problem not in before]


PAGE_ERRORS = {
    # a flipped sign: a mean and its interval, an interval's bound, a mean with its spread, a cell of a table
    "sign of a mean and its interval": (
        "README.md", "-0.1 points, 95 % interval [-1.0, +0.9]",
        "+0.1 points, 95 % interval [-0.9, +1.0]", "0.1 (-0.9, 1.0) not in"),
    "sign of an interval's bound": (
        "docs/methods.md", "by -1.7 [-2.9, -0.6] points", "by -1.7 [-2.9, +0.6] points", "-1.7 (-2.9, 0.6) not in"),
    "sign of a mean with its spread": (
        "docs/benchmarks.md", "(the farthest: −2.0 ± 1.8)", "(the farthest: 2.0 ± 1.8)", "2.0 (1.8) not in"),
    "sign in a table": (
        "docs/benchmarks.md", "| 68.5 ± 3.3 | -2.8 ± 4.9 (2/3) |", "| 68.5 ± 3.3 | 2.8 ± 4.9 (2/3) |",
        "2.8 (4.9) not in row 'bmnist_096 | CNC (groups: UMAP + KMeans)'"),
    # another row's numbers under a row's name
    "another row of a results table": (
        "docs/benchmarks.md",
        "| cmnist_096 | SupCon | 68.9 ± 0.6 | 68.7 ± 1.1 | 15.9 ± 11.4 | 0.652 ± 0.124 | 0.979 ± 0.156 |",
        "| cmnist_096 | SupCon | 65.5 ± 0.1 | 65.4 ± 0.4 | 12.8 ± 10.2 | 0.615 ± 0.052 | 1.381 ± 0.076 |",
        "65.5 (0.1) not in row 'cmnist_096 | SupCon'"),
    "another seed's CSV row": (
        "docs/benchmarks.md", "| 0 | 73.0 | 25.0 | 57.6 min |", "| 0 | 67.8 | 10.0 | 18.7 min |",
        "67.8 not in fullsize_protocol.md, fullsize_protocol.csv row eps_supinfonce_fairkl_true seed 0"),
    # another column of the same row
    "another column of a results table": (
        "docs/benchmarks.md", "| cmnist_096 | SupCon | 68.9 ± 0.6 | 68.7 ± 1.1 |",
        "| cmnist_096 | SupCon | 68.7 ± 1.1 | 68.9 ± 0.6 |",
        "68.7 (1.1) not in row 'cmnist_096 | SupCon', column 'test avg'"),
    "another column named in prose": (
        "docs/benchmarks.md", "FairKL unbiased 85.4 ± 2.3 (true)", "FairKL unbiased 85.5 ± 2.1 (true)",
        "85.5 (2.1) not in quality.md under a 'unbiased' header"),
    "another column under a page table's header": (
        "docs/benchmarks.md", "| 0 | 73.0 | 25.0 | 57.6 min |", "| 0 | 25.0 | 73.0 | 57.6 min |",
        "25.0 not in fullsize_protocol.md, fullsize_protocol.csv row eps_supinfonce_fairkl_true seed 0 under a "
        "'unbiased' header"),
    # a number after /, = or ×: a result unless a parameter's name stands before it
    "a number after /": ("README.md", "48.4 / 27.7 s", "48.4 / 17.7 s", "README.md: 17.7 not in"),
    "a number after =": (
        "docs/gpu.md", "timed beside it, 48.4 / 27.7 s",
        "timed beside it, first = 48.4 s, rerun = 17.7 s",
        "docs/gpu.md: 17.7 not in repro_time_default.md"),
    "a number after ×": (
        "docs/gpu.md", "bf16 autocast gave 1.27x the steps per second",
        "bf16 autocast gave ×1.37 the steps per second",
        "docs/gpu.md: 1.37 not in speed_settings.md"),
    # words for ratios are numbers
    "a ratio word": (
        "docs/gpu.md", "bf16 autocast gave 1.27x the steps per second", "bf16 autocast gave twice the steps per second",
        "'twice' (a ratio word) is no ratio speed_settings.md"),
    # a quote tied to its row, its regime, its verdict; counts, clock times and both ends of a range
    "two numbers swapped between the rows their clauses name": (
        "docs/methods.md", "-0.2 [-0.6, +0.1] points\nunbiased (TOST p < 0.001; those cells detect 0.5) and -3.4 "
        "[-7.9, +1.2] worst-group; ERM predictions at ε 0.5 (row\n`cnc-q3m8-pred-shrink-e0.5`) trail the default by "
        "+1.1 [+0.5, +1.6]",
        "+1.1 [+0.5, +1.6] points\nunbiased (TOST p < 0.001; those cells detect 0.5) and -3.4 [-7.9, +1.2] "
        "worst-group; ERM predictions at ε 0.5 (row\n`cnc-q3m8-pred-shrink-e0.5`) trail the default by -0.2 "
        "[-0.6, +0.1]",
        "-0.2 (-0.6, 0.1) not in default_search.md row cnc-q3m8-pred-shrink-e0.5"),
    "a value of another row of the file, the block naming both": (
        "docs/methods.md", "(row `fairkl-released`) by -6.9 [-8.3, -5.5]",
        "(row `fairkl-released`) by -2.8 [-4.0, -1.6]", "-2.8 (-4.0, -1.6) not in default_search.md row fairkl-released"),
    "within a margin called outside it": (
        "docs/methods.md", "is within ±1 point of it", "is outside ±1 point of it",
        "-0.2 (-0.6, 0.1) is not outside ±1 point"),
    "values swapped between regimes": (
        "docs/methods.md", "is 1.65\n(digits), 1.96 (CMNIST*)", "is 1.96\n(digits), 1.65 (CMNIST*)",
        "1.96 not in default_search.md under digits"),
    "a count": ("docs/methods.md", "in 57 of 81 runs", "in 75 of 81 runs", "75 (81) not in default_search.md"),
    "a clock time": ("README.md", "8:00 to 24:56", "8:00 to 28:17", "README.md: 28:17 not in suite_time.md"),
    "a range's first end": (
        "README.md", "57 to 90 s", "39 to 90 s", "README.md: the range 39 to 90 is no one column's or paragraph's "
        "of suite_time.md"),
}


@pytest.mark.parametrize("kind", PAGE_ERRORS)
def test_a_number_planted_in_a_page_is_reported(kind: str, tmp_path: Path) -> None:
    path, old, new, expected = PAGE_ERRORS[kind]
    found = planted(tmp_path, path, old, new, functools.partial(unsupported_numbers, pages=[path]))
    assert any(expected in problem for problem in found), (kind, found)


def test_a_history_phrase_planted_in_a_page_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "docs/methods.md", "## Metrics\n",
                    "## Metrics\n\nThe default was `q3` before this search changed it.\n", history_phrases)
    assert [problem.split(": ", 1)[1] for problem in found] == ["'before this'", "'search changed'"], found


def test_a_history_phrase_planted_in_a_params_comment_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "params.yaml", "eager: the CPU path, as fast as the step not split for capture",
                    "eager: the CPU path, its steps/s as before the step was split for capture", history_phrases)
    assert len(found) == 1 and found[0].startswith("params.yaml:") and found[0].endswith("'as before'"), found


def test_a_history_phrase_planted_in_a_source_line_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "src/debias/schema/sources.py", '"ours: off (default false): torch.compile measured',
                    '"ours: off (default false) since this search: torch.compile measured', history_phrases)
    assert found == ["sources.py: stage2.speed.compile: 'since this'"], found


def test_a_source_line_quoting_a_results_file_without_saying_measured_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "src/debias/schema/sources.py", "torch.compile measured 0.99x steps/s",
                    "torch.compile gave 0.99x steps/s", unsourced_measurements)
    assert len(found) == 1 and found[0].startswith(
        "sources.py: stage2.speed.compile: names speed_settings_compile.md without saying measured"), found


def test_a_wrong_number_in_a_source_line_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "src/debias/schema/sources.py", "torch.compile measured 0.99x steps/s",
                    "torch.compile measured 0.89x steps/s", unsourced_measurements)
    assert len(found) == 1 and found[0].startswith("sources.py: stage2.speed.compile: 0.89 not in "
                                                   "speed_settings_compile.md"), found


def test_a_wrong_number_after_a_slash_in_a_params_comment_is_reported(tmp_path: Path) -> None:
    found = planted(tmp_path, "params.yaml", "2.13 / 1.78 / 1.11 steps/s", "2.13 / 1.78 / 1.41 steps/s",
                    unsourced_measurements)
    assert len(found) == 1 and found[0].startswith("params.yaml:") and " 1.41 not in " in found[0], found


# ------------------------------------------------------------------------------------------------ a CSV's rows

CSV_SENTENCE = re.compile(r"The CMNIST\* inferred seeds spread by\s+16 points \(`fairkl_released\.csv`, "
                          r"rows `cmnist_096 eps_supinfonce_fairkl_cluster`: 52\.8 to 68\.5\)\.")


def csv_block() -> str:
    """A real sentence of docs/methods.md citing a CSV and naming its rows."""
    match = CSV_SENTENCE.search((REPO / "docs/methods.md").read_text(encoding="utf-8"))
    assert match, "docs/methods.md no longer cites fairkl_released.csv's rows so: point this test at another"
    return match.group(0)


def accepted(block: str, files: list[Path]) -> set[str]:
    """The one-decimal numbers from 0.0 to 100.0 that the check accepts in place of ``block``'s 68.5."""
    return {f"{x / 10:.1f}" for x in range(1001)
            if not block_problems("page", block.replace("68.5", f"{x / 10:.1f}"), files, named_rows(block))}


def test_a_csv_cited_without_a_row_holds_no_number() -> None:
    """A CSV holds so many values (fractions read in %, seconds in minutes) that nearly any number stands somewhere in
    it: a block citing one without naming a row has none of its numbers stand there."""
    files = [REPO / RESULTS / "fairkl_released.csv"]
    block = csv_block().replace(", rows `cmnist_096 eps_supinfonce_fairkl_cluster`", "")
    assert [p.split(": ")[1] for p in block_problems("page", block, files)] == [
        "52.8 not in fairkl_released.csv ('The CMNIST* inferred seeds spread by')",
        "68.5 not in fairkl_released.csv ('The CMNIST* inferred seeds spread by')"]
    assert accepted(block, files) == set()


@pytest.mark.slow
def test_a_csv_row_named_holds_only_its_own_values() -> None:
    """With its rows named, a CSV accepts only the values of those rows: as printed, in % or rounded (the check let 719
    of these 1,001 numbers through when any row counted)."""
    path = REPO / RESULTS / "fairkl_released.csv"
    block = csv_block()
    assert not block_problems("page", block, [path], named_rows(block))
    values = set()
    with path.open(encoding="utf-8") as handle:
        for row in csv.DictReader(handle):
            if row["method"] == "eps_supinfonce_fairkl_cluster" and row["setting"] == "cmnist_096":
                for value in row.values():
                    try:
                        v = float(value)
                    except ValueError:
                        continue
                    for reading in (v, v * 100) if 0 <= v <= 1 else (v,):
                        values |= {f"{round(reading, 1):.1f}", f"{math.floor(reading * 10 + 0.5) / 10:.1f}"}
    found = accepted(block, [path])
    assert "68.5" in found and found <= values and len(found) < 50, sorted(found - values)


# ------------------------------------------------------------------------------------------------ the pieces

@pytest.mark.parametrize("text, expected", [
    ("worst-group 29.7 ± 5.9 at α 0.03, λ 0.75 (`loss.alpha=0.03`), torch 2.15.0", ["29.7", "5.9"]),
    ("p_corr 0.995, ρ 0.997: 1,353.5 MiB and −1.3 points", ["1353.5", "-1.3"]),
    ("47–55 min of 3 epochs, 1,353 MiB, 65 % at ≥ 60 % worst-group, 5 seeds, 5,999 images",
     ["47", "55", "1353", "65"]),
    ("174 s (2.9 min) measured, 97–99 % idle, 5× faster", ["174", "2.9", "97", "99", "5"]),
    ("75.2 / 57.7 s, rerun = 28.4 s, ×1.27, q = 0.7, lr ×0.1, -S stage2.weight_decay=0.00001",
     ["75.2", "57.7", "28.4", "1.27"]),
    ("+3.0 [+0.2, +5.7] at a seventh of its cost, twice as fast, three times, half the time",
     ["3.0", "0.2", "5.7", "'a seventh'", "'twice'", "'three times'", "'half'"]),
    ("8:00 to 13:48, 42 to 68 s, 57 of 81 runs at 1:02:03, from 184 to 131 s, 3.10.2",
     ["8:00", "13:48", "42", "68", "57", "81", "1:02:03", "184", "131"]),
    ("a tenth of the anchors, at most ten times its 23.5 s, the 65 % target, the target of 65, 95 % interval, "
     "the 0.96 settings, stage-2 times", ["23.5"]),
])
def test_quoted_numbers_are_results_not_settings(text: str, expected: list[str]) -> None:
    assert [n.printed for n in quoted_numbers(text)] == expected


def test_a_mean_and_its_spread_or_interval_are_one_quote() -> None:
    text = "worst-group 29.7 ± 5.9; by +3.0 [+0.2, +5.7] and paired -14.8 points, 95 % interval [-53.1, +23.4]: 12.5"
    assert [(q.printed, q.column) for q in quotes(text)] == [
        ("29.7 (5.9)", "worst"), ("3.0 (0.2, 5.7)", ""), ("-14.8 (-53.1, 23.4)", ""), ("12.5", "")]
    assert [q.column for q in quotes("88.0 % test unbiased, 47.8 % worst-group, average 30.7 to 34.0 %")] == [
        "unbiased", "worst", "avg", ""]


def number(printed: str, unit: str = "") -> Number:
    return quoted_numbers(printed + (f" {unit}" if unit else "") + " ")[0]


def test_a_number_stands_in_a_cell_as_printed_sign_included_or_rounded() -> None:
    md, fraction, seconds = Cell("a", "-3.0 [-5.7, -0.2]"), Cell("test_worst_group", "0.174"), Cell("s", "8790.0")
    assert stands_in(number("-3.0"), md, False) and not stands_in(number("3.0"), md, False)
    assert not stands_in(number("+3.0"), md, False) and stands_in(number("-0.2"), md, False)
    assert stands_in(number("17.4"), fraction, True) and stands_in(number("0.17"), fraction, True)
    assert not stands_in(number("17.5"), fraction, True) and not stands_in(number("-17.4"), fraction, True)
    assert stands_in(number("146.5", "min"), seconds, True) and not stands_in(number("146.5"), seconds, True)
    assert not stands_in(number("146.6", "min"), seconds, True)
    assert stands_in(number("27.4"), Cell("idle", "0.274"), False)  # a printed fraction read in %
    assert not stands_in(number("70.0"), Cell("epochs", "0.7"), False)  # ... not a one-digit setting


def write(tmp_path: Path, results: dict[str, str], page: str) -> Path:
    (tmp_path / RESULTS).mkdir(parents=True, exist_ok=True)
    (tmp_path / "docs").mkdir(exist_ok=True)
    for name, text in results.items():
        (tmp_path / RESULTS / name).write_text(text, encoding="utf-8")
    (tmp_path / "README.md").write_text(page, encoding="utf-8")
    return tmp_path


def test_a_table_cites_the_files_of_the_paragraph_before_it(tmp_path: Path) -> None:
    results = {"x.md": "| 49.7 |\n"}
    assert not unsupported_numbers(write(tmp_path, results, "Measured (`benchmarks/results/x.md`):\n\n| a |\n|---|\n"
                                                            "| 49.7 |\n"))
    assert unsupported_numbers(write(tmp_path, results, "Measured (`benchmarks/results/x.md`):\n\n| a |\n|---|\n"
                                                        "| 49.8 |\n")) == ["README.md: 49.8 not in x.md ('| 49.8 |')"]
    # a link to a page of the same name cites no results file; a results path naming no file is reported
    assert not unsupported_numbers(write(tmp_path, results, "See [x.md](docs/x.md):\n\n| a |\n|---|\n| 49.8 |\n"))
    assert unsupported_numbers(write(tmp_path, results, "See `benchmarks/results/y.md`.\n")) == [
        "README.md: benchmarks/results/y.md is no file ('See `benchmarks/results/y.md`.')"]


def test_a_number_moved_to_another_row_of_its_file_is_reported(tmp_path: Path) -> None:
    """A block naming its row (row `b`), and a page table whose header is its results table's: each number is checked
    against that row, not anywhere in the file."""
    results = {"x.md": "| run | worst |\n|---|---|\n| a | 49.7 |\n| b | 12.5 |\n"}
    table = "Measured (`benchmarks/results/x.md`):\n\n| run | worst |\n|---|---|\n| a | {} |\n| b | {} |\n"
    for page, bad in (("The run b gave 12.5 % (`benchmarks/results/x.md`, row `b`).\n", []),
                      ("The run b gave 49.7 % (`benchmarks/results/x.md`, row `b`).\n", ["49.7"]),
                      ("The run c gave 49.7 % (`benchmarks/results/x.md`, row `c`).\n", ["`c`"]),
                      (table.format("49.7", "12.5"), []),
                      (table.format("12.5", "49.7"), ["12.5", "49.7"])):
        found = unsupported_numbers(write(tmp_path, results, page))
        assert [re.search(r": (?:row )?(\S+)", line).group(1) for line in found] == bad, (page, found)


def test_the_intervals_of_one_clause_stand_in_one_named_row(tmp_path: Path) -> None:
    """In a block naming rows, one clause's intervals are one row's: "-3.0 [-5.7, -0.2]" stands in row `b`, but the
    clause's other interval is row `a`'s, so a sign flipped into another row's cell is reported."""
    results = {"d.md": "| candidate | Δ vs b | Δ worst vs b | Δ vs a |\n|---|---|---|---|\n"
                       "| a | +3.0 [+0.2, +5.7] | +7.6 [+1.6, +13.6] | — |\n"
                       "| b | — | — | -3.0 [-5.7, -0.2] |\n"}
    page = "Rows `a` and `b` (`benchmarks/results/d.md`): a leads b by {} (worst-group +7.6 [+1.6, +13.6]).\n"
    assert not unsupported_numbers(write(tmp_path, results, page.format("+3.0 [+0.2, +5.7]")))
    (found,) = unsupported_numbers(write(tmp_path, results, page.format("-3.0 [-5.7, -0.2]")))
    assert "one clause, intervals of different rows (-3.0 (-5.7, -0.2) in row b; 7.6 (1.6, 13.6) in row a)" in found


def test_a_ratio_word_stands_where_a_measured_ratio_is_nearest_to_it(tmp_path: Path) -> None:
    """A ratio word is the nearest word to a measured ratio: here the default's cost over the 30-epoch schedule's,
    0.81 / 5.71 = 0.142 (default_search_d1b5879.md's rows), a seventh; not a twentieth, a fifth or twice."""
    results = {"s.md": "| candidate | cells | cost over FairKL |\n|---|---|---|\n| q3 | 15 | 0.81 |\n"
                       "| shipped | 15 | 5.71 |\n| fairkl | 15 | 1.00 |\n"}
    page = "Rows `q3` and `shipped` (`benchmarks/results/s.md`): q3 costs {} of the 30-epoch schedule.\n"
    assert not unsupported_numbers(write(tmp_path, results, page.format("a seventh")))
    for word in ("a twentieth", "a fifth", "twice"):
        (found,) = unsupported_numbers(write(tmp_path, results, page.format(word)))
        assert found.startswith(f"README.md: {word!r} (a ratio word) is no ratio s.md row q3, shipped holds"), found


def test_a_count_stands_where_the_results_print_it_and_a_tally_of_rows_is_not_checked(tmp_path: Path) -> None:
    """"57 of 81" stands in a cell printing it; a count whose whole no cell prints ("2 of 3 seeds" over a table of
    seeds) is a tally of rows the check cannot read, and passes."""
    printed = {"x.md": "| run | kept |\n|---|---|\n| a | 57 of 81 |\n| b | 52 of 81 |\n"}
    page = "Kept in {} runs (`benchmarks/results/x.md`, row `a`).\n"
    assert not unsupported_numbers(write(tmp_path, printed, page.format("57 of 81")))
    assert unsupported_numbers(write(tmp_path, printed, page.format("52 of 81"))) == [
        "README.md: 52 (81) not in x.md row a ('Kept in 52 of 81 runs (`benchmarks/results/x.md`, row `a`).')"]
    seeds = {"x.md": "| seed | kept |\n|---|---|\n| 0 | 12.5 |\n| 1 | 49.7 |\n| 2 | 12.5 |\n"}
    assert not unsupported_numbers(write(tmp_path, seeds, "12.5 in 2 of 3 seeds (`benchmarks/results/x.md`).\n"))


def test_a_margin_word_is_checked_against_the_interval_unless_negated(tmp_path: Path) -> None:
    """"within ±1 point" holds when the interval lies inside ±1, "outside" when it lies beyond; "neither shown
    worse nor shown equivalent within ±1" says nothing a margin check could read."""
    results = {"d.md": "| candidate | Δ |\n|---|---|\n| a | -0.2 [-0.6, +0.1] |\n| b | -0.4 [-2.1, +1.3] |\n"}
    page = "Row `{}` is {} ±1 point of it: {} (`benchmarks/results/d.md`).\n"
    assert not unsupported_numbers(write(tmp_path, results, page.format("a", "within", "-0.2 [-0.6, +0.1]")))
    (found,) = unsupported_numbers(write(tmp_path, results, page.format("b", "within", "-0.4 [-2.1, +1.3]")))
    assert found.startswith("README.md: -0.4 (-2.1, 1.3) is not within ±1 point ("), found
    assert unsupported_numbers(write(tmp_path, results, page.format("a", "outside", "-0.2 [-0.6, +0.1]")))
    assert not unsupported_numbers(write(tmp_path, results, page.format(
        "b", "neither shown worse nor shown equivalent within", "-0.4 [-2.1, +1.3]")))
