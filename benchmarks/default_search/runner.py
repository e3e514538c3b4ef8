"""The default search's runs: the cells' workspaces, each candidate's stage-2 run, its rows in the CSV under the
key of what made it, the phases in the protocol's order, and the command line (``python -m benchmarks.default_search``;
the protocol and the options: :mod:`benchmarks.default_search`)."""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import sys
import threading
from pathlib import Path
from typing import Any

from benchmarks import cells
from benchmarks.cells import BenchmarkError, Cell
from benchmarks.default_search.page import commits_of, markdown, protocol_commit
from benchmarks.default_search.protocol import (FAIRKL, FIELDS, HELDOUT_CELLS, RULES, SCREEN_CELLS, Candidate,
                                                candidates, carried, confirm_cells, decide, extension_plan,
                                                regime_of, sizes, validation_only)

RESULTS = Path(__file__).resolve().parent.parent / "results"


def rows_for(phase: str, cell: Cell, candidate: str, result: cells.RunResult,
             made: dict[str, str]) -> list[dict[str, Any]]:
    """One row per selection rule (:func:`cells.kept_numbers`), with what the run was made with (``made``: threads,
    jobs, rev, data_sha)."""
    return [{"phase": phase, "regime": regime_of(cell), "data": cell.data, "protocol": cell.protocol,
             "strength": f"{cell.strength:g}", "palette": cell.palette, "seed": cell.seed, "candidate": candidate,
             **cells.kept_numbers(result, rule), **made, "date": result.date or dt.date.today().isoformat(),
             "key": result.key} for rule in RULES]
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.default_search",
                                     description=sys.modules["benchmarks.default_search"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    cells.add_cell_arguments(parser)
    parser.add_argument("--phase", choices=("screen", "confirm", "extension", "all"), default="all",
                        help="stop after screen or confirm; extension: run steps 7 and 8 alone on the CSV's confirmation")
    parser.add_argument("--out", type=Path, default=RESULTS / "default_search")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from OUT.csv")
    args = parser.parse_args(argv)
    command = cells.shown_command("default_search", sys.argv[1:] if argv is None else argv)
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    all_candidates = candidates()
    try:
        if args.collect_only:
            rows = cells.read_results(csv_path, FIELDS, "--collect-only")
            cells.write_text(md_path, markdown(rows, all_candidates, command, commit=commits_of(rows, base=True),
                                               extension_commit=commits_of(rows, base=False)))
            print(md_path.read_text())
            return 0
        if args.workdir is None:
            raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
        cells.check_inputs(args.npz, SCREEN_CELLS + HELDOUT_CELLS, args.jobs, args.threads)
        rev = cells.git("rev-parse", args.rev)
        if cells.git("status", "--porcelain", "--untracked-files=no"):
            print(f"note: the working tree has uncommitted changes; the cells run commit {rev[:12]}", file=sys.stderr)
        run_search(args, rev, csv_path, md_path, command, all_candidates)
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(md_path.read_text())
    return 0


def run_search(args: argparse.Namespace, rev: str, csv_path: Path, md_path: Path, command: str,
               all_candidates: dict[str, Candidate]) -> None:
    npz = args.npz.resolve()
    source_sha = cells.file_sha256(npz)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    halves = cells.write_halves(npz, workdir)
    stored = cells.read_rows(csv_path, FIELDS)
    lock = threading.Lock()
    workspaces: dict[Cell, cells.Workspace] = {}
    made = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data_sha": source_sha[:16]}
    commit = protocol_commit(rev)

    def npz_of(cell: Cell) -> tuple[Path | None, str]:
        if cell.half:
            return halves[cell.half], cells.key_of(source_sha, cell.half, cells.HALF_SEED)
        return (npz, source_sha) if cell.data == "mnist10k" else (None, "digits")

    def expected_key(cell: Cell, name: str) -> str:
        path, data_key = npz_of(cell)
        ws = cells.Workspace(cell, workdir / cell.name, cells.workspace_key(cell, path, rev, args.threads, data_key))
        return cells.run_key(ws, all_candidates[name].group_source, all_candidates[name].sets)

    rows: list[dict[str, str]] = []
    done: set[str] = set()

    def keep_valid(chosen: list[Cell]) -> int:
        """Rows of ``chosen`` cells under their expected keys join ``rows``; the count of the others (stale)."""
        valid = {expected_key(c, n) for c in chosen for n in all_candidates}
        for row in stored:
            if row["key"] in valid and row["key"] not in done:
                rows.extend(r for r in stored if r["key"] == row["key"])
                done.add(row["key"])
        return sum(1 for row in stored if row["key"] not in done)

    def workspace(cell: Cell) -> cells.Workspace:
        with lock:
            if cell in workspaces:
                return workspaces[cell]
        path, data_key = npz_of(cell)
        ready = cells.prepare(workdir, cell, path, rev, args.threads, data_key)
        with lock:
            workspaces[cell] = ready
        return ready

    def write(stale: int = 0) -> None:
        if args.phase == "extension":  # the earlier phases' rows stand as stored, made at their own commit
            shown = [row for row in stored_others() if row["phase"] != "extension"] + rows
            cells.write_text(md_path, markdown(shown, all_candidates, command, commit=commits_of(shown, base=True),
                                               extension_commit=commit))
        else:
            cells.write_text(md_path, markdown(rows, all_candidates, command, stale, commit, commit))

    def run_one(phase: str, cell: Cell, name: str) -> None:
        result = cells.train(workspace(cell), name, all_candidates[name].sets, all_candidates[name].group_source,
                             args.threads)
        new = rows_for(phase, cell, name, result, made)
        with lock:
            rows.extend({k: str(v) for k, v in row.items()} for row in new)
            done.add(result.key)
            cells.write_rows(csv_path, FIELDS, stored_others() + rows)
            print(f"{phase} {cell.name} {name}: val unbiased {new[0]['val_unbiased']}, "
                  f"{result.cpu_seconds:.0f} CPU s", flush=True)

    def stored_others() -> list[dict[str, str]]:
        return [row for row in stored if row["key"] not in done]

    def run_phase(phase: str, chosen: list[Cell], names: list[str]) -> None:
        stale = keep_valid(chosen)
        tasks = [(cell, name) for cell in chosen for name in names if expected_key(cell, name) not in done]
        print(f"{phase}: {len(tasks)} run(s) to do, {len(chosen) * len(names) - len(tasks)} kept", flush=True)
        with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
            try:
                for future in [pool.submit(workspace, cell) for cell in sorted({cell for cell, _ in tasks})]:
                    future.result()  # the upstreams first: no two threads prepare one cell
                for future in [pool.submit(run_one, phase, cell, name) for cell, name in tasks]:
                    future.result()
            except BaseException:
                pool.shutdown(wait=True, cancel_futures=True)  # a failed run stops the search: nothing more starts
                raise
        write(stale)

    def extend(earlier: list[dict[str, str]], names: list[str]) -> None:
        """Step 7 on the confirmation rows of ``earlier`` (validation columns only)."""
        val_u, val_w, cpu = validation_only(earlier, "confirm")
        decision = decide(val_u, val_w, cpu, names)
        for extension in extension_plan(decision, val_u):
            run_phase("extension", extension.chosen(), [extension.default, extension.rival, *extension.others])

    if args.phase == "extension":
        names = carried(stored, all_candidates)
        if not any(row["phase"] == "confirm" for row in stored):
            raise BenchmarkError(f"--phase extension reads the confirmation's rows, and {csv_path} has none")
        extend(stored, names)
        return
    run_phase("screen", SCREEN_CELLS, [FAIRKL] + [n for n in all_candidates if n != FAIRKL])
    names = carried(rows, all_candidates)
    if not names:
        raise BenchmarkError("no eligible candidate completed every screen cell: nothing to carry")
    if args.phase == "screen":
        return
    found = sizes(rows, names)
    run_phase("confirm", confirm_cells({r: s.cells for r, s in found.items()}), names)
    if args.phase == "confirm":
        return
    extend(rows, names)
    run_phase("heldout", HELDOUT_CELLS, names)


if __name__ == "__main__":
    sys.exit(main())
