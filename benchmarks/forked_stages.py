"""Each stage's command through the fork server, tree against tree, taking turns: the command's wall and its body.

Per tree (the working tree and/or commits, as benchmarks/clones.py makes them), a fresh clone runs ``dvc repro``
once (inputs in place, the MLflow store migrated, its fork server up and idle), then every stage's command of
dvc.yaml, in DAG order, is run ``--rounds`` times, each round running the stage on every tree in turn (the trees
share each round's machine state). The body is the stage's own clock (``wall_time_s`` of its run record,
``reports/runs/<stage>.json``); the command less the body is the process around it (interpreter and launcher, fork,
imports, params checks, the MLflow run's opening and closing). Medians over the rounds; ratios to the first tree.
Unlike ``benchmarks.startup`` (a process per stage, its CPU and peak memory), the stages run as users run them: each
forked by the warm server, as ``dvc repro`` runs them.

    nice -n 5 python -m benchmarks.forked_stages --trees COMMIT worktree [--rounds 5] [--out benchmarks/results/forked_stages]
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.clones import body_seconds, forked_env, make_clone, stage_order, stop_servers
from benchmarks.pages import when_and_where, write_commented_csv

FIELDS = ["tree", "stage", "round", "command_s", "body_s"]


def prepare(tree: str, work: Path) -> tuple[Path, dict[str, str]]:
    """A fresh clone of ``tree`` after one ``dvc repro``, and the stages' environment (the fork server on, its own
    socket folder, bytecode reused as on a user's machine)."""
    clone = make_clone(Path(tempfile.mkdtemp(prefix="clone-", dir=work)), {}, None if tree == "worktree" else tree)
    env = forked_env(1, work / "numba", clone)
    subprocess.run(["dvc", "repro", "-q"], cwd=clone, env=env, check=True, capture_output=True)
    time.sleep(15)  # the server's idle work (UMAP's import, the distribution map) done, as between a user's runs
    return clone, env


def run_stage(clone: Path, env: dict[str, str], stage: str, command: str) -> tuple[float, float]:
    """(command wall, body wall) of one run of ``command`` in ``clone``."""
    started = time.perf_counter()
    done = subprocess.run(shlex.split(command), cwd=clone, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{command} failed in {clone}:\n{done.stderr[-2000:]}")
    return wall, 0.0 if stage == "source" else body_seconds(clone, stage)


def markdown(rows: list[dict], trees: list[str], stages: list[str], header: list[str]) -> str:
    """Per stage and tree: the median command, body and command less body; the sums; ratios to the first tree."""
    def median(tree: str, stage: str, field: str) -> float:
        return statistics.median(r[field] for r in rows if r["tree"] == tree and r["stage"] == stage)

    lines = ["# Each stage's command through the fork server, tree against tree", "", *[f"- {h}" for h in header], "",
             "| stage | " + " | ".join(f"{t}: command / body / around" for t in trees) + " |",
             "|---|" + "---:|" * len(trees)]
    totals = {t: [0.0, 0.0] for t in trees}
    for stage in stages:
        cells = []
        for tree in trees:
            command, body = median(tree, stage, "command_s"), median(tree, stage, "body_s")
            totals[tree][0] += command
            totals[tree][1] += body
            cells.append(f"{command:.2f} / {body:.2f} / {command - body:.2f}")
        lines.append(f"| {stage} | " + " | ".join(cells) + " |")
    lines.append("| sum of medians | " + " | ".join(f"{c:.2f} / {b:.2f} / {c - b:.2f}" for c, b in totals.values()) + " |")
    first = trees[0]
    for tree in trees[1:]:
        (c0, b0), (c1, b1) = totals[first], totals[tree]
        lines += ["", f"{tree} / {first}, sums of the medians: commands {c1 / c0:.2f}, bodies {b1 / b0:.2f}, around the "
                  f"bodies {(c1 - b1) / (c0 - b0):.2f}; the training stages' bodies: " + ", ".join(
                      f"{s} {median(tree, s, 'body_s') / median(first, s, 'body_s'):.2f}"
                      for s in stages if s.startswith("train_"))]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["worktree"], help="'worktree' and/or commits")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/forked_stages"),
                        help="writes OUT.md and OUT.csv")
    args = parser.parse_args()
    load = os.getloadavg()[0]
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="forked-") as folder:
        prepared = {tree: prepare(tree, Path(folder)) for tree in args.trees}
        order = stage_order(next(iter(prepared.values()))[0] / "dvc.yaml")
        for number in range(args.rounds):
            for stage, command in order:
                for tree, (clone, env) in prepared.items():
                    command_s, body_s = run_stage(clone, env, stage, command)
                    rows.append({"tree": tree, "stage": stage, "round": number, "command_s": command_s, "body_s": body_s})
            print(f"round {number + 1} of {args.rounds} done", flush=True)
        for _, env in prepared.values():
            stop_servers(env)
    header = [f"Command: `python -m benchmarks.forked_stages {' '.join(sys.argv[1:])}`",
              f"Date: {when_and_where(load, os.getloadavg()[0])}; DEBIAS_THREADS=1; the default params; medians over "
              f"{args.rounds} rounds, each running every stage on every tree in turn",
              "Seconds: the stage's command (dvc.yaml's, run by hand in the clone, forked by its warm server) / its body "
              "(the run record's clock) / the command less the body (`source` has no body)"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_commented_csv(args.out.with_suffix(".csv"), header, FIELDS, rows)
    args.out.with_suffix(".md").write_text(markdown(rows, args.trees, [s for s, _ in order], header))
    print(args.out.with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
