"""Where a sweep stands: each experiment queued / running / done / failed with its log, waiting for the end, and
the MLflow parent runs of stopped attempts ended as KILLED before a resume."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from debias.harness.progress import Heartbeat
from debias.tools.sweep.local import local_states
from debias.tools.sweep.slurm import slurm_states
from debias.tools.sweep.watch import SweepWatch

STATES = ("queued", "running", "done", "failed")
STOPPED_TAG = "debias.sweep_stopped"  # on a parent run of an attempt that never finished (see mark_stopped_attempts)


def statuses(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Experiment name -> (queued | running | done | failed, its log path or how to read it)."""
    return (slurm_states if state["launcher"] == "slurm" else local_states)(root, state)


def status_text(state: dict[str, Any], states: dict[str, tuple[str, str]]) -> str:
    counts = {s: sum(1 for v in states.values() if v[0] == s) for s in STATES}
    lines = [f"sweep {state['name']} ({state['launcher']}, commit {state['commit'][:7]}): "
             + ", ".join(f"{counts[s]} {s}" for s in STATES)]
    width = max(len(n) for n in states) if states else 0
    for name, (status, log) in states.items():
        lines.append(f"  {name:<{width}}  {status:<7}  {log}".rstrip())
    return "\n".join(lines)


def task_log(log: str) -> Path | None:
    """The log file of a status line's log field (``path (why)`` or ``path``), None where there is none."""
    path = log.split(" (", 1)[0].strip()
    return Path(path) if path and "/" in path else None


def wait(root: Path, state: dict[str, Any], poll_s: float, timeout_s: float | None = None,
         watch: SweepWatch | None = None, say: Callable[[str], None] | None = None) -> dict[str, tuple[str, str]]:
    """Poll until no experiment is queued or running (or ``timeout_s``); progress printed when it changes, and
    between changes the heartbeat of ``watch`` (its own when none is given) names each running task's stage, epoch
    and ETA from its log."""
    if watch is None or say is None:
        watch = SweepWatch("sweep")
        with Heartbeat(watch.line) as beat:
            return wait(root, state, poll_s, timeout_s, watch, beat.say)
    started, reported = time.time(), None
    watch.phase(f"{len(state['jobs'])} experiments on SLURM", len(state["jobs"]),
                workers=min(len(state["jobs"]), int(state["options"].get("array_parallelism") or 1)))
    while True:
        states = statuses(root, state)
        counts = tuple(sum(1 for v in states.values() if v[0] == s) for s in STATES)
        shown = ", ".join(f"{c} {s}" for c, s in zip(counts, STATES))
        watch.update(doing="waiting for SLURM", counts=shown, done=counts[2] + counts[3],
                     logs={name: task_log(log) for name, (status, log) in states.items() if status == "running"})
        if counts != reported:
            reported = counts
            say(f"[sweep] {time.time() - started:.0f} s: {shown}")
        if not counts[0] and not counts[1]:
            return states
        if timeout_s is not None and time.time() - started > timeout_s:
            return states
        time.sleep(poll_s)


def mark_stopped_attempts(root: Path, state: dict[str, Any], names: list[str]) -> int:
    """End as KILLED, with a tag saying why, the MLflow parent runs of earlier attempts of experiments that never
    finished (no DVC experiment): a task killed between two stages leaves its parent FINISHED by the last stage
    that ended, which would pass the attempt off as a finished experiment. Returns how many were marked."""
    if os.environ.get("DEBIAS_TRACKING", "").lower() == "off":
        return 0
    from mlflow.tracking import MlflowClient

    from debias.harness.tracking import DEFAULT_EXPERIMENT, KIND_TAG, tracking_uri

    options = state["options"]
    uri = options.get("tracking_uri") or tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(options.get("mlflow_experiment") or
                                               os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT)
    if experiment is None:
        return 0
    marked = 0
    for name in names:
        runs = client.search_runs([experiment.experiment_id], max_results=1000, filter_string=(
            f"tags.`{KIND_TAG}` = 'pipeline' and tags.`debias.dvc_experiment` = '{name}'"))
        for run_ in runs:
            if run_.info.status in ("FINISHED", "RUNNING", "SCHEDULED"):
                client.set_tag(run_.info.run_id, STOPPED_TAG, "this attempt stopped before its experiment finished "
                               "(cancelled, pre-empted, out of time or failed); debias sweep --resume reran it")
                client.set_terminated(run_.info.run_id, status="KILLED")
                marked += 1
    return marked
