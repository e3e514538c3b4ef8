"""The provenance section: git commit, DVC experiment, MLflow run ids and wall time per stage."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from debias.core import paths
from debias.core.environment import git_commit
from debias.params import Params
from debias.report.document import Block, Heading, Section, Table, Text, num
from debias.report.inputs import ReportInputs
from debias.report.sections.base import ReportContext

TITLE = "Provenance"


def dvc_experiment(records: dict[str, dict[str, Any]]) -> str:
    """``$DVC_EXP_NAME`` when set, else the experiment names in the run records, else a workspace run."""
    if os.environ.get("DVC_EXP_NAME"):
        return os.environ["DVC_EXP_NAME"]
    names = sorted({r["dvc_experiment"] for r in records.values() if r.get("dvc_experiment")})
    return ", ".join(names) if names else "none (a workspace run, not `dvc exp run`)"


def provenance_section(inputs: ReportInputs, params: Params, root: Path, run_id: str | None) -> Section:
    """Git commit, DVC experiment, MLflow run id and wall time per stage."""
    records = inputs.runs
    uris = sorted({r["tracking_uri"] for r in records.values() if r.get("tracking_uri")})
    blocks: list[Block] = [Table(["", ""], [
        ["git commit", git_commit(root) or "unknown (not a git repository)"],
        ["DVC experiment", dvc_experiment(records)],
        ["MLflow tracking URI", ", ".join(uris) or "none (tracking was off)"],
        ["MLflow pipeline (parent) run", ", ".join(sorted({r["parent_run_id"] for r in records.values()
                                                           if r.get("parent_run_id")})) or "none"],
    ])]
    blocks.append(Heading("Stages"))
    rows = [[stage, r.get("run_id") or "not logged", r.get("params_hash") or "", r.get("dvc_experiment") or "",
             num(r.get("wall_time_s"), 1)] for stage, r in records.items() if stage != "report"]
    total = sum(r.get("wall_time_s") or 0.0 for stage, r in records.items() if stage != "report")
    rows.append(["report (this run)", run_id or "not logged", "", os.environ.get("DVC_EXP_NAME", ""), "…"])
    blocks.append(Table(["stage", "MLflow run id", "params hash", "DVC experiment", "wall time (s)"], rows,
                        caption=f"From {paths.RUNS}/<stage>.json; total upstream wall time {total:.1f} s. A stage restored "
                                "from DVC's run-cache keeps the run id of the run that made its outputs."))
    if not records:
        blocks.append(Text(f"Missing: no run records in `{paths.RUNS}/`; stage run ids and times are unknown.", note=True))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """Where this run's outputs come from."""
    return provenance_section(context.inputs, context.params, context.root, context.run_id)
