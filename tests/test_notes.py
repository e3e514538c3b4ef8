"""Notes: a code :data:`debias.core.health.KINDS` calls a note reaches the stage's ``notes`` list, its log, MLflow's
``debias.notes`` tag and the report's details, and none of the warnings' places (the ``warnings`` list, the headline
summary, compare's ``!`` count, MLflow's ``debias.warnings`` tag); the correctness guards stay warnings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from debias.core import headline, health
from debias.training.selection import describe_selection

# Checks that guard correctness: never notes, whatever a benchmark measures.
GUARDS = ("degenerate-selection", "collapsed-representation", "chance-level", "unstable-training", "mixed-environment",
          "unread-param", "negligible-param", "weak-groups", "fairkl-starved")


def test_every_code_declares_its_kind_and_the_guards_are_warnings() -> None:
    assert set(health.KINDS) == set(health.CODES)
    assert set(health.KINDS.values()) <= {"warning", "note"}
    assert all(health.KINDS[code] == "warning" for code in GUARDS)
    assert health.KINDS["first-epoch-kept"] == "note"
    lines = [health.warning("chance-level", "a"), health.warning("first-epoch-kept", "b"), "no code here"]
    assert health.split_notes(lines) == ([lines[0], lines[2]], [lines[1]])


def test_a_first_epoch_kept_is_a_note_and_a_zero_validation_number_stays_a_warning() -> None:
    history = [{"epoch": 0.0, "val/unbiased": 0.9, "val/avg": 0.9}, {"epoch": 1.0, "val/unbiased": 0.8, "val/avg": 0.8}]
    first = describe_selection(history, 0, "best_unbiased")
    assert first["degenerate"] and first["first_epoch"]
    zero = [{"epoch": float(e), "val/worst_group": 0.0, "val/avg": 0.5, "val/unbiased": 0.5, "val/worst_group_n": 9.0}
            for e in range(3)]
    flat = describe_selection(zero, 0, "best_worst_group")
    assert flat["degenerate"] and not flat.get("first_epoch")


def test_a_note_reaches_notes_the_log_and_its_tag_and_no_warning_place(tmp_path: Path, capsys) -> None:
    from debias.harness.tracking import StageRun
    from debias.training.outputs import NOTES_TAG, StageOutputs, write_outputs
    from tests.test_training import run, tiny_split

    class Recorder(StageRun):
        logged: list[str] = []
        tags: dict[str, str] = {}

        def log_warnings(self, warnings: list[str]) -> None:
            Recorder.logged = list(warnings)

        def set_tags(self, tags: dict[str, str]) -> None:
            Recorder.tags.update(tags)

    model, result = run(3, selection="best_unbiased")
    result.selected_state = {"model": {k: v.clone() for k, v in model.state_dict().items()}}
    result.history = [{**row, "val/unbiased": u} for row, u in zip(result.history, (0.9, 0.8, 0.7))]
    result.selected_epoch = 0
    result.selection = describe_selection(result.history, 0, "best_unbiased")
    out = tmp_path / "reports"
    outputs = StageOutputs(model=tmp_path / "m.pt", embeddings_dir=tmp_path / "emb",
                           metrics=out / "metrics" / "stage2_train.json", curves=tmp_path / "curves.csv",
                           resume=tmp_path / "state.pt")
    outputs.metrics.parent.mkdir(parents=True)
    splits = {"train": tiny_split(), "val": tiny_split(seed=1), "test": tiny_split(seed=2)}
    write_outputs(model, "lenet5", result, splits, Recorder(None, None), outputs, 64, torch.device("cpu"), "stage2 x")
    metrics = json.loads(outputs.metrics.read_text())
    notes = [n for n in metrics["notes"] if n.startswith("first-epoch-kept: ")]
    assert len(notes) == 1
    assert not any(w.startswith(("first-epoch-kept", "degenerate-selection")) for w in metrics["warnings"])
    assert notes[0] not in Recorder.logged and notes[0] in Recorder.tags[NOTES_TAG]
    assert notes[0] not in Recorder.tags.get("debias.warnings", "")
    printed = capsys.readouterr().out
    assert f"note {notes[0]}" in printed and f"WARNING {notes[0]}" not in printed


def test_the_headline_report_and_compare_count_no_note(tmp_path: Path) -> None:
    from debias.report.document import Table, Text
    from debias.report.sections.stage_warnings import warnings_section
    from debias.tools.compare import data as compare_data
    from debias.tools.compare.collect import Experiment

    note = health.warning("first-epoch-kept", "the first epoch was kept")
    document = {"warnings": [], "notes": [note], "selection": {"rule": "best_unbiased", "selected_epoch": 0}}
    path = tmp_path / headline.DETAILED["train_contrastive"]
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(document))
    assert headline.local_warnings(tmp_path) == {}
    assert headline.warnings_summary(headline.local_warnings(tmp_path)) == "none"
    assert headline.local_notes(tmp_path) == {"train_contrastive": [note]}
    blocks = warnings_section(tmp_path).blocks
    assert any(isinstance(b, Text) and "no stage reported a warning" in b.text for b in blocks)
    assert any(isinstance(b, Table) and ["train_contrastive", "first-epoch-kept", note] in b.rows for b in blocks)
    files = {str(headline.DETAILED["train_contrastive"]): json.dumps(document)}
    experiment = Experiment("e", "experiment", {"seed": 0}, {"s2_worst": 0.5}, rev="r", timestamp="2026-01-01T00:00:00",
                            reader=lambda p: files.get(str(p)))
    experiment.load_notes()
    assert experiment.warnings == {}
    frame = compare_data.experiments_frame([experiment], [])
    assert int(frame["warnings"].iloc[0]) == 0


@pytest.mark.parametrize("code", GUARDS)
def test_a_guard_stays_in_the_warnings_list(code: str) -> None:
    line = health.warning(code, "planted")
    assert health.split_notes([line]) == ([line], [])


def test_each_codes_kind_is_the_verdict_of_the_warning_value_page() -> None:
    """KINDS is what benchmarks/results/warning_value.md's rule decided for each code, nothing else."""
    page = (Path(__file__).resolve().parent.parent / "benchmarks/results/warning_value.md").read_text()
    rows = [line.split(" | ") for line in page.splitlines() if line.startswith("| `")]
    verdicts = {cells[0].strip("| `"): cells[-1] for cells in rows if cells[0].strip("| `") in health.CODES}
    assert set(verdicts) == set(health.CODES)
    for code, words in verdicts.items():
        assert health.KINDS[code] == ("note" if words.startswith("note") else "warning"), (code, words)


@pytest.mark.parametrize(("differences", "kind"), [
    ([0.5 + 0.8 * ((i % 7) - 3) / 3 for i in range(60)], "note"),  # no loss, cells detect about 1 point
    ([0.5 + 6.0 * ((i % 7) - 3) / 3 for i in range(8)], "warning"),  # no loss, cells detect far more than 2 points
    ([-1.5 + 0.5 * ((i % 7) - 3) / 3 for i in range(20)], "warning"),  # a loss shown
    ([0.05 * ((i % 5) - 2) for i in range(20)], "note"),  # shown equivalent
])
def test_the_rule_keeps_a_warning_only_for_a_loss_or_cells_that_cannot_tell(differences: list[float],
                                                                              kind: str) -> None:
    from benchmarks.warning_value.rule import DETECT, measure, verdict

    found = measure(differences, differences)
    assert verdict("cnc-small-pools", found)[0] == kind, (found, verdict("cnc-small-pools", found))
    if kind == "warning" and found.unbiased.high >= 0:
        assert found.detectable > DETECT
    assert verdict("weak-groups", found)[0] == "warning"  # a guard, whatever it measured
