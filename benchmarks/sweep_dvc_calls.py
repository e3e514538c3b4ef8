"""The DVC calls a local sweep makes per experiment and per shared upstream run: a ``dvc`` process each, against
the same call in the sweep's own process (:func:`debias.tools.sweep.local.queue_experiment`,
:func:`debias.tools.sweep.workspace.set_local_config`).

In a fresh clone of this repository (queueing needs no outputs), ``--rounds`` rounds, each timing, in an order that
alternates between rounds: one experiment queued by ``dvc exp run --queue -n NAME -S seed=K`` and one by
``queue_experiment`` with the same arguments; then a clone's DVC settings (``workspace.CLONE_CONFIG`` and phase 1's
``cache.dir``) written by three ``dvc config --local`` / ``dvc cache dir --local`` processes into one fresh clone and by
``set_local_config`` into another. The in-process side is timed in this one process from its first call on (DVC's
modules imported by the first call count), as a sweep pays it. Wall seconds; the median round, and the saving per
experiment and per upstream run.

    python -m benchmarks.sweep_dvc_calls [--rounds 9] [--out benchmarks/results/sweep_dvc_calls]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.pages import when_and_where
from debias.tools.sweep import grid, local, workspace

REPO = Path(__file__).resolve().parents[1]
FLOW = (40, 20)  # README's flow with 20 seeds (benchmarks/canonical_flow.sh): 2 x 20 experiments, 20 upstream runs


def timed(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def clone(target: Path) -> Path:
    subprocess.run(["git", "clone", "-q", str(REPO), str(target)], check=True)
    return target


def queue_rounds(root: Path, rounds: int, env: dict[str, str]) -> dict[str, list[float]]:
    """Seconds per queued experiment, by way: ``dvc`` (a process) and ``in-process``."""
    times: dict[str, list[float]] = {"dvc": [], "in-process": []}
    for round_ in range(rounds):
        ways = [("dvc", lambda job: workspace.run(["dvc", *local.queue_args(job)], root, env)),
                ("in-process", lambda job: local.queue_experiment(root, job, env))]
        for way, call in ways if round_ % 2 == 0 else ways[::-1]:
            job = grid.Job(f"{way}-{round_}", {"seed": 100 + 2 * round_ + (way == "dvc")}, [])
            times[way].append(timed(lambda: call(job)))
    workspace.run(["dvc", "queue", "remove", "--all"], root, env)
    return times


def config_rounds(scratch: Path, rounds: int, cache: str) -> dict[str, list[float]]:
    """Seconds per clone's DVC settings, by way, each written into a fresh clone."""
    settings = [*workspace.CLONE_CONFIG, ("cache", "dir", cache)]

    def commands(target: Path) -> None:
        for section, option, value in settings:
            command = (["dvc", "cache", "dir", "--local", value] if (section, option) == ("cache", "dir")
                       else ["dvc", "config", "--local", f"{section}.{option}", value])
            workspace.run(command, target)

    times: dict[str, list[float]] = {"dvc": [], "in-process": []}
    for round_ in range(rounds):
        ways = [("dvc", commands), ("in-process", lambda target: workspace.set_local_config(target, settings))]
        for way, write in ways if round_ % 2 == 0 else ways[::-1]:
            target = clone(scratch / f"{way}-{round_}")
            times[way].append(timed(lambda: write(target)))
            shutil.rmtree(target)
    return times


def saved(times: dict[str, list[float]]) -> float:
    return statistics.median(times["dvc"]) - statistics.median(times["in-process"])


def row(what: str, times: dict[str, list[float]]) -> str:
    cli, inproc = statistics.median(times["dvc"]), statistics.median(times["in-process"])
    first = times["in-process"][0]
    return (f"| {what} | {cli:.2f} | {inproc:.2f} | {first:.2f} | {inproc / cli:.2f} | {cli - inproc:.2f} | "
            f"{min(times['dvc']):.2f}-{max(times['dvc']):.2f} | "
            f"{min(times['in-process']):.2f}-{max(times['in-process']):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sweep_dvc_calls"))
    args = parser.parse_args()
    load = os.getloadavg()[0]
    env = workspace.task_env(1, None, None)
    with tempfile.TemporaryDirectory() as scratch:
        root = clone(Path(scratch) / "repo")
        queued = queue_rounds(root, args.rounds, env)
        configured = config_rounds(Path(scratch), args.rounds, str(root / ".dvc" / "cache"))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout
    command = " ".join(["python -m benchmarks.sweep_dvc_calls", *sys.argv[1:]])
    lines = [
        "# A sweep's DVC calls: a process each against the sweep's own process",
        "",
        f"- Command: `{command}`",
        f"- Date: {when_and_where(load, os.getloadavg()[0])}; commit {commit.strip()}, DVC "
        f"{__import__('dvc').__version__}, Python {sys.version.split()[0]}",
        f"- {args.rounds} rounds, the two ways' order alternating; wall seconds per call: the median round, the "
        "in-process way's first call (DVC's modules imported), the ratio of the medians, the saving (median "
        "difference) and each way's range",
        "- Per experiment: `dvc exp run --queue -n NAME -S seed=K` in a fresh clone of the repository, against "
        "`local.queue_experiment` (the same entry: tests/test_sweep.py compares them). Per shared upstream run: the "
        "clone's `core.analytics`, `core.check_update` and `cache.dir` by three `dvc config --local` / `dvc cache dir "
        "--local` processes, against `workspace.set_local_config` (the same file, byte for byte: tests/test_sweep.py)",
        "",
        "| call | dvc process s | in-process s | in-process, first call s | ratio | saved s | dvc range | "
        "in-process range |",
        "|---|---:|---:|---:|---:|---:|---|---|",
        row("queue one experiment", queued),
        row("a clone's DVC settings", configured),
        "",
        f"README's canonical flow with 20 seeds queues {FLOW[0]} experiments and computes {FLOW[1]} shared upstream runs: "
        f"{saved(queued) * FLOW[0] + saved(configured) * FLOW[1]:.0f} s less of one core's work at these savings.",
        "",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
