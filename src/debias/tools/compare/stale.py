"""Which stages of an experiment hold results of *another* run: a stage is stale when the params its ``dvc.lock``
entry records differ from the experiment's params.yaml (for the keys that stage declares), or when an input it
read is not the output its producing stage last wrote, or comes from a stale stage.

A partial experiment (``dvc exp run -S seed=3 train_erm``, ``debias sweep --targets train_erm``) reruns the
stages it names and keeps the baseline's lock entries and outputs for the others: seed 3's ERM beside seed 0's
stage 2. ``debias compare`` blanks a stale stage's metrics and files and says why (:func:`stale_stages`), so
nothing averages one run's ERM with another's stage 2. Only ``dvc.lock`` and the params are read (no ``dvc
status``: it would need each experiment checked out).
"""

from __future__ import annotations

import shlex
from typing import Any

from debias.params import flatten

SHOWN = 3  # differing params named in a reason


def _text(value: Any) -> str:
    from debias.tools.compare.columns import param_text

    return "(absent)" if value is _ABSENT else param_text(value)


_ABSENT = object()


def _same(a: Any, b: Any) -> bool:
    from debias.tools.compare.columns import same_param

    return (a is _ABSENT) == (b is _ABSENT) and (a is _ABSENT or same_param(a, b))


def params_reason(entry: dict[str, Any], params: dict[str, Any]) -> str | None:
    """Why a lock ``entry`` does not match the flat ``params`` (the keys its ``params.yaml`` block declares, and
    every key under them), or None when it matches."""
    recorded = ((entry.get("params") or {}).get("params.yaml")) or {}
    if not isinstance(recorded, dict) or not recorded:
        return None
    declared = list(recorded)
    ran = flatten(recorded)
    now = {k: v for k, v in params.items() if any(k == d or k.startswith(d + ".") for d in declared)}
    keys = sorted(set(ran) | set(now))
    differ = [k for k in keys if not _same(ran.get(k, _ABSENT), now.get(k, _ABSENT))]
    if not differ:
        return None
    shown = ", ".join(f"{k}={_text(ran.get(k, _ABSENT))} (the experiment's: {_text(now.get(k, _ABSENT))})"
                      for k in differ[:SHOWN])
    more = f" and {len(differ) - SHOWN} more" if len(differ) > SHOWN else ""
    return f"ran with {shown}{more}"


def _within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/") or folder.startswith(path.rstrip("/") + "/")


def stale_stages(lock: dict[str, Any] | None, params: dict[str, Any]) -> dict[str, str]:
    """Stage name -> why its outputs are not this experiment's, from the experiment's ``dvc.lock`` (parsed) and
    its flat params; empty when every stage is consistent (or there is no lock)."""
    stages = {name: entry for name, entry in ((lock or {}).get("stages") or {}).items() if isinstance(entry, dict)}
    produced = {str(out.get("path")): (name, out.get("md5")) for name, entry in stages.items()
                for out in entry.get("outs") or [] if isinstance(out, dict)}
    stale: dict[str, str] = {}
    for name, entry in stages.items():
        reason = params_reason(entry, params)
        if reason:
            stale[name] = reason
    changed = True
    while changed:  # an input from a stale stage, or not the output its stage wrote: stale too (to a fixed point)
        changed = False
        for name, entry in stages.items():
            if name in stale:
                continue
            for dep in entry.get("deps") or []:
                path = str(dep.get("path")) if isinstance(dep, dict) else ""
                found = produced.get(path)
                if found and found[0] != name and dep.get("md5") and found[1] and dep.get("md5") != found[1]:
                    stale[name] = f"its input {path} is not the one {found[0]} wrote last (another run of {found[0]})"
                    break
                upstream = next((s for p, (s, _) in produced.items() if s in stale and s != name and _within(path, p)),
                                None)
                if upstream:
                    stale[name] = f"its input {path} comes from {upstream}, which is stale"
                    break
            changed |= name in stale
    return stale


def stale_outputs(lock: dict[str, Any] | None, stale: dict[str, str]) -> set[str]:
    """The output paths of the ``stale`` stages (files and folders), per ``lock``."""
    stages = (lock or {}).get("stages") or {}
    return {str(out.get("path")) for name in stale for out in (stages.get(name) or {}).get("outs") or []
            if isinstance(out, dict)}


def is_within(path: str, outputs: set[str]) -> bool:
    """Whether ``path`` is one of ``outputs`` or inside one of them."""
    return any(path == out or path.startswith(out.rstrip("/") + "/") for out in outputs)


def rerun_command(params: dict[str, Any], baseline: dict[str, Any] | None) -> str:
    """``dvc exp run`` with a ``-S`` for each param that differs from ``baseline`` (the whole pipeline, no target)."""
    from debias.tools.compare.columns import param_text, same_param

    if baseline is None:
        return "dvc exp run"
    differ = [k for k in params if not same_param(params[k], baseline.get(k))]
    return " ".join(["dvc exp run", *(f"-S {shlex.quote(f'{k}={param_text(params[k])}')}" for k in differ)])
