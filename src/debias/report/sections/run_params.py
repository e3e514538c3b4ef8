"""The params section: what the run changed against the committed params.yaml, and where it departs from the papers."""

from __future__ import annotations

from pathlib import Path

from debias.params import Params
from debias.schema.applicability import RunContext
from debias.report import params_table
from debias.report.document import Block, Heading, Section, Table, Text, show
from debias.report.inputs import ReportInputs
from debias.report.sections.base import ReportContext

TITLE = "Params"


def run_context(inputs: ReportInputs, params: Params) -> RunContext:
    """The params and the protocol the run resolved (from the bias summary; None when it is missing)."""
    return RunContext(params, (inputs.get("summary") or {}).get("protocol"))


def _not_listed(keys: list[str]) -> list[Block]:
    if not keys:
        return []
    return [Text(f"Not listed: {len(keys)} param{'s' if len(keys) > 1 else ''} that do not apply to this run's source, "
                 f"protocol or methods ({', '.join(f'`{k}`' for k in keys[:6])}{', …' if len(keys) > 6 else ''}).")]


def params_section(inputs: ReportInputs, params: Params, root: Path) -> Section:
    """What this run changed against the committed params.yaml, and where the committed params depart from the
    papers' settings (the schema defaults) with params.yaml's reason; params that do not apply are left out."""
    context = run_context(inputs, params)
    blocks: list[Block] = [Heading("Changed by this run (against the committed params.yaml)")]
    text, source = params_table.committed_text(root)
    committed = None
    if text is None:
        blocks.append(Text(f"Not available: {source}, so this run's changes cannot be told from the committed "
                           "settings. Every applicable param that departs from the papers' settings is listed below.",
                           note=True))
    else:
        committed = params_table.committed_params(text)
        changed, skipped = params_table.differing(params, committed, context)
        if changed:
            blocks.append(Table(["param", "this run", "committed"],
                                [[f"`{c.key}`", show(c.value), show(c.base)] for c in changed],
                                caption=f"Against {source} (e.g. `dvc exp run -S` overrides).", numeric=False))
        else:
            blocks.append(Text(f"None: this run used the committed params.yaml ({source}) as it is."))
        blocks += _not_listed(skipped)
    blocks.append(Heading(f"Where the {'committed' if committed else 'run’s'} params depart from the papers"))
    departing, skipped = params_table.departures(committed or params, text or "", context)
    if departing:
        blocks.append(Table(["param", "committed" if committed else "this run", "papers (schema default)", "why (params.yaml)"],
                            [[f"`{c.key}`", show(c.value), show(c.base), c.reason or "no comment in params.yaml"]
                             for c in departing], numeric=False, caption=(
            "The schema's defaults in src/debias/params/ are the papers' settings; the reason is the comment "
            "params.yaml gives the param (or the comment above it in its section).")))
    else:
        blocks.append(Text("None: every applicable param has the papers' setting."))
    blocks += _not_listed(skipped)
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """This run's params."""
    return params_section(context.inputs, context.params, context.root)
