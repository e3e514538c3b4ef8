"""Start-up of the `debias` commands that run outside the stages: a fresh interpreter importing the module a command
runs (``debias compare``: debias.tools.compare; ``debias sweep``: debias.tools.sweep), timed as the whole process, per
tree (the working tree and/or commits, each in a fresh clone as benchmarks/clones.py makes them, its ``src`` first
on ``PYTHONPATH``), the trees taking turns in every round so they see the same load. Bytecode is written by a first
untimed import and reused, as on a user's machine. Medians over the rounds, and whether torch was imported.

    python -m benchmarks.cli_start [--trees worktree COMMIT ...] [--repeats 5] [--out benchmarks/results/cli_start]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.clones import REPO, make_clone

COMMANDS = {"debias compare": "debias.tools.compare", "debias sweep": "debias.tools.sweep"}
PROBE = "import sys, {module}; print('torch' in sys.modules)"


def import_once(src: Path, module: str) -> tuple[float, bool]:
    """Wall seconds of a fresh ``python -c 'import module'`` with ``src`` first on the path, and whether it imported
    torch."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(src)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", PROBE.format(module=module)], env=env, capture_output=True,
                          text=True, check=True)
    return time.perf_counter() - start, done.stdout.strip() == "True"


def measure(trees: list[str], repeats: int, scratch: Path) -> dict[tuple[str, str], dict]:
    """Per (tree, command): the wall seconds of each round and whether torch was imported."""
    sources = {}
    for tree in trees:
        clone = make_clone(Path(tempfile.mkdtemp(dir=scratch)), {}, None if tree == "worktree" else tree)
        sources[tree] = clone / "src"
        for module in COMMANDS.values():
            import_once(sources[tree], module)  # writes the bytecode the timed rounds reuse
    found: dict[tuple[str, str], dict] = {(t, c): {"walls": [], "torch": False} for t in trees for c in COMMANDS}
    for _ in range(repeats):
        for tree in trees:
            for command, module in COMMANDS.items():
                wall, torch = import_once(sources[tree], module)
                found[tree, command]["walls"].append(wall)
                found[tree, command]["torch"] |= torch
    return found


def page(found: dict[tuple[str, str], dict], trees: list[str], repeats: int, argv: list[str], load: tuple) -> str:
    lines = ["# Start-up of the commands outside the stages", "",
             f"- Command: `python -m benchmarks.cli_start {shlex.join(argv)}`",
             f"- Date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC; load average (1 min) before "
             f"{load[0]:.2f}, after {os.getloadavg()[0]:.2f}; {os.cpu_count()} CPUs ({platform.machine()}); Python "
             f"{platform.python_version()}; {repeats} rounds, the trees in turn within each; bytecode written and reused",
             "- Each cell: a fresh interpreter importing the module the command runs, the whole process's wall "
             "seconds (median, then every round)", "",
             "| tree | command (module) | median s | rounds s | imports torch |", "|---|---|---:|---|---|"]
    for tree in trees:
        for command, module in COMMANDS.items():
            cell = found[tree, command]
            rounds = ", ".join(f"{w:.2f}" for w in cell["walls"])
            lines.append(f"| {tree} | `{command}` ({module}) | {statistics.median(cell['walls']):.2f} | {rounds} | "
                         f"{'yes' if cell['torch'] else 'no'} |")
    if "worktree" in trees:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                              text=True).stdout.strip()
        lines += ["", f"worktree: the code at commit {head} (with any uncommitted change)."]
    if len(trees) == 2:
        lines += ["", f"Medians, {trees[1]} / {trees[0]}:", ""]
        for command in COMMANDS:
            ratio = statistics.median(found[trees[1], command]["walls"]) / statistics.median(
                found[trees[0], command]["walls"])
            lines.append(f"- `{command}`: {ratio:.2f}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m benchmarks.cli_start", description=__doc__.split("\n\n")[0])
    parser.add_argument("--trees", nargs="+", default=["worktree"], help="'worktree' and/or commits")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (each tree once per round)")
    parser.add_argument("--out", type=Path, help="write OUT.md (else print it)")
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats {args.repeats}: allowed, a whole number >= 1")
    load = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cli-start-") as scratch:
        text = page(measure(args.trees, args.repeats, Path(scratch)), args.trees, args.repeats, argv, load)
    if args.out:
        args.out.with_suffix(".md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    main()
