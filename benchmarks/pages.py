"""What the results pages of the DVC-queue studies print: mean ± std over seeds and the warning codes rows carry."""

from __future__ import annotations

import statistics


def mean_std(values: list[float], scale: float = 1.0, digits: int = 1) -> str:
    values = [scale * v for v in values if v is not None]
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {spread:.{digits}f}"


def warning_flag(group: list[dict]) -> str:
    """`` ⚠ code in k of n seeds`` for each warning code carried by some of the rows ``group`` ('' when none)."""
    codes = [set(filter(None, (r.get("warnings") or "").split(";"))) for r in group]
    return "".join(f" ⚠ {code} in {sum(code in c for c in codes)} of {len(group)} seeds"
                   for code in sorted(set().union(*codes)))


def warning_notes(rows: list[dict]) -> list[str]:
    """The legend of the warning codes the rows carry (:data:`debias.core.health.CODES`); empty when none."""
    from debias.core.health import CODES

    found = sorted({code for r in rows for code in (r.get("warnings") or "").split(";") if code})
    if not found:
        return []
    return ["⚠ code in k of n seeds: k of the row's n runs carried that warning (debias.core.health) from the stage behind "
            "its numbers; each run's metrics JSON and MLflow hold the full message. "
            + " ".join(f"*{code}*: {CODES.get(code, 'see debias.core.health')}." for code in found)]
