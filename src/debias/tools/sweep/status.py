"""Where a sweep stands: each experiment queued / running / done / failed with its log, waiting for the end, and
the MLflow parent runs of stopped attempts ended as KILLED before a resume."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from debias.tools.sweep.local import local_states
from debias.tools.sweep.slurm import slurm_states

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


def wait(root: Path, state: dict[str, Any], poll_s: float, timeout_s: float | None = None) -> dict[str, tuple[str, str]]:
    """Poll until no experiment is queued or running (or ``timeout_s``); progress printed when it changes."""
    started, reported = time.time(), None
    while True:
        states = statuses(root, state)
        counts = tuple(sum(1 for v in states.values() if v[0] == s) for s in STATES)
        if counts != reported:
            reported = counts
            print(f"[sweep] {time.time() - started:.0f} s: " + ", ".join(f"{c} {s}" for c, s in zip(counts, STATES)),
                  flush=True)
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
