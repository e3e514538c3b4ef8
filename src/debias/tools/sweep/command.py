"""``debias sweep``: its arguments, launching a new sweep (validate, save the plan, phase 1, run or submit) and
``--status`` / ``--resume`` of an existing one."""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import asdict
from pathlib import Path
from typing import Any

from debias.harness.progress import Heartbeat

from debias.tools.sweep.extend import (DECIDE_METRIC, Plan, check_plan, extended_jobs, look_text, next_seeds,
                                       paired_differences, planned_looks, setting_label, settings)
from debias.tools.sweep.grid import (MAX_POINTS, Job, SweepError, check_grid, parse_seeds, plan_from_args,
                                     unread_in_grid, upstream_runs)
from debias.harness.tracking.store import RUN_NAME_VARIABLE
from debias.tools.sweep.local import run_local
from debias.metrics.paired import sequential_look
from debias.tools.sweep.records import experiment_ref, headline_values, is_number, record_restored
from debias.tools.sweep.slurm import launch_slurm, result_of
from debias.tools.sweep.status import mark_stopped_attempts, status_text, statuses, wait
from debias.tools.sweep.watch import SweepWatch
from debias.tools.sweep.workspace import (CLONES, cache_dir, committed_params, compute_upstream, load_state, refuse_dirty,
                                          run, save_state, sweep_dir, sweep_lock, task_env, upstream_experiment)

LAUNCHERS = ("local", "slurm")
DEFAULT_JOBS = 2  # local: DVC queue workers, one per core of a 2-core machine (quality.py's)
# What a resumed sweep takes from its plan, never from the command line: (option, attribute, its default).
PLAN_OPTIONS = (("-S", "set", []), ("--file", "file", None), ("--targets", "targets", None),
                ("--upstream", "upstream", None))


def tracking_default() -> str | None:
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def launch(root: Path, args: argparse.Namespace, watch: SweepWatch) -> int:
    """Validate, save the plan, run phase 1 (local) or submit both phases (slurm); wait if asked."""
    name, jobs, upstream = plan_from_args(args, root)
    here = sweep_dir(root, name)
    if (here / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} exists ({here / 'sweep.json'}): `debias sweep --name {name} --status` "
                         "shows it, `--resume` reruns what is not done; or choose another --name")
    watch.say(f"[sweep] {name}: {len(jobs)} experiments; validating them against the params schema")
    merged = check_grid(root, jobs, upstream)
    for message in unread_in_grid(jobs, merged):
        watch.say(f"[sweep] {name}: WARNING {message}")
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
    refuse_dirty(root, "a sweep")
    with sweep_lock(root, name):
        if (here / "sweep.json").exists():  # launched meanwhile by another `debias sweep`
            raise SweepError(f"sweep {name!r} exists ({here / 'sweep.json'}): `debias sweep --name {name} --resume`")
        return start(root, args, name, jobs, upstream, merged, watch)


def start(root: Path, args: argparse.Namespace, name: str, jobs: list[Job], upstream: str | None,
          merged: list[dict[str, Any]], watch: SweepWatch) -> int:
    """Save a validated sweep's plan at HEAD and run it (:func:`execute`); the caller holds its lock."""
    here = sweep_dir(root, name)
    commit = run(["git", "rev-parse", "HEAD"], root).strip()
    options = {k: getattr(args, k) for k in ("jobs", "partition", "time", "gpus", "cpus_per_task",
                                                 "array_parallelism", "mem_gb", "threads")}
    options["jobs"] = DEFAULT_JOBS if args.jobs is None else args.jobs
    options.update(dvc_remote=str(Path(args.dvc_remote).resolve()) if args.dvc_remote else None,
                   tracking_uri=args.tracking_uri or tracking_default(), mlflow_experiment=args.mlflow_experiment)
    state = {"name": name, "launcher": args.launcher, "commit": commit, "upstream_stage": upstream,
             "jobs": [asdict(j) for j in jobs], "options": options, "created": time.time()}
    state["phase1"] = upstream_runs(root, jobs, merged, upstream)
    save_state(root, state)
    watch.say(f"[sweep] {name}: {len(jobs)} experiments valid against the params schema"
          + (f", {len(state['phase1'])} shared upstream run(s) of {upstream}" if upstream else "")
          + f"; plan in {here / 'sweep.json'}")
    return execute(root, state, jobs, args, watch)


def shared_upstream(root: Path, state: dict[str, Any], todo: list[Job], env: dict[str, str], watch: SweepWatch,
                    say: Callable[[str], None]) -> None:
    """Phase 1 on this machine: each shared upstream run not yet computed, in a clone on this repository's DVC cache,
    ``--jobs`` at a time, its output in ``sweeps/<name>/logs/<upstream>.log`` (which the heartbeat reads)."""
    options = state["options"]
    pending = [u for u in state["phase1"] if u["name"] not in state.get("upstream_done", [])]
    if not pending:
        return
    cache = cache_dir(root)
    base = sweep_dir(root, state["name"])
    (base / "logs").mkdir(parents=True, exist_ok=True)
    up_env = {**env, "MLFLOW_EXPERIMENT_NAME": upstream_experiment(env)}
    tracking = env.get("DEBIAS_TRACKING", "required").strip().lower() != "off"  # off: no store to prepare
    if tracking and not env.get("MLFLOW_TRACKING_URI"):  # the clones' own stores go with them: log into this one's
        from debias.harness.tracking import ensure_experiment, tracking_uri

        up_env["MLFLOW_TRACKING_URI"] = tracking_uri(root)
        ensure_experiment(up_env["MLFLOW_TRACKING_URI"], up_env["MLFLOW_EXPERIMENT_NAME"], root)  # mlruns here
    specs = [{"root": str(root), "commit": state["commit"], "clone": str(base / CLONES / u["name"]),
              "overrides": u["overrides"], "stage": state["upstream_stage"], "cache_dir": cache,
              "log": str(base / "logs" / f"{u['name']}.log"),
              "env": {**up_env, RUN_NAME_VARIABLE: f"{state['name']}-{u['name']}"}} for u in pending]
    for spec in specs:
        Path(spec["log"]).unlink(missing_ok=True)
    say(f"[sweep] computing {len(specs)} shared upstream run(s) of {state['upstream_stage']} "
        f"(step 1 of 2; then {len(todo)} experiments)")
    watch.phase(f"shared upstream 0/{len(specs)} done", len(specs), "the shared upstream", options["jobs"])

    def compute(spec: dict[str, Any]) -> str:
        watch.started_run(Path(spec["clone"]).name, Path(spec["log"]))
        try:
            return compute_upstream(spec)
        finally:
            watch.ended_run(Path(spec["clone"]).name)

    with ThreadPoolExecutor(max_workers=options["jobs"]) as pool:
        futures = {pool.submit(compute, spec): Path(spec["clone"]).name for spec in specs}
        for count, future in enumerate(as_completed(futures), 1):
            future.result()
            watch.update(counts=f"shared upstream {count}/{len(specs)} done", done=count)
            say(f"[sweep] shared upstream {count}/{len(specs)} ({futures[future]}) done after "
                f"{time.time() - watch.started:.0f} s")
            state["upstream_done"] = [*state.get("upstream_done", []), futures[future]]
            save_state(root, state)


def execute(root: Path, state: dict[str, Any], todo: list[Job], args: argparse.Namespace, watch: SweepWatch) -> int:
    """Run ``todo`` (phase 1 first where it is not done), ``watch`` saying where it is; then the MLflow runs of the
    experiments DVC restored (:func:`record_restored`) and the status."""
    say = watch.say
    options = state["options"]
    threads = options["threads"] or options["cpus_per_task"] or 1
    env = task_env(threads, options["tracking_uri"], options["mlflow_experiment"])
    started = time.time()
    if state["launcher"] == "local":
        shared_upstream(root, state, todo, env, watch, say)
        state["launched"] = True
        save_state(root, state)
        run_local(root, todo, options["jobs"], env, poll_s=args.poll, started=started, watch=watch, say=say)
        final = statuses(root, state)
    else:
        watch.update(doing=f"submitting {len(todo)} experiments to SLURM")
        launch_slurm(root, state, todo, env, state["phase1"])
        state["launched"] = True
        save_state(root, state)
        say(f"[sweep] submitted {len(todo)} experiments to SLURM; `debias sweep --name {state['name']} --status`")
        if not args.wait:
            return 0
        final = wait(root, state, args.poll, watch=watch, say=say)
    watch.phase("recording in MLflow the stages DVC restored", 0)
    for line in record_restored(root, state, [name for name, (status, _) in final.items() if status == "done"]):
        say(f"[sweep] {line}")
    say(status_text(state, final))
    say(f"[sweep] wall time {time.time() - started:.1f} s")
    return 0 if all(s == "done" for s, _ in final.values()) else 1


def resume(root: Path, state: dict[str, Any], args: argparse.Namespace,
           watch: SweepWatch | None = None) -> int:
    """Rerun the experiments neither done nor queued nor running (a failed or killed one's clone is made anew), at
    the commit the sweep was launched at: a HEAD that moved since is refused (the rest would run other code or params
    than the experiments done, and compare would not find those on the new commit). With ``--seeds``, the seeds the
    plan lacks are added first (:func:`add_seeds`); with ``--until-decided``, the sequential looks follow."""
    head = run(["git", "rev-parse", "HEAD"], root).strip()
    if head != state["commit"]:
        raise SweepError(f"sweep {state['name']!r} ran at commit {state['commit'][:12]}; HEAD is now {head[:12]}: "
                         f"its experiments done there are not this commit's. `git checkout {state['commit'][:12]}` "
                         "and resume, or launch a new sweep (another --name) at this commit")
    refuse_dirty(root, f"resuming sweep {state['name']!r}")
    resume_options(state, args)
    watch = watch or SweepWatch("sweep")
    if args.seeds:
        add_seeds(root, state, parse_seeds(args.seeds), watch)
    code = rerun_unfinished(root, state, args, watch)
    if code == 0 and args.until_decided is not None:
        return until_decided(root, state, args, watch)
    return code


def resume_options(state: dict[str, Any], args: argparse.Namespace) -> None:
    """Check a resume's options against the sweep's plan: those that shape its experiments (``-S``, ``--file``,
    ``--targets``, ``--upstream``, another ``--threads``) are refused, naming the plan's and what works; ``--jobs``
    (workers, which change no result) replaces the plan's."""
    given = [flag for flag, name, default in PLAN_OPTIONS if getattr(args, name, default) not in (default, [])]
    if given:
        raise SweepError(f"--resume runs sweep {state['name']!r} as planned; {', '.join(given)} would change its "
                         f"experiments, which the done ones did not run: give --seeds to add seeds, or launch a new "
                         f"sweep (another --name) with them")
    options = state["options"]
    if getattr(args, "threads", None) is not None and args.threads != options.get("threads"):
        raise SweepError(f"--threads {args.threads}: sweep {state['name']!r} runs with --threads "
                         f"{options.get('threads') or options.get('cpus_per_task') or 1} (a thread count can change a "
                         "result's last digits, and its done experiments ran with that): resume without --threads")
    if getattr(args, "jobs", None) is not None:
        options["jobs"] = args.jobs


def add_seeds(root: Path, state: dict[str, Any], seeds: list[int],
              watch: SweepWatch | None = None) -> list[Job]:
    """Add to the plan every seed of ``seeds`` it lacks, for each setting (:func:`extended_jobs`), validated like a
    new sweep, with the shared upstream runs the new seeds need; saved. The experiments done stay as they are."""
    watch = watch or SweepWatch("sweep")
    jobs = [Job(**j) for j in state["jobs"]]
    new = extended_jobs(jobs, seeds)
    if not new:
        return []
    merged = check_grid(root, jobs + new, state["upstream_stage"], committed_params(root, state["commit"]))
    known = {u["key"]: u for u in state["phase1"]}
    for entry in upstream_runs(root, jobs + new, merged, state["upstream_stage"]):
        if entry["key"] not in known:
            entry["name"] = f"upstream-{len(known)}"
            known[entry["key"]] = entry
    added_upstream = len(known) - len(state["phase1"])
    state["phase1"] = list(known.values())
    state["jobs"] += [asdict(job) for job in new]
    save_state(root, state)
    settings_count = len(settings(jobs))
    watch.say(f"[sweep] {state['name']}: {len(new)} new experiments ({len(new) // settings_count} seed(s) x "
          f"{settings_count} setting(s)), {added_upstream} new shared upstream run(s); the experiments and upstream "
          "runs done are kept")
    return new


def rerun_unfinished(root: Path, state: dict[str, Any], args: argparse.Namespace,
                     watch: SweepWatch | None = None) -> int:
    """Run the experiments of the plan neither done nor queued nor running (failed, stopped or new)."""
    watch = watch or SweepWatch("sweep")
    states = statuses(root, state)
    todo = [Job(**j) for j in state["jobs"] if states[j["name"]][0] == "failed"]
    if not todo:
        for line in record_restored(root, state, [name for name, (status, _) in states.items() if status == "done"]):
            watch.say(f"[sweep] {line}")  # a SLURM sweep not waited for records its restored stages here
        watch.say(status_text(state, states))
        watch.say("[sweep] nothing to resume")
        return 0 if all(s == "done" for s, _ in states.values()) else 1
    watch.say(f"[sweep] resuming {len(todo)} experiment(s): {', '.join(j.name for j in todo)}")
    marked = mark_stopped_attempts(root, state, [job.name for job in todo])
    if marked:
        watch.say(f"[sweep] {marked} MLflow parent run(s) of the stopped attempts marked KILLED")
    if state["launcher"] == "slurm":
        for name, entry in state.get("upstream", {}).items():
            entry["result"] = result_of(entry["result_pickle"])
    return execute(root, state, todo, args, watch)


def metric_values(root: Path, state: dict[str, Any], names: list[str], metric: str) -> dict[str, float]:
    """Experiment name -> ``metric`` (points for an accuracy) from each one's git-tracked headline metrics; a
    SweepError names an experiment without a number for it."""
    from debias.core.headline import PERCENT_KEYS

    values = {}
    for name in names:
        value = headline_values(root, experiment_ref(state["commit"], name)).get(metric)
        if not is_number(value):
            raise SweepError(f"{name}: {metric} is {value!r}, not a number (its headline metrics: "
                             f"reports/metrics/*.json at its experiment); no verdict can be drawn on it: choose "
                             "another --metric")
        values[name] = float(value) * (100.0 if metric in PERCENT_KEYS else 1.0)
    return values


def until_decided(root: Path, state: dict[str, Any], args: argparse.Namespace,
                  watch: SweepWatch | None = None) -> int:
    """Look at the paired difference of the sweep's two settings at each planned look (:mod:`.extend`), adding the
    next batch of seeds and running it while the verdict is open and the plan has looks left."""
    watch = watch or SweepWatch("sweep")
    from debias.core.headline import LABELS, PERCENT_KEYS

    metric = args.metric or DECIDE_METRIC
    if metric not in LABELS:
        raise SweepError(f"--metric {metric!r}: not a headline metric; allowed: {', '.join(LABELS)}")
    if args.margin is None or not 0 < args.margin < (100 if metric in PERCENT_KEYS else float("inf")):
        raise SweepError(f"--until-decided needs --margin D > 0 (got {args.margin}), below 100 for an accuracy: the "
                         "difference that counts as none, in points for an accuracy (e.g. --margin 2)")
    members = settings([Job(**j) for j in state["jobs"]])
    if len(members) != 2:
        raise SweepError(f"--until-decided compares two settings paired by seed; sweep {state['name']!r} has "
                         f"{len(members)}: launch a sweep of two values (e.g. -S 'loss.epsilon=0,0.25')")
    first, second = (jobs[0] for jobs in members.values())
    names = (setting_label(first, second), setting_label(second, first))
    unit = "points" if metric in PERCENT_KEYS else f"({metric}'s units)"
    have = min(len(jobs) for jobs in members.values())
    kept = state.get("sequential")  # an interrupted plan goes on with its batch, whatever seeds it added since
    batch = args.batch or (int(kept["batch"]) if kept and "batch" in kept else have)
    plan = check_plan(state.get("sequential"),
                      Plan(metric, float(args.margin), planned_looks(have, batch, args.until_decided), batch))
    state["sequential"] = {**state.get("sequential", {}), **plan.as_state()}
    save_state(root, state)
    watch.say(f"[sweep] sequential plan: {metric} {names[1]} - {names[0]}, looks at {', '.join(map(str, plan.looks))} "
          f"seeds, each test at alpha/{len(plan.looks)} = {plan.alpha / len(plan.looks):.4g} (Bonferroni: a false "
          f"'differs' or a false 'within ±{plan.margin:g}' over all looks stays at alpha = {plan.alpha:g} or below)")
    for index, count in enumerate(plan.looks):
        seeds = sorted({job["overrides"]["seed"] for job in state["jobs"]})
        if len(seeds) < count:
            add_seeds(root, state, next_seeds(seeds, count - len(seeds)), watch)
            seeds = sorted({job["overrides"]["seed"] for job in state["jobs"]})
        members = settings([Job(**j) for j in state["jobs"] if j["overrides"]["seed"] in seeds[:count]])
        states = statuses(root, state)
        if any(states[job.name][0] != "done" for jobs in members.values() for job in jobs):
            code = rerun_unfinished(root, state, args, watch)
            if code != 0:
                watch.say(f"[sweep] look {index + 1} not taken: experiments failed; `debias sweep --name {state['name']} "
                      "--resume` with the same options reruns them and goes on with the plan")
                return code
        values = metric_values(root, state, [job.name for jobs in members.values() for job in jobs], metric)
        _, differences = paired_differences(members, values)
        look = sequential_look(differences, plan.margin, len(plan.looks), plan.alpha)
        watch.say(f"[sweep] {look_text(look, index, plan, metric, names, unit)}")
        state["sequential"].setdefault("seen", {})[str(count)] = {
            "mean": look.paired.mean, "low": look.paired.low, "high": look.paired.high, "differs": look.differs,
            "within": look.within}
        save_state(root, state)
        if look.decided:
            watch.say(f"[sweep] decided at {count} seeds")
            return 0
    watch.say(f"[sweep] undecided after {plan.looks[-1]} seeds (the plan's last look): neither a difference nor "
          f"equivalence within ±{plan.margin:g} {unit} shown")
    return 0


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
        watch = SweepWatch("sweep")  # from here on a line at least every 15 s, whatever runs
        with Heartbeat(watch.line) as beat, stopped_by_sigterm():
            watch.beat = beat
            if args.resume:
                with sweep_lock(root, args.name):
                    return resume(root, load_state(root, args.name), args, watch)  # the plan as the lock found it
            code = launch(root, args, watch)
            if code == 0 and args.until_decided is not None:
                name = plan_from_args(args, root)[0]
                with sweep_lock(root, name):
                    return until_decided(root, load_state(root, name), args, watch)
            return code
    except (SweepError, ParamsError, DebiasError, RuntimeError) as exc:
        print(f"debias sweep: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        name = args.name or "NAME"
        print(f"debias sweep: stopped; the experiments done are kept: `debias sweep --name {name} --status` shows "
              f"them, `debias sweep --name {name} --resume` runs the rest", file=sys.stderr)
        return 130


@contextlib.contextmanager
def stopped_by_sigterm() -> Iterator[None]:
    """SIGTERM (``kill``, a scheduler's stop) raises KeyboardInterrupt here as Ctrl-C does, so a killed ``debias
    sweep`` takes its experiments off DVC's queue and says so (:func:`debias.tools.sweep.local.stop_experiments`)
    rather than leaving them to run unseen; the previous handler is put back."""
    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


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
    p.add_argument("--seeds", nargs="+", metavar="SEED", help="the seeds, innermost axis of the grid (numbers or "
                   "ranges: 0 1 2, 0-9); with --resume: seeds to add to a finished sweep (the runs done are kept)")
    p.add_argument("--until-decided", type=int, metavar="MAX", help="add seeds in batches until the two settings' "
                   "paired difference is shown (t-test) or shown within ±--margin (TOST), or MAX seeds ran; each test "
                   "at alpha / the planned looks (Bonferroni): docs/comparing.md")
    p.add_argument("--margin", type=float, metavar="D", help="with --until-decided: the difference that counts as "
                   "none (points, for an accuracy)")
    p.add_argument("--metric", metavar="KEY", help=f"with --until-decided: the headline metric compared (default: "
                   f"{DECIDE_METRIC}, stage 2's test unbiased accuracy: it reads every test image, where a worst group "
                   "of a few images moves by tens of points per image)")
    p.add_argument("--batch", type=int, metavar="N", help="with --until-decided: seeds added per look (default: the "
                   "sweep's seed count)")
    p.add_argument("--max-points", type=int, default=MAX_POINTS, metavar="N",
                   help=f"refuse a sweep of more than N experiments (default {MAX_POINTS}: over six times the "
                   "project's largest grid; a bigger one is most often a range meant as a list)")
    p.add_argument("--file", help="a YAML sweep file: name, params (key: [values]), seeds, set, targets, upstream, "
                   "or experiments: [{name, set, targets}]")
    p.add_argument("--targets", nargs="+", help="stages each experiment runs (default: the whole pipeline)")
    p.add_argument("--upstream", metavar="STAGE", help="compute STAGE and its ancestors once per distinct value of "
                   "their params before the experiments (e.g. infer_groups), shared through DVC's run-cache")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--jobs", type=int, help=f"local: DVC queue workers (dvc queue start -j; default {DEFAULT_JOBS}, "
                   "quality.py's, one per core of a 2-core machine); with --resume: the workers from now on")
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
