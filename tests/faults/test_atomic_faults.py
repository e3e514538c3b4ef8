"""Atomic outputs: a crash or a kill mid-write leaves the previous file intact, and no stray
temporary file is ever recorded by DVC."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from debias.core import io
from debias.core.io import CorruptFileError, load_json, load_torch, save_json, save_torch
from tests.faults.conftest import (
    PYTHON,
    dvc,
    run_entrypoint_in_process,
    sigkill,
    snapshot,
    stage_env,
    stray_temp_files,
    wait_for,
    write_driver,
    write_params,
)

# Writes a ~300 MB payload with debias.core.io.save_torch, so that a test can SIGKILL it mid-write.
BIG_WRITER = """
import sys
import torch
from debias.core.io import save_torch

path, size = sys.argv[1], int(sys.argv[2])
payload = {"x": torch.ones(size, dtype=torch.uint8)}
save_torch(path, payload, kind="biased-split")
print("finished", flush=True)
"""
BIG = 300_000_000


def temp_files_of(path: Path) -> list[Path]:
    return sorted(path.parent.glob(f".{path.name}.*.tmp"))


def kill_mid_write(driver: Path, target: Path) -> None:
    """Start the writer and SIGKILL it once its temporary file holds part of the payload."""
    process = subprocess.Popen([PYTHON, str(driver), str(target), str(BIG)], env=stage_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    def half_written() -> bool:
        for temp in temp_files_of(target):
            try:
                if temp.stat().st_size > 1_000_000:
                    return True
            except FileNotFoundError:  # renamed or removed between the listing and the stat
                pass
        return False

    wait_for(half_written, process, what="the temporary file to be half written")
    sigkill(process)


# --------------------------------------------------------------------------- failures inside the write


def test_exception_inside_torch_save_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "models" / "erm.pt"
    save_torch(target, {"state": torch.arange(10)}, kind="checkpoint")
    before = target.read_bytes()

    def half_then_crash(obj, f, *args, **kwargs):
        part = before[: len(before) // 2]  # part of a file, then the crash
        f.write(part) if hasattr(f, "write") else Path(f).write_bytes(part)
        raise OSError("disk full (injected)")

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(OSError, match="injected"):
        save_torch(target, {"state": torch.arange(20)}, kind="checkpoint")
    monkeypatch.undo()
    assert target.read_bytes() == before
    assert torch.equal(load_torch(target, "checkpoint", ("state",))["state"], torch.arange(10))
    assert temp_files_of(target) == []  # the failed write cleaned up after itself


def test_exception_inside_a_json_write_keeps_the_previous_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "reports" / "metrics" / "erm.json"
    save_json(target, {"test": {"avg": 0.5}})
    before = target.read_bytes()
    real_write_text = Path.write_text

    def partial(self: Path, text: str, *args, **kwargs):
        real_write_text(self, text[: len(text) // 3])
        raise KeyboardInterrupt  # e.g. Ctrl-C between write and rename

    monkeypatch.setattr(Path, "write_text", partial)
    with pytest.raises(KeyboardInterrupt):
        save_json(target, {"test": {"avg": 0.9}})
    monkeypatch.undo()
    assert target.read_bytes() == before and load_json(target) == {"test": {"avg": 0.5}}
    assert temp_files_of(target) == []


def test_a_truncated_file_is_reported_not_loaded(tmp_path: Path) -> None:
    """What a non-atomic writer would leave: the reader names the file and what to do."""
    target = tmp_path / "train.pt"
    save_torch(target, {"x": torch.zeros(1000)}, kind="biased-split")
    target.write_bytes(target.read_bytes()[:500])
    with pytest.raises(CorruptFileError, match=r"train\.pt cannot be read as a debias biased-split file.*truncated"):
        load_torch(target, "biased-split")


# --------------------------------------------------------------------------- SIGKILL mid-write


@pytest.mark.slow
def test_sigkill_mid_write_keeps_the_previous_file_and_the_next_write_sweeps_the_temp(tmp_path: Path) -> None:
    driver = write_driver(tmp_path, "big_writer.py", BIG_WRITER)
    target = tmp_path / "data" / "biased" / "train.pt"
    save_torch(target, {"x": torch.arange(100, dtype=torch.uint8)}, kind="biased-split")
    before = target.read_bytes()
    kill_mid_write(driver, target)
    assert target.read_bytes() == before  # byte-identical ...
    assert torch.equal(load_torch(target, "biased-split", ("x",))["x"], torch.arange(100, dtype=torch.uint8))  # ... loadable
    leftovers = temp_files_of(target)
    assert leftovers, "a SIGKILL cannot be caught: the half-written temporary file is expected here"
    # the next write of the same output (the rerun of its stage) removes what the killed writer left
    save_torch(target, {"x": torch.arange(50, dtype=torch.uint8)}, kind="biased-split")
    assert temp_files_of(target) == []
    assert len(load_torch(target, "biased-split", ("x",))["x"]) == 50


def test_a_live_writers_temp_is_not_swept(tmp_path: Path) -> None:
    """Sweeping is only for dead writers: a concurrent writer's temporary file is left alone."""
    target = tmp_path / "out.json"
    with io.atomic_path(target) as mine:
        mine.write_text("{}")
        save_json(target, {"other": 1})  # another write of the same path while ours is open
        assert mine.exists()
    assert load_json(target) == {}


def test_killed_write_in_a_persistent_dvc_output_is_never_recorded(downloaded_clone: Path, tmp_path: Path) -> None:
    """data/raw is ``persist: true``: DVC keeps what is in it between runs and hashes every file in it.

    Kill a writer of data/raw/splits.pt mid-write, then ``dvc repro``: the previous file is intact
    and loadable, and DVC does not see the killed writer's temporary (``.*.tmp`` is in .dvcignore):
    nothing reruns, dvc.lock records exactly one file there, and a rerun of download sweeps it.
    """
    clone = downloaded_clone
    target = clone / "data/raw/splits.pt"
    before = target.read_bytes()
    kill_mid_write(write_driver(tmp_path, "big_writer.py", BIG_WRITER), target)
    assert target.read_bytes() == before
    load_torch(target, "raw-splits", ("train", "val", "test"))
    assert temp_files_of(target)  # what the kill left
    done = dvc(clone, "repro", "download")
    assert "Running stage 'download'" not in done.stdout  # the temporary is DVC-ignored: nothing changed
    assert "up to date" in dvc(clone, "status", "download").stdout
    done = dvc(clone, "repro", "--force", "download")
    assert "Running stage 'download'" in done.stdout
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    raw = next(out for out in lock["stages"]["download"]["outs"] if out["path"] == "data/raw")
    assert raw["nfiles"] == 1, f"dvc.lock records {raw['nfiles']} files in data/raw: {sorted(p.name for p in (clone / 'data/raw').iterdir())}"
    assert stray_temp_files(clone) == []  # the rerun's own write swept the dead writer's temporary
    assert target.read_bytes() == before  # same params, same bytes (so inject_bias need not rerun)


# --------------------------------------------------------------------------- a real stage killed mid-training


def test_killed_training_stage_leaves_every_previous_output_intact(prepared_workspace: Path, monkeypatch,
                                                                    capsys) -> None:
    """SIGKILL train_erm while it trains (outputs of an earlier run present): nothing changes on disk
    but the resume state; rerunning finishes and removes the resume state."""
    ws = prepared_workspace
    write_params(ws, {"erm": {"epochs": 30}})  # 29 epochs of margin: the kill must land mid-training on a loaded machine
    before = snapshot(ws)
    resume = ws / "models/.resume/erm.pt"
    process = subprocess.Popen([PYTHON, "pipeline/train_erm.py"], cwd=ws, env=stage_env(),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(resume.exists, process, what="the first resume state")
    sigkill(process)
    after = snapshot(ws)
    resume_keys = {k for k in after if k.startswith("models/.resume/")}
    assert {k: v for k, v in after.items() if k not in resume_keys} == before
    assert [p for p in stray_temp_files(ws) if ".resume" not in p.parts] == []
    assert load_torch(resume, "resume-state", ("epoch",))["epoch"] >= 0
    done = run_entrypoint_in_process(ws, "train_erm", monkeypatch, capsys)  # the rerun
    assert done.returncode == 0, done.stderr
    assert not resume.exists()
    assert json.loads((ws / "reports/metrics/erm.json").read_text())["selected_epoch"] == 29
