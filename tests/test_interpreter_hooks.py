"""An interpreter hook (``sitecustomize`` / ``usercustomize``, imported by ``site`` before any stage code) from
outside the interpreter's installation can change what every stage computes (a default dtype) while no stage's deps
name it: a stage refuses it, naming its path, unless the hook declares that it changes no result."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from debias.harness.stage import SIDE_CHANNEL_MARK, unseen_hooks

FLOAT64_HOOK = "import torch\ntorch.set_default_dtype(torch.float64)\n"


def _hook(monkeypatch: pytest.MonkeyPatch, name: str, file: Path, **attributes: object) -> None:
    module = types.ModuleType(name)
    module.__file__ = str(file)
    for key, value in attributes.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def test_a_hook_outside_the_installation_is_named_unless_it_declares_itself_a_side_channel(tmp_path, monkeypatch):
    for name in ("sitecustomize", "usercustomize"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    assert unseen_hooks() == []
    (tmp_path / "src").mkdir()
    _hook(monkeypatch, "sitecustomize", tmp_path / "src" / "sitecustomize.py")
    assert unseen_hooks() == [f"sitecustomize ({tmp_path / 'src' / 'sitecustomize.py'})"]
    _hook(monkeypatch, "usercustomize", tmp_path / "usercustomize.py")
    assert [entry.split(" ")[0] for entry in unseen_hooks()] == ["sitecustomize", "usercustomize"]
    _hook(monkeypatch, "sitecustomize", tmp_path / "src" / "sitecustomize.py", **{SIDE_CHANNEL_MARK: "a profiler"})
    _hook(monkeypatch, "usercustomize", Path(sys.prefix) / "lib" / "usercustomize.py")  # the installation's own
    assert unseen_hooks() == []


@pytest.mark.slow
def test_dvc_repro_refuses_a_sitecustomize_in_src_naming_it(tmp_path) -> None:
    """A clone whose src/ (on the path, as an editable install puts it) holds a sitecustomize.py that sets float64:
    the stage fails before any work, naming the file and what to do; declared a side channel, it runs."""
    from tests.faults.conftest import dvc, make_clone

    clone = make_clone(tmp_path / "clone")
    hook = clone / "src" / "sitecustomize.py"
    hook.write_text(FLOAT64_HOOK)
    path = os.pathsep.join([str(clone / "src"), os.environ.get("PYTHONPATH", "")])
    done = dvc(clone, "repro", "download", check=False, PYTHONPATH=path)
    assert done.returncode != 0, done.stdout + done.stderr
    assert (f"[download] error: the interpreter ran sitecustomize ({hook}) at start-up, a hook outside its "
            "installation") in done.stderr, done.stderr
    assert "Take it off the path (PYTHONPATH, src/) or move what it does into src/debias" in done.stderr
    assert not (clone / "data" / "raw").exists() or not any((clone / "data" / "raw").iterdir())
    hook.write_text(f'{SIDE_CHANNEL_MARK} = "prints nothing, changes nothing"\n')
    done = dvc(clone, "repro", "download", check=False, PYTHONPATH=path)
    assert done.returncode == 0, done.stdout + done.stderr
