"""The label-free selection rules: worst-class and worst-inferred-group validation accuracy, on hand-made curves
and through the real epoch loop; their numbers against a reference counted by hand; ERM's refusal of the rule that
needs inferred groups."""

from __future__ import annotations

import typing

import pytest
import torch
from torch import nn

from debias.params import ParamsError
from debias.schema import validate
from debias.params.optim import NEEDS_INFERRED_GROUPS, Selection
from debias.training.loop import FitResult, fit
from debias.training.outputs import selection_warnings
from debias.training.selection import (RULES, check_rule_for, describe_selection, label_free_scalars, picks_by_rule,
                                       selection_score)

# Per epoch: (worst-group, worst-class, worst-inferred-group) validation accuracy. The oracle keeps epoch 1,
# worst-class epoch 2, worst-inferred-group epoch 3 (and last epoch 4).
CURVES = [(0.1, 0.5, 0.2), (0.6, 0.4, 0.3), (0.3, 0.8, 0.4), (0.2, 0.7, 0.9), (0.2, 0.1, 0.1)]


def history(curves: list[tuple[float, float, float]] = CURVES, n: int = 40) -> list[dict[str, float]]:
    return [{"epoch": float(epoch), "val/worst_group": wg, "val/unbiased": 0.5, "val/avg": 0.5,
             "val/worst_group_n": float(n), "val/worst_class": wc, "val/mean_class": 0.5,
             "val/worst_class_n": float(n), "val/worst_inferred_group": wi, "val/mean_inferred_group": 0.5,
             "val/worst_inferred_group_n": float(n)} for epoch, (wg, wc, wi) in enumerate(curves)]


def best(rows: list[dict[str, float]], selection: str) -> int:
    """The epoch fit keeps: the first best score."""
    chosen = None
    for row in rows:
        if chosen is None or selection_score(row, selection) > selection_score(chosen, selection):
            chosen = row
    assert chosen is not None
    return int(chosen["epoch"])


def test_each_rule_keeps_its_own_epoch_where_they_disagree() -> None:
    rows = history()
    assert best(rows, "best_worst_group") == 1
    assert best(rows, "best_worst_class") == 2
    assert best(rows, "best_worst_inferred_group") == 3
    assert best(rows, "last") == 4
    assert picks_by_rule(rows) == {"last": 4, "best_worst_group": 1, "best_worst_class": 2,
                                   "best_worst_inferred_group": 3, "best_unbiased": 1}


def test_the_selection_block_names_the_rule_and_what_every_rule_would_have_kept() -> None:
    block = describe_selection(history(), 2, "best_worst_class")
    assert block["rule"] == "best_worst_class" and block["selected_epoch"] == 2
    assert block["picks"]["best_worst_group"] == 1 and block["picks"]["best_worst_inferred_group"] == 3
    assert block["reason"].startswith("best validation worst-class accuracy (validation worst-class 0.800")
    assert block["runner_up_epoch"] == 3 and block["runner_up_worst_class"] == 0.7
    assert block["won_by_images"] == 4 and not block["fragile"] and not block["degenerate"]  # 32 of 40 vs floor(28)
    inferred = describe_selection(history(), 3, "best_worst_inferred_group")
    assert inferred["runner_up_worst_inferred_group"] == 0.4 and "worst-inferred-group" in inferred["reason"]


def test_without_attributes_only_the_label_free_rules_are_replayed() -> None:
    rows = [{k: v for k, v in row.items() if "worst_group" not in k and k != "val/unbiased"
             and "inferred" not in k} for row in history()]
    assert picks_by_rule(rows) == {"last": 4, "best_worst_class": 2}
    with pytest.raises(ValueError, match=r"val/worst_inferred_group.*allowed here: last, best_worst_class"):
        selection_score(rows[0], "best_worst_inferred_group")


def test_ties_go_to_the_tie_breaks_then_the_earlier_epoch() -> None:
    rows = history([(0.1, 0.5, 0.5)] * 3)
    rows[2]["val/mean_class"] = 0.6  # same worst class, better class mean: kept
    rows[1]["val/mean_inferred_group"] = 0.6
    assert best(rows, "best_worst_class") == 2
    assert best(rows, "best_worst_inferred_group") == 1
    rows[1]["val/avg"] = 0.9  # class mean decides before the average does
    assert best(rows, "best_worst_class") == 2
    block = describe_selection(rows, 2, "best_worst_class")
    assert "epochs [0, 1, 2] tie on validation worst-class accuracy" in block["reason"]


def test_a_zero_worst_class_at_every_epoch_is_degenerate_and_one_image_is_fragile() -> None:
    zero = describe_selection(history([(0.5, 0.0, 0.5)] * 3), 0, "best_worst_class")
    assert zero["degenerate"] and "validation worst-class accuracy was 0 at every epoch (3)" in zero["reason"]
    assert "kept by validation class-mean accuracy" in zero["reason"]
    fragile = describe_selection(history([(0.5, 0.5, 0.2), (0.5, 0.5, 10 / 40), (0.5, 0.5, 11 / 40)]), 2,
                                 "best_worst_inferred_group")
    assert fragile["won_by_images"] == 1 and fragile["fragile"]
    result = FitResult(history=[], selected_epoch=2, selected_state={}, selection=fragile)
    (message,) = selection_warnings(result)
    assert message.startswith("fragile-selection: epoch 2 was kept by 1 validation image of its worst inferred group")


def test_label_free_numbers_against_a_count_by_hand() -> None:
    y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2, 2])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 2, 2, 2])  # class 0: 3/4, class 1: 1/2, class 2: 3/3
    group = torch.tensor([0, 0, 1, 1, 2, 4, 5, 5, 5])  # groups 0: 2/2, 1: 1/2, 2: 1/1, 4: 0/1, 5: 3/3; 3 empty
    out = label_free_scalars(pred, y, group)
    assert out["val/worst_class"] == 0.5 and out["val/worst_class_n"] == 2
    assert out["val/mean_class"] == pytest.approx((0.75 + 0.5 + 1.0) / 3, abs=1e-12)
    assert out["val/worst_inferred_group"] == 0.0 and out["val/worst_inferred_group_n"] == 1
    assert out["val/mean_inferred_group"] == pytest.approx((1 + 0.5 + 1 + 0 + 1) / 5, abs=1e-12)  # empty 3 skipped
    assert "val/worst_inferred_group" not in label_free_scalars(pred, y)
    with pytest.raises(ValueError, match="another split; rerun infer_groups"):
        label_free_scalars(pred, y, group[:3])


class Scripted:
    """A task whose training does nothing; validation returns the next row of hand-made numbers."""

    def __init__(self) -> None:
        self.model = nn.Linear(1, 1)

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def train_epoch(self, epoch: int) -> dict[str, float]:
        with torch.no_grad():
            self.model.bias.fill_(float(epoch))  # the weights say which epoch they are
        return {"train/loss": 1.0}

    def extra_state(self) -> dict:
        return {}

    def load_extra_state(self, state: dict) -> None:
        pass


@pytest.mark.parametrize(("selection", "epoch"), [("best_worst_group", 1), ("best_worst_class", 2),
                                                  ("best_worst_inferred_group", 3), ("last", 4)])
def test_the_epoch_loop_keeps_the_rules_epoch_and_its_weights(selection: str, epoch: int) -> None:
    rows = iter(history())
    task = Scripted()
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.1)
    result = fit(task, optimizer, len(CURVES), lambda: {k: v for k, v in next(rows).items() if k != "epoch"},
                 selection=selection)
    assert result.selected_epoch == epoch and result.selection["rule"] == selection
    assert float(result.selected_state["model"]["bias"]) == epoch
    assert result.selection["picks"] == {"last": 4, "best_worst_group": 1, "best_worst_class": 2,
                                         "best_worst_inferred_group": 3, "best_unbiased": 1}
    # every other rule's model is kept with its own epoch's weights (also where the selection moved on from it)
    assert sorted(result.pick_states) == sorted({1, 2, 3, 4} - {epoch})
    assert all(float(state["model"]["bias"]) == e for e, state in result.pick_states.items())


def test_a_resumed_loop_keeps_the_rules_weights_of_the_epochs_before_the_interruption(tmp_path) -> None:
    rows = history()
    calls = iter(range(100))

    def validate(stop_at: int | None):
        def numbers() -> dict[str, float]:
            i = next(calls)
            if i == stop_at:
                raise KeyboardInterrupt
            return {k: v for k, v in rows[i % len(rows)].items() if k != "epoch"}
        return numbers

    task = Scripted()
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.1)
    with pytest.raises(KeyboardInterrupt):  # interrupted during epoch 3's validation: epochs 0-2 are saved
        fit(task, optimizer, len(CURVES), validate(3), selection="last", state_path=tmp_path / "resume.pt")
    calls = iter(range(3, 100))
    task = Scripted()
    result = fit(task, torch.optim.SGD(task.model.parameters(), lr=0.1), len(CURVES), validate(None),
                 selection="last", state_path=tmp_path / "resume.pt")
    assert result.resumed_from == 3 and result.selection["picks"]["best_worst_group"] == 1
    assert {e: float(state["model"]["bias"]) for e, state in result.pick_states.items()} == {1: 1.0, 2: 2.0, 3: 3.0}


def test_erm_refuses_the_rule_that_needs_inferred_groups() -> None:
    with pytest.raises(ParamsError, match=r"erm.selection = best_worst_inferred_group: ERM has no inferred groups .*"
                                          r"allowed: last, best_worst_group, best_worst_class"):
        validate({"erm": {"selection": "best_worst_inferred_group"}})
    assert validate({"erm": {"selection": "best_worst_class"}}).erm.selection == "best_worst_class"
    assert validate({"stage2": {"selection": "best_worst_inferred_group"}}).stage2.selection == \
        "best_worst_inferred_group"
    with pytest.raises(ValueError, match="erm.selection = best_worst_inferred_group: .*allowed: last, best_worst_group"):
        check_rule_for("erm.selection", "best_worst_inferred_group", inferred_groups=False)
    check_rule_for("stage2.selection", "best_worst_inferred_group", inferred_groups=True)


def test_the_schema_allows_exactly_the_registered_rules() -> None:
    assert set(typing.get_args(Selection)) == set(RULES)
    assert set(NEEDS_INFERRED_GROUPS) == {name for name, r in RULES.items() if r.needs_inferred_groups}


def test_stage_2_selects_by_the_validation_splits_inferred_groups_and_refuses_without_them(tmp_path) -> None:
    import json

    from debias.harness.tracking import StageRun
    from debias.training.methods import train_stage2
    from debias.training.outputs import StageOutputs
    from tests.test_training import tiny_split

    params = validate({"groups": {"method": "true"},
                       "stage2": {"method": "erm", "epochs": 2, "batch_size": 32,
                                  "selection": "best_worst_inferred_group"}})
    train, val = tiny_split(64), tiny_split(32, seed=1)
    outputs = StageOutputs(model=tmp_path / "stage2.pt", embeddings_dir=tmp_path / "stage2",
                           metrics=tmp_path / "stage2_train.json", curves=tmp_path / "curves.csv",
                           resume=tmp_path / "resume.pt")
    splits = {"train": train, "val": val, "test": val}
    with pytest.raises(ValueError, match="stage2.selection = best_worst_inferred_group: this stage has no inferred"):
        train_stage2(params, splits, train.a.clone(), train.a != train.y, None, StageRun(None, None), outputs)
    assert not outputs.metrics.exists()
    train_stage2(params, splits, train.a.clone(), train.a != train.y, None, StageRun(None, None), outputs,
                 inferred_group=train.g.clone(), val_inferred_group=val.g.clone())
    block = json.loads(outputs.metrics.read_text())["selection"]
    assert block["rule"] == "best_worst_inferred_group" and block["unit"] == "worst inferred group"
    assert set(block["picks"]) == set(RULES)  # with true attributes every rule is replayed on the same run
    header = outputs.curves.read_text().splitlines()[0].split(",")
    assert {"val/worst_class", "val/worst_inferred_group", "val/worst_group"} <= set(header)
    # the oracle's groups given as the inferred ones: both rules read the same numbers
    rows = [dict(zip(header, map(float, line.split(",")))) for line in outputs.curves.read_text().splitlines()[1:]]
    assert all(row["val/worst_inferred_group"] == row["val/worst_group"] for row in rows)


@pytest.mark.slow
def test_each_rules_test_numbers_are_those_of_a_run_that_selects_by_it(tmp_path) -> None:
    """The selection block's ``picks_test``: what every rule's model gives on test, from one run; a run selecting by
    that rule itself (same seed, deterministic training) reports the same test numbers for its kept model."""
    import json

    from debias.core.runtime import seed_everything
    from debias.harness.tracking import StageRun
    from debias.training.methods import train_stage2
    from debias.training.outputs import PICK_TEST_KEYS, StageOutputs
    from tests.test_training import tiny_split

    train, val, test = tiny_split(64), tiny_split(32, seed=1), tiny_split(48, seed=2)

    def stage(selection: str) -> dict:
        params = validate({"groups": {"method": "true"},
                           "stage2": {"method": "erm", "epochs": 6, "batch_size": 8, "lr": 0.1,
                                      "selection": selection}})
        folder = tmp_path / selection
        outputs = StageOutputs(model=folder / "stage2.pt", embeddings_dir=folder / "stage2",
                               metrics=folder / "stage2_train.json", curves=folder / "curves.csv",
                               resume=folder / "resume.pt")
        seed_everything(0)
        train_stage2(params, {"train": train, "val": val, "test": test}, train.a.clone(), train.a != train.y, None,
                     StageRun(None, None), outputs, inferred_group=train.g.clone(), val_inferred_group=val.g.clone())
        return json.loads(outputs.metrics.read_text())

    first = stage("last")
    block = first["selection"]
    assert set(block["picks_test"]) == set(RULES)
    assert {rule: row["epoch"] for rule, row in block["picks_test"].items()} == block["picks"]
    shared = [key for key in PICK_TEST_KEYS if key in first["test"]]
    assert shared and all(block["picks_test"]["last"][key] == first["test"][key] for key in shared)
    for rule in RULES:
        own = stage(rule)
        assert own["selected_epoch"] == block["picks"][rule]
        assert {key: own["test"][key] for key in shared} == {key: block["picks_test"][rule][key] for key in shared}
    assert len(set(block["picks"].values())) > 1  # the rules disagreed: the kept models of other epochs were tested


def test_the_reports_selection_table_names_every_rules_epoch(tmp_path) -> None:
    import json

    from debias.report.sections.stage_warnings import picks_text, warnings_section

    block = describe_selection(history(), 2, "best_worst_class")
    (tmp_path / "reports/metrics").mkdir(parents=True)
    (tmp_path / "reports/metrics/stage2_train.json").write_text(json.dumps({"selection": block, "warnings": []}))
    section = warnings_section(tmp_path)
    table = next(b for b in section.blocks if getattr(b, "headers", None) and "each rule's epoch" in b.headers)
    assert table.rows[0][1] == "best_worst_class" and table.rows[0][2] == "2"
    assert table.rows[0][-1] == "last 4, best_worst_group 1, best_worst_class 2, best_worst_inferred_group 3, best_unbiased 1"
    assert picks_text(None) == "n/a"
