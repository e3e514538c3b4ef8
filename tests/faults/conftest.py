"""Helpers of the fault-injection suite: temporary workspaces and clones, stage subprocesses, snapshots.

Every fault is exercised by doing it: a stage entrypoint runs in a subprocess in a temporary copy
of the working tree, is fed bad params or bad files, or is killed, and the test checks the exit
code, the one-line message on stderr and what is left on disk. Nothing is written into the
repository itself. The subprocess is dvc.yaml's command (the launcher, the stage forked by the
warm fork server, as under DVC), or ``python pipeline/<stage>.py`` where the test is about the
process itself (a kill, a signal, a limit set on it).
"""

from __future__ import annotations

import copy
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO, committed_text, copy_worktree

PYTHON = sys.executable

# A tiny, fast and healthy configuration: ERM learns enough in 3 epochs for pred groups to find
# minority points, so every later stage has what it needs; CNC on them (no UMAP: fast).
TINY: dict = {
    "data": {"max_per_split": 150},
    "erm": {"epochs": 3, "lr": 0.05},
    "groups": {"method": "pred"},
    "stage2": {"method": "cnc", "epochs": 1, "cnc": {"anchor_fraction": 0.03}},
    "probe": {"c_grid": [1.0], "max_iter": 50},
    "evaluate": {"splits": ["test"], "mi_max_iter": 20, "umap": {"max_points": 100}},
}


def deep_update(base: dict, changes: dict) -> dict:
    """Merge nested ``changes`` into ``base`` (in place) and return it."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            deep_update(base[key], value)
        else:
            base[key] = copy.deepcopy(value)
    return base


def shipped_params() -> dict:
    """The committed params.yaml (never the workspace's: a `dvc exp run` may have changed it)."""
    return yaml.safe_load(committed_text("params.yaml"))


def write_params(folder: Path, changes: dict | None = None, base: dict | None = None) -> dict:
    """Write ``folder/params.yaml``: the shipped params (or ``base``) with TINY and ``changes`` merged in."""
    params = deep_update(deep_update(copy.deepcopy(base) if base is not None else shipped_params(), TINY),
                         changes or {})
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return params


def make_workspace(target: Path, changes: dict | None = None) -> Path:
    """A plain (non-git, non-DVC) workspace: the stage entrypoints, dvc.yaml (the stages' declared outputs)
    and a tiny params.yaml."""
    target.mkdir(parents=True, exist_ok=True)
    shutil.copytree(REPO / "pipeline", target / "pipeline", dirs_exist_ok=True)
    shutil.copy(REPO / "dvc.yaml", target / "dvc.yaml")
    write_params(target, changes)
    return target


def stage_env(**extra: str) -> dict[str, str]:
    """The environment of a stage subprocess: no inherited store/DVC settings, tracking off, 1 thread."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(DEBIAS_TRACKING="off", DEBIAS_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
               MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true", PYTHONHASHSEED="0",
               GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@t")
    env.update(extra)
    return env


def script_command(script: str, env: dict[str, str]) -> list[str]:
    """How DVC runs a stage's ``script`` (dvc.yaml's ``python -m debias.harness.launch``: forked by the warm fork
    server, one per worker's environment), or ``python SCRIPT`` where ``env`` changes what an import reads (a
    server of its own would cost more than it saves)."""
    from debias.harness.forkserver import read_at_import

    if any(read_at_import(name) for name in env):
        return [PYTHON, script]
    return launcher_command(script)


def launcher_command(script: str) -> list[str]:
    """dvc.yaml's command of a single-process stage: ``python -m debias.harness.launch --single SCRIPT``."""
    return [PYTHON, "-m", "debias.harness.launch", "--single", script]


def stage_command(stage: str, env: dict[str, str]) -> list[str]:
    """:func:`script_command` of ``pipeline/<stage>.py``."""
    return script_command(f"pipeline/{stage}.py", env)


def run_stage(workspace: Path, stage: str, timeout: float = 180, **env: str) -> subprocess.CompletedProcess:
    """Stage ``stage`` in ``workspace`` as DVC runs it (:func:`stage_command`); returns the finished process (never
    raises on rc). A forked stage has what the plain process has (tests/test_forkserver.py checks it); the signal
    and kill tests start ``python pipeline/<stage>.py`` themselves."""
    return subprocess.run(stage_command(stage, env), cwd=workspace, env=stage_env(**env),
                          capture_output=True, text=True, check=False, timeout=timeout)


def run_stages_in_one_process(workspace: Path, stages: Iterable[str], timeout: float = 300,
                              **env: str) -> subprocess.CompletedProcess:
    """Run several stage entrypoints (as ``__main__``) one after another in one process, forked by the warm fork
    server as :func:`stage_command` says.

    The same code as ``python pipeline/<stage>.py`` for each, without paying the imports once
    per stage; used to prepare workspaces, never for the fault under test.
    """
    runner = Path(tempfile.mkdtemp(prefix="stages-")) / "run_stages.py"  # outside the workspace: no stray file there
    runner.write_text("import runpy\n" + "".join(
        f"runpy.run_path('pipeline/{stage}.py', run_name='__main__')\n" for stage in stages))
    try:
        done = subprocess.run(script_command(str(runner), env), cwd=workspace, env=stage_env(**env),
                              capture_output=True, text=True, check=False, timeout=timeout)
    finally:  # a run past its timeout leaves no runner behind either
        shutil.rmtree(runner.parent, ignore_errors=True)
    assert done.returncode == 0, f"preparing {list(stages)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def run_parallel(jobs: dict[str, Callable[[], subprocess.CompletedProcess]], workers: int = 2) -> dict:
    """Run independent subprocess jobs two at a time (the machine has 2 cores); results by name."""
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {name: pool.submit(job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def assert_clean_failure(done: subprocess.CompletedProcess, *fragments: str, stage: str | None = None) -> None:
    """Exit code 2, no traceback, and every fragment in the one message on stderr."""
    report = f"rc={done.returncode}\n--- stdout\n{done.stdout}\n--- stderr\n{done.stderr}"
    assert done.returncode == 2, report
    assert "Traceback" not in done.stderr, report
    if stage is not None:
        assert f"[{stage}] error:" in done.stderr, report
    for fragment in fragments:
        assert fragment in done.stderr, f"missing {fragment!r}\n{report}"


def files_under(root: Path, folders: Iterable[str] = ("data", "models", "reports")) -> list[Path]:
    return sorted(p for folder in folders if (root / folder).exists() for p in (root / folder).rglob("*") if p.is_file())


def snapshot(root: Path, folders: Iterable[str] = ("data", "models", "reports")) -> dict[str, tuple[str, int]]:
    """sha256 and mtime (ns) of every file under the output folders."""
    return {str(p.relative_to(root)): (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in files_under(root, folders)}


def stray_temp_files(root: Path) -> list[Path]:
    """Temporary files of :func:`debias.core.io.atomic_path` (``.<name>.<...>.tmp``) left under the outputs."""
    return [p for p in files_under(root) if p.name.startswith(".") and p.name.endswith(".tmp")]


# --------------------------------------------------------------------------- prepared workspaces

PREPARED_STAGES = ("download", "inject_bias", "train_erm", "infer_groups")


@pytest.fixture(scope="session")
def prepared_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace where download, inject_bias, train_erm and infer_groups have run (tiny config)."""
    workspace = make_workspace(tmp_path_factory.mktemp("prepared") / "ws")
    run_stages_in_one_process(workspace, PREPARED_STAGES)
    return workspace


@pytest.fixture
def prepared_workspace(prepared_template: Path, tmp_path: Path) -> Path:
    """A private copy (mtimes kept) of the prepared workspace."""
    target = tmp_path / "ws"
    shutil.copytree(prepared_template, target, symlinks=True)
    return target


# --------------------------------------------------------------------------- git + DVC clones


def make_clone(target: Path, changes: dict | None = None) -> Path:
    """The working tree's tracked and unignored files in a fresh git repository, tiny params, committed."""
    copy_worktree(target)
    write_params(target, changes)
    env = stage_env()
    for command in (["git", "init", "-q"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        subprocess.run(command, cwd=target, check=True, env=env, capture_output=True)
    return target


def dvc(clone: Path, *args: str, check: bool = True, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """Run ``dvc`` in ``clone`` with tracking off and one thread (unless ``env`` says otherwise)."""
    done = subprocess.run(["dvc", *args], cwd=clone, env=stage_env(DVC_NO_ANALYTICS="1", **env),
                          capture_output=True, text=True, check=False, timeout=timeout)
    if check:
        assert done.returncode == 0, f"dvc {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return done


def git_commit_all(clone: Path, message: str) -> None:
    env = stage_env()
    subprocess.run(["git", "add", "-A"], cwd=clone, check=True, env=env, capture_output=True)
    subprocess.run(["git", "commit", "-qm", message], cwd=clone, check=True, env=env, capture_output=True)


@pytest.fixture(scope="session")
def downloaded_clone_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git + DVC clone where ``dvc repro download`` has run and dvc.lock is committed."""
    clone = make_clone(tmp_path_factory.mktemp("dvc-template") / "clone")
    dvc(clone, "repro", "download")
    git_commit_all(clone, "download")
    return clone


@pytest.fixture
def downloaded_clone(downloaded_clone_template: Path, tmp_path: Path) -> Path:
    target = tmp_path / "clone"
    shutil.copytree(downloaded_clone_template, target, symlinks=True)
    return target


# --------------------------------------------------------------------------- killing a subprocess at a known point


def write_driver(folder: Path, name: str, source: str) -> Path:
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def wait_for(predicate: Callable[[], bool], process: subprocess.Popen, timeout: float = 120,
             what: str = "condition") -> None:
    """Poll ``predicate`` until true; fail (showing the process output) if the process ends first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"process ended (rc={process.returncode}) before {what}:\n{out}\n{err}")
        if time.monotonic() > deadline:
            process.kill()
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.01)


def sigkill(process: subprocess.Popen) -> None:
    """SIGKILL the process we started (by its own pid) and reap it."""
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


def run_entrypoint_in_process(workspace: Path, stage: str, monkeypatch: pytest.MonkeyPatch,
                              capsys: pytest.CaptureFixture) -> subprocess.CompletedProcess:
    """Execute ``pipeline/<stage>.py`` as ``__main__`` in this interpreter, in ``workspace``.

    The same file and harness as ``python pipeline/<stage>.py`` (exit code from SystemExit,
    stdout/stderr captured) without a new interpreter's imports; each test file also runs
    real subprocesses for the process-level behaviour.
    """
    import runpy

    monkeypatch.chdir(workspace)
    for name in ("DEBIAS_DEBUG", "MLFLOW_TRACKING_URI", "DVC_ROOT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEBIAS_TRACKING", "off")
    capsys.readouterr()
    try:
        runpy.run_path(str(workspace / "pipeline" / f"{stage}.py"), run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    captured = capsys.readouterr()
    return subprocess.CompletedProcess([stage], code, captured.out, captured.err)


# --------------------------------------------------------------------------- the determinism runs, started early

DETERMINISM_MODULE = "test_whole_pipeline_determinism"


class BackgroundRepro:
    """``dvc repro`` of the whole pipeline in two fresh clones, running in the background."""

    def __init__(self, root: Path, changes: dict) -> None:
        self.root, self.changes = root, changes
        self.clones: list[Path] = []
        self.processes: list[subprocess.Popen] = []
        self._results: list[subprocess.CompletedProcess] | None = None

    def start(self) -> None:
        """Start both runs (once)."""
        if self.processes:
            return
        self.clones = [make_clone(self.root / f"clone-{i}", self.changes) for i in range(2)]
        self.processes = [subprocess.Popen(["dvc", "repro"], cwd=clone, env=stage_env(DVC_NO_ANALYTICS="1"),
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                           start_new_session=True)  # its own process group: see stop()
                          for clone in self.clones]

    def results(self, timeout: float = 900) -> list[subprocess.CompletedProcess]:
        self.start()
        if self._results is None:
            self._results = []
            for clone, process in zip(self.clones, self.processes):
                out, err = process.communicate(timeout=timeout)
                self._results.append(subprocess.CompletedProcess(["dvc", "repro", str(clone)], process.returncode,
                                                                 out, err))
        return self._results

    def stop(self) -> None:
        """Kill what is still running (an interrupted session): dvc and its stage, by the group we made."""
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.communicate()


DETERMINISM_CHANGES = {"groups": {"method": "pred"}}


@pytest.fixture(scope="session", autouse=True)
def determinism_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """Start the determinism test's two pipeline runs (the suite's longest wait, mostly one core each)
    as the session begins, so they overlap the other fault tests; the determinism module (named to
    run last) collects them. Nothing starts when that module is not selected. Under pytest-xdist every
    worker collects every test, so a worker starts them only when the module asks (in the one worker it runs on)."""
    selected = any(getattr(getattr(item, "module", None), "__name__", "").endswith(DETERMINISM_MODULE)
                   for item in request.session.items)
    if not selected:
        yield None
        return
    runs = BackgroundRepro(tmp_path_factory.mktemp("determinism"), DETERMINISM_CHANGES)
    if "PYTEST_XDIST_WORKER" not in os.environ:
        runs.start()
    yield runs
    runs.stop()
