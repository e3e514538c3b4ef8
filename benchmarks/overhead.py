"""Where the wall time of the pipeline's commands goes, tree against tree: DVC's own work (its YAML files among it),
the stage processes around their bodies, the bodies, MLflow, the always-run ``source`` stage and a sweep's
experiment.

Per tree (the working tree and/or commits), in a fresh clone after a first ``dvc repro`` (caches warm, the fork server
up), each command run on every tree in turn, round after round (the trees share each round's machine state):

- ``warm``: ``dvc repro -f`` (every stage runs); ``warm-off``: the same with ``DEBIAS_TRACKING=off`` (MLflow's share
  is the difference of the stage processes' time around their bodies);
- ``noop``: ``dvc repro`` with nothing changed; ``noop-exp``: ``dvc exp run`` with nothing changed;
- ``sweep``: ``debias sweep`` of two experiments (``-S loss.epsilon=0.1,0.25``, seed 0, ``--upstream infer_groups``,
  one worker): its wall, the shared upstream phase, each experiment's stage bodies, and a timeline of every Python
  process the sweep starts (a ``sitecustomize`` hook on the path writes each one's start and exit): DVC's queue
  around the experiments, and within each experiment DVC before its first stage, between its stages and after its
  last (collecting the experiment), against the stage commands.

Once per run, beside the trees: DVC's floor, a no-op ``dvc repro`` and ``dvc exp run`` of a pipeline of the same nine
stages in a chain whose commands are ``echo`` (one always changed, as ``source``), no params; the same chain with a
``python -c`` process per stage, ``dvc repro -f`` of it timed too (the overhead of a process per stage with nothing in
it); and what reaching ``python`` through PATH costs against the interpreter itself (a version manager's shim runs
before every stage).

The DVC commands run in this process's Python through a wrapper (:data:`DVC_TIMED`) that times, inside DVC, each
stage command it runs and its YAML parsing and writing; DVC's own work is the wall less the stage commands. A stage
command's time less its body (its run record, ``reports/runs/<stage>.json``) is the process around the body: the
interpreter and launcher start, the fork, the project's imports, the params checks, MLflow, the outputs.

    nice -n 5 python -m benchmarks.overhead --trees 123001f worktree --out benchmarks/results/overhead
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from benchmarks.clones import REPO, body_seconds, child_env, forked_env, make_clone, stop_servers
from benchmarks.pages import when_and_where

STAGES = ("source", "download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe",
          "evaluate", "report")
# `python -c DVC_TIMED OUT ARGS...`: DVC's command line in-process, with its stage commands and YAML timed; the
# timings (seconds) written to OUT as JSON at exit.
DVC_TIMED = """
import atexit, json, sys, time
started = time.perf_counter()
out, args = sys.argv[1], sys.argv[2:]
timings = {"yaml_s": 0.0, "yaml_calls": 0, "stages": {}}
import dvc.utils.serialize._yaml as yml
import dvc.stage.run as stage_run

def timed_yaml(function):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return function(*a, **k)
        finally:
            timings["yaml_s"] += time.perf_counter() - t
            timings["yaml_calls"] += 1
    return wrapper

for name in ("parse_yaml", "_dump"):  # parse_yaml_for_update (round-trip) calls parse_yaml
    setattr(yml, name, timed_yaml(getattr(yml, name)))
original_cmd_run = stage_run.cmd_run

def cmd_run(stage, *a, **k):
    t = time.perf_counter()
    try:
        return original_cmd_run(stage, *a, **k)
    finally:
        timings["stages"][stage.addressing] = time.perf_counter() - t
stage_run.cmd_run = cmd_run

def write():
    timings["wall_s"] = time.perf_counter() - started
    open(out, "w").write(json.dumps(timings))
atexit.register(write)
from dvc.cli import main
sys.exit(main(args))
"""


def timed_dvc(clone: Path, env: dict[str, str], args: list[str], log: Path, records: bool = True) -> dict:
    """Run ``dvc ARGS`` through :data:`DVC_TIMED`: its wall (from this side: the interpreter's start counts), stage
    command seconds, YAML seconds; stage bodies from the run records of the stages that ran (none without
    ``records``: a pipeline of plain commands)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json") as out, open(log, "a") as handle:
        handle.write(f"$ dvc {' '.join(args)}\n")
        handle.flush()
        started = time.perf_counter()
        status = subprocess.call([sys.executable, "-c", DVC_TIMED, out.name, *args], cwd=clone, env=env,
                                 stdout=handle, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
        timings = json.loads(Path(out.name).read_text() or "{}")
    if status:
        raise SystemExit(f"dvc {' '.join(args)} failed in {clone} (exit {status}); log: {log}")
    stages = timings.get("stages", {})
    bodies = {stage: body_seconds(clone, stage) if records else 0.0 for stage in stages if stage != "source"}
    return {"wall_s": wall, "dvc_start_s": wall - timings.get("wall_s", wall), "yaml_s": timings.get("yaml_s", 0.0),
            "yaml_calls": timings.get("yaml_calls", 0), "commands_s": sum(stages.values()),
            "source_s": stages.get("source", 0.0), "bodies_s": sum(bodies.values()),
            "around_bodies_s": sum(stages[s] - bodies[s] for s in bodies), "stages": stages, "bodies": bodies}


def image_passes(clone: Path) -> dict[str, float]:
    """Training image passes (one image through the encoder, forward and backward) of ERM and stage 2: ERM's training
    images times its epochs; CNC's batches drawn times its batch (2 M + (2 if two-sided else 1) N images)."""
    params = yaml.safe_load((clone / "params.yaml").read_text())
    train = json.loads((clone / "data" / "biased" / "summary.json").read_text())["splits"]["train"]["n"]
    info = json.loads((clone / "reports" / "metrics" / "stage2_train_info.json").read_text())
    passes = {"train_erm": float(train * params["erm"]["epochs"])}
    sampler = info.get("sampler", {})
    if info.get("method") == "cnc" and "batches_drawn" in sampler:
        cnc = params["stage2"]["cnc"]
        per_batch = 2 * cnc["num_positives"] + (2 if sampler.get("two_sided") else 1) * cnc["num_negatives"]
        passes["train_contrastive"] = float(sampler["batches_drawn"] * per_batch)
    return passes


# A sitecustomize module: each Python process appends "start|exit <time> <pid> <ppid> <argv>" to $PROC_TIMELINE.
TIMELINE_HOOK = """DEBIAS_SIDE_CHANNEL = "benchmarks.overhead: writes each process's start and exit time, changes no result"
import atexit, os, sys, time

def _line(kind):
    with open(os.environ["PROC_TIMELINE"], "a") as handle:
        handle.write(f"{kind} {time.time():.4f} {os.getpid()} {os.getppid()} {' '.join(sys.argv)}\\n")

if os.environ.get("PROC_TIMELINE"):
    _line("start")
    atexit.register(_line, "exit")
"""


STAGE_SCRIPT = re.compile(r"pipeline/(\w+)\.py")  # a stage command's script, in its argv


def read_timeline(path: Path) -> dict[int, dict]:
    """pid -> {start, exit, ppid, argv} from the hook's lines (a process killed or exec'ed has no exit)."""
    processes: dict[int, dict] = {}
    for line in path.read_text().splitlines():
        kind, when, pid, ppid, *argv = line.split(" ")
        entry = processes.setdefault(int(pid), {"ppid": int(ppid), "argv": " ".join(argv)})
        entry[kind] = float(when)
    return processes


def experiment_split(processes: dict[int, dict]) -> list[dict]:
    """Per ``dvc exp exec-run`` process (one queued experiment): its wall, DVC before its first stage command, after
    its last, between them, and its stage commands (launcher processes, by stage)."""
    found = []
    for pid, run in processes.items():
        if "exp exec-run" not in run["argv"] or "exit" not in run:
            continue
        stages = sorted((p for p in processes.values() if p["ppid"] == pid and "exit" in p
                         and STAGE_SCRIPT.search(p["argv"])), key=lambda p: p["start"])
        if not stages:
            continue
        commands = {STAGE_SCRIPT.search(p["argv"]).group(1): p["exit"] - p["start"] for p in stages}
        wall = run["exit"] - run["start"]
        before, after = stages[0]["start"] - run["start"], run["exit"] - stages[-1]["exit"]
        found.append({"start": run["start"], "wall_s": wall, "before_s": before, "after_s": after,
                      "between_s": wall - before - after - sum(commands.values()), "commands": commands})
    return sorted(found, key=lambda e: e["start"])


def dvc_floor(work: Path, env: dict[str, str], log: Path, repeats: int, with_files: bool = False,
              python: bool = False) -> dict:
    """No-op ``dvc repro`` and ``dvc exp run`` of nine ``echo`` stages in a chain (the first always changed); with
    ``with_files``, in a git repository holding this working tree's tracked files too (DVC's experiment commands
    stage and stash the repository's files: their count is part of DVC's work), its own pipeline left out; with
    ``python``, each stage a ``python -c`` process writing its output, and ``dvc repro -f`` of them timed too."""
    toy = Path(tempfile.mkdtemp(prefix="toy-", dir=work))
    if with_files:
        files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True,
                               check=True).stdout.split("\0")
        for name in filter(None, files):
            if (REPO / name).is_file() and not name.startswith((".dvc/", "dvc.yaml", "dvc.lock")):
                (toy / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(REPO / name, toy / name)
    stages, previous = {}, None
    for stage in STAGES:
        command = (f"python -c \"open('{stage}.txt', 'w').write('{stage}')\"" if python
                   else f"echo {stage} > {stage}.txt")
        stages[stage] = {"cmd": command, **({"deps": [f"{previous}.txt"]} if previous else {}),
                         "outs": [f"{stage}.txt"], **({"always_changed": True} if stage == "source" else {})}
        previous = stage
    (toy / "dvc.yaml").write_text(yaml.safe_dump({"stages": stages}, sort_keys=False))
    for command in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"], ["git", "add", "-A"],
                    ["git", "commit", "-qm", "toy"]):
        subprocess.run(command, cwd=toy, env=env, check=True, capture_output=True)
    modes = (("noop", ["repro"]), ("noop-exp", ["exp", "run"])) + ((("warm", ["repro", "-f"]),) if python else ())
    return {mode: min((timed_dvc(toy, env, args, log, records=False) for _ in range(repeats)), key=lambda r: r["wall_s"])
            for mode, args in modes}


def interpreter_start(env: dict[str, str], repeats: int = 5) -> dict[str, float]:
    """Median seconds of ``python -c pass`` through PATH (as a stage command starts) and of this interpreter."""
    import statistics

    def seconds(executable: str) -> float:
        times = []
        for _ in range(repeats):
            started = time.perf_counter()
            subprocess.run([executable, "-c", "pass"], env=env, check=True)
            times.append(time.perf_counter() - started)
        return statistics.median(times)

    return {"path_s": seconds(shutil.which("python", path=env.get("PATH")) or "python"),
            "interpreter_s": seconds(sys.executable)}


def timed_sweep(clone: Path, env: dict[str, str], log: Path) -> dict:
    """Two experiments through ``debias sweep`` (seed 0, ``-S loss.epsilon=0.1,0.25``, upstream shared, one worker):
    its wall, the shared upstream phase (from its lines), the bodies of each experiment's stages that ran (run
    records in the cache, named by the experiment's dvc.lock) and the process timeline (:data:`TIMELINE_HOOK`)."""
    name = f"ovh{int(time.time())}"
    hook = Path(tempfile.mkdtemp(prefix="hook-", dir=clone.parent))
    (hook / "sitecustomize.py").write_text(TIMELINE_HOOK)
    timeline = hook / "timeline.txt"
    env = {**env, "PYTHONPATH": os.pathsep.join([str(hook), env.get("PYTHONPATH", "")]),
           "PROC_TIMELINE": str(timeline)}
    command = [sys.executable, "-m", "debias.tools.cli", "sweep", "--name", name, "-S", "loss.epsilon=0.1,0.25",
               "--seeds", "0", "--upstream", "infer_groups", "--jobs", "1", "--poll", "1"]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=clone, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    with open(log, "a") as handle:
        handle.write(f"$ {' '.join(command)}\n{done.stdout}\n{done.stderr}\n")
    if done.returncode:
        raise SystemExit(f"debias sweep failed in {clone} (exit {done.returncode}); log: {log}")
    upstream = re.search(r"shared upstream 1/1 \(\S+\) done after (\d+) s", done.stdout)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=clone, capture_output=True, text=True).stdout.strip()
    cache = Path(subprocess.run(["dvc", "cache", "dir"], cwd=clone, capture_output=True, text=True).stdout.strip())
    experiments = []
    for value in ("0.1", "0.25"):
        experiment = f"{name}-epsilon{value}-seed0"
        ref = f"refs/exps/{commit[:2]}/{commit[2:]}/{experiment}"
        lock = yaml.safe_load(subprocess.run(["git", "show", f"{ref}:dvc.lock"], cwd=clone, capture_output=True,
                                             text=True, check=True).stdout)
        queue_log = subprocess.run(["dvc", "queue", "logs", experiment], cwd=clone, env=env, capture_output=True,
                                   text=True).stdout
        ran = re.findall(r"Running stage '(\w+)'", queue_log)
        bodies = {}
        for stage in ran:
            if stage == "source":
                continue
            md5 = next(o["md5"] for o in lock["stages"][stage]["outs"] if o["path"] == f"reports/runs/{stage}.json")
            bodies[stage] = float(json.loads((cache / "files" / "md5" / md5[:2] / md5[2:]).read_text())["wall_time_s"])
        experiments.append({"name": experiment, "ran": ran, "bodies_s": sum(bodies.values()), "bodies": bodies})
    processes = read_timeline(timeline)
    split = experiment_split(processes)
    for entry, record in zip(experiments, split):  # one worker: the experiments ran in the order queued
        entry.update(record)
    queueing = [p["exit"] - p["start"] for p in processes.values() if "exp run --queue" in p["argv"] and "exit" in p]
    return {"wall_s": wall, "upstream_s": float(upstream.group(1)) if upstream else 0.0,
            "ran": experiments[0]["ran"], "bodies_s": sum(e["bodies_s"] for e in experiments),
            "experiments": experiments, "queueing_s": queueing}


def prepare_tree(tree: str, work: Path, threads: int) -> dict:
    """A fresh clone of ``tree`` after its first ``dvc repro`` (caches warm, its fork server up): its result entry,
    with the clone, environment and log kept under ``_run`` for :func:`measure`."""
    clone = make_clone(Path(tempfile.mkdtemp(prefix="clone-", dir=work)), {}, None if tree == "worktree" else tree)
    env = forked_env(threads, work / "numba", clone)
    log = work / f"{tree}.log"
    timed_dvc(clone, env, ["repro"], log)  # the first run: caches and the fork server
    return {"tree": tree, "_run": (clone, env, log)}


COMMANDS = (("warm", {}, ["repro", "-f"]), ("warm-off", {"DEBIAS_TRACKING": "off"}, ["repro", "-f"]),
            ("noop", {}, ["repro"]), ("noop-exp", {}, ["exp", "run"]))


def measure(results: list[dict], repeats: int) -> None:
    """Each command of :data:`COMMANDS` on every tree in turn, ``repeats`` rounds (the fastest kept per tree: the
    trees share each round's machine state), then each tree's sweep; the fork servers stopped at the end."""
    for _ in range(repeats):
        for mode, extra, args in COMMANDS:
            for result in results:
                clone, env, log = result["_run"]
                run = timed_dvc(clone, {**env, **extra}, args, log)
                if mode not in result or run["wall_s"] < result[mode]["wall_s"]:
                    result[mode] = run
                print(f"{result['tree']} {mode}: {run['wall_s']:.1f} s", flush=True)
                if mode == "warm" and "passes" not in result:
                    result["passes"] = image_passes(clone)
    for result in results:
        clone, env, log = result.pop("_run")
        result["sweep"] = timed_sweep(clone, env, log)
        print(f"{result['tree']} sweep: {result['sweep']['wall_s']:.1f} s", flush=True)
        stop_servers(env)


def fmt(seconds: float) -> str:
    return f"{seconds:.1f}"


def page(results: list[dict], args: argparse.Namespace, load: tuple[float, float]) -> str:
    """The results as markdown: one table of the split per tree and command, the sweep, the per-image times."""
    lines = ["# Where the pipeline's wall time goes", "",
             f"- Command: `python -m benchmarks.overhead {' '.join(sys.argv[1:])}`",
             f"- Date: {when_and_where(*load)}; DEBIAS_THREADS="
             f"{args.threads}; the fastest of {args.repeats} rounds per command and tree (each round runs "
             "the command on every tree in turn); bytecode written and reused "
             "(`PYTHONDONTWRITEBYTECODE` unset), as on a user's machine",
             "- Columns, seconds: wall; DVC's own work (wall less the stage commands; its start-up, until its `main`, "
             "and its YAML parsing and writing of dvc.yaml, dvc.lock and params.yaml among it); the `source` stage's "
             "command; the other stage commands around their bodies (interpreter, launcher, fork, imports, checks, "
             "MLflow, outputs); the bodies; overhead = wall less the bodies, and its share of the wall", "",
             "| tree | command | wall | DVC own | DVC start | DVC YAML (calls) | source | around bodies | bodies | "
             "overhead | share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    commands = {"warm": "`dvc repro -f`", "warm-off": "`dvc repro -f`, tracking off", "noop": "`dvc repro`, no-op",
                "noop-exp": "`dvc exp run`, no-op"}
    trees = [r for r in results if "sweep" in r]
    floor = next((r for r in results if "start" in r), None)
    files = next((r for r in results if r.get("floor")), None)
    processes = next((r for r in results if r.get("python")), None)
    for result in results:
        if result is processes:
            continue
        for mode, label in commands.items():
            if mode not in result:
                continue
            r = result[mode]
            own = r["wall_s"] - r["commands_s"]
            overhead = r["wall_s"] - r["bodies_s"]
            lines.append(f"| {result['tree']} | {label} | {fmt(r['wall_s'])} | {fmt(own)} | {fmt(r['dvc_start_s'])} | "
                         f"{fmt(r['yaml_s'])} ({r['yaml_calls']}) | {fmt(r['source_s'])} | {fmt(r['around_bodies_s'])} | "
                         f"{fmt(r['bodies_s'])} | {fmt(overhead)} | {100 * overhead / r['wall_s']:.0f} % |")
    lines += ["", "Per stage of `dvc repro -f` (command / body, seconds):", "",
              "| tree | " + " | ".join(STAGES) + " |", "|---|" + "---:|" * len(STAGES)]
    for result in trees:
        r = result["warm"]
        cells = [f"{r['stages'].get(s, 0):.1f} / {r['bodies'].get(s, 0):.1f}" if s != "source"
                 else f"{r['stages'].get(s, 0):.1f} / -" for s in STAGES]
        lines.append(f"| {result['tree']} | " + " | ".join(cells) + " |")
    lines += ["", "MLflow's share of `dvc repro -f` (around the bodies, tracking required less off):", ""]
    for result in trees:
        on, off = result["warm"], result["warm-off"]
        lines.append(f"- {result['tree']}: {fmt(on['around_bodies_s'] - off['around_bodies_s'])} s around the bodies, "
                     f"{fmt(on['bodies_s'] - off['bodies_s'])} s within them")
    lines += ["", "A sweep of two experiments (`debias sweep --name ... -S loss.epsilon=0.1,0.25 --seeds 0 --upstream "
              "infer_groups --jobs 1`, after the runs above; seed 0, so the upstream stages are the workspace's):", "",
              "| tree | wall | shared upstream | the experiments' stages | their bodies | overhead | share |",
              "|---|---:|---:|---|---:|---:|---:|"]
    for result in trees:
        s = result["sweep"]
        overhead = s["wall_s"] - s["bodies_s"]
        lines.append(f"| {result['tree']} | {fmt(s['wall_s'])} | {fmt(s['upstream_s'])} | {', '.join(s['ran'])} | "
                     f"{fmt(s['bodies_s'])} | {fmt(overhead)} | {100 * overhead / s['wall_s']:.0f} % |")
    lines += ["", "Each experiment of that sweep from its process timeline (seconds; DVC's `exp exec-run` process from its "
              "start to its exit: DVC before the first stage command (the experiment's workspace, its checkout), "
              "between the stage commands (each stage's status, its outputs saved to the cache and dvc.lock), after "
              "the last (the experiment collected into a git ref); the stage commands and, within them, the bodies; "
              "the experiment's overhead = its wall less the bodies):", "",
              "| tree | experiment | wall | DVC before | DVC between | DVC after | stage commands | bodies | overhead "
              "| share |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for result in trees:
        for e in result["sweep"]["experiments"]:
            if "wall_s" not in e:
                continue
            overhead = e["wall_s"] - e["bodies_s"]
            lines.append(f"| {result['tree']} | {e['name'].split('-', 1)[1]} | {fmt(e['wall_s'])} | {fmt(e['before_s'])} | "
                         f"{fmt(e['between_s'])} | {fmt(e['after_s'])} | {fmt(sum(e['commands'].values()))} | "
                         f"{fmt(e['bodies_s'])} | {fmt(overhead)} | {100 * overhead / e['wall_s']:.0f} % |")
    lines += ["", "Outside the experiments: each `dvc exp run --queue` process (where the sweep starts one per experiment) "
              "took " + "; ".join(f"{r['tree']} " + (", ".join(fmt(q) for q in r["sweep"]["queueing_s"]) + " s"
                                                   if r["sweep"]["queueing_s"] else
                                                   "none started (the sweep queues in its own process)")
                                  for r in trees) + "."]
    lines += ["", "Training time per image pass (body / images through the encoder in training, forward and backward; "
              "evaluation inside the body counted):", ""]
    for result in trees:
        passes, bodies = result["passes"], result["warm"]["bodies"]
        parts = [f"{stage} {1e6 * bodies[stage] / n:.0f} µs ({n:,.0f} passes)" for stage, n in passes.items()]
        lines.append(f"- {result['tree']}: " + ", ".join(parts))
    if floor:
        start = floor["start"]
        lines += ["", "DVC's floor: the same commands on a pipeline of nine `echo` stages in a chain (the first always "
                  f"changed, no params): `dvc repro`, no-op, {fmt(floor['noop']['wall_s'])} s; `dvc exp run`, no-op, "
                  f"{fmt(floor['noop-exp']['wall_s'])} s"
                  + (f"; the same pipeline in a repository holding this tree's tracked files as well (DVC's experiment "
                     f"commands stage and stash them): {fmt(files['noop']['wall_s'])} s and "
                     f"{fmt(files['noop-exp']['wall_s'])} s" if files else "")
                  + f". Starting `python -c pass` through PATH, as a stage command does: {start['path_s']:.2f} s; the "
                  f"interpreter itself: {start['interpreter_s']:.2f} s."]
        for base in trees[:1]:
            for entry in filter(None, (floor, files)):
                lines += ["", f"{entry['tree']} as a share of {base['tree']}'s wall: no-op `dvc repro` "
                          f"{entry['noop']['wall_s'] / base['noop']['wall_s']:.2f}, no-op `dvc exp run` "
                          f"{entry['noop-exp']['wall_s'] / base['noop-exp']['wall_s']:.2f}."]
    if processes:
        warm = processes["warm"]["wall_s"]
        lines += ["", f"A process per stage under DVC, with nothing in it: the nine stages each a `python -c` that writes "
                  f"its output, through PATH as above; `dvc repro -f` {fmt(warm)} s. That is the overhead of this "
                  "pipeline's shape with no stage harness, no imports and no MLflow; beside each tree's bodies it would "
                  "be " + ", ".join(f"{100 * warm / (warm + r['warm']['bodies_s']):.0f} % of {r['tree']}'s warm wall"
                                    for r in trees) + "."]
    for b in trees[1:]:
        a = trees[0]
        lines += ["", f"Ratios {b['tree']} / {a['tree']}:", ""]
        for mode, label in commands.items():
            lines.append(f"- {label}: wall {b[mode]['wall_s'] / a[mode]['wall_s']:.2f}")
        lines.append(f"- the sweep of two experiments: wall {b['sweep']['wall_s'] / a['sweep']['wall_s']:.2f}")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["worktree"], help="'worktree' and/or commits, in this order")
    parser.add_argument("--threads", type=int, default=1, help="DEBIAS_THREADS (default 1, as the suite)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each command per tree; the fastest is kept")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/overhead"),
                        help="results stem: .md and .json are written")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="overhead-") as folder:
        results = [prepare_tree(tree, Path(folder), args.threads) for tree in args.trees]
        measure(results, args.repeats)
        env = child_env(args.threads, Path(folder) / "numba", Path(folder))
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        floor = {"tree": "DVC's floor", **dvc_floor(Path(folder), env, Path(folder) / "floor.log", args.repeats),
                 "start": interpreter_start(env)}
        files = {"tree": "DVC's floor, this repository's files", "floor": True,
                 **dvc_floor(Path(folder), env, Path(folder) / "floor.log", args.repeats, with_files=True)}
        processes = {"tree": "a process per stage", "python": True,
                     **dvc_floor(Path(folder), env, Path(folder) / "floor.log", args.repeats, python=True)}
        for entry in (floor, files, processes):
            print(f"{entry['tree']}: {entry['noop']['wall_s']:.1f} s / {entry['noop-exp']['wall_s']:.1f} s", flush=True)
    results += [floor, files, processes]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(results, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(page(results, args, (load, os.getloadavg()[0])))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
