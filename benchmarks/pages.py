"""What results files print: mean ± std over seeds, the warning codes rows carry, and CSVs whose header lines (the
command, the date, the machine) stand above the rows as ``# `` comments."""

from __future__ import annotations

import argparse
import csv
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any


def when_and_where(load_before: float, load_after: float) -> str:
    """A results page's line of when and on what: the UTC time now, the 1-minute load average before and after the
    run, the CPU count and architecture."""
    import datetime
    import os
    import platform

    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1 min) before "
            f"{load_before:.2f}, after {load_after:.2f}; {os.cpu_count()} CPUs ({platform.machine()})")


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


def number_or_text(text: str) -> Any:
    """A CSV cell as an int, else a float, else its text; None when empty."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            continue
    return text if text else None


def read_commented_csv(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The ``# `` header lines and the rows of a results CSV (cells by :func:`number_or_text`)."""
    lines = path.read_text().splitlines()
    header = [line[2:] for line in lines if line.startswith("# ")]
    rows = [{k: number_or_text(v) for k, v in row.items()}
            for row in csv.DictReader(line for line in lines if not line.startswith("#"))]
    return header, rows


def write_commented_csv(path: Path, header: list[str], fields: list[str], rows: list[dict[str, Any]]) -> None:
    """A results CSV: ``header`` as ``# `` lines, then the rows' ``fields`` (others left out), floats to 4 places."""
    with open(path, "w", newline="") as handle:
        handle.write("".join(f"# {h}\n" for h in header))
        writer = csv.DictWriter(handle, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows({k: (round(v, 4) if isinstance(v, float) else v) for k, v in r.items()} for r in rows)


def add_out_arguments(parser: argparse.ArgumentParser, out: Path) -> None:
    """``--out`` (where OUT.md and OUT.csv go, default ``out``) and ``--render`` (only rewrite an earlier run's page)."""
    parser.add_argument("--out", default=str(out), help="writes OUT.md and OUT.csv")
    parser.add_argument("--render", metavar="CSV", help="only rewrite the Markdown of an earlier run's CSV")


def render(path: Path, markdown: Callable[[list[dict[str, Any]], list[str]], str], drop_empty: bool = False) -> int:
    """Rewrite the page beside the results CSV ``path`` from its header lines and rows (``drop_empty``: empty cells
    left out of the rows); 0."""
    header, rows = read_commented_csv(path)
    if drop_empty:
        rows = [{k: v for k, v in row.items() if v is not None} for row in rows]
    path.with_suffix(".md").write_text(markdown(rows, header))
    return 0
