"""The warnings section: every stage's warnings, first, and how each training stage chose its model."""

from __future__ import annotations

from pathlib import Path

from debias.core.headline import local_notes, local_selection, run_warnings, warning_code
from debias.report.document import Block, Section, Table, Text
from debias.report.sections.base import ReportContext

TITLE = "Warnings"


def warnings_section(root: Path) -> Section:
    """Every stage's warnings (``"warnings"`` in its metrics files, and the unread params its run record kept), first
    in the report; its notes (``"notes"``: lines, not warnings) below them; and how each training stage chose its
    model (``"selection"``) where the stage recorded it."""
    by_stage = run_warnings(root)
    selection = local_selection(root)
    blocks: list[Block] = []
    total = sum(len(messages) for messages in by_stage.values())
    if total:
        blocks.append(Text(f"{total} warning{'s' if total > 1 else ''} from {len(by_stage)} stage"
                           f"{'s' if len(by_stage) > 1 else ''}: read them before the results.", note=True))
        blocks.append(Table(["stage", "warning", "message"],
                            [[stage, warning_code(m), m] for stage, messages in by_stage.items() for m in messages],
                            numeric=False))
    else:
        blocks.append(Text("None: no stage reported a warning."))
    notes = local_notes(root)
    if notes:
        blocks.append(Table(["stage", "note", "message"],
                            [[stage, warning_code(m), m] for stage, messages in notes.items() for m in messages],
                            caption="Notes: facts about the run that were measured not to predict worse numbers "
                                    "(benchmarks/results/warning_value.md); details, not warnings.", numeric=False))
    if selection:
        rows = [[stage, str(s.get("rule", "")), str(s.get("selected_epoch", "")),
                 "yes" if s.get("degenerate") else "no", str(s.get("reason") or ""), picks_text(s.get("picks"))]
                for stage, s in selection.items()]
        blocks.append(Table(["stage", "selection rule", "selected epoch", "degenerate", "reason", "each rule's epoch"],
                            rows, caption="How each training stage chose the epoch it kept (validation split), and "
                                          "the epoch every rule its numbers allow would have kept.", numeric=False))
    return Section(TITLE, blocks)


def picks_text(picks: dict[str, int] | None) -> str:
    """``'last 4, best_worst_group 1, best_worst_class 2'`` from a selection block's ``picks`` ('n/a' without)."""
    return ", ".join(f"{rule} {epoch}" for rule, epoch in picks.items()) if picks else "n/a"


def section(context: ReportContext) -> Section:
    """The warnings of this run's stages and of its params."""
    return warnings_section(context.root)
