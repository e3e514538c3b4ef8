"""The SLURM launcher (submitit): each experiment a job-array task in its own clone, phase 1 a first array the
experiments depend on (``afterok``), and their states from ``squeue`` and submitit's result pickles."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from debias.core.headline import forget_committed_run
from debias.tools.sweep.grid import Job, set_args
from debias.harness.tracking.store import RUN_NAME_VARIABLE
from debias.tools.sweep.workspace import (CLONES, clone_at, compute_upstream, finished_experiments,
                                          push_run_cache, run, stream, sweep_dir, upstream_experiment, with_src)

# ``squeue`` job states (man squeue, JOB STATE CODES) -> sweep state; anything else still listed counts as running.
SLURM_QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def run_experiment(spec: dict[str, Any]) -> str:
    """One experiment in its own clone (a SLURM array task): pull the run-cache, ``dvc exp run``, push the
    run-cache and the experiment (git ref to the repository, outputs to the DVC remote), remove the clone."""
    clone, root = Path(spec["clone"]), Path(spec["root"])
    clone_at(root, spec["commit"], clone)
    forget_committed_run(clone)  # DVC then restores each stage from its run-cache (:func:`clone_at`)
    env = with_src(spec["env"], clone)
    run(["dvc", "remote", "add", "--local", "-f", "-d", "sweep", spec["remote"]], clone)
    run(["dvc", "pull", "--run-cache", "--allow-missing"], clone, env, check=False)
    # --pull: a stage found in the run-cache is restored with its outputs fetched from the remote
    # into the task's log as it runs: `debias sweep` reads each task's stage and epoch there
    out = stream(["dvc", "exp", "run", "--pull", "-n", spec["name"], *set_args(spec["overrides"]), *spec["targets"]],
                 clone, env)
    push_run_cache(clone, env)
    run(["dvc", "exp", "push", "origin", spec["name"]], clone, env)
    shutil.rmtree(clone, ignore_errors=True)
    return out[-2000:]


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM job id (``123_4`` for an array task) -> squeue state, for the jobs still known to squeue."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    if not arrays:
        return {}
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(arrays)], capture_output=True,
                          text=True)
    found = {}
    for line in done.stdout.splitlines():
        job_id, _, status = line.strip().partition("|")
        found[job_id] = status
    return found


def result_of(result_pickle: str) -> str | None:
    """"success" or "error: <last line>" from a submitit result pickle; None when there is none (never ran or
    killed: cancelled, pre-empted, out of time)."""
    path = Path(result_pickle)
    if not path.is_file():
        return None
    import pickle

    try:
        outcome, value = pickle.loads(path.read_bytes())
    except Exception as exc:  # a half-written pickle: the task was killed while writing it
        return f"error: unreadable result ({exc})"
    if outcome == "success":
        return "success"
    lines = [line for line in str(value).splitlines() if line.strip()]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]  # the traceback's "SomeError: message"
    return f"error: {(raised or lines or [outcome])[-1][:300]}"


def slurm_executor(folder: Path, options: dict[str, Any], name: str, dependency: str | None = None) -> Any:
    import submitit

    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    parameters: dict[str, Any] = dict(name=name, timeout_min=options["time"], cpus_per_task=options["cpus_per_task"],
                                      slurm_array_parallelism=options["array_parallelism"], nodes=1, tasks_per_node=1,
                                      slurm_additional_parameters={"kill-on-invalid-dep": "yes"})
    if options.get("partition"):
        parameters["slurm_partition"] = options["partition"]
    if options.get("gpus"):
        parameters["gpus_per_node"] = options["gpus"]
    if options.get("mem_gb"):
        parameters["mem_gb"] = options["mem_gb"]
    else:
        parameters["slurm_mem"] = None  # submitit's default memory request is the scheduler's default
    if dependency:
        parameters["slurm_dependency"] = dependency
    executor.update_parameters(**parameters)
    return executor


def launch_slurm(root: Path, state: dict[str, Any], todo: list[Job], env: dict[str, str],
                 phase1: list[dict[str, Any]]) -> None:
    """Submit phase 1 (one array task per upstream value not yet computed) and the experiments' array (depending
    on phase 1 with ``afterok``); job ids and log paths go into the state."""
    options, here = state["options"], sweep_dir(root, state["name"])
    logs = here / "logs"
    common = {"root": str(root), "commit": state["commit"], "remote": options["dvc_remote"]}
    dependency = None
    upstream_env = {**env, "MLFLOW_EXPERIMENT_NAME": upstream_experiment(env)}
    pending = [u for u in phase1 if state.setdefault("upstream", {}).get(u["name"], {}).get("result") != "success"]
    if pending:
        specs = [{**common, "clone": str(here / CLONES / u["name"]), "overrides": u["overrides"],
                  "stage": state["upstream_stage"],
                  "env": {**upstream_env, RUN_NAME_VARIABLE: f"{state['name']}-{u['name']}"}} for u in pending]
        executor = slurm_executor(logs, options, f"{state['name']}-upstream")
        submitted = executor.map_array(compute_upstream, specs)
        for u, job in zip(pending, submitted):
            state["upstream"][u["name"]] = {"job_id": job.job_id, "log": str(job.paths.stdout),
                                            "result_pickle": str(job.paths.result_pickle)}
        dependency = "afterok:" + ":".join(sorted({j.job_id.split("_")[0] for j in submitted}))
    specs = [{**common, "clone": str(here / CLONES / job.name), "name": job.name, "overrides": job.overrides,
              "targets": job.targets, "env": env} for job in todo]
    executor = slurm_executor(logs, options, state["name"], dependency)
    submitted = executor.map_array(run_experiment, specs)
    for job, handle in zip(todo, submitted):
        state.setdefault("slurm", {})[job.name] = {"job_id": handle.job_id, "log": str(handle.paths.stdout),
                                                   "result_pickle": str(handle.paths.result_pickle)}


def slurm_states(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    done = finished_experiments(root, state["commit"])
    submitted = state.get("slurm", {})
    listed = squeue_states([s["job_id"] for s in submitted.values()])
    states = {}
    for job in state["jobs"]:
        name, entry = job["name"], submitted.get(job["name"])
        if name in done:
            states[name] = ("done", entry["log"] if entry else "")
        elif entry is None:
            states[name] = ("failed", "never submitted")
        elif entry["job_id"] in listed:
            status = listed[entry["job_id"]]
            states[name] = ("queued" if status in SLURM_QUEUED else "running", entry["log"])
        else:
            outcome = result_of(entry["result_pickle"])
            why = outcome or "no result: cancelled, pre-empted, out of time or its upstream failed"
            states[name] = ("failed", f"{entry['log']} ({why})")
    return states
