"""The stage launcher runs the code of the tree DVC runs it in (a queued experiment's copy of the commit), not the
code an editable install points at (the workspace, which may have changed since the experiment was queued)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from debias.harness.launch import tree_src
from tests.conftest import REPO


def test_the_tree_s_own_src_is_named_only_when_debias_came_from_elsewhere(tmp_path: Path) -> None:
    (tmp_path / "src" / "debias").mkdir(parents=True)
    assert tree_src(tmp_path, REPO / "src" / "debias") is None  # no debias package there: nothing to run instead
    (tmp_path / "src" / "debias" / "__init__.py").write_text("")
    assert tree_src(tmp_path, REPO / "src" / "debias") == (tmp_path / "src").resolve()
    assert tree_src(tmp_path, tmp_path / "src" / "debias") is None  # already the tree's own
    (tmp_path / "link").symlink_to(tmp_path / "src", target_is_directory=True)
    assert tree_src(tmp_path, tmp_path / "link" / "debias") is None  # the same folder by another name


def test_a_launcher_started_in_another_tree_runs_that_tree_s_code_with_its_arguments_and_exit_code(
        tmp_path: Path) -> None:
    """The launcher imported from this repository, started in a copy whose ``debias`` differs, runs the copy's
    (its ``exec`` keeps the pid, the arguments and the exit code); a copy whose code cannot be put first (``-E``
    ignores PYTHONPATH) is refused with exit 2, not run with the wrong code."""
    tree = tmp_path / "tree"
    (tree / "src" / "debias" / "harness").mkdir(parents=True)
    (tree / "src" / "debias" / "__init__.py").write_text("")
    (tree / "src" / "debias" / "harness" / "__init__.py").write_text("")
    (tree / "src" / "debias" / "harness" / "launch.py").write_text(
        "import os, sys\nprint('tree code', os.getpid(), sys.argv[1:], os.environ['PYTHONPATH'])\nsys.exit(7)\n")
    other = tmp_path / "other"  # a folder of another package on the path: kept, after the tree's src
    other.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(other)]), "DEBIAS_FORKSERVER": "0"}
    done = subprocess.run([sys.executable, "-c", "import os, sys; print('pid', os.getpid(), flush=True); "
                           "sys.argv = ['launch', '--single', 'pipeline/x.py', 'a b']; "
                           "from debias.harness.launch import main; main()"],
                          cwd=tree, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7, done.stderr
    first, second = done.stdout.splitlines()
    # the other tree's src is replaced, not kept behind: the stages of both trees share one fork server
    path = os.pathsep.join([str((tree / "src").resolve()), str(other)])
    assert second == f"tree code {first.split()[1]} ['--single', 'pipeline/x.py', 'a b'] {path}"
    refused = subprocess.run([sys.executable, "-E", "-c", "import sys; sys.path.insert(0, sys.argv[1]); "
                              "sys.argv = ['launch', 'pipeline/x.py']; from debias.harness.launch import main; main()",
                              str(REPO / "src")], cwd=tree, env={**env, "PYTHONPATH": str(tree / "src")},
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "python -E or -I" in refused.stderr, refused.stderr
