"""A sweep's grid: axes and seeds (``-S`` / ``--seeds``) or a YAML file into jobs, each job's ``-S`` overrides, and
the whole grid (and its targets, its upstream stage) checked against the params schema and dvc.yaml."""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from debias.core.trees import flatten

SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
# A sweep's name is a folder (sweeps/<name>/) and the prefix of git refs: one path component that starts with a
# letter or digit, so '.', '..' and names git or a shell would read as options are refused.
SWEEP_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")

# The longest sweep or experiment name, in bytes: each is one file name (sweeps/<name>/, an experiment's git ref
# refs/exps/.../<name> and its clone folder), and Linux file systems (ext4, xfs, btrfs) allow 255 bytes.
MAX_NAME = 255

# Experiments a sweep may have unless --max-points raises it (ours): over six times the largest grid the project
# runs (the quality benchmark's on a cluster: 156 experiments, docs/cluster.md). Each point is a DVC experiment of
# its own (a queue entry, a git ref, an MLflow run tree), so a grid past this is most often a range typed for a
# list (-S 'seed=range(0,1000000)'), which would validate and queue for hours before the first stage ran.
MAX_POINTS = 1000


class SweepError(ValueError):
    """A sweep that cannot run as asked (bad grid, unknown stage, dirty tree, unknown sweep); nothing was launched."""


@dataclass
class Job:
    """One DVC experiment of a sweep: its name, ``-S`` overrides (dotted key -> value) and target stages."""

    name: str
    overrides: dict[str, Any]
    targets: list[str] = field(default_factory=list)


def _plain(value: Any) -> Any:
    """A parsed Hydra value with its quoted strings as ``str`` (lists and dicts walked)."""
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return getattr(value, "text", value)  # hydra's QuotedString


def _shown(name: str) -> str:
    """``name`` quoted, cut to its first 40 characters."""
    return repr(name) if len(name) <= 40 else repr(name[:40])[:-1] + "…'"


def check_name(name: str) -> str:
    """``name`` when it is a safe sweep name (:data:`SWEEP_NAME`, no '..', at most :data:`MAX_NAME` bytes), else a
    SweepError saying what is allowed."""
    if not SWEEP_NAME.fullmatch(name) or ".." in name:
        raise SweepError(f"sweep name {name!r}: it names the folder sweeps/<name>/ and prefixes the experiments' "
                         "names; allowed: letters, digits, '.', '_' and '-', starting with a letter or digit, "
                         "without '..'")
    if len(name.encode()) > MAX_NAME:
        raise SweepError(f"sweep name {_shown(name)} is {len(name.encode())} characters; allowed: at most {MAX_NAME} "
                         "(it names the folder sweeps/<name>/ and prefixes the experiments' names, each a file name); "
                         "nothing was written")
    return name


def check_job_names(jobs: list[Job]) -> None:
    """Raise a SweepError naming the experiments whose names are longer than a file name (:data:`MAX_NAME` bytes:
    each is a git ref and a folder)."""
    long = [job.name for job in jobs if len(job.name.encode()) > MAX_NAME]
    if long:
        raise SweepError(f"experiment name {_shown(long[0])} is {len(long[0].encode())} characters; allowed: at most "
                         f"{MAX_NAME} (each is a git ref and a folder); {len(long)} of {len(jobs)} are longer: give a "
                         "shorter --name, or name the experiments in a --file (experiments: [{name, set}])")


def too_many(points: int | str, limit: int, what: str) -> SweepError:
    return SweepError(f"{what} has {points} points, more than --max-points = {limit} (each point is one DVC "
                      "experiment); nothing was validated or queued: give fewer values (a range meant as a list?) "
                      "or raise --max-points if you mean it")


def range_length(override: Any) -> int | None:
    """The number of values of a ``range(...)`` sweep (None for other sweeps)."""
    from hydra.core.override_parser.types import RangeSweep

    sweep = override.value()
    if not isinstance(sweep, RangeSweep) or sweep.start is None or sweep.stop is None or not sweep.step:
        return None
    return max(0, math.ceil((sweep.stop - sweep.start) / sweep.step))


def parse_axis(item: str, max_points: int = MAX_POINTS) -> tuple[str, list[Any]]:
    """``'loss.epsilon=0,0.25'`` -> ``('loss.epsilon', [0, 0.25])`` (one value: a fixed override), by the grammar
    ``dvc exp run -S`` uses (Hydra's override parser: sweeps, quoted commas, lists). An axis of more than
    ``max_points`` values is refused before its values are listed."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    usage = f"-S {item!r}: expected KEY=VALUE[,VALUE...], e.g. -S 'loss.epsilon=0,0.25'"
    try:
        override = OverridesParser.create().parse_override(item)
    except Exception as exc:  # hydra's OverrideParseException
        raise SweepError(f"{usage} ({exc})") from None
    if override.type is not OverrideType.CHANGE or not override.key_or_group or not item.partition("=")[2].strip():
        raise SweepError(f"{usage}; no +key or ~key in a sweep")
    if not override.is_sweep_override():
        return override.key_or_group, [_plain(override.value())]
    values = list(itertools.islice(override.sweep_iterator(), max_points + 1))
    if len(values) > max_points:
        raise too_many(range_length(override) or f"more than {max_points}", max_points, f"-S {item!r} alone")
    return override.key_or_group, [_plain(v) for v in values]


def nested(base: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """``base`` (a copy) with each dotted key of ``overrides`` set (missing sections are created)."""
    out = copy.deepcopy(base)
    for key, value in overrides.items():
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[leaf] = copy.deepcopy(value)
    return out


def value_label(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, separators=(",", ""))
    return SAFE_NAME.sub("_", str(text)).strip("._-") or "x"


def point_name(prefix: str, point: dict[str, Any]) -> str:
    """``<prefix>-<leaf><value>...``, e.g. ``eps-epsilon0.25-seed1`` (characters git refuses in a ref name become _)."""
    parts = [f"{key.rsplit('.', 1)[-1]}{value_label(value)}" for key, value in point.items()]
    return "-".join([SAFE_NAME.sub("_", prefix).strip("._-") or "sweep", *parts]).replace("..", ".")


def grid(name: str, axes: dict[str, list[Any]], seeds: list[int] | None = None, fixed: dict[str, Any] | None = None,
         targets: list[str] | None = None, max_points: int = MAX_POINTS) -> list[Job]:
    """Every combination of the ``axes`` values (then the ``seeds``, innermost) as a :class:`Job`; ``fixed``
    overrides go into every job. Names are :func:`point_name`'s, made unique with an index where two coincide.
    More than ``max_points`` combinations are refused (counted, not listed)."""
    axes = dict(axes)
    if seeds:
        if "seed" in axes:
            raise SweepError("give the seeds once: either --seeds or -S seed=...")
        axes["seed"] = list(seeds)
    keys = list(axes)
    points = math.prod(len(axes[k]) for k in keys)
    if points > max_points:
        shape = " x ".join(f"{len(axes[k])} {k}" for k in keys)
        raise too_many(points, max_points, f"the grid ({shape})")
    jobs = []
    for values in itertools.product(*(axes[k] for k in keys)) if keys else [()]:
        point = dict(zip(keys, values))
        jobs.append(Job(point_name(name, point), {**(fixed or {}), **point}, list(targets or [])))
    names = [job.name for job in jobs]
    if len(set(names)) < len(names):
        for index, job in enumerate(jobs):
            job.name = f"{SAFE_NAME.sub('_', name)}-{index}"
    return jobs


def jobs_from_file(path: Path, default_name: str, max_points: int = MAX_POINTS) -> tuple[str, list[Job], str | None]:
    """A sweep file: ``name``, ``params`` (dotted key -> list of values), ``seeds``, ``set`` (fixed overrides),
    ``targets``, ``upstream``; or ``experiments`` (a list of ``{name, set, targets}``) instead of a grid.
    Returns (name, jobs, upstream stage)."""
    try:
        spec = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise SweepError(f"--file {path}: cannot read it ({exc})") from None
    known = {"name", "params", "seeds", "set", "targets", "upstream", "experiments"}
    if not isinstance(spec, dict) or set(spec) - known:
        raise SweepError(f"--file {path}: expected a mapping with keys among {sorted(known)}, got "
                         f"{sorted(set(spec) - known) if isinstance(spec, dict) else type(spec).__name__}")
    name = str(spec.get("name") or default_name)
    fixed = flatten(spec.get("set") or {})
    targets = list(spec.get("targets") or [])
    if spec.get("experiments"):
        jobs = [Job(str(e["name"]), {**fixed, **flatten(e.get("set") or {})}, list(e.get("targets") or targets))
                for e in spec["experiments"]]
    else:
        axes = {k: (v if isinstance(v, list) else [v]) for k, v in flatten(spec.get("params") or {}).items()}
        jobs = grid(name, axes, spec.get("seeds"), fixed, targets, max_points)
    return name, jobs, spec.get("upstream")


def set_args(overrides: dict[str, Any]) -> list[str]:
    """``-S key=value`` arguments for ``dvc exp run`` (values in YAML flow style, each on one line: DVC's -S parser
    rejects a wrapped value)."""
    args = []
    for key, value in overrides.items():
        text = yaml.safe_dump(value, default_flow_style=True, width=float("inf")).strip()
        text = text.removesuffix("\n...").removesuffix("...").strip()
        args += ["-S", f"{key}={text}"]
    return args


# --------------------------------------------------------------------------- checks before launching


def stage_graph(dvc_yaml: Path) -> dict[str, dict[str, Any]]:
    """Stage name -> ``{"deps": [...], "outs": [...], "params": [...]}`` of a dvc.yaml (paths and param keys)."""
    stages = (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages") or {}

    def names(entries: list[Any]) -> list[str]:
        found = []
        for entry in entries or []:
            if isinstance(entry, dict):
                for key, value in entry.items():  # {path: options} or {params file: [keys]}
                    found += [str(k) for k in value] if isinstance(value, list) else [str(key)]
            else:
                found.append(str(entry))
        return found

    return {name: {"deps": names(s.get("deps")), "outs": names(s.get("outs")), "params": names(s.get("params"))}
            for name, s in stages.items()}


def ancestors(graph: dict[str, dict[str, Any]], stage: str) -> list[str]:
    """``stage`` and every stage whose outputs it depends on, directly or not (a dep inside an out counts)."""

    def feeds(dep: str, out: str) -> bool:
        return dep == out or dep.startswith(out.rstrip("/") + "/") or out.startswith(dep.rstrip("/") + "/")

    found, todo = [], [stage]
    while todo:
        current = todo.pop()
        if current in found:
            continue
        found.append(current)
        todo += [name for name, s in graph.items()
                 if any(feeds(d, o) for d in graph[current]["deps"] for o in s["outs"])]
    return found


def upstream_key(params: dict[str, Any], prefixes: list[str]) -> str:
    """The values of the params the upstream stages read (dotted prefixes), as canonical JSON."""
    flat = flatten(params)
    chosen = {k: v for k, v in flat.items() if any(k == p or k.startswith(p + ".") for p in prefixes)}
    return json.dumps(chosen, sort_keys=True, default=str)


def check_grid(root: Path, jobs: list[Job], upstream: str | None = None,
               base: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Every job's params (``base``, default params.yaml, with its overrides) checked against the schema and its
    targets against dvc.yaml, all before any launch; returns the merged params of each job. Raises
    :class:`SweepError` listing every problem."""
    from debias.params import ParamsError, read_yaml
    from debias.schema import validate

    if not jobs:
        raise SweepError("the grid is empty: give -S KEY=V1,V2 (and --seeds) or --file")
    graph = stage_graph(root / "dvc.yaml")
    problems = []
    names = [job.name for job in jobs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"experiment names given twice: {', '.join(duplicates)}")
    seen: dict[str, str] = {}
    for job in jobs:  # -S lr=0.001,0.001 or --seeds 0 0: the same experiment twice
        same = seen.setdefault(json.dumps(job.overrides, sort_keys=True, default=str), job.name)
        if same != job.name:
            shown = ", ".join(f"{k}={v}" for k, v in job.overrides.items())
            problems.append(f"experiments {same} and {job.name} have the same params ({shown}): give each value once")
    for stage in [*(t for job in jobs for t in job.targets), *([upstream] if upstream else [])]:
        if stage not in graph:
            problems.append(f"stage {stage!r} is not in dvc.yaml; stages: {', '.join(graph)}")
    base = (read_yaml(root / "params.yaml") or {}) if base is None else base
    merged = []
    for job in jobs:
        params = nested(base, job.overrides)
        try:
            validate(params)
        except ParamsError as exc:
            problems.append(f"{job.name}: {str(exc).replace('invalid params.yaml:', 'invalid params:')}")
        merged.append(params)
    if problems:
        raise SweepError("the sweep was not launched; fix these first:\n  - " + "\n  - ".join(dict.fromkeys(problems)))
    return merged


def unread_in_grid(jobs: list[Job], merged: list[dict[str, Any]]) -> list[str]:
    """``unread-param: KEY = VALUE: ...`` for each ``-S`` key of the grid that an experiment does not read (each message
    once): said before anything runs, as ``debias check-params`` says it."""
    from debias.schema import validate
    from debias.schema.applicability import RunContext, unread_warnings

    found: list[str] = []
    for job, params in zip(jobs, merged):
        found += unread_warnings(RunContext(validate(params)), job.overrides)
    return list(dict.fromkeys(found))


def upstream_runs(root: Path, jobs: list[Job], merged: list[dict[str, Any]], upstream: str | None) -> list[dict]:
    """One phase-1 run per distinct value of the params ``upstream`` and its ancestors read: ``{key, overrides}``
    (the overrides of the first job with that value)."""
    if not upstream:
        return []
    graph = stage_graph(root / "dvc.yaml")
    prefixes = sorted({p for stage in ancestors(graph, upstream) for p in graph[stage]["params"]})
    found: dict[str, dict] = {}
    for job, params in zip(jobs, merged):
        key = upstream_key(params, prefixes)
        found.setdefault(key, {"key": key, "overrides": job.overrides, "name": f"upstream-{len(found)}"})
    return list(found.values())


def plan_from_args(args: argparse.Namespace, root: Path) -> tuple[str, list[Job], str | None]:
    """The sweep's name, jobs and upstream stage from ``--file`` and/or ``-S`` / ``--seeds`` / ``--targets``."""
    limit = MAX_POINTS if getattr(args, "max_points", None) is None else args.max_points
    if limit < 1:
        raise SweepError(f"--max-points = {limit}; allowed: a whole number >= 1")
    name, jobs, upstream = args.name or "sweep", [], args.upstream
    if args.name:
        check_name(args.name)  # before anything is read: the name is a folder
    if args.file:
        name, jobs, from_file = jobs_from_file(Path(args.file), args.name or Path(args.file).stem, limit)
        name = args.name or name
        upstream = upstream or from_file
    if args.set or args.seeds or not jobs:
        axes, fixed = {}, {}
        for item in args.set:
            key, values = parse_axis(item, limit)
            if len(values) > 1:
                axes[key] = values
            else:
                fixed[key] = values[0]
        if jobs:  # a file's jobs, with -S values over every one of them
            if axes or args.seeds:
                raise SweepError("with --file, -S sets one value for every experiment; put grids in the file")
            jobs = [Job(j.name, {**j.overrides, **fixed}, j.targets) for j in jobs]
        else:
            jobs = grid(name, axes, parse_seeds(args.seeds) if args.seeds else None, fixed, args.targets, limit)
    if args.targets:
        jobs = [Job(j.name, j.overrides, list(args.targets)) for j in jobs]
    check_name(name)
    if len(jobs) > limit:  # a file's list of experiments
        raise too_many(len(jobs), limit, "the sweep")
    check_job_names(jobs)
    return name, jobs, upstream

SEEDS_ITEM = re.compile(r"(\d+)(?:-(\d+))?")


def parse_seeds(items: list[str]) -> list[int]:
    """``['0', '1', '5-9']`` -> ``[0, 1, 5, 6, 7, 8, 9]`` (ranges inclusive, order kept, each seed once); a
    SweepError names an item that is neither."""
    seeds: list[int] = []
    for item in items:
        for part in str(item).split(","):
            match = SEEDS_ITEM.fullmatch(part.strip())
            if not match or (match.group(2) and int(match.group(2)) < int(match.group(1))):
                raise SweepError(f"--seeds {item!r}: expected whole numbers >= 0 or ranges FIRST-LAST, e.g. "
                                 "--seeds 0 1 2 or --seeds 0-9")
            first, last = int(match.group(1)), int(match.group(2) or match.group(1))
            seeds += [s for s in range(first, last + 1) if s not in seeds]
    return seeds
