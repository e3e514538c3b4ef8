"""Stage start-up (issue 16): heavy libraries imported only where a stage uses them, no MLflow with tracking off,
and a finished stage process skips the interpreter's teardown - but only when it is the process's own script."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from debias.core.lazy import lazy_callable, lazy_module
from tests.conftest import REPO

STAGE_SCRIPT = """
import atexit, sys
from debias.harness.stage import main
atexit.register(lambda: open("atexit-ran", "w").write("yes"))
def body(params, run):
    print("body ran; mlflow imported:", "mlflow" in sys.modules, flush=True)
main("download", body)
print("after main", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO), env.get("PYTHONPATH", "")]),
               DEBIAS_TRACKING="off", DEBIAS_THREADS="1", **extra)
    return env


@pytest.mark.slow
def test_a_finished_stage_process_ends_without_teardown_only_as_its_own_script(tmp_path) -> None:
    (tmp_path / "params.yaml").write_text((REPO / "params.yaml").read_text())
    (tmp_path / "download.py").write_text(STAGE_SCRIPT)
    done = subprocess.run([sys.executable, "download.py"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "body ran; mlflow imported: False" in done.stdout  # DEBIAS_TRACKING=off: MLflow is never imported
    assert "after main" not in done.stdout  # ended right after the stage, with exit code 0 ...
    assert (tmp_path / "atexit-ran").read_text() == "yes"  # ... after the atexit handlers ran
    assert (tmp_path / "reports" / "runs" / "download.json").exists()  # and the run record was written
    (tmp_path / "atexit-ran").unlink()
    # the same entrypoint run in-process by another program (runpy, as tests and scripts do) returns normally
    script = "import runpy; runpy.run_path('download.py', run_name='__main__'); print('caller goes on')"
    done = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "after main" in done.stdout and "caller goes on" in done.stdout


@pytest.mark.slow
def test_registry_groups_and_tracking_import_no_pandas_sklearn_or_mlflow() -> None:
    heavy = "('pandas', 'sklearn', 'scipy', 'mlflow', 'matplotlib', 'umap')"
    code = ("import sys, debias.data.sources, debias.harness.tracking, debias.harness.stage; "
            f"print(sorted(m for m in {heavy} if m in sys.modules)); "
            "import debias.groups.inference; "  # reads and writes parquet tables: pandas, but no matching libraries
            f"print(sorted(m for m in {heavy} if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["[]", "['pandas']"]


@pytest.mark.slow
def test_compare_and_sweep_import_no_torch_until_a_tensor_metric_is_asked_for() -> None:
    """``debias compare`` and ``debias sweep`` read tables and paired statistics: torch (seconds of import) stays out of
    their processes; a name of :mod:`debias.metrics` that computes on tensors imports it on first use."""
    code = ("import sys, debias.tools.compare, debias.tools.sweep; print('torch' in sys.modules); "
            "from debias.metrics import GroupAccuracy, wilson_interval; print('torch' in sys.modules); "
            "from debias.metrics import accuracy_report; print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:3] == ["False", "False", "True"]


def test_lazy_stand_ins_import_on_first_use() -> None:
    json_module = lazy_module("json")
    assert json_module.dumps([1]) == "[1]"
    join = lazy_callable("os.path", "join")
    assert join("a", "b") == os.path.join("a", "b") and join.__name__ == "join"
    assert Path(lazy_module("pathlib").__getattr__("Path")("x")) == Path("x")


def test_threads_default_to_one_in_every_run_and_take_debias_threads(monkeypatch) -> None:
    """Unset, every stage process trains at DEFAULT_THREADS (1): `dvc repro`, `dvc exp run` and the queue alike, so
    DVC's run-cache never restores a run whose sums were rounded at another count; DEBIAS_THREADS sets another."""
    import torch

    from debias.core import runtime

    before = torch.get_num_threads()
    saved = {name: os.environ.get(name) for name in runtime.THREAD_VARIABLES}
    try:
        monkeypatch.delenv("DEBIAS_THREADS", raising=False)
        torch.set_num_threads(2)
        runtime.configure_threads()
        assert runtime.DEFAULT_THREADS == 1 and torch.get_num_threads() == 1 and os.environ["OMP_NUM_THREADS"] == "1"
        monkeypatch.setenv("DEBIAS_THREADS", "2")
        runtime.configure_threads()
        assert torch.get_num_threads() == 2 and os.environ["OPENBLAS_NUM_THREADS"] == "2"
        monkeypatch.setenv("DEBIAS_THREADS", "0")
        with pytest.raises(ValueError, match="DEBIAS_THREADS = '0'; allowed: a whole number >= 1"):
            runtime.configure_threads()
    finally:
        torch.set_num_threads(before)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def test_a_module_files_resolved_path_is_realpaths_through_linked_files_and_folders(tmp_path) -> None:
    """The stage's import check resolves each folder once and keeps every answer: the same path os.path.realpath
    gives for a plain file, a linked file, a file in a linked folder, a chain of links and a missing file."""
    from debias.harness import stage

    real = tmp_path / "real"
    (real / "pkg").mkdir(parents=True)
    (real / "pkg" / "mod.py").write_text("")
    (tmp_path / "linked").symlink_to(real)  # a linked folder
    (real / "pkg" / "alias.py").symlink_to(real / "pkg" / "mod.py")  # a linked file
    (tmp_path / "chain.py").symlink_to(tmp_path / "linked" / "pkg" / "alias.py")  # a link to a link through a link
    paths = [real / "pkg" / "mod.py", tmp_path / "linked" / "pkg" / "mod.py", real / "pkg" / "alias.py",
             tmp_path / "linked" / "pkg" / "alias.py", tmp_path / "chain.py", tmp_path / "linked" / "pkg" / "gone.py",
             Path("/")]
    for path in paths * 2:  # the second round answers from what the first kept
        assert stage.resolved(str(path)) == os.path.realpath(path), path
    assert stage.resolved(str(tmp_path / "chain.py")) == str(real.resolve() / "pkg" / "mod.py")
