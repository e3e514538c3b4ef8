"""The repository side of a sweep: git and DVC commands, the stages' environment, ``sweeps/<name>/sweep.json``,
clones at the sweep's commit, and phase 1 (shared upstream stages computed once) in a clone."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from collections.abc import Iterator
from typing import Any

from debias.core.headline import forget_committed_run
from debias.tools.sweep.grid import SweepError, check_name, set_args

SWEEPS = "sweeps"  # <repository>/sweeps/<name>/: sweep.json, logs/, clones/ (git-ignored)
CLONES = "clones"  # sweeps/<name>/clones/<experiment>: the clone a SLURM task runs its experiment in
# a clone's .dvc/config.local: no usage report and no check for a newer DVC from its commands
CLONE_CONFIG = [("core", "analytics", "false"), ("core", "check_update", "false")]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True) -> str:
    """``args`` run in ``cwd``; stdout (a failure with ``check`` raises, with its output)."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({done.returncode}):\n{done.stdout[-4000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def stream(args: list[str], cwd: Path, env: dict[str, str] | None = None, log: Path | None = None,
           keep: int = 4000) -> str:
    """``args`` run in ``cwd`` with their output (stdout and stderr, line by line, as it comes) appended to ``log``,
    or to this process's stdout (a SLURM task's log) without one, so the run's progress can be read while it runs;
    returns the last ``keep`` characters (a failure raises, with them)."""
    tail = ""
    sink = open(log, "a", encoding="utf-8") if log is not None else None  # noqa: SIM115 (closed below)
    try:
        with subprocess.Popen(args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              errors="replace", bufsize=1) as process:
            assert process.stdout is not None
            for line in process.stdout:
                (sink or sys.stdout).write(line)
                (sink or sys.stdout).flush()
                tail = (tail + line)[-keep:]
            code = process.wait()
    finally:
        if sink is not None:
            sink.close()
    if code != 0:
        raise RuntimeError(f"{' '.join(args)} failed ({code}){f'; its log: {log}' if log else ''}:\n{tail}")
    return tail


@contextlib.contextmanager
def as_process(cwd: Path, env: dict[str, str]) -> Iterator[None]:
    """The working directory ``cwd`` and ``os.environ`` exactly ``env`` for the block, then both as they were: a DVC
    command run in this process sees what its own process would (DVC finds the repository and resolves params.yaml
    from the working directory; git's identity for DVC's commits comes from the environment; no ``DVC_*`` of a
    caller). This process's other threads use absolute paths and pass their subprocesses an environment."""
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    os.environ.clear()
    os.environ.update(env)
    try:
        os.chdir(cwd)
        yield
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)


def push_run_cache(clone: Path, env: dict[str, str]) -> None:
    """``dvc push --run-cache``, then the objects of the run-cache's ``cache: false`` outputs (the git-tracked
    metrics) that it leaves out: DVC 3 pushes the run-cache's entries but only the outputs its workspace index holds,
    and a stage whose output is missing on the remote is not restored from the run-cache elsewhere (it reruns).
    The second step runs in the clone (DVC resolves a run-cache entry's paths against the working directory)."""
    run(["dvc", "push", "--run-cache"], clone, env)
    run([sys.executable, "-c", f"from {__name__} import push_run_cache_outputs; push_run_cache_outputs()"], clone, env)


def push_run_cache_outputs() -> None:
    """Push every output of this repository's run-cache entries that is in its local cache to the default remote."""
    from dvc.repo import Repo

    with Repo(".") as repo:
        entries = [(value.parent.name, value.name) for value in Path(repo.stage_cache.cache_dir).glob("*/*/*")]
        objs = set().union(*repo.stage_cache.get_used_objs(entries).values()) if entries else set()
        present = {obj for obj in objs if repo.cache.local.exists(obj.value)}
        failed = repo.cloud.push(present).failed if present else set()
    if failed:
        raise SystemExit(f"pushing {len(failed)} run-cache output(s) to the DVC remote failed")


def task_env(threads: int, tracking_uri: str | None, experiment: str | None) -> dict[str, str]:
    """The environment of every stage a sweep runs: machine settings only (never params) and the tracking server.
    Each stage runs its own tree's code: a queued experiment's copy of the commit (the stage launcher puts that
    tree's ``src`` first, :func:`debias.harness.launch.run_tree_code`), a clone's (:func:`with_src`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_TRACKING", "SLURM_JOB",
                                                                     "SLURM_ARRAY", "SLURM_TASK", "SLURM_STEP"))}
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


def committed_params(root: Path, commit: str) -> dict[str, Any]:
    """params.yaml as committed at ``commit``: a sweep's base, never the workspace's (which a ``dvc exp run -S``
    leaves changed), parsed as DVC parses it (YAML 1.2)."""
    from debias.params import parse_yaml

    text = run(["git", "show", f"{commit}:params.yaml"], root)
    return parse_yaml(text.encode("utf-8"), Path(f"{commit}:params.yaml")) or {}


def refuse_dirty(root: Path, doing: str) -> None:
    """A SweepError naming the tracked inputs with uncommitted changes (:func:`dirty_files`) and how to undo them:
    queued experiments snapshot the workspace, so they would run them while the sweep's records say its commit."""
    dirty = dirty_files(root)
    if dirty:
        undo = (" (params.yaml holds a `dvc exp run -S`'s values: `git checkout params.yaml` restores the committed "
                "ones)" if "params.yaml" in dirty else "")
        raise SweepError(f"commit or undo these before {doing} (the experiments run the committed tree): "
                         + ", ".join(dirty[:20]) + undo)


@contextlib.contextmanager
def sweep_lock(root: Path, name: str) -> Iterator[None]:
    """Hold ``sweeps/<name>/.lock`` (an exclusive ``flock``) while a sweep is launched or resumed: a second ``debias
    sweep`` on it is refused, naming the first, instead of both rewriting its plan. The lock goes with the process."""
    import fcntl

    path = sweep_dir(root, name) / ".lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            raise SweepError(f"sweep {name!r} is being launched or resumed by {holder}; wait for it to end (`debias "
                             f"sweep --name {name} --status` shows where it is), then resume") from None
        handle.truncate(0)
        handle.write(f"`debias sweep` pid {os.getpid()}\n")
        handle.flush()
        yield


def sweep_dir(root: Path, name: str) -> Path:
    """``<root>/sweeps/<name>``; a name that is not one safe path component is a SweepError (:func:`check_name`)."""
    return root / SWEEPS / check_name(name)


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


# Tracked files a sweep's clones may ignore: the workspace's own run records (``dvc repro`` rewrites dvc.lock), which
# name outputs and change no experiment's inputs.
RUN_RECORDS = ("dvc.lock",)


def run_records(root: Path) -> set[str]:
    """The tracked files a run rewrites (outputs, not inputs): dvc.lock and the git-tracked headline metrics."""
    from debias.core.headline import committed_metrics

    return {*RUN_RECORDS, *(path.relative_to(root).as_posix() for path in committed_metrics(root))}


def dirty_files(root: Path) -> list[str]:
    """Tracked inputs with uncommitted changes (what a clone of HEAD would not see): a run's records aside (after
    ``dvc exp run``, ``git checkout params.yaml`` leaves that run's dvc.lock and headline metrics, which the
    experiments recompute or restore)."""
    records = run_records(root)
    return [line[3:] for line in run(["git", "status", "--porcelain", "--untracked-files=no"], root).splitlines()
            if line.strip() and line[3:] not in records]


def clone_at(root: Path, commit: str, target: Path) -> None:
    """A fresh git clone of ``root`` at ``commit`` in ``target`` (a previous one there is removed). Its runs first
    forget the committed run (:func:`debias.core.headline.forget_committed_run`): the committed dvc.lock names the
    outputs of the run that wrote it, elsewhere (its run records hold that run's ids and times); where a stage's deps
    match it, DVC takes that record for the stage's cached run, finds its outputs in no cache here and reruns the
    stage without reading the run-cache, which holds the same stage as run here (a sweep's first seed recomputed the
    upstream `dvc repro` had just cached)."""
    shutil.rmtree(target, ignore_errors=True)
    target.parent.mkdir(parents=True, exist_ok=True)
    run(["git", "clone", "-q", "--no-checkout", "--no-hardlinks", str(root), str(target)], target.parent)
    run(["git", "checkout", "-q", commit], target)
    set_local_config(target, CLONE_CONFIG)


def cache_dir(repo: Path) -> str:
    """What ``dvc cache dir`` prints in ``repo``, read through DVC's own :class:`dvc.config.Config` in this process:
    the cache folder its configuration sets at any level (a relative one resolved against its file), else
    ``.dvc/cache``."""
    from dvc.config import Config

    config = Config(dvc_dir=str(repo / ".dvc"), validate=False)
    configured = config["cache"].get("dir")
    return str(configured) if configured else os.path.join(str(config.dvc_dir), "cache")


def set_local_config(repo: Path, settings: list[tuple[str, str, str]]) -> None:
    """``dvc config --local SECTION.OPTION VALUE`` for each (section, option, value) in turn, through DVC's own
    :class:`dvc.config.Config` in this process: the edits the command makes (``dvc cache dir --local`` is
    ``cache.dir``), without starting DVC once per setting (0.5 s each)."""
    from dvc.config import Config

    config = Config(dvc_dir=str(repo / ".dvc"), validate=False)  # as the command's: Config.from_cwd(validate=False)
    for section, option, value in settings:
        with config.edit("local") as conf:
            conf[section][option] = value


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
    forget_committed_run(clone)  # DVC then restores each stage from its run-cache (:func:`clone_at`)
    env = with_src(spec["env"], clone)
    if spec.get("cache_dir"):
        set_local_config(clone, [("cache", "dir", spec["cache_dir"])])
    if spec.get("remote"):
        run(["dvc", "remote", "add", "--local", "-f", "-d", "sweep", spec["remote"]], clone)
        run(["dvc", "pull", "--run-cache", "--allow-missing"], clone, env, check=False)
    apply_overrides(clone / "params.yaml", [a for a in set_args(spec["overrides"]) if a != "-S"])
    pull = ["--pull"] if spec.get("remote") else []  # restore from the run-cache with outputs from the remote
    # into its log as it runs (a SLURM task's own log without one): the sweep reads its stage and epoch there
    out = stream(["dvc", "repro", *pull, spec["stage"]], clone, env, Path(spec["log"]) if spec.get("log") else None)
    if spec.get("remote"):
        push_run_cache(clone, env)
    shutil.rmtree(clone, ignore_errors=True)
    return out[-2000:]


def upstream_experiment(env: dict[str, str]) -> str:
    """The MLflow experiment of phase 1's runs: ``<the sweep's experiment>-upstream``."""
    from debias.harness.tracking import DEFAULT_EXPERIMENT

    return f"{env.get('MLFLOW_EXPERIMENT_NAME') or DEFAULT_EXPERIMENT}-upstream"
