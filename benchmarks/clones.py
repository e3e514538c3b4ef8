"""Fresh clones of the repository and measured commands in them: the clone (working tree or a commit), the stages'
environment, the launcher that reads a command's CPU seconds and peak RSS, and dvc.yaml's stage order."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from debias.core.headline import forget_committed_run
from debias.core.trees import merge

REPO = Path(__file__).resolve().parent.parent


NUMBA_CACHE = Path.home() / ".cache" / "debias" / "numba"  # what tests/conftest.py and the entrypoints use


def make_clone(target: Path, overrides: dict, ref: str | None) -> Path:
    """A fresh git repository holding the working tree's tracked and unignored files (as
    tests/test_pipeline.py makes it), or the tree of commit ``ref``; params.yaml with ``overrides``."""
    if ref:
        archive = subprocess.run(["git", "archive", "--format=tar", ref], cwd=REPO, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    else:
        files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                               capture_output=True, text=True, check=True).stdout.split("\0")
        for name in filter(None, files):
            source = REPO / name
            if source.is_file():
                (target / name).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / name)
    forget_committed_run(target)
    params = yaml.safe_load((target / "params.yaml").read_text())
    (target / "params.yaml").write_text(yaml.safe_dump(merge(params, overrides), sort_keys=False))
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=speed", "-c", "user.email=speed@local", "commit", "-qm", "speed"]):
        subprocess.run(command, cwd=target, check=True)
    return target


def home_relative(path: Path | str) -> str:
    """``path`` with the home folder written as ``~`` (results carry no machine paths)."""
    path, home = Path(path), Path.home()
    return f"~/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def stage_order(dvc_yaml: Path) -> list[tuple[str, str]]:
    """(stage, cmd) of dvc.yaml in an order where every stage follows the stages whose outputs it reads."""
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]

    def paths(entries: list) -> list[str]:
        return [next(iter(e)) if isinstance(e, dict) else e for e in entries or []]

    def produces(out: str, dep: str) -> bool:
        return dep == out or dep.startswith(out.rstrip("/") + "/") or out.startswith(dep.rstrip("/") + "/")

    outs = {name: paths(s.get("outs")) + paths(s.get("metrics")) + paths(s.get("plots")) for name, s in stages.items()}
    before = {name: {other for other in stages if other != name
                     for dep in paths(s.get("deps")) for out in outs[other] if produces(out, dep)}
              for name, s in stages.items()}
    order: list[str] = []
    while len(order) < len(stages):
        ready = [n for n in stages if n not in order and before[n] <= set(order)]
        if not ready:
            raise SystemExit(f"dvc.yaml has a cycle among {sorted(set(stages) - set(order))}")
        order.append(ready[0])
    return [(name, stages[name]["cmd"]) for name in order]


# A small launcher between this process and the measured command: a child's peak RSS counts the memory of
# the process it was forked from (the kernel keeps the larger of the old and new image's peak across exec),
# so forking the command from this torch-loaded process would add ~0.7 GB to every stage.
LAUNCHER = ("import resource, subprocess, sys; status = subprocess.call(sys.argv[2:]); "
            "u = resource.getrusage(resource.RUSAGE_CHILDREN); "
            "open(sys.argv[1], 'w').write(f'{u.ru_maxrss} {u.ru_utime + u.ru_stime}'); sys.exit(status)")


def run_measured(command: list[str], cwd: Path, env: dict[str, str], log: Path) -> tuple[int, float, float, float]:
    """Run ``command``; return (exit status, wall seconds, CPU seconds, peak RSS in MiB).

    CPU (user + system) and peak RSS come from RUSAGE_CHILDREN of a minimal launcher process
    (``python -S``): CPU summed over the command and its waited-for descendants, peak RSS the largest of
    them - with `dvc repro` that is the stage's Python process (or DVC itself, whichever is larger).
    """
    with open(log, "ab") as handle, tempfile.NamedTemporaryFile("r", suffix=".rss") as rss:
        handle.write(f"$ {shlex.join(command)}\n".encode())
        handle.flush()
        start = time.perf_counter()
        status = subprocess.call([sys.executable, "-S", "-c", LAUNCHER, rss.name, *command], cwd=cwd, env=env,
                                 stdout=handle, stderr=subprocess.STDOUT)
        wall = time.perf_counter() - start
        peak_kib, cpu = (float(v) for v in (Path(rss.name).read_text() or "0 0").split())
    return status, wall, cpu, peak_kib / 1024


def child_env(threads: int, numba_cache: Path, clone: Path) -> dict[str, str]:
    """The stages' environment: tracking required, the thread count, and the clone's own src/ first on the
    path (the editable install points at this repository's src/, which would make every clone run it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(clone / "src"), *filter(None, [os.environ.get("PYTHONPATH")])])
    env.update(DEBIAS_TRACKING="required", DEBIAS_THREADS=str(threads), OMP_WAIT_POLICY="PASSIVE",
               NUMBA_CACHE_DIR=str(numba_cache), MLFLOW_DISABLE_TELEMETRY="true", PYTHONUNBUFFERED="1",
               GIT_AUTHOR_NAME="speed", GIT_AUTHOR_EMAIL="speed@local", GIT_COMMITTER_NAME="speed",
               GIT_COMMITTER_EMAIL="speed@local")
    env.pop("DEBIAS_DEVICE", None)
    # a process per stage: the CPU and peak-RSS columns come from the launched process tree, which a stage forked
    # by the fork server is not part of (benchmarks/repro_time.py measures the pipeline with the server)
    env["DEBIAS_FORKSERVER"] = "0"
    return env


def forked_env(threads: int, numba_cache: Path, clone: Path, bytecode: bool = True) -> dict[str, str]:
    """:func:`child_env` as users run the stages: the fork server on, with a socket folder of its own
    (``XDG_RUNTIME_DIR``: its servers are this environment's alone, stopped with :func:`stop_servers`); with
    ``bytecode``, bytecode written once and reused (``PYTHONDONTWRITEBYTECODE`` unset), as on a user's machine."""
    runtime = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: a socket path holds < 108 bytes
    env = {**child_env(threads, numba_cache, clone), "XDG_RUNTIME_DIR": runtime}
    env.pop("DEBIAS_FORKSERVER", None)
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def stop_servers(env: dict[str, str]) -> None:
    """Stop the fork servers of ``env``'s socket folder (:func:`forked_env`)."""
    subprocess.run(["pkill", "-f", env["XDG_RUNTIME_DIR"]], check=False)


def body_seconds(clone: Path, stage: str) -> float:
    """A stage body's wall seconds, from its run record (``reports/runs/<stage>.json``)."""
    return float(json.loads((clone / "reports" / "runs" / f"{stage}.json").read_text())["wall_time_s"])
