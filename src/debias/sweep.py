"""``debias sweep``: a grid of DVC experiments (params x values x seeds) run on the DVC queue or a SLURM job array.

Every grid point is one ordinary DVC experiment (``dvc exp run -n NAME -S key=value ... [targets]``), so
``dvc exp show`` and ``debias compare`` read a sweep like any other experiments. Two launchers:

- ``local``: DVC's own queue (``dvc exp run --queue`` then ``dvc queue start -j N``) on this machine.
- ``slurm``: a job array through submitit; each array task clones the repository at the sweep's commit into
  ``sweeps/<name>/work/<experiment>``, pulls DVC's run-cache from the DVC remote (``dvc pull --run-cache``),
  runs ``dvc exp run``, pushes the run-cache (``dvc push --run-cache``) and the experiment (``dvc exp push
  origin``: its git ref to this repository, its outputs to the remote), and removes its clone.

Shared upstream stages run once: with ``--upstream STAGE`` each distinct value of the params that STAGE and its
ancestors read (``params:`` in dvc.yaml) is first computed by one ``dvc repro STAGE`` in a clone (phase 1; SLURM:
a first array that the experiments' array depends on with ``afterok``), whose run-cache the experiments then
restore instead of recomputing (local: the clone uses this repository's cache; SLURM: through the DVC remote).
Its MLflow runs go to the experiment ``<mlflow experiment>-upstream``.

The whole grid is validated against the params schema (and the targets against dvc.yaml) before anything is
queued or submitted. The plan and the SLURM job ids are kept in ``sweeps/<name>/sweep.json``: ``--status`` shows
each experiment queued / running / done / failed with its log, ``--resume`` reruns what is neither done nor
queued nor running (an experiment is done when its DVC experiment exists at the sweep's baseline commit).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

SWEEPS = "sweeps"  # <repository>/sweeps/<name>/: sweep.json, logs/, work/ (git-ignored)
STATES = ("queued", "running", "done", "failed")
# ``dvc queue status`` -> sweep state; a requeued name lists several entries: the first of STATUS_PRIORITY wins.
STATUS_PRIORITY = ("Running", "Queued", "Success", "Failed")
QUEUE_STATES = {"Running": "running", "Queued": "queued", "Success": "done", "Failed": "failed"}
# ``squeue`` job states (man squeue, JOB STATE CODES) -> sweep state; anything else still listed counts as running.
SLURM_QUEUED = ("PENDING", "CONFIGURING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SUSPENDED")
LAUNCHERS = ("local", "slurm")
SAFE_NAME = re.compile(r"[^A-Za-z0-9_.-]+")
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


class SweepError(ValueError):
    """A sweep that cannot run as asked (bad grid, unknown stage, dirty tree, unknown sweep); nothing was launched."""


@dataclass
class Job:
    """One DVC experiment of a sweep: its name, ``-S`` overrides (dotted key -> value) and target stages."""

    name: str
    overrides: dict[str, Any]
    targets: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------- the grid


def parse_value(text: str) -> Any:
    """A ``-S`` value as DVC reads params.yaml (YAML 1.2: ``1e-3`` is a number, ``yes`` a string)."""
    from ruamel.yaml import YAML

    return YAML(typ="safe", pure=True).load(text) if text.strip() else ""


def split_values(text: str) -> list[str]:
    """``'0,0.25,[1, 2]'`` -> ``['0', '0.25', '[1, 2]']``: commas split values outside brackets and quotes."""
    parts, depth, quote, current = [], 0, "", []
    for char in text:
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return [p.strip() for p in parts]


def parse_axis(item: str) -> tuple[str, list[Any]]:
    """``'loss.epsilon=0,0.25'`` -> ``('loss.epsilon', [0, 0.25])`` (one value: a fixed override)."""
    key, sep, values = item.partition("=")
    key = key.strip()
    if not sep or not key or not values.strip():
        raise SweepError(f"-S {item!r}: expected KEY=VALUE[,VALUE...], e.g. -S 'loss.epsilon=0,0.25'")
    return key, [parse_value(v) for v in split_values(values)]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}`` (lists are leaves)."""
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


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
         targets: list[str] | None = None) -> list[Job]:
    """Every combination of the ``axes`` values (then the ``seeds``, innermost) as a :class:`Job`; ``fixed``
    overrides go into every job. Names are :func:`point_name`'s, made unique with an index where two coincide."""
    axes = dict(axes)
    if seeds:
        if "seed" in axes:
            raise SweepError("give the seeds once: either --seeds or -S seed=...")
        axes["seed"] = list(seeds)
    keys = list(axes)
    jobs = []
    for values in itertools.product(*(axes[k] for k in keys)) if keys else [()]:
        point = dict(zip(keys, values))
        jobs.append(Job(point_name(name, point), {**(fixed or {}), **point}, list(targets or [])))
    names = [job.name for job in jobs]
    if len(set(names)) < len(names):
        for index, job in enumerate(jobs):
            job.name = f"{SAFE_NAME.sub('_', name)}-{index}"
    return jobs


def jobs_from_file(path: Path, default_name: str) -> tuple[str, list[Job], str | None]:
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
        jobs = grid(name, axes, spec.get("seeds"), fixed, targets)
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


def check_grid(root: Path, jobs: list[Job], upstream: str | None = None) -> list[dict[str, Any]]:
    """Every job's params (params.yaml with its overrides) checked against the schema and its targets against
    dvc.yaml, all before any launch; returns the merged params of each job. Raises :class:`SweepError` listing
    every problem."""
    from debias.params import ParamsError, read_yaml, validate

    if not jobs:
        raise SweepError("the grid is empty: give -S KEY=V1,V2 (and --seeds) or --file")
    graph = stage_graph(root / "dvc.yaml")
    problems = []
    names = [job.name for job in jobs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        problems.append(f"experiment names given twice: {', '.join(duplicates)}")
    for stage in [*(t for job in jobs for t in job.targets), *([upstream] if upstream else [])]:
        if stage not in graph:
            problems.append(f"stage {stage!r} is not in dvc.yaml; stages: {', '.join(graph)}")
    base = read_yaml(root / "params.yaml") or {}
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


# --------------------------------------------------------------------------- commands and state


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    """``args`` run in ``cwd``; stdout (a failure with ``check`` raises, with its output)."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def task_env(threads: int, tracking_uri: str | None, experiment: str | None, src: Path | None = None) -> dict[str, str]:
    """The environment of every stage a sweep runs: machine settings only (never params), the tracking server,
    and ``PYTHONPATH`` with ``src`` first so the stages run the commit being swept."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_TRACKING", "SLURM_JOB",
                                                                     "SLURM_ARRAY", "SLURM_TASK", "SLURM_STEP"))}
    if src is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [env.get("PYTHONPATH")])])
    env.update(DEBIAS_THREADS=str(threads), DEBIAS_TRACKING=env.get("DEBIAS_TRACKING", "required"),
               MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", OMP_WAIT_POLICY="PASSIVE",
               DEBIAS_DEVICE=env.get("DEBIAS_DEVICE", "cpu"),
               NUMBA_CACHE_DIR=env.get("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "debias" / "numba")),
               GIT_AUTHOR_NAME=env.get("GIT_AUTHOR_NAME", "debias-sweep"),
               GIT_AUTHOR_EMAIL=env.get("GIT_AUTHOR_EMAIL", "sweep@debias.invalid"),
               GIT_COMMITTER_NAME=env.get("GIT_COMMITTER_NAME", "debias-sweep"),
               GIT_COMMITTER_EMAIL=env.get("GIT_COMMITTER_EMAIL", "sweep@debias.invalid"))
    if tracking_uri:
        env["MLFLOW_TRACKING_URI"] = tracking_uri
    if experiment:
        env["MLFLOW_EXPERIMENT_NAME"] = experiment
    return env


def sweep_dir(root: Path, name: str) -> Path:
    return root / SWEEPS / name


def save_state(root: Path, state: dict[str, Any]) -> Path:
    path = sweep_dir(root, state["name"]) / "sweep.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    tmp.replace(path)
    return path


def load_state(root: Path, name: str) -> dict[str, Any]:
    path = sweep_dir(root, name) / "sweep.json"
    if not path.is_file():
        known = sorted(p.parent.name for p in (root / SWEEPS).glob("*/sweep.json"))
        raise SweepError(f"no sweep named {name!r} in {root / SWEEPS}; known: {', '.join(known) or 'none'}")
    return json.loads(path.read_text())


def finished_experiments(root: Path, baseline: str) -> set[str]:
    """Names of the DVC experiments of ``baseline`` (``refs/exps/<2>/<38>/<name>``: only successful runs make one)."""
    refs = run(["git", "for-each-ref", "--format=%(refname)", f"refs/exps/{baseline[:2]}/{baseline[2:]}/"], root,
               check=False)
    return {line.rsplit("/", 1)[-1] for line in refs.splitlines() if line.strip()}


def dirty_files(root: Path) -> list[str]:
    """Tracked files with uncommitted changes (what a clone of HEAD would not see)."""
    return [line[3:] for line in run(["git", "status", "--porcelain", "--untracked-files=no"], root).splitlines()
            if line.strip()]


def clone_at(root: Path, commit: str, target: Path) -> None:
    """A fresh git clone of ``root`` at ``commit`` in ``target`` (a previous one there is removed)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "clone", "-q", "--no-checkout", "--no-hardlinks", str(root), str(target)], target.parent)
    run(["git", "checkout", "-q", commit], target)
    for setting in (["core.analytics", "false"], ["core.check_update", "false"]):
        run(["dvc", "config", "--local", *setting], target)


# --------------------------------------------------------------------------- phase 1: shared upstream stages


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


def with_src(env: dict[str, str], clone: Path) -> dict[str, str]:
    """``env`` with the clone's ``src`` first on ``PYTHONPATH``: the stages run the swept commit's code, not an
    editable install's (whose tree may change while the sweep runs)."""
    return {**env, "PYTHONPATH": os.pathsep.join([str(clone / "src"), *filter(None, [env.get("PYTHONPATH")])])}


def compute_upstream(spec: dict[str, Any]) -> str:
    """Phase 1 in a clone: params.yaml with the overrides (as ``dvc exp run -S`` writes them), ``dvc repro
    STAGE``, then the run-cache shared (``cache_dir``: this clone uses that cache; ``remote``: pushed there)."""
    from dvc.utils.hydra import apply_overrides

    clone = Path(spec["clone"])
    clone_at(Path(spec["root"]), spec["commit"], clone)
    env = with_src(spec["env"], clone)
    if spec.get("cache_dir"):
        run(["dvc", "cache", "dir", "--local", spec["cache_dir"]], clone)
    if spec.get("remote"):
        run(["dvc", "remote", "add", "--local", "-f", "-d", "sweep", spec["remote"]], clone)
        run(["dvc", "pull", "--run-cache", "--allow-missing"], clone, env, check=False)
    apply_overrides(clone / "params.yaml", [a for a in set_args(spec["overrides"]) if a != "-S"])
    pull = ["--pull"] if spec.get("remote") else []  # restore from the run-cache with outputs from the remote
    out = run(["dvc", "repro", *pull, spec["stage"]], clone, env)
    if spec.get("remote"):
        print(out, flush=True)  # into the SLURM task's log
    if spec.get("remote"):
        run(["dvc", "push", "--run-cache"], clone, env)
    shutil.rmtree(clone, ignore_errors=True)
    return out[-2000:]


def run_experiment(spec: dict[str, Any]) -> str:
    """One experiment in its own clone (a SLURM array task): pull the run-cache, ``dvc exp run``, push the
    run-cache and the experiment (git ref to the repository, outputs to the DVC remote), remove the clone."""
    clone, root = Path(spec["clone"]), Path(spec["root"])
    clone_at(root, spec["commit"], clone)
    env = with_src(spec["env"], clone)
    run(["dvc", "remote", "add", "--local", "-f", "-d", "sweep", spec["remote"]], clone)
    run(["dvc", "pull", "--run-cache", "--allow-missing"], clone, env, check=False)
    # --pull: a stage found in the run-cache is restored with its outputs fetched from the remote
    out = run(["dvc", "exp", "run", "--pull", "-n", spec["name"], *set_args(spec["overrides"]), *spec["targets"]], clone, env)
    print(out, flush=True)  # into the task's log
    run(["dvc", "push", "--run-cache"], clone, env)
    run(["dvc", "exp", "push", "origin", spec["name"]], clone, env)
    shutil.rmtree(clone, ignore_errors=True)
    return out[-2000:]


# --------------------------------------------------------------------------- the local launcher (DVC's queue)


def parse_queue_status(text: str) -> dict[str, str]:
    """Experiment name -> DVC status (Queued, Running, Success, Failed) from ``dvc queue status``'s text
    (columns: task, name, created..., status); several entries of one name: the first of STATUS_PRIORITY."""
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        words = line.split()
        found = [status for status in STATUS_PRIORITY if status in words[2:]]
        if found:
            current = statuses.get(words[1])
            if current is None or STATUS_PRIORITY.index(found[0]) < STATUS_PRIORITY.index(current):
                statuses[words[1]] = found[0]
    return statuses


def queue_text(root: Path, attempts: int = 3) -> str:
    """``dvc queue status``'s text; it fails now and then while workers write the queue (retried: a queue that
    cannot be read raises rather than reporting every experiment failed)."""
    for attempt in range(attempts):
        done = subprocess.run(["dvc", "queue", "status"], cwd=root, capture_output=True, text=True)
        if done.returncode == 0:
            return done.stdout
        time.sleep(2 * (attempt + 1))
    raise RuntimeError(f"dvc queue status failed {attempts} times in {root}: {done.stderr.strip()[-500:]}")


def start_workers(root: Path, workers: int, env: dict[str, str]) -> bool:
    """``dvc queue start -j N``: tops the queue up to N workers (running ones are kept; idle ones exit). A failure
    (seen once: exit 255 while 2 workers ran, the next call fine) is reported and retried at the next poll."""
    # The workers outlive the command and inherit its stdout: no pipe, or waiting on it waits for them.
    done = subprocess.run(["dvc", "queue", "start", "-j", str(workers)], cwd=root, env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if done.returncode != 0:
        print(f"[sweep] dvc queue start -j {workers} exited {done.returncode}; retried at the next poll",
              file=sys.stderr, flush=True)
    return done.returncode == 0


def queue_status(root: Path) -> dict[str, str]:
    return parse_queue_status(queue_text(root))


def queue_log(root: Path, name: str, text: str) -> str:
    """Where DVC keeps a queued experiment's output (``.dvc/tmp/exps/run/<task>/<task>.out``; ``text``: ``dvc queue
    status``'s), else the command that prints it."""
    for line in text.splitlines():
        words = line.split()
        if len(words) > 1 and words[1] == name:
            found = list((root / ".dvc" / "tmp" / "exps" / "run").glob(f"{words[0]}*/*.out"))
            if found:
                return str(found[0])
    return f"dvc queue logs {name}"


def run_local(root: Path, jobs: list[Job], workers: int, env: dict[str, str], deadline: float = float("inf"),
              poll_s: float = 10.0, log: str = "sweep") -> list[str]:
    """Queue ``jobs`` (in order) that are not done, queued or running, run them on ``workers`` DVC queue workers
    and wait. Workers start after the first ``workers`` experiments are queued, so queueing overlaps running.
    At ``deadline`` (a ``time.time()``) the queue is stopped and unfinished experiments are left out. Returns
    the names that did not succeed (failed ones are printed with the end of their log)."""
    present = queue_status(root)
    done = finished_experiments(root, run(["git", "rev-parse", "HEAD"], root).strip())
    todo = [job for job in jobs if job.name not in done and present.get(job.name) not in ("Success", "Queued", "Running")]
    started = time.time()
    for count, job in enumerate(todo, 1):
        run(["dvc", "exp", "run", "--queue", "-n", job.name, *set_args(job.overrides), *job.targets], root, env)
        if count % workers == 0:
            start_workers(root, workers, env)
        if time.time() > deadline:
            break
    start_workers(root, workers, env)
    names = {job.name for job in jobs}
    reported = -1
    while True:
        statuses = {**queue_status(root), **{name: "Success" for name in done}}
        finished = [n for n in names if statuses.get(n) in ("Success", "Failed")]
        if len(finished) != reported:
            reported = len(finished)
            print(f"[{log}] {reported}/{len(names)} experiments done after {time.time() - started:.0f} s", flush=True)
        if len(finished) == len(names) or time.time() > deadline:
            break
        if not any(statuses.get(n) in ("Queued", "Running") for n in names):
            break  # nothing left to run (e.g. experiments not queued before the deadline)
        start_workers(root, workers, env)  # idle workers exit while queueing is slower than running
        time.sleep(poll_s)
    if len(finished) < len(names):
        print(f"[{log}] stopping the queue with {len(names) - len(finished)} experiments unfinished", flush=True)
        run(["dvc", "queue", "remove", "--queued"], root, check=False)
        run(["dvc", "queue", "kill", *[n for n in names if statuses.get(n) == "Running"]], root, check=False)
    for name in sorted(n for n in names if statuses.get(n) == "Failed"):
        print(f"[{log}] experiment {name} FAILED:\n{run(['dvc', 'queue', 'logs', name], root, check=False)[-3000:]}",
              file=sys.stderr)
    return sorted(n for n in names if statuses.get(n) != "Success")


def local_states(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    done = finished_experiments(root, state["commit"])
    text = queue_text(root)
    queued = parse_queue_status(text)
    states = {}
    for job in state["jobs"]:
        name = job["name"]
        status = "done" if name in done else QUEUE_STATES.get(queued.get(name, ""), "failed")
        if name not in done and name not in queued:
            status = "failed" if state.get("launched") else "queued"
        states[name] = (status, queue_log(root, name, text) if status in ("failed", "running") else "")
    return states


# --------------------------------------------------------------------------- the SLURM launcher (submitit)


def squeue_states(job_ids: list[str]) -> dict[str, str]:
    """SLURM job id (``123_4`` for an array task) -> squeue state, for the jobs still known to squeue."""
    arrays = sorted({j.split("_")[0] for j in job_ids})
    if not arrays:
        return {}
    done = subprocess.run(["squeue", "-h", "-r", "-o", "%i|%T", "-j", ",".join(arrays)], capture_output=True,
                          text=True)
    found = {}
    for line in done.stdout.splitlines():
        job_id, _, status = line.strip().partition("|")
        found[job_id] = status
    return found


def result_of(result_pickle: str) -> str | None:
    """"success" or "error: <last line>" from a submitit result pickle; None when there is none (never ran or
    killed: cancelled, pre-empted, out of time)."""
    path = Path(result_pickle)
    if not path.is_file():
        return None
    import pickle

    try:
        outcome, value = pickle.loads(path.read_bytes())
    except Exception as exc:  # a half-written pickle: the task was killed while writing it
        return f"error: unreadable result ({exc})"
    if outcome == "success":
        return "success"
    lines = [line for line in str(value).splitlines() if line.strip()]
    raised = [line for line in lines if EXCEPTION_LINE.match(line)]  # the traceback's "SomeError: message"
    return f"error: {(raised or lines or [outcome])[-1][:300]}"


def slurm_executor(folder: Path, options: dict[str, Any], name: str, dependency: str | None = None) -> Any:
    import submitit

    executor = submitit.AutoExecutor(folder=folder / "%j", cluster="slurm")
    parameters: dict[str, Any] = dict(name=name, timeout_min=options["time"], cpus_per_task=options["cpus_per_task"],
                                      slurm_array_parallelism=options["array_parallelism"], nodes=1, tasks_per_node=1,
                                      slurm_additional_parameters={"kill-on-invalid-dep": "yes"})
    if options.get("partition"):
        parameters["slurm_partition"] = options["partition"]
    if options.get("gpus"):
        parameters["gpus_per_node"] = options["gpus"]
    if options.get("mem_gb"):
        parameters["mem_gb"] = options["mem_gb"]
    else:
        parameters["slurm_mem"] = None  # submitit's default memory request is the scheduler's default
    if dependency:
        parameters["slurm_dependency"] = dependency
    executor.update_parameters(**parameters)
    return executor


def upstream_experiment(env: dict[str, str]) -> str:
    """The MLflow experiment of phase 1's runs: ``<the sweep's experiment>-upstream``."""
    from debias.tracking import DEFAULT_EXPERIMENT

    return f"{env.get('MLFLOW_EXPERIMENT_NAME') or DEFAULT_EXPERIMENT}-upstream"


def launch_slurm(root: Path, state: dict[str, Any], todo: list[Job], env: dict[str, str],
                 phase1: list[dict[str, Any]]) -> None:
    """Submit phase 1 (one array task per upstream value not yet computed) and the experiments' array (depending
    on phase 1 with ``afterok``); job ids and log paths go into the state."""
    options, here = state["options"], sweep_dir(root, state["name"])
    logs = here / "logs"
    common = {"root": str(root), "commit": state["commit"], "remote": options["dvc_remote"]}
    dependency = None
    upstream_env = {**env, "MLFLOW_EXPERIMENT_NAME": upstream_experiment(env)}
    pending = [u for u in phase1 if state.setdefault("upstream", {}).get(u["name"], {}).get("result") != "success"]
    if pending:
        specs = [{**common, "clone": str(here / "work" / u["name"]), "overrides": u["overrides"],
                  "stage": state["upstream_stage"], "env": upstream_env} for u in pending]
        executor = slurm_executor(logs, options, f"{state['name']}-upstream")
        submitted = executor.map_array(compute_upstream, specs)
        for u, job in zip(pending, submitted):
            state["upstream"][u["name"]] = {"job_id": job.job_id, "log": str(job.paths.stdout),
                                            "result_pickle": str(job.paths.result_pickle)}
        dependency = "afterok:" + ":".join(sorted({j.job_id.split("_")[0] for j in submitted}))
    specs = [{**common, "clone": str(here / "work" / job.name), "name": job.name, "overrides": job.overrides,
              "targets": job.targets, "env": env} for job in todo]
    executor = slurm_executor(logs, options, state["name"], dependency)
    submitted = executor.map_array(run_experiment, specs)
    for job, handle in zip(todo, submitted):
        state.setdefault("slurm", {})[job.name] = {"job_id": handle.job_id, "log": str(handle.paths.stdout),
                                                   "result_pickle": str(handle.paths.result_pickle)}


def slurm_states(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    done = finished_experiments(root, state["commit"])
    submitted = state.get("slurm", {})
    listed = squeue_states([s["job_id"] for s in submitted.values()])
    states = {}
    for job in state["jobs"]:
        name, entry = job["name"], submitted.get(job["name"])
        if name in done:
            states[name] = ("done", entry["log"] if entry else "")
        elif entry is None:
            states[name] = ("failed", "never submitted")
        elif entry["job_id"] in listed:
            status = listed[entry["job_id"]]
            states[name] = ("queued" if status in SLURM_QUEUED else "running", entry["log"])
        else:
            outcome = result_of(entry["result_pickle"])
            why = outcome or "no result: cancelled, pre-empted, out of time or its upstream failed"
            states[name] = ("failed", f"{entry['log']} ({why})")
    return states


# --------------------------------------------------------------------------- the command


def statuses(root: Path, state: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """Experiment name -> (queued | running | done | failed, its log path or how to read it)."""
    return (slurm_states if state["launcher"] == "slurm" else local_states)(root, state)


def status_text(state: dict[str, Any], states: dict[str, tuple[str, str]]) -> str:
    counts = {s: sum(1 for v in states.values() if v[0] == s) for s in STATES}
    lines = [f"sweep {state['name']} ({state['launcher']}, commit {state['commit'][:7]}): "
             + ", ".join(f"{counts[s]} {s}" for s in STATES)]
    width = max(len(n) for n in states) if states else 0
    for name, (status, log) in states.items():
        lines.append(f"  {name:<{width}}  {status:<7}  {log}".rstrip())
    return "\n".join(lines)


def wait(root: Path, state: dict[str, Any], poll_s: float, timeout_s: float | None = None) -> dict[str, tuple[str, str]]:
    """Poll until no experiment is queued or running (or ``timeout_s``); progress printed when it changes."""
    started, reported = time.time(), None
    while True:
        states = statuses(root, state)
        counts = tuple(sum(1 for v in states.values() if v[0] == s) for s in STATES)
        if counts != reported:
            reported = counts
            print(f"[sweep] {time.time() - started:.0f} s: " + ", ".join(f"{c} {s}" for c, s in zip(counts, STATES)),
                  flush=True)
        if not counts[0] and not counts[1]:
            return states
        if timeout_s is not None and time.time() - started > timeout_s:
            return states
        time.sleep(poll_s)


def tracking_default() -> str | None:
    return os.environ.get("MLFLOW_TRACKING_URI") or None


def plan_from_args(args: argparse.Namespace, root: Path) -> tuple[str, list[Job], str | None]:
    """The sweep's name, jobs and upstream stage from ``--file`` and/or ``-S`` / ``--seeds`` / ``--targets``."""
    name, jobs, upstream = args.name or "sweep", [], args.upstream
    if args.file:
        name, jobs, from_file = jobs_from_file(Path(args.file), args.name or Path(args.file).stem)
        name = args.name or name
        upstream = upstream or from_file
    if args.set or args.seeds or not jobs:
        axes, fixed = {}, {}
        for item in args.set:
            key, values = parse_axis(item)
            if len(values) > 1:
                axes[key] = values
            else:
                fixed[key] = values[0]
        if jobs:  # a file's jobs, with -S values over every one of them
            if axes or args.seeds:
                raise SweepError("with --file, -S sets one value for every experiment; put grids in the file")
            jobs = [Job(j.name, {**j.overrides, **fixed}, j.targets) for j in jobs]
        else:
            jobs = grid(name, axes, args.seeds, fixed, args.targets)
    if args.targets:
        jobs = [Job(j.name, j.overrides, list(args.targets)) for j in jobs]
    if SAFE_NAME.search(name):
        raise SweepError(f"sweep name {name!r}: use letters, digits, '.', '_' and '-' only")
    return name, jobs, upstream


def launch(root: Path, args: argparse.Namespace) -> int:
    """Validate, save the plan, run phase 1 (local) or submit both phases (slurm); wait if asked."""
    name, jobs, upstream = plan_from_args(args, root)
    here = sweep_dir(root, name)
    if (here / "sweep.json").exists():
        raise SweepError(f"sweep {name!r} exists ({here / 'sweep.json'}): `debias sweep --name {name} --status` "
                         "shows it, `--resume` reruns what is not done; or choose another --name")
    merged = check_grid(root, jobs, upstream)
    if args.launcher == "slurm":
        if shutil.which("sbatch") is None:
            raise SweepError("--launcher slurm: sbatch is not on PATH (no SLURM client here)")
        if not (args.tracking_uri or tracking_default()) and os.environ.get("DEBIAS_TRACKING", "").lower() != "off":
            raise SweepError("--launcher slurm needs an MLflow server every node reaches (--tracking-uri or "
                             "MLFLOW_TRACKING_URI; `debias services up` starts one): each task's own store is "
                             "deleted with its clone. DEBIAS_TRACKING=off runs without tracking")
        if not args.dvc_remote:
            raise SweepError("--launcher slurm needs --dvc-remote PATH (a folder every node sees): the tasks share "
                             "DVC's run-cache and push their experiments' outputs there")
    dirty = dirty_files(root)
    if dirty:
        raise SweepError("commit these first (the experiments run the committed tree): " + ", ".join(dirty[:20]))
    commit = run(["git", "rev-parse", "HEAD"], root).strip()
    options = {k: getattr(args, k) for k in ("jobs", "partition", "time", "gpus", "cpus_per_task",
                                                 "array_parallelism", "mem_gb", "threads")}
    options.update(dvc_remote=str(Path(args.dvc_remote).resolve()) if args.dvc_remote else None,
                   tracking_uri=args.tracking_uri or tracking_default(), mlflow_experiment=args.mlflow_experiment)
    state = {"name": name, "launcher": args.launcher, "commit": commit, "upstream_stage": upstream,
             "jobs": [asdict(j) for j in jobs], "options": options, "created": time.time()}
    state["phase1"] = upstream_runs(root, jobs, merged, upstream)
    save_state(root, state)
    print(f"[sweep] {name}: {len(jobs)} experiments valid against the params schema"
          + (f", {len(state['phase1'])} shared upstream run(s) of {upstream}" if upstream else "")
          + f"; plan in {here / 'sweep.json'}", flush=True)
    return execute(root, state, jobs, args)


def execute(root: Path, state: dict[str, Any], todo: list[Job], args: argparse.Namespace) -> int:
    options = state["options"]
    threads = options["threads"] or options["cpus_per_task"] or 1
    local = state["launcher"] == "local"  # queued experiments run this tree's code; SLURM tasks their clone's
    env = task_env(threads, options["tracking_uri"], options["mlflow_experiment"], root / "src" if local else None)
    started = time.time()
    if state["launcher"] == "local":
        pending = [u for u in state["phase1"] if u["name"] not in state.get("upstream_done", [])]
        if pending:
            cache = run(["dvc", "cache", "dir"], root).strip()
            base = sweep_dir(root, state["name"]) / "work"
            up_env = {**env, "MLFLOW_EXPERIMENT_NAME": upstream_experiment(env)}
            if not env.get("MLFLOW_TRACKING_URI"):  # the clones' own stores go with them: log into this repository's
                from debias.tracking import ensure_experiment, tracking_uri

                up_env["MLFLOW_TRACKING_URI"] = tracking_uri(root)
                ensure_experiment(up_env["MLFLOW_TRACKING_URI"], up_env["MLFLOW_EXPERIMENT_NAME"], root)  # mlruns here
            specs = [{"root": str(root), "commit": state["commit"], "clone": str(base / u["name"]),
                      "overrides": u["overrides"], "stage": state["upstream_stage"], "cache_dir": cache,
                      "env": up_env} for u in pending]
            print(f"[sweep] computing {len(specs)} shared upstream run(s) of {state['upstream_stage']}", flush=True)
            with ThreadPoolExecutor(max_workers=options["jobs"]) as pool:
                list(pool.map(compute_upstream, specs))
            state["upstream_done"] = [*state.get("upstream_done", []), *(u["name"] for u in pending)]
        state["launched"] = True
        save_state(root, state)
        run_local(root, todo, options["jobs"], env, poll_s=args.poll)
        final = statuses(root, state)
    else:
        launch_slurm(root, state, todo, env, state["phase1"])
        state["launched"] = True
        save_state(root, state)
        print(f"[sweep] submitted {len(todo)} experiments to SLURM; `debias sweep --name {state['name']} --status`",
              flush=True)
        if not args.wait:
            return 0
        final = wait(root, state, args.poll)
    print(status_text(state, final))
    print(f"[sweep] wall time {time.time() - started:.1f} s")
    return 0 if all(s == "done" for s, _ in final.values()) else 1


STOPPED_TAG = "debias.sweep_stopped"  # on a parent run of an attempt that never finished (see mark_stopped_attempts)


def mark_stopped_attempts(root: Path, state: dict[str, Any], names: list[str]) -> int:
    """End as KILLED, with a tag saying why, the MLflow parent runs of earlier attempts of experiments that never
    finished (no DVC experiment): a task killed between two stages leaves its parent FINISHED by the last stage
    that ended, which would pass the attempt off as a finished experiment. Returns how many were marked."""
    if os.environ.get("DEBIAS_TRACKING", "").lower() == "off":
        return 0
    from mlflow.tracking import MlflowClient

    from debias.tracking import DEFAULT_EXPERIMENT, KIND_TAG, tracking_uri

    options = state["options"]
    uri = options.get("tracking_uri") or tracking_uri(root)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(options.get("mlflow_experiment") or
                                               os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT)
    if experiment is None:
        return 0
    marked = 0
    for name in names:
        runs = client.search_runs([experiment.experiment_id], max_results=1000, filter_string=(
            f"tags.`{KIND_TAG}` = 'pipeline' and tags.`debias.dvc_experiment` = '{name}'"))
        for run_ in runs:
            if run_.info.status in ("FINISHED", "RUNNING", "SCHEDULED"):
                client.set_tag(run_.info.run_id, STOPPED_TAG, "this attempt stopped before its experiment finished "
                               "(cancelled, pre-empted, out of time or failed); debias sweep --resume reran it")
                client.set_terminated(run_.info.run_id, status="KILLED")
                marked += 1
    return marked


def resume(root: Path, state: dict[str, Any], args: argparse.Namespace) -> int:
    """Rerun the experiments neither done nor queued nor running (a failed or killed one's clone is made anew)."""
    states = statuses(root, state)
    todo = [Job(**j) for j in state["jobs"] if states[j["name"]][0] == "failed"]
    if not todo:
        print(status_text(state, states))
        print("[sweep] nothing to resume")
        return 0 if all(s == "done" for s, _ in states.values()) else 1
    print(f"[sweep] resuming {len(todo)} experiment(s): {', '.join(j.name for j in todo)}", flush=True)
    marked = mark_stopped_attempts(root, state, [job.name for job in todo])
    if marked:
        print(f"[sweep] {marked} MLflow parent run(s) of the stopped attempts marked KILLED", flush=True)
    if state["launcher"] == "slurm":
        for name, entry in state.get("upstream", {}).items():
            entry["result"] = result_of(entry["result_pickle"])
    return execute(root, state, todo, args)


def main(args: argparse.Namespace) -> int:
    from debias.errors import DebiasError
    from debias.params import ParamsError
    from debias.paths import repo_root

    root = Path(args.repo).resolve() if args.repo else repo_root()
    try:
        if args.status or args.resume:
            if not args.name:
                raise SweepError("--status / --resume need --name (the sweep's name: ls sweeps/)")
            state = load_state(root, args.name)
            if args.status:
                print(status_text(state, statuses(root, state)))
                return 0
            return resume(root, state, args)
        return launch(root, args)
    except (SweepError, ParamsError, DebiasError, RuntimeError) as exc:
        print(f"debias sweep: {exc}", file=sys.stderr)
        return 2


SWEEP_HELP = """\
Run a grid of DVC experiments (params x values x seeds) on DVC's queue (--launcher local) or as a SLURM job
array (--launcher slurm, through submitit); each grid point is an ordinary DVC experiment. The whole grid is
checked against the params schema before anything runs.

examples:
  debias sweep --name eps -S 'loss.epsilon=0,0.25' --seeds 0 1 --upstream infer_groups
  debias sweep --name eps --launcher slurm --dvc-remote /shared/dvc-remote --partition gpu --gpus 1 \\
      --time 120 -S 'loss.epsilon=0,0.25' --seeds 0 1 2 --upstream infer_groups
  debias sweep --file benchmarks/my_grid.yaml --launcher slurm --dvc-remote /shared/dvc-remote
  debias sweep --name eps --status
  debias sweep --name eps --resume --wait
"""


def add_parser(commands: Any) -> None:
    """The ``sweep`` subcommand (its handler is ``args.handler``)."""
    p = commands.add_parser("sweep", help="run a grid of DVC experiments locally or on SLURM",
                            description=SWEEP_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", help="the sweep's name (prefix of its experiments' names; sweeps/<name>/ keeps its state)")
    p.add_argument("-S", "--set", action="append", default=[], metavar="KEY=V1[,V2...]",
                   help="a grid axis (several values) or a fixed override (one value), as dvc exp run -S")
    p.add_argument("--seeds", type=int, nargs="+", help="the seeds, innermost axis of the grid")
    p.add_argument("--file", help="a YAML sweep file: name, params (key: [values]), seeds, set, targets, upstream, "
                   "or experiments: [{name, set, targets}]")
    p.add_argument("--targets", nargs="+", help="stages each experiment runs (default: the whole pipeline)")
    p.add_argument("--upstream", metavar="STAGE", help="compute STAGE and its ancestors once per distinct value of "
                   "their params before the experiments (e.g. infer_groups), shared through DVC's run-cache")
    p.add_argument("--launcher", choices=LAUNCHERS, default="local")
    p.add_argument("--jobs", type=int, default=2, help="local: DVC queue workers (dvc queue start -j; default 2, quality.py's, one per core of a 2-core "
                   "machine)")
    p.add_argument("--threads", type=int, help="torch CPU threads per experiment (default: --cpus-per-task)")
    p.add_argument("--partition", help="slurm: partition (default: the cluster's default)")
    p.add_argument("--time", type=int, default=60, help="slurm: minutes per task (default 60, ours: SLURM needs a limit; a tiny "
                   "experiment takes about a minute, a real one sets its own)")
    p.add_argument("--gpus", type=int, default=0, help="slurm: GPUs per task (default: 0)")
    p.add_argument("--cpus-per-task", type=int, default=1, help="slurm: CPUs per task (default 1: DEBIAS_THREADS=1, as the test suite)")
    p.add_argument("--mem-gb", type=float, help="slurm: memory per task (default: the partition's default)")
    p.add_argument("--array-parallelism", type=int, default=256, help="slurm: array tasks running at once (default: "
                   "submitit's, 256)")
    p.add_argument("--dvc-remote", help="slurm: a DVC remote every node sees (a shared folder path)")
    p.add_argument("--tracking-uri", help="MLflow server of every stage (default: $MLFLOW_TRACKING_URI)")
    p.add_argument("--mlflow-experiment", help="MLflow experiment of the runs (default: $MLFLOW_EXPERIMENT_NAME "
                   "or debias)")
    p.add_argument("--status", action="store_true", help="show each experiment: queued, running, done, failed + log")
    p.add_argument("--resume", action="store_true", help="rerun the failed or killed experiments (done ones are kept)")
    p.add_argument("--wait", action="store_true", help="slurm: wait until every task ended (local always waits)")
    p.add_argument("--poll", type=float, default=10.0, help="seconds between status checks while waiting")
    p.add_argument("--repo", help=argparse.SUPPRESS)  # the repository root (default: the one around the cwd)
    p.set_defaults(handler=main)
