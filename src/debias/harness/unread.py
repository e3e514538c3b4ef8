"""A stage's ``unread-param`` warnings, said as it starts, before any data is loaded or any step trained.

The params a stage declares (:data:`debias.harness.stage.STAGE_PARAMS`) whose values differ from those DVC recorded
for the stage's previous run (its entry in ``dvc.lock``: the run whose outputs are in the workspace), and that this
run does not read (:func:`debias.schema.applicability.unread_warnings`: ``-S loss.temperature=0.2`` under CNC,
``-S stage2.momentum=0.5`` under Adam). DVC reruns a stage when any declared param changes; these are the changes
that cannot change its results. The stage prints them, and keeps them in its run record (``unread_params``) and on
its MLflow run; the report gathers them from the run records (:func:`debias.core.headline.recorded_unread`).

``dvc.lock`` is read here only: it names which values changed, never what the stage computes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from debias.core.trees import flatten
from debias.params import Params, as_dict

LOCK = Path("dvc.lock")


def recorded(stage: str, lock: Path = LOCK) -> dict[str, Any] | None:
    """The params.yaml values dvc.lock records for ``stage``'s last run, flat (``{"loss.epsilon": 0.0, ...}``); None
    without a readable record (no dvc.lock, no entry for the stage, a file that is not YAML)."""
    from ruamel.yaml import YAML

    try:
        document = YAML(typ="safe").load(lock.read_text(encoding="utf-8"))  # YAML 1.2, as DVC writes it
    except Exception:  # noqa: BLE001 (missing, unreadable or broken: nothing to compare with, DVC itself will say)
        return None
    entry = document.get("stages", {}).get(stage) if isinstance(document, dict) else None
    values = entry.get("params", {}).get("params.yaml") if isinstance(entry, dict) else None
    return flatten(values) if isinstance(values, dict) else None


def changed_since_last_run(stage: str, params: Params, keys: list[str], lock: Path = LOCK) -> dict[str, Any]:
    """The declared ``keys``' leaves whose value differs from the stage's record in ``lock`` (none without one)."""
    before = recorded(stage, lock)
    if before is None:
        return {}
    now = flatten(as_dict(params, keys))
    return {key: value for key, value in now.items() if key in before and before[key] != value}


def unread_since_last_run(stage: str, params: Params, keys: list[str], lock: Path = LOCK) -> list[str]:
    """``unread-param: KEY = VALUE: ...`` for each declared param changed since the stage's last run that this run
    does not read."""
    from debias.schema.applicability import RunContext, unread_warnings

    changed = changed_since_last_run(stage, params, keys, lock)
    return unread_warnings(RunContext(params), changed) if changed else []
