"""The stage's check of its imports (``debias.harness.stage.unseen_modules``, before and after every stage's body):
how long resolving its module files takes, ``os.path.realpath`` of each file against ``resolved`` (each folder
resolved once per process, every answer kept).

In one process holding what a training stage imports (the ``train_contrastive`` entrypoint's modules, torch, MLflow,
pandas, scikit-learn), ``--rounds`` rounds, each timing, one after the other (the order alternating between rounds):
``os.path.realpath`` of every module file (what each of the check's two calls did), ``resolved`` with nothing kept
(the first call) and ``resolved`` again (the second call); and whether every answer is the same. The median round is
reported with the ratios.

    python -m benchmarks.import_check [--rounds 9] [--out benchmarks/results/import_check]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from benchmarks.pages import when_and_where

ROOT = Path(__file__).resolve().parent.parent


def load_stage_imports() -> None:
    """Import what the ``train_contrastive`` stage imports, without running it, and MLflow (tracking on)."""
    spec = importlib.util.spec_from_file_location("stage_entrypoint", ROOT / "pipeline" / "train_contrastive.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    import mlflow  # noqa: F401
    import pandas  # noqa: F401
    import sklearn.linear_model  # noqa: F401
    import torch  # noqa: F401


def module_files() -> list[str]:
    return [m.__file__ for m in list(sys.modules.values())
            if isinstance(getattr(m, "__file__", None), str) and os.path.isabs(m.__file__)]


def timed(function) -> tuple[float, list[str]]:
    started = time.perf_counter()
    found = function()
    return time.perf_counter() - started, found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/import_check"))
    args = parser.parse_args()
    load_stage_imports()
    from debias.harness import stage

    files = module_files()
    load = os.getloadavg()[0]
    times: dict[str, list[float]] = {"realpath": [], "first": [], "again": []}
    same = True
    plain = lambda: [os.path.realpath(f) for f in files]  # noqa: E731
    cached = lambda: [stage.resolved(f) for f in files]  # noqa: E731
    for round_ in range(args.rounds):
        stage._RESOLVED.clear()
        if round_ % 2:
            t_first, first = timed(cached)
            t_again, again = timed(cached)
            t_plain, reference = timed(plain)
        else:
            t_plain, reference = timed(plain)
            t_first, first = timed(cached)
            t_again, again = timed(cached)
        same &= reference == first == again
        for key, value in (("realpath", t_plain), ("first", t_first), ("again", t_again)):
            times[key].append(value)
    median = {key: statistics.median(values) * 1e3 for key, values in times.items()}
    old = 2 * median["realpath"]  # the check's two calls, before and after the body
    new = median["first"] + median["again"]
    command = " ".join(["python -m benchmarks.import_check", *sys.argv[1:]])
    lines = [
        "# The stage's import check: resolving its module files",
        "",
        f"- Command: `{command}`",
        f"- Date: {when_and_where(load, os.getloadavg()[0])}; Python "
        f"{platform.python_version()}",
        f"- {len(files)} module files (what the `train_contrastive` stage imports, with MLflow); {args.rounds} rounds, "
        "the order alternating; medians, milliseconds",
        f"- Every answer the same as `os.path.realpath`'s: {'yes' if same else 'NO'}",
        "",
        "| | ms |",
        "|---|---:|",
        f"| `os.path.realpath` of every file (each of the check's two calls) | {median['realpath']:.1f} |",
        f"| `resolved`, first call (nothing kept) | {median['first']:.1f} |",
        f"| `resolved`, second call | {median['again']:.1f} |",
        f"| per stage, both calls: `os.path.realpath` | {old:.1f} |",
        f"| per stage, both calls: `resolved` | {new:.1f} |",
        "",
        f"Per stage, `resolved` takes {new / old:.2f} of the time (both calls).",
        "",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
