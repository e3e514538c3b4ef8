"""The schedule study's runs: each cell's workspace, the candidates' stage-2 runs, one CSV row per epoch under the
key of what made it, and the command line (``python -m benchmarks.schedule_search``:
:mod:`benchmarks.schedule_search`)."""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import math
import sys
import threading
from pathlib import Path

from benchmarks import cells
from benchmarks.cells import BenchmarkError, Cell, regime_of
from benchmarks.schedule_search.rule import (CANDIDATES, FIELDS, KEPT_RULE, RESULTS, SEARCH, cells_needed,
                                             heldout_cells, read_csv, validation_cells)
from debias.training.selection import picks_by_rule

# history key -> column (the epoch's numbers a row keeps; accuracies as fractions)
COLUMNS = {"val/unbiased": "val_unbiased", "val/worst_group": "val_worst", "val/aligned": "val_aligned",
           "val/conflicting": "val_conflicting", "test/unbiased": "test_unbiased", "test/worst_group": "test_worst",
           "train/ce": "train_ce", "train/contrastive": "train_contrastive", "val/spread": "val_spread"}


def rows_of(phase: str, cell: Cell, candidate: str, result: cells.RunResult, made: dict[str, str]) -> list[dict]:
    """One row per epoch of the run, ``kept`` 1 on the epoch :data:`KEPT_RULE` picks."""
    kept = picks_by_rule(result.history)[KEPT_RULE]
    return [{"phase": phase, "regime": regime_of(cell), "data": cell.data, "protocol": cell.protocol,
             "strength": f"{cell.strength:g}", "palette": cell.palette, "seed": str(cell.seed),
             "candidate": candidate, "epoch": str(int(h["epoch"])), "kept": str(int(int(h["epoch"]) == kept)),
             **{column: f"{h.get(key, math.nan):.4f}" for key, column in COLUMNS.items()},
             "cpu_seconds": f"{result.cpu_seconds:.1f}", **made, "date": result.date or dt.date.today().isoformat(),
             "key": result.key} for h in result.history]


def run_cells(args: argparse.Namespace, rev: str, csv_path: Path) -> list[dict[str, str]]:
    """Every candidate on every cell (rows kept from ``csv_path`` when their key matches), ``args.jobs`` cells at once,
    validation first; a cell not started by ``args.stop_at`` is left out. The CSV is rewritten after each run."""
    sizes = cells_needed(read_csv(SEARCH))
    chosen = [("validation", c) for c in validation_cells(sizes)] + [("heldout", c) for c in heldout_cells()]
    npz = args.npz.resolve() if args.npz else None
    cells.check_inputs(npz, [cell for _, cell in chosen], args.jobs, args.threads)
    deadline = dt.datetime.fromisoformat(args.stop_at) if args.stop_at else None
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    source_sha = cells.file_sha256(npz) if npz else "digits"
    halves = cells.write_halves(npz, workdir) if npz else {}
    made = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data_sha": source_sha[:16]}
    rows = cells.read_rows(csv_path, FIELDS)
    done = {(row["key"], row["candidate"]) for row in rows}
    lock = threading.Lock()

    def data_of(cell: Cell) -> tuple[Path | None, str]:
        if cell.half:
            return halves[cell.half], cells.key_of(source_sha, cell.half, cells.HALF_SEED)
        return (None, "digits") if cell.data == "digits" else (npz, source_sha)

    def one_cell(phase: str, cell: Cell) -> None:
        if deadline and dt.datetime.now(dt.timezone.utc) > deadline:
            return
        path, data_key = data_of(cell)
        expected = cells.Workspace(cell, workdir / cell.name,
                                   cells.workspace_key(cell, path, rev, args.threads, data_key, ("cluster",)))
        todo = [name for name, sets in CANDIDATES.items()
                if (cells.run_key(expected, "cluster", sets), name) not in done]
        if not todo:
            return
        workspace = cells.prepare(workdir, cell, path, rev, args.threads, data_key, ("cluster",))
        for name in todo:
            result = cells.train(workspace, name, CANDIDATES[name], "cluster", args.threads)
            new = rows_of(phase, cell, name, result, made)
            with lock:
                rows.extend(new)
                cells.write_rows(csv_path, FIELDS, rows)
            kept = next(r for r in new if r["kept"] == "1")
            print(f"{phase} {cell.name} {name}: kept epoch {kept['epoch']}, val unbiased {kept['val_unbiased']}, "
                  f"{result.cpu_seconds:.0f} CPU s", flush=True)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_cell, phase, cell) for phase, cell in chosen]
        try:
            for future in futures:
                future.result()
        except BaseException:
            pool.shutdown(wait=True, cancel_futures=True)  # a failed run stops the study: nothing more starts
            raise
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.schedule_search",
                                     description=sys.modules["benchmarks.schedule_search"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (x uint8 [N, 28, 28], y)")
    cells.add_cell_arguments(parser)
    parser.add_argument("--stop-at", help="an ISO time with its zone (2026-12-02T18:05+00:00): no cell starts after it")
    parser.add_argument("--out", type=Path, default=RESULTS / "default_search_schedule")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from OUT.csv")
    args = parser.parse_args(argv)
    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    command = cells.shown_command("schedule_search", sys.argv[1:] if argv is None else argv)
    try:
        if args.stop_at:
            try:
                if dt.datetime.fromisoformat(args.stop_at).tzinfo is None:
                    raise ValueError
            except ValueError:
                raise BenchmarkError(f"--stop-at {args.stop_at!r}: an ISO time with its zone is allowed, "
                                     "e.g. 2026-12-02T18:05+00:00") from None
        if not args.collect_only:
            if args.workdir is None:
                raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
            if args.npz is None:
                raise BenchmarkError("--npz is required (mnist10k.npz: the CMNIST* and Biased-MNIST cells)")
            run_cells(args, cells.git("rev-parse", args.rev), csv_path)
        from benchmarks.schedule_search.page import markdown

        rows = cells.read_results(csv_path, FIELDS, "--collect-only")
        cells.write_text(md_path, markdown(rows, read_csv(SEARCH), command))
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
