"""``debias sweep``: its arguments, launching a new sweep (validate, save the plan, phase 1, run or submit) and
``--status`` / ``--resume`` of an existing one."""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from debias.tools.sweep.grid import (MAX_POINTS, Job, SweepError, check_grid, plan_from_args, unread_in_grid,
                                     upstream_runs)
from debias.harness.tracking.store import RUN_NAME_VARIABLE
from debias.tools.sweep.local import run_local
from debias.tools.sweep.slurm import launch_slurm, result_of
from debias.tools.sweep.status import mark_stopped_attempts, status_text, statuses, wait
from debias.tools.sweep.workspace import (CLONES, compute_upstream, dirty_files, load_state, run, save_state, sweep_dir, task_env,
                                    upstream_experiment)

LAUNCHERS = ("local", "slurm")


def tracking_default() -> str | None:
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def launch(root: Path, args: argparse.Namespace) -> int:
    """Validate, save the plan, run phase 1 (local) or submit both phases (slurm); wait if asked."""
    name, jobs, upstream = plan_from_args(args, root)
    here = sweep_dir(root, name)
    if (here / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} exists ({here / 'sweep.json'}): `debias sweep --name {name} --status` "
                         "shows it, `--resume` reruns what is not done; or choose another --name")
    print(f"[sweep] {name}: {len(jobs)} experiments; validating them against the params schema", flush=True)
    merged = check_grid(root, jobs, upstream)
    for message in unread_in_grid(jobs, merged):
        print(f"[sweep] {name}: WARNING {message}", flush=True)
    if args.launcher == "slurm":
        if shutil.which("sbatch") is None:
            raise SweepError("--launcher slurm: sbatch is not on PATH (no SLURM client here)")
        if not (args.tracking_uri or tracking_default()) and os.environ.get("DEBIAS_TRACKING", "").lower() != "off":
            raise SweepError("--launcher slurm needs an MLflow server every node reaches (--tracking-uri or "
                             "MLFLOW_TRACKING_URI; `debias services up` starts one): each task's own store is "
                             "deleted with its clone. DEBIAS_TRACKING=off runs without tracking")
        if not args.dvc_remote:
            raise SweepError("--launcher slurm needs --dvc-remote PATH (a folder every node sees): the tasks share "
                             "DVC's run-cache and push their experiments' outputs there")
    dirty = dirty_files(root)
    if dirty:
        undo = (" (params.yaml holds a `dvc exp run -S`'s values: `git checkout params.yaml` restores the committed "
                "ones)" if "params.yaml" in dirty else "")
        raise SweepError("commit these first (the experiments run the committed tree): " + ", ".join(dirty[:20]) + undo)
    commit = run(["git", "rev-parse", "HEAD"], root).strip()
    options = {k: getattr(args, k) for k in ("jobs", "partition", "time", "gpus", "cpus_per_task",
                                                 "array_parallelism", "mem_gb", "threads")}
    options.update(dvc_remote=str(Path(args.dvc_remote).resolve()) if args.dvc_remote else None,
                   tracking_uri=args.tracking_uri or tracking_default(), mlflow_experiment=args.mlflow_experiment)
    state = {"name": name, "launcher": args.launcher, "commit": commit, "upstream_stage": upstream,
             "jobs": [asdict(j) for j in jobs], "options": options, "created": time.time()}
    state["phase1"] = upstream_runs(root, jobs, merged, upstream)
    save_state(root, state)
    print(f"[sweep] {name}: {len(jobs)} experiments valid against the params schema"
          + (f", {len(state['phase1'])} shared upstream run(s) of {upstream}" if upstream else "")
          + f"; plan in {here / 'sweep.json'}", flush=True)
    return execute(root, state, jobs, args)


def execute(root: Path, state: dict[str, Any], todo: list[Job], args: argparse.Namespace) -> int:
    options = state["options"]
    threads = options["threads"] or options["cpus_per_task"] or 1
    local = state["launcher"] == "local"  # queued experiments run this tree's code; SLURM tasks their clone's
    env = task_env(threads, options["tracking_uri"], options["mlflow_experiment"], root / "src" if local else None)
    started = time.time()
    if state["launcher"] == "local":
        pending = [u for u in state["phase1"] if u["name"] not in state.get("upstream_done", [])]
        if pending:
            cache = run(["dvc", "cache", "dir"], root).strip()
            base = sweep_dir(root, state["name"]) / CLONES
            up_env = {**env, "MLFLOW_EXPERIMENT_NAME": upstream_experiment(env)}
            if not env.get("MLFLOW_TRACKING_URI"):  # the clones' own stores go with them: log into this repository's
                from debias.harness.tracking import ensure_experiment, tracking_uri

                up_env["MLFLOW_TRACKING_URI"] = tracking_uri(root)
                ensure_experiment(up_env["MLFLOW_TRACKING_URI"], up_env["MLFLOW_EXPERIMENT_NAME"], root)  # mlruns here
            specs = [{"root": str(root), "commit": state["commit"], "clone": str(base / u["name"]),
                      "overrides": u["overrides"], "stage": state["upstream_stage"], "cache_dir": cache,
                      "env": {**up_env, RUN_NAME_VARIABLE: f"{state['name']}-{u['name']}"}} for u in pending]
            print(f"[sweep] computing {len(specs)} shared upstream run(s) of {state['upstream_stage']} "
                  f"(step 1 of 2; then {len(todo)} experiments)", flush=True)
            with ThreadPoolExecutor(max_workers=options["jobs"]) as pool:
                futures = {pool.submit(compute_upstream, spec): Path(spec["clone"]).name for spec in specs}
                for count, future in enumerate(as_completed(futures), 1):
                    future.result()
                    print(f"[sweep] shared upstream {count}/{len(specs)} ({futures[future]}) done after "
                          f"{time.time() - started:.0f} s", flush=True)
            state["upstream_done"] = [*state.get("upstream_done", []), *(u["name"] for u in pending)]
        state["launched"] = True
        save_state(root, state)
        run_local(root, todo, options["jobs"], env, poll_s=args.poll, started=started)
        final = statuses(root, state)
    else:
        launch_slurm(root, state, todo, env, state["phase1"])
        state["launched"] = True
        save_state(root, state)
        print(f"[sweep] submitted {len(todo)} experiments to SLURM; `debias sweep --name {state['name']} --status`",
              flush=True)
        if not args.wait:
            return 0
        final = wait(root, state, args.poll)
    print(status_text(state, final))
    print(f"[sweep] wall time {time.time() - started:.1f} s")
    return 0 if all(s == "done" for s, _ in final.values()) else 1


def resume(root: Path, state: dict[str, Any], args: argparse.Namespace) -> int:
    """Rerun the experiments neither done nor queued nor running (a failed or killed one's clone is made anew), at
    the commit the sweep was launched at: a HEAD that moved since is refused (the rest would run other code or params
    than the experiments done, and compare would not find those on the new commit)."""
    head = run(["git", "rev-parse", "HEAD"], root).strip()
    if head != state["commit"]:
        raise SweepError(f"sweep {state['name']!r} ran at commit {state['commit'][:12]}; HEAD is now {head[:12]}: "
                         f"its experiments done there are not this commit's. `git checkout {state['commit'][:12]}` "
                         "and resume, or launch a new sweep (another --name) at this commit")
    states = statuses(root, state)
    todo = [Job(**j) for j in state["jobs"] if states[j["name"]][0] == "failed"]
    if not todo:
        print(status_text(state, states))
        print("[sweep] nothing to resume")
        return 0 if all(s == "done" for s, _ in states.values()) else 1
    print(f"[sweep] resuming {len(todo)} experiment(s): {', '.join(j.name for j in todo)}", flush=True)
    marked = mark_stopped_attempts(root, state, [job.name for job in todo])
    if marked:
        print(f"[sweep] {marked} MLflow parent run(s) of the stopped attempts marked KILLED", flush=True)
    if state["launcher"] == "slurm":
        for name, entry in state.get("upstream", {}).items():
            entry["result"] = result_of(entry["result_pickle"])
    return execute(root, state, todo, args)


def main(args: argparse.Namespace) -> int:
    from debias.core.errors import DebiasError
    from debias.core.paths import repo_root
    from debias.params import ParamsError

    root = Path(args.repo).resolve() if args.repo else repo_root()
    try:
        if args.status or args.resume:
            if not args.name:
                raise SweepError("--status / --resume need --name (the sweep's name: ls sweeps/)")
            state = load_state(root, args.name)
            if args.status:
                print(status_text(state, statuses(root, state)))
                return 0
            return resume(root, state, args)
        return launch(root, args)
    except (SweepError, ParamsError, DebiasError, RuntimeError) as exc:
        print(f"debias sweep: {exc}", file=sys.stderr)
        return 2


SWEEP_HELP = """\
Run a grid of DVC experiments (params x values x seeds) on DVC's queue (--launcher local) or as a SLURM job
array (--launcher slurm, through submitit); each grid point is an ordinary DVC experiment. The whole grid is
checked against the params schema before anything runs.

examples:
  debias sweep --name eps -S 'loss.epsilon=0,0.25' --seeds 0 1 --upstream infer_groups
  debias sweep --name eps --launcher slurm --dvc-remote /shared/dvc-remote --partition gpu --gpus 1 \\
      --time 120 -S 'loss.epsilon=0,0.25' --seeds 0 1 2 --upstream infer_groups
  debias sweep --file benchmarks/my_grid.yaml --launcher slurm --dvc-remote /shared/dvc-remote
  debias sweep --name eps --status
  debias sweep --name eps --resume --wait
"""


def add_parser(commands: Any) -> None:
    """The ``sweep`` subcommand (its handler is ``args.handler``)."""
    p = commands.add_parser("sweep", help="run a grid of DVC experiments locally or on SLURM",
                            description=SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="the sweep's name (prefix of its experiments' names; sweeps/<name>/ keeps its state)")
    p.add_argument("-S", "--set", action="append", default=[], metavar="KEY=V1[,V2...]",
                   help="a grid axis (several values) or a fixed override (one value), as dvc exp run -S")
    p.add_argument("--seeds", type=int, nargs="+", help="the seeds, innermost axis of the grid")
    p.add_argument("--max-points", type=int, default=MAX_POINTS, metavar="N",
                   help=f"refuse a sweep of more than N experiments (default {MAX_POINTS}: over six times the "
                   "project's largest grid; a bigger one is most often a range meant as a list)")
    p.add_argument("--file", help="a YAML sweep file: name, params (key: [values]), seeds, set, targets, upstream, "
                   "or experiments: [{name, set, targets}]")
    p.add_argument("--targets", nargs="+", help="stages each experiment runs (default: the whole pipeline)")
    p.add_argument("--upstream", metavar="STAGE", help="compute STAGE and its ancestors once per distinct value of "
                   "their params before the experiments (e.g. infer_groups), shared through DVC's run-cache")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--jobs", type=int, default=2, help="local: DVC queue workers (dvc queue start -j; default 2, quality.py's, one per core of a 2-core "
                   "machine)")
    p.add_argument("--threads", type=int, help="torch CPU threads per experiment (default: --cpus-per-task)")
    p.add_argument("--partition", help="slurm: partition (default: the cluster's default)")
    p.add_argument("--time", type=int, default=60, help="slurm: minutes per task (default 60, ours: SLURM needs a limit; a tiny "
                   "experiment takes about a minute, a real one sets its own)")
    p.add_argument("--gpus", type=int, default=0, help="slurm: GPUs per task (default: 0)")
    p.add_argument("--cpus-per-task", type=int, default=1, help="slurm: CPUs per task (default 1: DEBIAS_THREADS=1, as the test suite)")
    p.add_argument("--mem-gb", type=float, help="slurm: memory per task (default: the partition's default)")
    p.add_argument("--array-parallelism", type=int, default=256, help="slurm: array tasks running at once (default: "
                   "submitit's, 256)")
    p.add_argument("--dvc-remote", help="slurm: a DVC remote every node sees (a shared folder path)")
    p.add_argument("--tracking-uri", help="MLflow server of every stage (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--mlflow-experiment", help="MLflow experiment of the runs (default: $MLFLOW_EXPERIMENT_NAME "
                   "or debias)")
    p.add_argument("--status", action="store_true", help="show each experiment: queued, running, done, failed + log")
    p.add_argument("--resume", action="store_true", help="rerun the failed or killed experiments (done ones are kept)")
    p.add_argument("--wait", action="store_true", help="slurm: wait until every task ended (local always waits)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between status checks while waiting")
    p.add_argument("--repo", help=argparse.SUPPRESS)  # the repository root (default: the one around the cwd)
    p.set_defaults(handler=main)
