"""The schedule study (benchmarks/schedule_search/): inputs refused before any work, the decision read from the kept
epochs' validation numbers alone by its rule, the decline located on the aligned or conflicting images, the page."""

from __future__ import annotations

import pytest

from benchmarks.cells import Cell, digits_cell
from benchmarks.schedule_search import page, rule, runner
from debias.metrics.paired import seeds_needed

EPOCH_FIELDS = ("val_unbiased", "val_aligned", "val_conflicting", "val_worst")


def cell_for(regime: str, i: int, phase: str = "validation") -> Cell:
    seed = (rule.VALIDATION_SEED if phase == "validation" else rule.HELDOUT_SEED) + i
    return digits_cell(seed) if regime == "digits" else Cell("mnist10k-A", regime, "paper", seed)


def run_rows(phase: str, cell: Cell, candidate: str, curve: list[float], conflicting_drop: float = 0.0) -> list[dict]:
    """One run's rows: validation unbiased ``curve`` per epoch (fractions), its kept epoch the best."""
    kept = max(range(len(curve)), key=lambda e: (curve[e], -e))
    return [{"phase": phase, "regime": rule.regime_of(cell), "data": cell.data, "protocol": cell.protocol,
             "strength": f"{cell.strength:g}", "palette": cell.palette, "seed": str(cell.seed),
             "candidate": candidate, "epoch": str(e), "kept": str(int(e == kept)), "val_unbiased": f"{u:.4f}",
             "val_aligned": "0.9900", "val_conflicting": f"{u - conflicting_drop * e:.4f}",
             "val_worst": f"{u - 0.3:.4f}", "test_unbiased": f"{u:.4f}", "test_worst": f"{u - 0.3:.4f}",
             "train_ce": "0.1000", "train_contrastive": "2.0000", "val_spread": "0.5000",
             "cpu_seconds": "10.0" if candidate != "half" else "5.0", "threads": "1", "jobs": "2", "rev": "abc",
             "data_sha": "d", "date": "2026-12-02", "key": f"k{cell}{candidate}"}
            for e, u in enumerate(curve)]


def study(shift: dict[str, dict[str, float]], sizes: dict[str, int], phase: str = "validation",
          decline: float = 0.03) -> list[dict]:
    """Every regime's cells: the base declines by ``decline`` per epoch; each candidate's kept epoch is the base's
    plus ``shift[candidate][regime]`` (fractions), with a small per-cell wobble."""
    rows = []
    for regime, n in sizes.items():
        for i in range(n):
            cell, wobble = cell_for(regime, i, phase), 0.004 * ((i % 3) - 1)
            rows += run_rows(phase, cell, "constant", [0.9, 0.9 - decline, 0.9 - 2 * decline], decline / 2)
            for candidate in ("decay", "half"):
                top = 0.9 + shift.get(candidate, {}).get(regime, 0.0) + wobble
                rows += run_rows(phase, cell, candidate, [top - 0.01, top, top - 0.005])
    return rows


SIZES = {"digits": 6, "cmnist": 5, "bmnist": 5}


def test_bad_inputs_are_refused_before_any_work(tmp_path, capsys) -> None:
    workdir = tmp_path / "work"
    assert runner.main(["--workdir", str(workdir)]) == 2
    assert "--npz is required" in capsys.readouterr().err and not workdir.exists()
    assert runner.main(["--npz", str(tmp_path / "none.npz"), "--workdir", str(workdir)]) == 2
    assert "--npz" in capsys.readouterr().err and not workdir.exists()
    assert runner.main(["--stop-at", "18:05", "--workdir", str(workdir)]) == 2
    assert "--stop-at '18:05': an ISO time with its zone" in capsys.readouterr().err and not workdir.exists()
    assert runner.main(["--collect-only", "--out", str(tmp_path / "results")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_a_schedule_shown_better_in_one_regime_and_worse_in_none_becomes_the_default() -> None:
    rows = study({"decay": {"bmnist": 0.03}}, SIZES)
    winner, verdicts = rule.decide(rows, SIZES)
    assert winner == "decay" and verdicts["decay"].startswith("qualifies: shown better in bmnist")
    assert verdicts["half"].startswith("stays out: shown better in no regime")


def test_shown_worse_anywhere_or_an_unfinished_regime_keeps_the_base() -> None:
    worse = study({"decay": {"bmnist": 0.03, "digits": -0.03}}, SIZES)
    assert rule.decide(worse, SIZES) == ("constant", {
        "decay": "stays out: shown worse in digits (shown better in bmnist)",
        "half": "stays out: shown better in no regime (and worse in none)"})
    unfinished = study({"decay": {"bmnist": 0.03}}, {**SIZES, "cmnist": 4})
    winner, verdicts = rule.decide(unfinished, SIZES)
    assert winner == "constant" and verdicts["decay"] == "undecided: the validation cells of cmnist did not all finish"


def test_the_decision_reads_no_test_column_and_no_held_out_cell() -> None:
    rows = study({"decay": {"bmnist": 0.03}}, SIZES)
    scrambled = [{**r, "test_unbiased": "0.0000", "test_worst": "1.0000"} for r in rows]
    heldout = study({"half": {"bmnist": 0.05}}, SIZES, phase="heldout")
    assert rule.decide(scrambled + heldout, SIZES) == rule.decide(rows, SIZES)


def test_the_cells_are_sized_from_the_searchs_paired_sd_and_are_fresh() -> None:
    search = []
    for regime, step in (("digits", 0.02), ("cmnist", 0.01), ("bmnist", 0.03)):
        for i in range(6):
            for candidate, value in zip(rule.SIZING, (0.9, 0.9 + step * ((i % 3) - 1))):
                search.append({"phase": "confirm", "regime": regime, "rule": "best_unbiased", "candidate": candidate,
                               "data": "digits", "protocol": "cmnist", "palette": "paper", "seed": str(i),
                               "strength": "0.96", "val_unbiased": str(value)})
    sizes = rule.cells_needed(search)
    assert sizes["bmnist"] == seeds_needed(rule.sizing_sd(search, "bmnist"), delta=rule.DETECT) > sizes["cmnist"]
    assert sizes["cmnist"] == rule.FLOOR  # a small sd: the floor
    chosen = rule.validation_cells(sizes)
    assert [rule.regime_of(c) for c in chosen[:3]] == list(rule.REGIMES)
    assert len(chosen) == sum(sizes.values()) and min(c.seed for c in chosen) >= rule.VALIDATION_SEED
    assert not {c.data for c in rule.heldout_cells()} & {"mnist10k-A"}


def test_the_page_locates_the_decline_and_says_what_removes_it() -> None:
    floor = {regime: rule.FLOOR for regime in rule.REGIMES}  # no search rows: every regime sized at the floor
    rows = study({"decay": {"bmnist": 0.03}}, floor) + study({}, {"bmnist": 3}, phase="heldout")
    text = page.markdown(rows, [], "python -m benchmarks.schedule_search --collect-only")
    bmnist = next(line for line in text.splitlines() if line.startswith("- bmnist: `constant`'s last epoch"))
    assert "-6.0 [-6.0, -6.0] points unbiased (a decline, removed by `decay`, `half`" in bmnist
    assert "bias-aligned +0.0 [+0.0, +0.0], bias-conflicting -9.0 [-9.0, -9.0]" in bmnist
    assert "its last trails the kept one by -6.0 [-6.0, -6.0]" in bmnist
    assert "**Default: `decay`**" in text and "## Held-out" in text and "| bmnist | decay | 3 |" in text
    assert "validation digits 8 of 8, cmnist 8 of 8, bmnist 8 of 8; held-out bmnist 3" in text


def test_a_run_becomes_one_row_per_epoch_with_its_kept_epoch_marked() -> None:
    from benchmarks import cells

    history = [{"epoch": float(e), "val/unbiased": u, "val/worst_group": 0.1, "val/aligned": 0.9,
                "val/conflicting": 0.5, "test/unbiased": 0.8, "test/worst_group": 0.2, "train/ce": 0.3,
                "train/contrastive": 1.0, "val/spread": 0.4, "val/avg": u} for e, u in enumerate((0.8, 0.85, 0.82))]
    rows = runner.rows_of("validation", digits_cell(300), "decay", cells.RunResult(history, 12.0, 20.0, "k"),
                          {"threads": "1", "jobs": "2", "rev": "r", "data_sha": "d"})
    assert [r["kept"] for r in rows] == ["0", "1", "0"] and set(rows[0]) == set(rule.FIELDS)
    assert rows[1]["val_unbiased"] == "0.8500" and rows[0]["train_contrastive"] == "1.0000"
