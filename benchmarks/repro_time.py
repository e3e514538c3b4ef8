"""The default pipeline's `dvc repro`, first and warm, tree against tree: what a new user waits for.

Per round and tree (the working tree and/or commits, alternating who goes first each round), in a fresh clone:

- first: `dvc repro` with empty caches: a new clone (no dvc.lock, an empty MLflow store), an empty numba cache
  (``NUMBA_CACHE_DIR``) and a socket folder of its own (``XDG_RUNTIME_DIR``: no fork server running yet);
- warm: `dvc repro -f` right after, in the same clone and environment (numba's cache filled, the fork server up).

Then that environment's fork server is stopped. Wall seconds of the whole command and each stage's body (its run
record, reports/runs/<stage>.json); medians over the rounds and the ratio to the last tree. ``--set KEY=VALUE``
(as ``dvc exp run -S`` takes it) is written into each clone's params.yaml before its first run: another data source.

    nice -n 5 python -m benchmarks.repro_time --trees worktree COMMIT --rounds 3 --out benchmarks/results/repro_time
    python -m benchmarks.repro_time --trees worktree COMMIT --rounds 1 --set data.source=adult \
        --set data.path=../shared/datasets/adult --out benchmarks/results/repro_time_adult
"""

from __future__ import annotations

import argparse
import csv
import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

from benchmarks.clones import child_env, make_clone

STAGES = ("download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe", "evaluate",
          "report")


def stop_servers(runtime: Path) -> None:
    """SIGTERM the fork servers whose sockets are in ``runtime`` (their command line names the socket)."""
    sockets = [str(path) for path in runtime.glob("debias/*.sock")]
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if sockets and any(sock in cmdline.read_text() for sock in sockets):
                os.kill(int(cmdline.parent.name), signal.SIGTERM)
        except (OSError, ValueError):
            continue


def timed_repro(clone: Path, env: dict[str, str], force: bool, log: Path) -> dict[str, float]:
    """Wall seconds of `dvc repro [-f]` and of each stage body; SystemExit if it fails."""
    command = ["dvc", "repro", *(["-f"] if force else [])]
    with open(log, "a") as handle:
        started = time.perf_counter()
        status = subprocess.call(command, cwd=clone, env=env, stdout=handle, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - started
    if status:
        raise SystemExit(f"{' '.join(command)} failed in {clone} (exit {status}); log: {log}")
    row = {"wall_s": round(wall, 2)}
    for stage in STAGES:
        record = clone / "reports" / "runs" / f"{stage}.json"
        row[f"{stage}_s"] = round(json.loads(record.read_text())["wall_time_s"], 2) if record.exists() else float("nan")
    return row


def in_clone(override: str) -> str:
    """``KEY=VALUE`` for a clone elsewhere: a relative path under a ``*path`` / ``*root`` key made absolute (from here)."""
    key, _, value = override.partition("=")
    if key.endswith(("path", "root")) and value not in ("", "null") and not Path(value).is_absolute():
        return f"{key}={Path(value).resolve()}"
    return override


def one_round(tree: str, round_index: int, threads: int, work: Path, overrides: list[str]) -> list[dict]:
    from dvc.utils.hydra import apply_overrides

    clone = make_clone(Path(tempfile.mkdtemp(prefix=f"clone-{round_index}-", dir=work)), {},
                       None if tree == "worktree" else tree)
    if overrides:
        apply_overrides(clone / "params.yaml", [in_clone(o) for o in overrides])
    numba = Path(tempfile.mkdtemp(prefix="numba-", dir=work))
    runtime = Path(tempfile.mkdtemp(prefix="rt", dir="/tmp"))  # short: a socket path holds < 108 bytes
    env = {**child_env(threads, numba, clone), "XDG_RUNTIME_DIR": str(runtime)}
    env.pop("DEBIAS_FORKSERVER", None)  # the default (speed.py's stages switch it off to measure a process each)
    log = work / f"{tree}-{round_index}.log"
    rows = []
    try:
        for mode, force in (("first", False), ("warm", True)):
            rows.append({"tree": tree, "round": round_index, "mode": mode, **timed_repro(clone, env, force, log)})
            print(f"round {round_index} {tree} {mode}: {rows[-1]['wall_s']} s", flush=True)
    finally:
        stop_servers(runtime)
    return rows


def summary(rows: list[dict], trees: list[str]) -> list[dict]:
    """Median wall and stage-body seconds per (tree, mode); ratio = tree / last tree."""
    out = []
    for mode in ("first", "warm"):
        medians = {}
        for tree in trees:
            mine = [r for r in rows if r["tree"] == tree and r["mode"] == mode]
            medians[tree] = {key: statistics.median(r[key] for r in mine) for key in mine[0] if key.endswith("_s")}
        for tree in trees:
            out.append({"mode": mode, "tree": tree, "runs": sum(r["tree"] == tree and r["mode"] == mode for r in rows),
                        **{k: round(v, 2) for k, v in medians[tree].items()},
                        "wall_ratio": round(medians[tree]["wall_s"] / medians[trees[-1]]["wall_s"], 3)})
    return out


def write(rows: list[dict], table: list[dict], args: argparse.Namespace, out: Path, load: tuple) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".csv"), "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    keys = ["wall_s", *(f"{s}_s" for s in STAGES)]
    what = f"with {', '.join(f'-S {o}' for o in args.set)}" if args.set else "of the default pipeline"
    lines = [f"# `dvc repro` {what}, first and warm", "",
             f"- Command: `python -m benchmarks.repro_time {' '.join(sys.argv[1:])}`",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1 min) "
             f"before {load[0]:.2f}, after {load[1]:.2f}; {os.cpu_count()} CPUs ({platform.machine()})",
             f"- DEBIAS_THREADS={args.threads}, DEBIAS_TRACKING=required; trees: {', '.join(args.trees)}",
             "- first: a fresh clone, empty MLflow store, empty numba cache, no fork server; warm: `dvc repro -f` "
             "right after in the same clone (caches filled, the fork server up where the tree has one)",
             "- Medians over the rounds; stage columns: each stage body's wall seconds (reports/runs/<stage>.json); "
             f"ratio: wall / wall of {args.trees[-1]}", "",
             "| mode | tree | runs | " + " | ".join(k.removesuffix("_s") for k in keys) + " | ratio |",
             "|---|---|---:|" + "---:|" * (len(keys) + 1)]
    for row in table:
        lines.append(f"| {row['mode']} | {row['tree']} | {row['runs']} | "
                     + " | ".join(f"{row[k]:.1f}" for k in keys) + f" | {row['wall_ratio']:.3f} |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trees", nargs="+", default=["worktree"], help="'worktree' and/or commits")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="DEBIAS_THREADS of the stages")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="a params.yaml override of every clone (as dvc exp run -S takes it); repeatable")
    parser.add_argument("--out", default=str(HERE / "results" / "repro_time"), help="writes OUT.md and OUT.csv")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    work = Path(tempfile.mkdtemp(prefix="repro-time-"))
    load_before = os.getloadavg()[0]
    rows: list[dict] = []
    for round_index in range(args.rounds):
        order = args.trees if round_index % 2 == 0 else list(reversed(args.trees))
        for tree in order:
            rows.extend(one_round(tree, round_index, args.threads, work, args.set))
    write(rows, summary(rows, args.trees), args, Path(args.out), (load_before, os.getloadavg()[0]))
    print(Path(args.out).with_suffix(".md").read_text())


if __name__ == "__main__":
    main()
