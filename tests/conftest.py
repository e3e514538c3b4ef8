"""Shared fixtures. Tests are offline; tracking is off unless a test turns it on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from debias.core.headline import forget_committed_run

REPO = Path(__file__).resolve().parents[1]
SHARED_DATASETS = REPO.parent / "shared" / "datasets"
MNIST10K = SHARED_DATASETS / "mnist10k.npz"

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "debias" / "numba"))
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("DEBIAS_FORKSERVER_IDLE", "60")  # the suite's fork servers leave a minute after their last stage


# Fixtures that run pipeline stages or `dvc repro` in a workspace before the test: a test that uses one is in the
# slow tier (`-m slow`), left out of the edit-test loop's `python -m pytest -q -m "not slow"`.
SLOW_FIXTURES = frozenset({"prepared_template", "prepared_workspace", "downloaded_clone_template", "downloaded_clone",
                           "npz_clone"})


# The longest test files, longest first (seconds on one of two workers: benchmarks/results/suite_time.md): they run
# first, so that the last files to start are short and both workers end together.
LONGEST_FIRST = ("tests/test_pipeline.py", "tests/test_cluster.py", "tests/test_sweep.py", "tests/test_trace.py",
                 "tests/faults/test_silent_results_faults.py", "tests/test_forkserver.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a :data:`SLOW_FIXTURES` fixture ``slow``; run the :data:`LONGEST_FIRST` files first
    (each file's tests keep their order)."""
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
    rank = {name: position for position, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


def pytest_collection_finish(session: pytest.Session) -> None:
    """The objects alive once the tests are collected (the libraries they imported: torch, pandas, sympy, ...) leave
    the garbage collector's generations (``gc.freeze``): each later full collection, Python's own and pytest's at the
    session's end, walks what the tests made, not the libraries again."""
    import gc

    gc.freeze()


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's hook: absent without it
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """With ``-n N``, each test file runs whole on one worker, so its module fixtures (a pipeline run, a SLURM sweep)
    are made once, handed out in the collection's order (:data:`LONGEST_FIRST` first), not xdist's most-tests-first;
    a ``--dist`` other than xdist's default ``load`` is left to xdist."""
    if config.getoption("dist") != "load":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # xdist's --no-loadscope-reorder
    return LoadFileScheduling(config, log)


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test inherits a tracking store, a DVC root or a device choice from the shell."""
    for name in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "DVC_EXP_NAME", "DVC_EXP_BASELINE_REV", "DEBIAS_DEVICE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("DEBIAS_TRACKING", "off")
    import torch  # here, not at the top: xdist's controller loads this file and runs no test

    torch.manual_seed(0)


@pytest.fixture
def mnist10k() -> dict[str, np.ndarray]:
    if not MNIST10K.exists():
        pytest.skip(f"shared dataset {MNIST10K.name} is not beside the repository")
    data = np.load(MNIST10K)
    return {"x": data["x"], "y": data["y"]}


def tiny_grey_digits(n_per_class: int = 12, classes: int = 10, size: int = 28, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Synthetic grey 'digits': a bright square whose position depends on the class."""
    rng = np.random.default_rng(seed)
    y = np.repeat(np.arange(classes), n_per_class)
    x = rng.integers(0, 60, size=(len(y), size, size)).astype(np.uint8)
    x[x < 30] = 0
    for label in range(classes):
        r, c = divmod(label, 4)
        x[y == label, 2 + 6 * r : 8 + 6 * r, 2 + 6 * c : 8 + 6 * c] = 250
    return x, y


@pytest.fixture(scope="session")
def mlflow_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A migrated, empty SQLite MLflow store, created once per session (migrations cost seconds), by the first xdist
    worker that needs it, in the folder the workers share; copy it per test."""
    import fcntl

    worker = os.environ.get("PYTEST_XDIST_WORKER")
    folder = tmp_path_factory.getbasetemp()
    folder = folder.parent if worker else folder  # xdist: the session's folder above the workers'
    path = folder / "mlflow-template.db"
    with open(folder / "mlflow-template.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            from mlflow.tracking import MlflowClient

            scratch = folder / f"mlflow-template-{worker or 'main'}.db"
            MlflowClient(tracking_uri=f"sqlite:///{scratch}").search_experiments()
            scratch.rename(path)
    return path


def fresh_store(template: Path, folder: Path) -> Path:
    target = folder / "mlflow.db"
    shutil.copy(template, target)
    return target


def committed_text(name: str) -> str:
    """A repository file as committed (HEAD), never the workspace's copy: `dvc exp run` rewrites params.yaml
    in the workspace, and the suite must pass after any experiment a user applied. Outside git (an exported
    tree) the file on disk is the shipped one."""
    done = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=REPO, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else (REPO / name).read_text()


def copy_worktree(target: Path) -> Path:
    """The working tree's tracked and unignored files (uncommitted edits included) copied into ``target``,
    without dvc.lock, so a clone runs the code under test and every stage from scratch; params.yaml is the
    committed one (:func:`committed_text`)."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.split("\0")
    target.mkdir(parents=True, exist_ok=True)
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    forget_committed_run(target)
    (target / "params.yaml").write_text(committed_text("params.yaml"))
    return target


def unlabelled_image_folder(folder: Path, n_train: int) -> dict:
    """`debias example-folder` at 16 px without its attribute column (``n_train`` training images, 16 per evaluation
    split) written to ``folder``; returns the params changes that run a pipeline on it with label-free selection."""
    from debias.tools.cli import main as cli_main

    assert cli_main(["example-folder", str(folder), "--n-train", str(n_train), "--n-eval", "16", "--size", "16",
                     "--no-attribute"]) == 0
    return {"data": {"source": "imagefolder", "image_size": 16, "max_per_split": None,
                     "imagefolder": {"root": str(folder), "attribute_column": None}},
            "erm": {"selection": "best_worst_class"}, "stage2": {"selection": "best_worst_inferred_group"}}
