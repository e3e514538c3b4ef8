"""Nested dicts of params and their dotted form: the one merge, flatten and unflatten of presets, sweeps and benchmarks."""

from __future__ import annotations

import copy
from typing import Any


def merge(base: dict, changes: dict) -> dict:
    """``base`` updated recursively with ``changes`` (a new dict; a dict replaces a missing or null value)."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        out[key] = merge(out.get(key) or {}, value) if isinstance(value, dict) else copy.deepcopy(value)
    return out


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; lists are leaves, an empty dict adds nothing."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}``."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, last = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return tree
