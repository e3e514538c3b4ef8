"""The headline card: ERM against stage 2 on the test split, the warnings, what to look at next."""

from __future__ import annotations

from pathlib import Path

from debias.core.headline import run_warnings
from debias.params import Params
from debias.report import card
from debias.report.document import Block, Section, Table, Text
from debias.report.sections.base import ReportContext

TITLE = "Headline"


def headline_facts(summaries: dict[str, card.ModelSummary], by_stage: dict[str, list[str]], params: Params) -> card.Facts:
    """What the next-step rules of one run look at."""
    chosen = summaries["stage2"] if summaries["stage2"].worst_group else summaries["erm"]
    return card.Facts([(stage, m) for stage, ms in by_stage.items() for m in ms], summaries["erm"].worst,
                      summaries["stage2"].worst, chosen.worst_group, params.report.min_group_n, params.report.confidence)


def card_blocks(headers: list[str], rows: list[list[str]], warnings: str, next_line: str, caption: str,
                untrained: str | None = None) -> list[Block]:
    """The card: its table, the line naming the test groups without a training image (``untrained``, where there
    are), the warnings line and the next-step line (shared with ``debias compare``'s page)."""
    return [Table(headers, rows, caption=caption, numeric=False), *([Text(untrained, note=True)] if untrained else []),
            Text(warnings, note=warnings != "No warnings."), Text(f"Next: {next_line}", lead=True)]


def headline_section(summaries: dict[str, card.ModelSummary], root: Path, params: Params) -> Section:
    """ERM against stage 2 on the test split, the warnings, and what to look at next."""
    by_stage = run_warnings(root)
    models = [summaries["erm"], summaries["stage2"]]
    headers, rows = card.card_table(models, params.report.min_group_n, params.report.confidence)
    found = [(stage, m) for stage, ms in by_stage.items() for m in ms]
    caption = (f"Test split; one run (seed {params.seed}). Intervals: Wilson score at {100 * params.report.confidence:g} % "
               "from the group's n. The worst group is the (class, attribute) cell with the lowest test accuracy; "
               "one of its n test images moves it by 100 / n points.")
    return Section(TITLE, card_blocks(headers, rows, card.warnings_line(found),
                                      card.next_step(headline_facts(summaries, by_stage, params)), caption,
                                      card.untrained_line(models)),
                   card=True)


def section(context: ReportContext) -> Section:
    """The card of this run."""
    return headline_section(context.summaries, context.root, context.params)
