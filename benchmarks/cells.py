"""Benchmark cells: one (data, protocol, palette, seed) workspace whose upstream stages ran once, and stage-2 runs in
it keyed by everything that made them (data file, code, params), so a resumed benchmark never reuses a result
computed from other inputs.

A cell's workspace is a clone of the repository at one commit with the cell's params.yaml; ``dvc repro
infer_groups`` runs there once per group source, and each source's groups table is kept beside the others
(``groups-<source>.parquet``). A stage-2 run is ``benchmarks/stage2_epochs.py`` of that clone (the registered
method's task, per-epoch validation and test), whose per-epoch history is stored with its key; the CPU seconds of
the run's process (user + system, from ``wait4``: the work done, whatever else the machine runs) and its wall
seconds are kept with it.

Results CSVs are written whole to a temporary file and renamed over the old one; rows that do not parse (a
truncated last line) are dropped with a warning instead of being counted as done.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import math
import os
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

from debias.core.trees import merge
from debias.metrics.paired import paired
from debias.training.selection import describe_selection, picks_by_rule

#: The upstream recipe of benchmarks/quality.yaml on mnist10k's 10k real digits (5,999 training images, ERM 5 epochs).
MNIST10K: dict[str, Any] = {
    "data": {"source": "npz", "val_fraction": 0.15, "test_fraction": 0.25},
    "model": {"name": "lenet5"},
    "erm": {"optimizer": "sgd", "lr": 0.01, "momentum": 0.9, "weight_decay": 0.0005, "batch_size": 32, "epochs": 5,
            "selection": "last", "augment_shift": 2},
}
#: protocol -> (bias.protocol, its strength key): CMNIST* colours the strokes with p_corr, Biased-MNIST the background
#: with rho.
PROTOCOLS: dict[str, tuple[str, str]] = {"cmnist": ("foreground", "p_corr"), "bmnist": ("background", "rho")}
STRENGTH = 0.96  # p_corr / rho of a cell that names none: ~240 bias-conflicting of mnist10k's 5,999 training images
# paper: the papers' palettes (params.yaml's); other: colours no default was tuned on before (CMNIST*: matplotlib hsv
# at 0.1, 0.3, ..., 0.9 instead of 0, 0.2, ..., 0.8; Biased-MNIST: matplotlib's tab10); fresh: colours no search
# ever chose on (CMNIST*: matplotlib's Dark2, darker and less saturated; Biased-MNIST: matplotlib's Paired, light and
# dark shades of five hues).
PALETTES: dict[str, dict[str, Any]] = {
    "paper": {},
    "other": {"bias": {
        "foreground": {"colours": [[255, 153, 0], [102, 255, 0], [0, 255, 255], [51, 0, 255], [255, 0, 153]]},
        "background": {"colours": [[31, 119, 180], [255, 127, 14], [44, 160, 44], [214, 39, 40], [148, 103, 189],
                                   [140, 86, 75], [227, 119, 194], [127, 127, 127], [188, 189, 34], [23, 190, 207]]}}},
    "fresh": {"bias": {
        "foreground": {"colours": [[27, 158, 119], [217, 95, 2], [117, 112, 179], [231, 41, 138], [102, 166, 30]]},
        "background": {"colours": [[166, 206, 227], [31, 120, 180], [178, 223, 138], [51, 160, 44], [251, 154, 153],
                                   [227, 26, 28], [253, 191, 111], [255, 127, 0], [202, 178, 214], [106, 61, 154]]}}},
}
# digits: the bundled default data, params.yaml's upstream as shipped; mnist10k-A / -B: the two disjoint halves of
# mnist10k (:func:`write_halves`), one to choose on, one to report on
DATASETS = ("mnist10k", "mnist10k-A", "mnist10k-B", "digits")
HALVES = ("A", "B")
HALF_SEED = 20261129  # the permutation that splits mnist10k into its halves, class by class
GROUP_SOURCES = ("cluster", "pred")


class BenchmarkError(Exception):
    """Bad input, named with what is allowed, raised before any training."""


@dataclass(frozen=True, order=True)
class Cell:
    """One data cell. ``data`` mnist10k or one of its halves (the ``protocol`` at ``strength`` and the ``palette``
    apply) or digits (params.yaml's own foreground protocol at p_corr 0.9, the papers' palette: only the seed
    changes)."""

    data: str
    protocol: str
    palette: str
    seed: int
    strength: float = STRENGTH

    @property
    def name(self) -> str:
        strength = "" if self.strength == STRENGTH else f"{self.strength:g}"
        return f"{self.data}-{self.protocol}{strength}-{self.palette}-s{self.seed}"

    @property
    def half(self) -> str:
        """'A' or 'B' for a cell on one half of mnist10k, '' otherwise."""
        return self.data.rpartition("-")[2] if self.data.startswith("mnist10k-") else ""

    def overrides(self, npz: Path | None) -> dict[str, Any]:
        """The params.yaml overrides of this cell (``npz``: the file it reads, its half for a half's cell)."""
        if self.data == "digits":
            return {"seed": self.seed, "data": {"source": "digits"}}
        protocol, strength_key = PROTOCOLS[self.protocol]
        bias = {"bias": {"protocol": protocol, protocol: {strength_key: self.strength}}}
        tree = merge(merge(MNIST10K, bias), PALETTES[self.palette])
        return merge(tree, {"seed": self.seed, "data": {"path": str(npz)}})


def digits_cell(seed: int) -> Cell:
    return Cell("digits", "cmnist", "paper", seed)


def regime_of(cell: Cell) -> str:
    """digits, cmnist, bmnist, or the protocol with its strength where that is not the cells' usual one."""
    if cell.data == "digits":
        return "digits"
    return cell.protocol + ("" if cell.strength == STRENGTH else f"{cell.strength:g}")


def cell_of(row: dict[str, str]) -> Cell:
    """The cell a results row names."""
    return Cell(row["data"], row["protocol"], row["palette"], int(row["seed"]), float(row["strength"]))


def check_inputs(npz: Path | None, cells: list[Cell], jobs: int, threads: int) -> None:
    """Refuse what would fail later, before any clone or training: a missing or foreign npz, bad job counts."""
    if jobs < 1:
        raise BenchmarkError(f"--jobs = {jobs}: allowed: a whole number >= 1 (runs at once)")
    if threads < 1:
        raise BenchmarkError(f"--threads = {threads}: allowed: a whole number >= 1 (torch threads per run)")
    if any(cell.data != "digits" for cell in cells):
        if npz is None:
            raise BenchmarkError("--npz is required for the mnist10k cells (mnist10k.npz of the datasets folder)")
        if not npz.is_file():
            raise BenchmarkError(f"--npz {npz}: no such file (expected mnist10k.npz: x uint8 [N, 28, 28], y int)")
        try:
            import numpy

            with numpy.load(npz) as archive:
                missing = [key for key in ("x", "y") if key not in archive.files]
        except Exception as exc:  # noqa: BLE001 (any unreadable file is refused the same way)
            raise BenchmarkError(f"--npz {npz}: not a readable .npz ({type(exc).__name__}: {exc})") from None
        if missing:
            raise BenchmarkError(f"--npz {npz}: lacks the arrays {missing} (expected x uint8 [N, 28, 28] and y int)")


def write_halves(npz: Path, folder: Path) -> dict[str, Path]:
    """mnist10k split into two disjoint halves, class by class (a fixed permutation, :data:`HALF_SEED`): half A's
    images are chosen on, half B's reported on. Written once as ``folder/mnist10k-{A,B}.npz``; rewritten when the
    source's SHA-256 (stored beside them) differs."""
    import numpy

    paths = {half: folder / f"mnist10k-{half}.npz" for half in HALVES}
    stamp, source_key = folder / "mnist10k-halves.key", key_of(file_sha256(npz), HALF_SEED)
    if stamp.exists() and stamp.read_text() == source_key and all(p.exists() for p in paths.values()):
        return paths
    with numpy.load(npz) as archive:
        x, y = archive["x"], archive["y"]
    rng = numpy.random.default_rng(HALF_SEED)
    first: list[numpy.ndarray] = []
    for label in numpy.unique(y):
        members = rng.permutation(numpy.flatnonzero(y == label))
        first.append(members[: len(members) // 2])
    in_a = numpy.zeros(len(y), bool)
    in_a[numpy.concatenate(first)] = True
    folder.mkdir(parents=True, exist_ok=True)
    for half, mask in (("A", in_a), ("B", ~in_a)):
        partial = paths[half].with_name(paths[half].stem + ".tmp.npz")
        numpy.savez(partial, x=x[mask], y=y[mask])
        os.replace(partial, paths[half])
    stamp.write_text(source_key)
    return paths


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def code_key(rev: str, root: Path = ROOT) -> str:
    """The git objects of everything a cell's runs execute or read at ``rev``: the package, the stage entrypoints,
    dvc.yaml, params.yaml (the values a cell does not override) and the stage-2 runner."""
    paths = ("src", "pipeline", "dvc.yaml", "params.yaml", "benchmarks/stage2_epochs.py")
    return hashlib.sha256(" ".join(git("rev-parse", f"{rev}:{path}", cwd=root) for path in paths).encode()).hexdigest()


def key_of(*parts: Any) -> str:
    """A short hash of JSON-able parts (sorted keys): the identity of a cell or a run."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Workspace:
    cell: Cell
    path: Path
    key: str  # data, code and upstream params

    def groups_table(self, source: str) -> Path:
        return self.path / f"groups-{source}.parquet"


def workspace_key(cell: Cell, npz: Path | None, rev: str, threads: int, data_key: str,
                  sources: tuple[str, ...] = GROUP_SOURCES) -> str:
    """The identity of a cell's upstream: its data file's SHA-256 (``data_key``; the bundled digits need none), the
    code at ``rev``, the cell's params, the group sources and the torch threads every run of it uses."""
    return key_of(data_key if cell.data != "digits" else "digits", code_key(rev), cell.overrides(npz), sources,
                  threads)


def run_key(workspace: Workspace, group_source: str, sets: dict[str, Any]) -> str:
    """The identity of a stage-2 run: its workspace's key (data, code, params, threads), group source and params."""
    return key_of(workspace.key, group_source, sets)


def stage_env(path: Path, threads: int) -> dict[str, str]:
    return {**os.environ, "DEBIAS_THREADS": str(threads), "DEBIAS_TRACKING": "off", "PYTHONPATH": str(path / "src")}


def prepare(workdir: Path, cell: Cell, npz: Path | None, rev: str, threads: int, data_key: str,
            sources: tuple[str, ...] = GROUP_SOURCES) -> Workspace:
    """The cell's workspace at ``rev`` with each group source's table (``sources``); reused only when its stored key matches (a
    workspace of other data, code or params is rebuilt), so nothing stale is read."""
    path = workdir / cell.name
    params_tree = cell.overrides(npz)
    key = workspace_key(cell, npz, rev, threads, data_key, sources)
    stamp = path / "upstream.key"
    if stamp.exists() and stamp.read_text() == key and all((path / f"groups-{s}.parquet").exists() for s in sources):
        return Workspace(cell, path, key)
    if path.exists():
        shutil.rmtree(path)
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(path)], check=True)
    git("checkout", "-q", rev, cwd=path)
    params_file = path / "params.yaml"
    base = yaml.safe_load(params_file.read_text())
    log = workdir / f"{cell.name}.upstream.log"
    with log.open("w") as handle:
        for source in sources:
            params = merge(merge(base, params_tree), {"groups": {"method": source}})
            params_file.write_text(yaml.safe_dump(params, sort_keys=False, width=1000))
            done = subprocess.run(["dvc", "repro", "infer_groups"], cwd=path, env=stage_env(path, threads),
                                  stdout=handle, stderr=subprocess.STDOUT)
            if done.returncode != 0:
                raise BenchmarkError(f"{cell.name}: `dvc repro infer_groups` (groups.method {source}) failed with exit "
                                     f"code {done.returncode}; its output: {log}")
            shutil.copy(path / "data/groups/train.parquet", path / f"groups-{source}.parquet")
    stamp.write_text(key)
    return Workspace(cell, path, key)


@dataclass
class RunResult:
    history: list[dict[str, float]]
    cpu_seconds: float
    wall_seconds: float
    key: str
    date: str = ""  # the day the run was made (ISO)


def kept_numbers(result: RunResult, rule: str) -> dict[str, Any]:
    """A results row's columns for selection ``rule`` on the run: the epoch it keeps on the history, whether that pick
    is degenerate, that epoch's validation and test numbers, and the run's CPU and wall seconds."""
    epoch = picks_by_rule(result.history)[rule]
    kept = next(row for row in result.history if int(row["epoch"]) == epoch)
    return {"rule": rule, "epoch": epoch,
            "degenerate": int(bool(describe_selection(result.history, epoch, rule)["degenerate"])),
            "val_unbiased": round(kept["val/unbiased"], 4), "val_worst": round(kept["val/worst_group"], 4),
            "test_avg": round(kept["test/avg"], 4), "test_unbiased": round(kept["test/unbiased"], 4),
            "test_worst": round(kept["test/worst_group"], 4),
            "test_worst_n": int(kept.get("test/worst_group_n", 0) or 0),
            "cpu_seconds": round(result.cpu_seconds, 1), "wall_seconds": round(result.wall_seconds, 1)}

def _run_measured(command: list[str], env: dict[str, str], log: Path) -> tuple[int, float, float]:
    """Run ``command``; its exit code, the CPU seconds of its process (and its children, user + system) and the wall
    seconds."""
    started = time.perf_counter()
    with log.open("w") as handle:
        process = subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
    return process.returncode, usage.ru_utime + usage.ru_stime, time.perf_counter() - started


def train(workspace: Workspace, name: str, sets: dict[str, Any], group_source: str, threads: int) -> RunResult:
    """Stage 2 of ``sets`` (dotted params.yaml keys) in ``workspace`` on ``group_source``'s groups: its per-epoch
    history, reused from an earlier run only when the stored key (workspace key, group source, sets) matches."""
    key = run_key(workspace, group_source, sets)
    stored = workspace.path / f"history-{name}.json"
    if stored.exists():
        try:
            found = json.loads(stored.read_text())
            if found.get("key") == key:
                return RunResult(found["history"], found["cpu_seconds"], found["wall_seconds"], key,
                                 found.get("date", ""))
        except (json.JSONDecodeError, KeyError, TypeError):
            pass  # unreadable or of another layout: trained again below
    partial = stored.with_suffix(".tmp")
    command = [sys.executable, str(workspace.path / "benchmarks/stage2_epochs.py"), str(workspace.path), "--threads",
               str(threads), "--history", str(partial), "--groups", str(workspace.groups_table(group_source))]
    for dotted, value in sets.items():  # YAML's own spelling: 1e-05 would read back as a string, 1.0e-05 does not
        command += ["-S", f"{dotted}={yaml.safe_dump(value, default_flow_style=True).removesuffix(chr(10) + '...' + chr(10)).strip()}"]
    log = workspace.path / f"stage2-{name}.log"
    code, cpu, wall = _run_measured(command, stage_env(workspace.path, threads), log)
    if code != 0:
        raise BenchmarkError(f"{workspace.cell.name} {name}: stage 2 failed with exit code {code}; its output: {log}")
    history = json.loads(partial.read_text())
    date = time.strftime("%Y-%m-%d")
    stored.write_text(json.dumps({"key": key, "history": history, "cpu_seconds": cpu, "wall_seconds": wall,
                                  "date": date}))
    partial.unlink()
    return RunResult(history, cpu, wall, key, date)


# --------------------------------------------------------------------------- results files


def read_rows(path: Path, fields: list[str], legacy: list[list[str]] | None = None) -> list[dict[str, str]]:
    """The complete rows of a results CSV (every field present and non-empty where the header has it); a row that is
    not (a truncated last line) is dropped, with a warning on stderr. ``legacy``: earlier layouts also read (to
    render them; their rows never count as done: their keys lack what the current key holds)."""
    if not path.exists():
        return []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        if reader.fieldnames in (legacy or []):
            fields = list(reader.fieldnames)
        if reader.fieldnames != fields:
            raise BenchmarkError(f"{path}: its columns {reader.fieldnames} are not this script's {fields}: move it "
                                 "away to start a new results file")
        rows, dropped = [], 0
        for row in reader:
            if None in row or any(row.get(field) in (None, "") for field in fields):
                dropped += 1
                continue
            rows.append(row)
    if dropped:
        print(f"warning: {path}: {dropped} incomplete row(s) dropped (they are run again)", file=sys.stderr)
    return rows


def read_results(path: Path, fields: list[str], flag: str,
                 legacy: list[list[str]] | None = None) -> list[dict[str, str]]:
    """The rows a results page is rendered from: refused in one line when the CSV is missing or holds no row (a
    header alone says nothing about what any row was made with)."""
    if not path.exists():
        raise BenchmarkError(f"{flag}: {path} does not exist; run without {flag} first")
    rows = read_rows(path, fields, legacy)
    if not rows:
        raise BenchmarkError(f"{flag}: {path} holds no complete row (a header alone): nothing to render")
    return rows


MADE_WITH = ("threads", "jobs", "rev", "data_sha")  # what each row records of how it was made


def made_with(rows: list[dict[str, str]]) -> str:
    """What the rows were made with, read from them (never from the command that renders them): torch threads, runs
    at once, commit, data file and dates; "not recorded" for rows of a layout without those columns."""
    import platform

    if not rows:
        return "no rows yet"

    def seen(key: str) -> str:
        found = sorted({row.get(key) or "not recorded" for row in rows})
        return " / ".join(found)

    dates = sorted({row["date"] for row in rows if row.get("date")})
    when = (f"; runs made {dates[0]}" + (f" to {dates[-1]}" if len(dates) > 1 else "")) if dates else ""
    return (f"{platform.machine()} CPU; torch threads per run: {seen('threads')}; runs at once: {seen('jobs')}; code "
            f"and params.yaml of commit {seen('rev')}; mnist10k.npz SHA-256 {seen('data_sha')}{when}")


def write_rows(path: Path, fields: list[str], rows: list[dict[str, Any]]) -> None:
    """Write the CSV whole to a temporary file beside it, then rename it over ``path`` (never half-written)."""
    partial = path.with_suffix(path.suffix + ".tmp")
    with partial.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fields)
        writer.writeheader()
        writer.writerows(rows)
    os.replace(partial, path)


def add_cell_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every cell study takes: its scratch folder, torch threads per run, runs at once, the commit."""
    parser.add_argument("--workdir", type=Path, help="scratch folder for the per-cell workspaces")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs at once")
    parser.add_argument("--rev", default="HEAD", help="the commit every cell is cloned at")


def shown_command(module: str, argv: list[str]) -> str:
    """The command line a results page prints for ``python -m benchmarks.<module> argv``, the scratch folder as
    SCRATCH and the data file as mnist10k.npz (no machine's paths)."""
    shown = ["SCRATCH" if i and argv[i - 1] == "--workdir" else "mnist10k.npz" if i and argv[i - 1] == "--npz"
             else a for i, a in enumerate(argv)]
    return f"python -m benchmarks.{module} " + " ".join(map(shlex.quote, shown))

def write_text(path: Path, text: str) -> None:
    partial = path.with_suffix(path.suffix + ".tmp")
    partial.write_text(text)
    os.replace(partial, path)


# --------------------------------------------------------------------------- statistics


def interval(values: list[float]) -> tuple[float, float, float]:
    """Mean and the 95 % t-interval of the mean; NaN bounds from fewer than 2 values, and no mean from none."""
    found = paired(values)
    return found.mean, found.low, found.high


def fmt_interval(values: tuple[float, float, float], signed: bool = False) -> str:
    mean, low, high = values
    if math.isnan(mean):
        return "–"
    spec = "+.1f" if signed else ".1f"
    return f"{mean:{spec}}" if math.isnan(low) else f"{mean:{spec}} [{low:{spec}}, {high:{spec}}]"


def excludes_zero(values: tuple[float, float, float]) -> bool:
    """Whether a paired interval excludes 0 (a difference shown); never from fewer than 2 pairs or a zero width."""
    mean, low, high = values
    return not math.isnan(low) and high > low and (low > 0 or high < 0)
