"""The headline metrics ``debias compare`` shows as columns and the text of a param value, in one place for the
collection (collect, stale) and the tables (compare_data)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Metric:
    """A headline metric as a column: ``group`` and ``label`` are its two header lines in the terminal."""

    key: str
    group: str
    label: str
    percent: bool = True
    priority: int = 5  # the terminal table drops the lowest first when it is too wide


METRICS: tuple[Metric, ...] = (
    Metric("erm_avg", "ERM", "avg", priority=2), Metric("erm_unbiased", "ERM", "unb", priority=2),
    Metric("erm_worst", "ERM", "wg", priority=6),
    Metric("s2_avg", "stage 2", "avg", priority=9), Metric("s2_unbiased", "stage 2", "unb", priority=9),
    Metric("s2_worst", "stage 2", "wg", priority=10),
    Metric("probe_erm_avg", "ERM probe", "avg", priority=1), Metric("probe_erm_unbiased", "ERM probe", "unb", priority=1),
    Metric("probe_erm_worst", "ERM probe", "wg", priority=3),
    Metric("probe_s2_avg", "S2 probe", "avg", priority=4), Metric("probe_s2_unbiased", "S2 probe", "unb", priority=4),
    Metric("probe_s2_worst", "S2 probe", "wg", priority=8),
    Metric("align_erm", "align", "ERM", percent=False, priority=3), Metric("align_s2", "align", "S2", percent=False, priority=7),
    Metric("mi_a_erm", "Î(A;Z)", "ERM", percent=False, priority=3), Metric("mi_a_s2", "Î(A;Z)", "S2", percent=False, priority=7),
    # written only for data without bias labels (beside the worst-group columns that say they need them)
    Metric("erm_worst_class", "ERM", "wc", priority=6), Metric("s2_worst_class", "stage 2", "wc", priority=10),
)
METRIC_KEYS = tuple(m.key for m in METRICS)

def param_text(value: Any) -> str:
    """A param value as text, the same for DVC's (typed) and MLflow's (string) params: ``0.25``, ``cnc``, ``[1, 2]``."""
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except ValueError:
            return value
        return value if isinstance(parsed, str) else json.dumps(parsed)
    return "null" if value is None else json.dumps(value)


def _number(value: Any) -> float | None:
    """A param value as a float where it is a number (MLflow's text parsed as JSON first); None otherwise."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def param_key(value: Any) -> str:
    """A param value as DVC compares it, as text: numbers by value (``0`` and ``0.0``, as a ``-S key=0`` and YAML
    write the same value, are both ``0``; a bool is no number), anything else as :func:`param_text`."""
    number = _number(value)
    if number is None or math.isnan(number) or math.isinf(number):
        return param_text(value)
    return str(int(number)) if number.is_integer() and abs(number) < 2 ** 53 else repr(number)


def same_param(a: Any, b: Any) -> bool:
    """Whether two param values are equal as DVC compares them (:func:`param_key`)."""
    return param_key(a) == param_key(b)
