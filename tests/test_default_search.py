"""The default-choice benchmarks (benchmarks/default_choice.py, benchmarks/default_search.py on benchmarks/cells.py):
inputs refused before any work, runs resumed only under the key of their data, code and params, results files
never half-written, tables rendered from any subset of candidates, finalists and the default chosen by the rules."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from tests.conftest import REPO


def load(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # the scripts import cells by name; dataclasses look their module up
    spec.loader.exec_module(module)
    return module


cells = load("cells")
choice = load("default_choice")
search = load("default_search")


@pytest.mark.parametrize("script", [choice, search])
def test_bad_inputs_are_refused_before_any_work(script, tmp_path, capsys) -> None:
    workdir = tmp_path / "work"
    assert script.main(["--npz", str(tmp_path / "none.npz"), "--workdir", str(workdir)]) == 2
    assert "--npz" in capsys.readouterr().err and not workdir.exists()  # nothing cloned, nothing trained
    (tmp_path / "broken.npz").write_bytes(b"not an npz")
    assert script.main(["--npz", str(tmp_path / "broken.npz"), "--workdir", str(workdir)]) == 2
    assert "not a readable .npz" in capsys.readouterr().err and not workdir.exists()
    npz = tmp_path / "ok.npz"
    import numpy as np

    np.savez(npz, x=np.zeros((2, 28, 28), np.uint8), y=np.zeros(2, int))
    assert script.main(["--npz", str(npz), "--workdir", str(workdir), "--jobs", "0"]) == 2
    assert "--jobs = 0: allowed: a whole number >= 1" in capsys.readouterr().err
    assert script.main(["--collect-only", "--out", str(tmp_path / "results")]) == 2
    err = capsys.readouterr().err
    assert "--collect-only: " in err and "does not exist" in err


def test_a_truncated_row_is_not_done_and_results_are_written_whole(tmp_path, capsys) -> None:
    path = tmp_path / "out.csv"
    fields = ["a", "b", "key"]
    cells.write_rows(path, fields, [{"a": 1, "b": 2, "key": "k1"}, {"a": 3, "b": 4, "key": "k2"}])
    path.write_text(path.read_text() + "5,6\n")  # an interrupted write's last line
    assert [r["key"] for r in cells.read_rows(path, fields)] == ["k1", "k2"]
    assert "1 incomplete row(s) dropped" in capsys.readouterr().err
    assert not list(tmp_path.glob("*.tmp"))
    with pytest.raises(cells.BenchmarkError, match="are not this script's"):
        cells.read_rows(path, ["other"])


def stub_workspace(tmp_path, name: str = "ws"):
    """A workspace whose stage-2 runner writes a fixed two-epoch history (no training)."""
    root = tmp_path / name
    (root / "benchmarks").mkdir(parents=True)
    (root / "benchmarks/stage2_epochs.py").write_text(
        "import json, sys\n"
        "path = sys.argv[sys.argv.index('--history') + 1]\n"
        "json.dump([{'epoch': e, 'val/unbiased': 0.5 + e / 10, 'val/worst_group': 0.2, 'test/avg': 0.6,"
        " 'test/unbiased': 0.55, 'test/worst_group': 0.3, 'test/worst_group_n': 20} for e in range(2)],"
        " open(path, 'w'))\n"
        "open(sys.argv[0] + '.calls', 'a').write('x')\n")
    return cells.Workspace(cells.digits_cell(0), root, key="workspace-key")


def test_a_run_is_reused_only_under_its_key(tmp_path) -> None:
    workspace = stub_workspace(tmp_path)
    calls = workspace.path / "benchmarks/stage2_epochs.py.calls"
    first = cells.train(workspace, "cand", {"loss.epsilon": 0.25}, "cluster", threads=1)
    again = cells.train(workspace, "cand", {"loss.epsilon": 0.25}, "cluster", threads=1)
    assert calls.read_text() == "x" and again.key == first.key and again.history == first.history
    assert first.date and first.cpu_seconds >= 0
    other = cells.train(workspace, "cand", {"loss.epsilon": 0.5}, "cluster", threads=1)  # other params: trained
    assert calls.read_text() == "xx" and other.key != first.key
    moved = cells.Workspace(workspace.cell, workspace.path, key="other-data-or-code")
    cells.train(moved, "cand", {"loss.epsilon": 0.5}, "cluster", threads=1)
    assert calls.read_text() == "xxx"


def fake_rows(values: dict[str, list[float]], phase: str, chosen, cpu: dict[str, float]) -> list[dict[str, str]]:
    rows = []
    for name, per_cell in values.items():
        for cell, value in zip(chosen, per_cell):
            for rule in search.RULES:
                rows.append({"phase": phase, "data": cell.data, "protocol": cell.protocol, "palette": cell.palette,
                             "seed": str(cell.seed), "candidate": name, "rule": rule, "epoch": "1", "degenerate": "0",
                             "val_unbiased": str(value), "val_worst": str(value - 0.3), "test_avg": str(value),
                             "test_unbiased": str(value), "test_worst": str(value - 0.3), "test_worst_n": "20",
                             "cpu_seconds": str(cpu[name]), "wall_seconds": "1", "key": f"{name}{cell}"})
    return rows


def test_finalists_and_the_default_follow_the_rules(tmp_path) -> None:
    """Eligible: at most COST_BUDGET x FairKL's CPU time; finalists: the best eligible, the simplest not shown
    worse, the best across ε = 0 and across the group source, the shipped default and FairKL; the default: the
    held-out winner or the simplest eligible finalist not shown worse."""
    every = search.candidates()
    n = len(search.SELECT_CELLS)
    best, close, eps0, pred = ("cnc-q3-cluster-replace-e0.25", "cnc-s30-cluster-replace-e0",
                               "cnc-q3-cluster-replace-e0", "cnc-q3-pred-replace-e0.25")
    spread = [0.001 * i for i in range(n)]
    values = {best: [0.90 + s for s in spread], close: [0.90 + s + (0.002 if i % 2 else -0.004) for i, s in enumerate(spread)],
              eps0: [0.80 + s for s in spread], pred: [0.70 + s for s in spread],
              search.SHIPPED: [0.95] * n, search.FAIRKL: [0.85 + s for s in spread]}
    cpu = {best: 60, close: 60, eps0: 62, pred: 60, search.SHIPPED: 240, search.FAIRKL: 40}
    rows = fake_rows(values, "select", search.SELECT_CELLS, cpu)
    assert not search.eligible(rows, "select", search.SHIPPED)  # 6x FairKL: measured, not chosen
    warned = {best: {"digits-cmnist-paper-s0": 2, "digits-cmnist-paper-s1": 0}}  # pools drawn with replacement
    assert search.eligible(rows, "select", best) and not search.eligible(rows, "select", best, warned)
    assert search.finalists(rows, every, warned)[0] == close  # the best that would not warn on the shipped data
    picks = search.finalists(rows, every)
    assert picks[:2] == [best, close] and pred in picks
    assert eps0 in picks  # the best one's twin at eps 0: what the margin does alone
    assert picks[-2:] == [search.SHIPPED, search.FAIRKL]
    held = fake_rows({name: [0.9 + 0.002 * i for i in range(len(search.HELDOUT_CELLS))] for name in picks},
                     "heldout", search.HELDOUT_CELLS, cpu)
    winner, default = search.decision(rows + held, picks, every)
    assert default == close  # tied with the winner: the fewest departures from the shipped default, then the cheapest
    text = search.markdown(rows + held, every, "python benchmarks/default_search.py ...",
                           {"threads": "1", "jobs": "2", "rev": "abc", "data": "123"})
    assert "## 1. Selection: validation numbers" in text and "## 2. Held-out cells: test numbers" in text
    assert f"the default (the winner or the simplest eligible finalist not shown worse on either number): **{close}**" in text


def test_the_objective_table_renders_without_cnc_among_the_candidates() -> None:
    """A run of a subset of candidates (no cnc) renders its tables (it crashed on an empty mean)."""
    chosen = [cells.Cell("mnist10k", "cmnist", "paper", s) for s in (0, 1, 2)]
    rows = []
    for name, base in (("kl_a1_l05", 0.8), ("released_a003_l05", 0.85)):
        for i, cell in enumerate(chosen):
            for rule in choice.RULES:
                rows.append({"protocol": cell.protocol, "palette": cell.palette, "seed": str(cell.seed),
                             "candidate": name, "rule": rule, "epoch": "3", "degenerate": "0", "val_worst": "0.4",
                             "val_unbiased": "0.8", "test_avg": "0.8", "test_unbiased": str(base + 0.01 * i),
                             "test_worst": str(base - 0.4 + 0.02 * i), "test_worst_n": "40", "cpu_seconds": "30",
                             "wall_seconds": "31", "date": "2026-11-28", "key": f"{name}{i}"})
    text = choice.table(rows, "python benchmarks/default_choice.py ...", {"threads": "1", "jobs": "2", "inputs": "x"})
    assert "Chosen under `best_unbiased`" in text and "## Stage-2 cost: CPU seconds" in text
    assert "- Runs: 2026-11-28; written" in text
    assert json.dumps(choice.candidate_sets("kl_a1_l05"))  # every candidate's params are JSON (they key its runs)
