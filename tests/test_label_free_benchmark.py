"""benchmarks/label_free_selection.py's table: each label-free rule's loss against the oracle, paired by seed."""

from __future__ import annotations

from benchmarks import label_free_selection as lfs


def row(seed: int, rule: str, epoch: int, worst_group: float) -> dict:
    return {"setting": "cmnist_096", "seed": seed, "method": "jtt", "rule": rule, "epoch": epoch,
            "test_worst_group": worst_group}


def test_the_loss_is_the_oracles_worst_group_minus_the_rules_paired_by_seed() -> None:
    rows = [row(0, "best_worst_group", 3, 0.70), row(0, "best_worst_class", 3, 0.70), row(0, "last", 7, 0.40),
            row(1, "best_worst_group", 2, 0.60), row(1, "best_worst_class", 5, 0.50), row(1, "last", 7, 0.50),
            row(2, "best_worst_group", 4, 0.80), row(2, "best_worst_class", 1, 0.90), row(2, "last", 7, 0.50)]
    text = lfs.table(rows, {"jtt": "JTT"})
    cells = [cell.strip() for cell in text.splitlines()[2].strip("|").split("|")]
    assert cells[:3] == ["cmnist_096", "JTT", "70.0 ± 10.0"]
    assert cells[3] == "0.0 ± 10.0 (1/3)"  # losses 0, 10, -10 points; seed 0 kept the oracle's epoch
    assert cells[4] == "n/a"  # no run recorded the inferred-group rule
    assert cells[5] == "23.3 ± 11.5 (0/3)"  # losses 30, 10, 30 (sample std)


def test_a_cell_with_fewer_seeds_says_how_many() -> None:
    text = lfs.table([row(0, "best_worst_group", 3, 0.7), row(0, "last", 3, 0.7)], {})
    assert "70.0 (n=1)" in text and "0.0 (n=1) (1/1)" in text
