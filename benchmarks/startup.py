"""Stage start-up benchmark: how long each stage's process runs outside its body (imports, params, MLflow run).

In a fresh temporary clone per tree (the working tree and/or commits, as benchmarks/clones.py makes them), the
default pipeline is run once with `dvc repro` (so every stage's inputs exist and the MLflow store is migrated),
then every stage's command (dvc.yaml's, unchanged) is run ``--repeats`` times, in DAG order, with a sitecustomize
module that times the stage body (the function ``debias.harness.stage.main`` calls) from inside the process. Per stage:

- wall / CPU: the whole process (CPU = user + system, from RUSAGE_CHILDREN of a minimal launcher);
- body: the body's wall and CPU seconds, measured in the process;
- overhead = process - body (wall and CPU): interpreter start, imports, params, the MLflow run before the body,
  and what runs after it (the run's end, the run record) and at exit; ``pre`` is the part before the body
  (in-process, from when the interpreter imports sitecustomize), ``post`` from the body's end to the atexit
  handlers; the rest (``interpreter``) is the interpreter's start before site and its teardown after atexit.

The `source` stage has no body (a fingerprint, not a harnessed stage): all of it counts as overhead. Several trees
take turns stage by stage, so they see the same background load. Medians over the repeats.

    nice -n 5 python -m benchmarks.startup [--trees worktree COMMIT ...] [--repeats 3] [--threads 1]
        [--tracking required|off] [--out benchmarks/results/startup]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import shutil
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent

from benchmarks.clones import NUMBA_CACHE, child_env, make_clone, run_measured, stage_order
from benchmarks.pages import write_commented_csv

# A sitecustomize.py put first on the stages' PYTHONPATH: in a process started as `python pipeline/<stage>.py`
# (exactly dvc.yaml's command; the debias.harness.launch process before its exec is left alone) it wraps debias.harness.stage.main
# to mark (seconds since interpreter start-up reached site, CPU seconds) the body's start and end and the exit,
# written to $DEBIAS_STARTUP_MARKS from an atexit handler (which also runs when the stage ends with os._exit).
SITECUSTOMIZE = r"""
import atexit, json, os, resource, sys, time
DEBIAS_SIDE_CHANNEL = "times the stage's start-up, body and exit; changes nothing it computes"
t0 = time.perf_counter()
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
if os.environ.get("DEBIAS_STARTUP_MARKS") and sys.argv and sys.argv[0].endswith(".py"):
    marks = {}
    def dump():
        marks["exit"] = [time.perf_counter() - t0, cpu()]
        with open(os.environ["DEBIAS_STARTUP_MARKS"], "w") as handle:
            json.dump(marks, handle)
    atexit.register(dump)
    if os.path.basename(sys.argv[0]) != "source.py":  # the source stage is not harnessed
        import debias.harness.stage as stage
        harness = stage.main
        def main(name, body):
            def timed(params, run):
                marks["body_start"] = [time.perf_counter() - t0, cpu()]
                try:
                    body(params, run)
                finally:
                    marks["body_end"] = [time.perf_counter() - t0, cpu()]
            harness(name, timed)
        stage.main = main
"""


def measure_stage(clone: Path, env: dict[str, str], cmd: str, log: Path, site: Path) -> dict[str, float]:
    """Run the stage's dvc.yaml command (``python`` is this interpreter) with :data:`SITECUSTOMIZE` in ``site``."""
    words = shlex.split(cmd.split("#")[0])
    command = [sys.executable if words[0] == "python" else words[0], *words[1:]]
    with tempfile.NamedTemporaryFile("r", suffix=".json") as marks_file:
        env = {**env, "DEBIAS_STARTUP_MARKS": marks_file.name,
               "PYTHONPATH": os.pathsep.join([str(site), env.get("PYTHONPATH", "")])}
        status, wall, cpu, rss = run_measured(command, clone, env, log)
        if status != 0:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
            raise SystemExit(f"{cmd} failed ({status}); log {log}:\n{tail}")
        marks = json.loads(Path(marks_file.name).read_text())
    body_wall = body_cpu = 0.0
    pre_wall = post_wall = None
    if "body_start" in marks:
        body_wall = marks["body_end"][0] - marks["body_start"][0]
        body_cpu = marks["body_end"][1] - marks["body_start"][1]
        pre_wall, post_wall = marks["body_start"][0], marks["exit"][0] - marks["body_end"][0]
    return {"wall_s": wall, "cpu_s": cpu, "body_wall_s": body_wall, "body_cpu_s": body_cpu,
            "overhead_wall_s": wall - body_wall, "overhead_cpu_s": cpu - body_cpu, "pre_wall_s": pre_wall,
            "post_wall_s": post_wall, "interpreter_wall_s": wall - marks["exit"][0], "peak_rss_mib": rss}


def median_row(samples: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k in samples[0] if all(s[k] is not None for s in samples)]
    return {k: statistics.median(s[k] for s in samples) for k in keys}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    work = Path(tempfile.mkdtemp(prefix="startup-"))
    logs, site = work / "logs", work / "site"
    logs.mkdir()
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
    clones, envs, repro = {}, {}, {}
    try:
        for index, tree in enumerate(args.trees):
            (work / str(index)).mkdir()
            clones[tree] = make_clone(work / str(index), {}, None if tree == "worktree" else tree)
            envs[tree] = child_env(args.threads, NUMBA_CACHE, clones[tree])
            envs[tree]["DEBIAS_TRACKING"] = args.tracking
            # a process per stage, which this benchmark times from inside (the fork server's effect: repro_time.py)
            envs[tree]["DEBIAS_FORKSERVER"] = "0"
            status, wall, cpu, rss = run_measured(["dvc", "repro"], clones[tree], envs[tree],
                                                  logs / f"{index}-repro.log")
            if status != 0:
                raise SystemExit(f"dvc repro failed in the clone of {tree}; see {logs}")
            repro[tree] = {"tree": tree, "stage": "(first `dvc repro`, whole pipeline)", "wall_s": wall, "cpu_s": cpu,
                           "peak_rss_mib": rss}
            print(f"[startup] {tree}: dvc repro {wall:.1f} s (CPU {cpu:.1f} s)", flush=True)
        samples: dict[tuple[str, str], list[dict[str, float]]] = {}
        stages = stage_order(clones[args.trees[0]] / "dvc.yaml")
        for repeat in range(args.repeats):
            for turn, (stage, _) in enumerate(stages):
                order = args.trees if (turn + repeat) % 2 == 0 else args.trees[::-1]
                for tree in order:
                    cmd = dict(stage_order(clones[tree] / "dvc.yaml"))[stage]
                    row = measure_stage(clones[tree], envs[tree], cmd, logs / f"{args.trees.index(tree)}-{stage}.log", site)
                    samples.setdefault((tree, stage), []).append(row)
                    print(f"[startup] {tree} {stage} #{repeat + 1}: {row['wall_s']:.2f} s wall (body "
                          f"{row['body_wall_s']:.2f}), CPU {row['cpu_s']:.2f} s (body {row['body_cpu_s']:.2f}); "
                          f"overhead {row['overhead_wall_s']:.2f} s wall, {row['overhead_cpu_s']:.2f} s CPU", flush=True)
        rows = []
        for tree in args.trees:
            tree_rows = [{"tree": tree, "stage": stage, **median_row(samples[(tree, stage)])} for stage, _ in stages]
            rows += tree_rows
            rows.append({"tree": tree, "stage": "total", **{k: sum(r.get(k) or 0.0 for r in tree_rows) for k in
                                                            ("wall_s", "cpu_s", "body_wall_s", "body_cpu_s",
                                                             "overhead_wall_s", "overhead_cpu_s")}})
            rows.append(repro[tree])
        return rows
    finally:
        if args.keep:
            print(f"[startup] clones kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def fmt(value: Any) -> str:
    return "" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)


def markdown(rows: list[dict[str, Any]], header: list[str]) -> str:
    lines = ["# Stage start-up overhead", "", *[f"- {h}" for h in header], "",
             "Overhead = the stage's process minus its body (wall and CPU seconds); pre = wall seconds from the "
             "interpreter's site import to the body, post = from the body's end to the atexit handlers (the MLflow "
             "run's end, the run record), interpreter = the rest (start-up before site, teardown after atexit). "
             "Medians over the repeats; total = sum over the stages.", ""]
    columns = [("wall_s", "process wall"), ("body_wall_s", "body wall"), ("overhead_wall_s", "overhead wall"),
               ("pre_wall_s", "pre"), ("post_wall_s", "post"), ("interpreter_wall_s", "interpreter"),
               ("cpu_s", "process CPU"), ("body_cpu_s", "body CPU"),
               ("overhead_cpu_s", "overhead CPU")]
    for tree in dict.fromkeys(r["tree"] for r in rows):
        lines += [f"## {tree}", "", "| stage | " + " | ".join(f"{name} (s)" for _, name in columns) + " |",
                  "|---|" + "---:|" * len(columns)]
        for r in (r for r in rows if r["tree"] == tree):
            label = f"**{r['stage']}**" if r["stage"] == "total" else r["stage"]
            lines.append(f"| {label} | " + " | ".join(fmt(r.get(key)) for key, _ in columns) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["worktree"], help="'worktree' and/or commits")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="DEBIAS_THREADS of the stages")
    parser.add_argument("--tracking", choices=("required", "optional", "off"), default="required")
    parser.add_argument("--keep", action="store_true", help="keep the temporary clones")
    parser.add_argument("--out", default=str(HERE / "results" / "startup"), help="writes OUT.md and OUT.csv")
    args = parser.parse_args(argv)
    started = datetime.datetime.now().astimezone()
    load_before = os.getloadavg()[0]
    rows = run(args)
    command = shlex.join(["python", "-m", "benchmarks.startup", *(argv if argv is not None else sys.argv[1:])])
    header = [f"Command: `{command}`",
              f"Date: {started:%Y-%m-%d %H:%M %Z}; load average (1 min) before {load_before:.2f}, after "
              f"{os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs",
              f"DEBIAS_TRACKING={args.tracking}, DEBIAS_THREADS={args.threads}, default params, warm numba cache; "
              f"trees: {', '.join('the working tree' if t == 'worktree' else 'commit ' + t for t in args.trees)}"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(markdown(rows, header))
    fields = ["tree", "stage", "wall_s", "body_wall_s", "overhead_wall_s", "pre_wall_s", "post_wall_s",
              "interpreter_wall_s", "cpu_s", "body_cpu_s", "overhead_cpu_s", "peak_rss_mib"]
    write_commented_csv(out.with_suffix(".csv"), header, fields, rows)
    print(out.with_suffix(".md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
