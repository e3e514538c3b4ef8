"""The warning-value study's runs: both pool settings on each cell, the pipeline's warning count, and the command line
(``python -m benchmarks.warning_value``; what is measured and the rule: :mod:`benchmarks.warning_value`)."""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime as dt
import json
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import yaml

from benchmarks import cells
from benchmarks.cells import BenchmarkError, Cell, digits_cell
from benchmarks.warning_value.rule import (AVOIDING, CONFIRM_FIELDS, CONFIRM_SEEDS, DIGITS_SEEDS, FIELDS,
                                           PIPELINE_FIELDS, RESULTS, RULE_KEPT, SEARCH, WARNED, heldout_cells,
                                           regime_of)
from debias.core import health

# --------------------------------------------------------------------------- per-run checks


def short_pools(workspace: cells.Workspace, sets: dict[str, Any]) -> list[str]:
    """The pools CNC's sampler of ``sets`` finds short on the workspace's training split and clusters: what the
    stage's train info lists (``sampler.short_pools``); a ``cnc-small-pools`` warning fires when non-empty and
    ``short_pools`` is ``replace`` (``shrink`` cuts M and N instead, and this returns [] for it)."""
    from debias.data.store import load_splits
    from debias.groups import load_groups
    from debias.schema import validate
    from debias.training.methods.cnc.train import cnc_sampler

    raw = yaml.safe_load((workspace.path / "params.yaml").read_text())
    for dotted, value in sets.items():
        *parents, leaf = dotted.split(".")
        node = raw
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    params = validate(raw)
    train = load_splits(workspace.path / "data/biased")["train"]
    groups = load_groups(workspace.groups_table(WARNED.group_source), y=train.y)
    return list(cnc_sampler(train, groups.inferred_label, params).report()["short_pools"])


def stage2_codes(result: cells.RunResult, rule: str, short: list[str]) -> list[str]:
    """The stage-2 warning codes a run's history shows for ``rule``'s pick: ``cnc-small-pools`` (``short``),
    ``degenerate-selection`` / ``first-epoch-kept`` / ``fragile-selection`` (the selection block), ``unstable-training`` (params.yaml's
    thresholds) and ``collapsed-representation`` (the kept epoch's validation features)."""
    from debias.params import HealthParams
    from debias.training.selection import describe_selection, picks_by_rule

    epoch = picks_by_rule(result.history)[rule]
    block = describe_selection(result.history, epoch, rule)
    thresholds = HealthParams()
    kept = next(row for row in result.history if int(row["epoch"]) == epoch)
    found = ["cnc-small-pools"] if short else []
    if block["degenerate"]:
        found.append("first-epoch-kept" if block.get("first_epoch") else "degenerate-selection")
    elif block["fragile"]:
        found.append("fragile-selection")
    losses = [row["train/loss"] for row in result.history if "train/loss" in row]
    if health.loss_instability(losses, thresholds.loss_spike, thresholds.loss_end, thresholds.loss_min_fall):
        found.append("unstable-training")
    if kept.get("val/spread", 1.0) < health.COLLAPSE_SPREAD:
        found.append("collapsed-representation")
    return found


def row_of(phase: str, cell: Cell, setting: str, name: str, result: cells.RunResult, short: list[str],
           made: dict[str, str]) -> dict[str, str]:
    """The CSV row of one run under the default's rule."""
    kept = cells.kept_numbers(result, RULE_KEPT)
    from debias.training.selection import describe_selection

    block = describe_selection(result.history, kept["epoch"], RULE_KEPT)
    codes = stage2_codes(result, RULE_KEPT, short)
    row = {"phase": phase, "regime": regime_of(cell), "data": cell.data, "protocol": cell.protocol,
           "strength": f"{cell.strength:g}", "palette": cell.palette, "seed": cell.seed, "setting": setting,
           "candidate": name, "rule": RULE_KEPT, "epoch": kept["epoch"], "degenerate": kept["degenerate"],
           "fragile": int(bool(block["fragile"])), "short_pools": len(short), "codes": ";".join(codes) or "none",
           "val_unbiased": kept["val_unbiased"], "test_unbiased": kept["test_unbiased"],
           "test_worst": kept["test_worst"], "cpu_seconds": kept["cpu_seconds"], **made,
           "date": result.date or dt.date.today().isoformat(), "key": result.key}
    return {k: str(v) for k, v in row.items()}


# --------------------------------------------------------------------------- runs


def chosen_cells(digits_only: bool, confirm: bool = False) -> list[tuple[str, Cell]]:
    """(phase, cell): the bundled digits at :data:`DIGITS_SEEDS`, then the default search's held-out cells; with
    ``confirm``, the confirmation's digits at :data:`CONFIRM_SEEDS` alone."""
    if confirm:
        return [("confirm", digits_cell(seed)) for seed in CONFIRM_SEEDS]
    found = [("digits", digits_cell(seed)) for seed in DIGITS_SEEDS]
    return found if digits_only else found + [("heldout", cell) for cell in interleaved(heldout_cells(SEARCH))]


def interleaved(chosen: list[Cell]) -> list[Cell]:
    """``chosen`` taking each regime in turn (its first cell, then each regime's second, ...), so that a run stopped
    early holds every regime's first cells rather than one regime's all."""
    position: dict[str, int] = {}
    ranked = []
    for cell in chosen:
        regime = regime_of(cell)
        position[regime] = position.get(regime, 0) + 1
        ranked.append((position[regime], regime, cell))
    return [cell for _, _, cell in sorted(ranked, key=lambda item: (item[0], item[1]))]


def run_cells(args: argparse.Namespace, rev: str, csv_path: Path, pools_path: Path) -> list[dict[str, str]]:
    """Both settings on every chosen cell (rows kept from ``csv_path`` when their key matches), ``args.jobs`` at once;
    the CSV is rewritten after each run. A confirmation cell (``args.confirm``) runs its cluster groups' upstream
    alone, records its pool check in ``pools_path`` and runs both settings only where a pool is short."""
    chosen = chosen_cells(args.digits_only, args.confirm)
    npz = args.npz.resolve() if args.npz else None
    cells.check_inputs(npz, [cell for _, cell in chosen], args.jobs, args.threads)
    workdir = args.workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    source_sha = cells.file_sha256(npz) if npz else "digits"
    halves = cells.write_halves(npz, workdir) if npz and not args.digits_only else {}
    made = {"threads": str(args.threads), "jobs": str(args.jobs), "rev": rev[:12], "data_sha": source_sha[:16]}
    stored = {row["key"] + row["setting"]: row for row in cells.read_rows(csv_path, FIELDS)}
    rows: list[dict[str, str]] = list(stored.values())
    checked = {row["seed"]: row for row in cells.read_rows(pools_path, CONFIRM_FIELDS) if row["rev"] == rev[:12]}
    lock = threading.Lock()

    def data_of(cell: Cell) -> tuple[Path | None, str]:
        if cell.half:
            return halves[cell.half], cells.key_of(source_sha, cell.half, cells.HALF_SEED)
        return (None, "digits") if cell.data == "digits" else (npz, source_sha)

    def one_cell(phase: str, cell: Cell) -> None:
        path, data_key = data_of(cell)
        if phase == "confirm" and checked.get(str(cell.seed), {}).get("short_pools") == "0":
            return  # checked at this commit: no short pool, nothing to run
        sources = (WARNED.group_source,) if phase == "confirm" else cells.GROUP_SOURCES
        workspace = cells.prepare(workdir, cell, path, rev, args.threads, data_key, sources)
        short = short_pools(workspace, WARNED.sets)
        if phase == "confirm":
            with lock:
                checked[str(cell.seed)] = {"seed": str(cell.seed), "short_pools": str(len(short)), "rev": rev[:12],
                                           "date": dt.date.today().isoformat()}
                cells.write_rows(pools_path, CONFIRM_FIELDS, sorted(checked.values(), key=lambda r: int(r["seed"])))
            print(f"confirm {cell.name}: short pools {len(short)}", flush=True)
            if not short:
                return
        for setting, candidate in (("replace", WARNED), ("shrink", AVOIDING)):
            key = cells.run_key(workspace, candidate.group_source, candidate.sets)
            if key + setting in stored:
                continue
            result = cells.train(workspace, candidate.name, candidate.sets, candidate.group_source, args.threads)
            row = row_of(phase, cell, setting, candidate.name, result, short if setting == "replace" else [], made)
            with lock:
                rows.append(row)
                cells.write_rows(csv_path, FIELDS, rows)
            print(f"{phase} {cell.name} {setting}: test unbiased {row['test_unbiased']} short pools {len(short)} "
                  f"codes {row['codes']}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(one_cell, phase, cell) for phase, cell in chosen]
        for future in futures:
            future.result()
    return rows


def pipeline_counts(args: argparse.Namespace, rev: str, path: Path) -> list[dict[str, str]]:
    """``dvc repro`` of the bundled default at :data:`DIGITS_SEEDS` in fresh clones at ``rev`` (one clone per job,
    seeds in turn; MLflow off), with every stage's warnings and notes as the clone's own code reads them."""
    workdir = args.workdir.resolve() / "pipeline"
    workdir.mkdir(parents=True, exist_ok=True)
    done = {row["seed"]: row for row in cells.read_rows(path, PIPELINE_FIELDS) if row["rev"] == rev[:12]}
    rows: list[dict[str, str]] = list(done.values())
    lock = threading.Lock()
    todo = [seed for seed in DIGITS_SEEDS if str(seed) not in done]
    reader = ("import json; from debias.core.headline import local_warnings, recorded_unread; "
              "from debias.core import headline; notes = getattr(headline, 'local_notes', lambda: {})(); "
              "print(json.dumps([[m for ms in {**local_warnings(), **recorded_unread()}.values() for m in ms], "
              "[m for ms in notes.values() for m in ms]]))")

    def worker(k: int) -> None:
        clone = workdir / f"clone{k}"
        if not clone.exists():
            subprocess.run(["git", "clone", "-q", "--no-checkout", str(cells.ROOT), str(clone)], check=True)
        cells.git("checkout", "-q", "-f", rev, cwd=clone)
        env = {**cells.stage_env(clone, args.threads)}
        while True:
            with lock:
                if not todo:
                    return
                seed = todo.pop(0)
            params = clone / "params.yaml"
            text = cells.git("show", f"{rev}:params.yaml", cwd=clone)
            params.write_text(re.sub(r"(?m)^seed: \d+", f"seed: {seed}", text, count=1) + "\n")
            log = workdir / f"repro-seed{seed}.log"
            with log.open("w") as handle:
                done_run = subprocess.run(["dvc", "repro"], cwd=clone, env=env, stdout=handle, stderr=subprocess.STDOUT)
            if done_run.returncode != 0:
                raise BenchmarkError(f"seed {seed}: `dvc repro` failed ({done_run.returncode}); its output: {log}")
            out = subprocess.run([sys.executable, "-c", reader], cwd=clone, env=env, check=True, capture_output=True,
                                 text=True).stdout
            warned, noted = json.loads(out.strip().splitlines()[-1])
            row = {"seed": str(seed), "warnings": " | ".join(warned) or "none", "notes": " | ".join(noted) or "none",
                   "rev": rev[:12], "date": dt.date.today().isoformat()}
            with lock:
                rows.append(row)
                cells.write_rows(path, PIPELINE_FIELDS, sorted(rows, key=lambda r: int(r["seed"])))
            print(f"pipeline seed {seed}: warnings {row['warnings'][:120]}; notes {row['notes'][:80]}", flush=True)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for future in [pool.submit(worker, k) for k in range(args.jobs)]:
            future.result()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.warning_value", description=sys.modules["benchmarks.warning_value"].__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--npz", type=Path, help="mnist10k.npz (the held-out cells)")
    cells.add_cell_arguments(parser)
    parser.add_argument("--digits-only", action="store_true", help="the bundled digits' cells alone")
    parser.add_argument("--pipeline", action="store_true", help="only count the warnings of `dvc repro` at seeds 0-19")
    parser.add_argument("--confirm", action="store_true",
                        help=f"the confirmation of cnc-small-pools: the digits at seeds {CONFIRM_SEEDS[0]}-{CONFIRM_SEEDS[-1]}")
    parser.add_argument("--out", type=Path, default=RESULTS / "warning_value")
    parser.add_argument("--collect-only", action="store_true", help="rewrite OUT.md from the CSVs")
    args = parser.parse_args(argv)

    csv_path, md_path = args.out.with_suffix(".csv"), args.out.with_suffix(".md")
    pipeline_path = args.out.with_name(args.out.name + "_pipeline.csv")
    pools_path = args.out.with_name(args.out.name + "_confirm_pools.csv")
    command = cells.shown_command("warning_value", sys.argv[1:] if argv is None else argv)
    try:
        if not args.collect_only:
            if args.workdir is None:
                raise BenchmarkError("--workdir is required (a scratch folder for the cells' workspaces)")
            rev = cells.git("rev-parse", args.rev)
            if args.pipeline:
                pipeline_counts(args, rev, pipeline_path)
            else:
                run_cells(args, rev, csv_path, pools_path)
        from benchmarks.warning_value.page import markdown, rule_commit

        rows = cells.read_results(csv_path, FIELDS, "--collect-only")
        pipeline = cells.read_rows(pipeline_path, PIPELINE_FIELDS)
        checked = cells.read_rows(pools_path, CONFIRM_FIELDS)
        cells.write_text(md_path, markdown(rows, pipeline, SEARCH, command, rule_commit(), checked))
    except BenchmarkError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(md_path.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
