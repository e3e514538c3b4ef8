"""Queue-worker threads: stage times of experiments run by DVC's queue with several workers, per tree.

For every tree (commits and/or the working tree), a fresh temporary clone with the default params
(``--set`` adds overrides) runs `dvc repro` once (unmeasured: the shared upstream stages), then
``--experiments`` experiments (``-S stage2.lr=...``: each trains another stage-2 model, so train_contrastive,
linear_probe, evaluate and report all rerun) are queued and run with `dvc queue start -j --jobs`;
DEBIAS_THREADS and OMP_WAIT_POLICY are unset (as on a user's machine), so each stage takes the thread count the
code picks. Stage wall times come from the clone's MLflow store (each stage's run,
start to end); the queue's wall time from the first `dvc queue start` to an empty queue. ``--alone`` also
runs one experiment by itself (one worker) per tree, for reference. Trees take turns, ``--rounds`` times.

    nice -n 5 python -m benchmarks.queue_threads --trees COMMIT_BEFORE COMMIT_AFTER [--jobs 2]
        [--experiments 2] [--alone] [--set stage2.epochs=3 ...] [--out benchmarks/results/queue_threads]
"""

from __future__ import annotations

import argparse
import datetime
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent

from benchmarks.clones import NUMBA_CACHE, child_env, make_clone

STAGE2_STAGES = ("train_contrastive", "linear_probe", "evaluate", "report")


def nested(assignments: list[str]) -> dict:
    """``a.b=1`` strings as a nested override dict (values parsed as YAML)."""
    out: dict = {}
    for item in assignments:
        key, value = item.split("=", 1)
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = yaml.safe_load(value)
    return out


def dvc(clone: Path, env: dict[str, str], *args: str, timeout: float = 3600) -> str:
    done = subprocess.run(["dvc", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise SystemExit(f"dvc {' '.join(args)} failed in {clone}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def run_queue(clone: Path, env: dict[str, str], rates: list[float], jobs: int) -> tuple[float, list[str]]:
    """Queue one experiment per stage-2 learning rate, run them with ``jobs`` workers; (queue wall seconds,
    experiment names)."""
    names = []
    for rate in rates:
        name = f"lr{rate:g}-j{jobs}-{int(time.time() * 1000) % 10**6}".replace(".", "")
        dvc(clone, env, "exp", "run", "--queue", "-n", name, "-S", f"stage2.lr={rate}")
        names.append(name)
    start = time.perf_counter()
    dvc(clone, env, "queue", "start", "-j", str(jobs))
    while True:
        time.sleep(5)
        status = dvc(clone, env, "queue", "status")
        if not any(word in status for word in ("Running", "Queued")):
            break
    wall = time.perf_counter() - start
    if "Failed" in status:
        raise SystemExit(f"a queued experiment failed in {clone}:\n{status}")
    return wall, names


def stage_walls(clone: Path, names: list[str]) -> dict[str, list[float]]:
    """Per stage, the wall seconds of its MLflow runs (start to end) in the experiments ``names``."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{clone / 'mlflow.db'}")
    experiments = [e.experiment_id for e in client.search_experiments()]
    walls: dict[str, list[float]] = {}
    for name in names:
        runs = client.search_runs(experiments, filter_string=f"tags.`debias.dvc_experiment` = '{name}'")
        for run in runs:
            stage = run.data.tags["debias.stage"]
            if run.info.end_time:
                walls.setdefault(stage, []).append((run.info.end_time - run.info.start_time) / 1000)
    return walls


def thread_lines(clone: Path, env: dict[str, str], names: list[str]) -> list[str]:
    """The thread-count lines the stages printed (dvc queue logs)."""
    lines = []
    for name in names:
        log = subprocess.run(["dvc", "queue", "logs", name], cwd=clone, env=env, capture_output=True, text=True).stdout
        lines += sorted({line.strip() for line in log.splitlines() if "DEBIAS_THREADS unset" in line})
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", required=True, help="commits and/or 'worktree'")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--experiments", type=int, default=2)
    parser.add_argument("--alone", action="store_true", help="also one experiment with one worker, per tree")
    parser.add_argument("--rounds", type=int, default=1, help="the trees take turns this many times")
    parser.add_argument("--set", nargs="*", default=[], help="params overrides, e.g. stage2.epochs=3")
    parser.add_argument("--out", default=str(HERE / "results" / "queue_threads"))
    args = parser.parse_args(argv)
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="queue-threads-"))
    clones, envs = {}, {}
    results: list[dict[str, Any]] = []
    try:
        for index, tree in enumerate(args.trees):
            (work / str(index)).mkdir()
            clones[tree] = make_clone(work / str(index), nested(args.set), None if tree == "worktree" else tree)
            env = child_env(1, NUMBA_CACHE, clones[tree])
            env.pop("DEBIAS_THREADS")  # the point: what the stages pick by themselves
            env.pop("OMP_WAIT_POLICY", None)  # as a user's shell has it (infer_groups and evaluate set it themselves)
            envs[tree] = env
            dvc(clones[tree], env, "repro")
            print(f"[queue] {tree}: upstream ready", flush=True)
        for round_index in range(args.rounds):  # every experiment trains anew: its own stage-2 learning rate
            base = 0.0005 + 0.0001 * round_index * (args.experiments + 1)
            runs = [("queue", [round(base + 0.0001 * i, 6) for i in range(args.experiments)], args.jobs)]
            if args.alone:
                runs.append(("alone", [round(base + 0.0001 * args.experiments, 6)], 1))
            for kind, values, jobs in runs:
                for tree in args.trees if round_index % 2 == 0 else args.trees[::-1]:
                    wall, names = run_queue(clones[tree], envs[tree], values, jobs)
                    walls = stage_walls(clones[tree], names)
                    results.append({"tree": tree, "kind": kind, "jobs": jobs, "experiments": len(values),
                                    "queue_wall_s": wall, "stages": {s: walls.get(s, []) for s in STAGE2_STAGES},
                                    "threads": thread_lines(clones[tree], envs[tree], names)})
                    print(f"[queue] {tree} {kind}: {wall:.0f} s; " + ", ".join(
                        f"{s} {statistics.median(v):.1f} s" for s, v in walls.items() if v), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    command = shlex.join(["python", "-m", "benchmarks.queue_threads", *(argv if argv is not None else sys.argv[1:])])
    lines = ["# Queue workers and threads", "",
             f"- Command: `{command}`",
             f"- Date: {started:%Y-%m-%d %H:%M %Z}; load average (1 min) before {load_before:.2f}, after "
             f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs; DEBIAS_THREADS and OMP_WAIT_POLICY unset, "
             "DEBIAS_TRACKING=required",
             "- Stage seconds: each stage's MLflow run, start to end (median over the experiments; the values in "
             "brackets); queue: `dvc queue start` to an empty queue.", "",
             "| tree | run | workers | experiments | queue wall (s) | " + " | ".join(f"{s} (s)" for s in STAGE2_STAGES)
             + " | threads the stages chose |",
             "|---|---|---:|---:|---:|" + "---:|" * len(STAGE2_STAGES) + "---|"]
    for r in results:
        cells = [f"{statistics.median(v):.1f} [{', '.join(f'{x:.1f}' for x in v)}]" if v else "" for v in
                 (r["stages"][s] for s in STAGE2_STAGES)]
        chosen = "; ".join(dict.fromkeys(line.split("] ", 1)[-1] for line in r["threads"])) or "library default"
        lines.append(f"| {r['tree']} | {r['kind']} | {r['jobs']} | {r['experiments']} | {r['queue_wall_s']:.0f} | "
                     + " | ".join(cells) + f" | {chosen} |")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
