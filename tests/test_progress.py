"""Progress output: a training stage prints one line per epoch under a terminal and in a log, and a log holds no
carriage returns (no bar redraws, no per-batch lines)."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from debias.data.store import save_split
from debias.harness import progress
from tests.conftest import REPO, committed_text
from tests.test_training import tiny_split

EPOCHS = 3
EPOCH_LINE = re.compile(r"^\[train_erm\] epoch (\d+) \((\d+)/(\d+)\): loss \d+\.\d{4}, train acc [01]\.\d{3}, "
                        r"val avg [01]\.\d{3}, unbiased [01]\.\d{3}, worst-group [01]\.\d{3} \(\d+(\.\d)? s(; ETA .+)?\)$")


def stage_folder(tmp_path: Path) -> Path:
    """A folder holding what pipeline/train_erm.py reads: three tiny biased splits and a params.yaml."""
    for seed, name in enumerate(("train", "val", "test")):
        (tmp_path / "data" / "biased").mkdir(parents=True, exist_ok=True)
        save_split(tmp_path / "data" / "biased" / f"{name}.pt", tiny_split(seed=seed))
    params = yaml.safe_load(committed_text("params.yaml"))
    params["erm"].update(epochs=EPOCHS, batch_size=32)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    return tmp_path


def stage_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO / "src"), "DEBIAS_TRACKING": "off", "DEBIAS_THREADS": "1",
            "COLUMNS": "120"}


def run_under_terminal(command: list[str], cwd: Path) -> tuple[int, str]:
    """Run ``command`` with stdout and stderr on a pseudo-terminal; return its exit code and everything it wrote."""
    controller, terminal = pty.openpty()
    process = subprocess.Popen(command, cwd=cwd, env=stage_env(), stdin=subprocess.DEVNULL, stdout=terminal,
                               stderr=terminal, close_fds=True)
    os.close(terminal)
    chunks = []
    while True:
        try:
            chunk = os.read(controller, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(controller)
    return process.wait(timeout=600), b"".join(chunks).decode(errors="replace")


def epoch_lines(text: str) -> list[re.Match]:
    lines = [line.split("\r")[-1].strip() for line in text.replace("\r\n", "\n").split("\n")]
    return [match for line in lines if (match := EPOCH_LINE.match(line))]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_training_stage_prints_one_line_per_epoch_under_a_terminal(tmp_path: Path) -> None:
    folder = stage_folder(tmp_path)
    code, text = run_under_terminal([sys.executable, str(REPO / "pipeline" / "train_erm.py")], folder)
    assert code == 0, text[-3000:]
    found = epoch_lines(text)
    assert [(int(m[1]), int(m[2]), int(m[3])) for m in found] == [(e, e + 1, EPOCHS) for e in range(EPOCHS)], text
    assert all("ETA" in m[0] for m in found[:-1]) and "ETA" not in found[-1][0]
    assert (folder / "reports" / "metrics" / "erm.json").exists()


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_training_stage_log_has_epoch_lines_and_no_carriage_returns(tmp_path: Path) -> None:
    folder = stage_folder(tmp_path)
    done = subprocess.run([sys.executable, str(REPO / "pipeline" / "train_erm.py")], cwd=folder, env=stage_env(),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(epoch_lines(done.stderr)) == EPOCHS, done.stderr  # progress goes to stderr
    assert "\r" not in done.stdout + done.stderr  # no bar redraws in a log
    assert len((done.stdout + done.stderr).splitlines()) < 10 * EPOCHS  # no per-batch lines


def test_durations_and_epoch_lines_read_as_documented() -> None:
    assert [progress.duration(s) for s in (0.44, 12.2, 221, 7500)] == ["0.4 s", "12 s", "3 min 41 s", "2 h 05 min"]
    metrics = {"epoch": 2.0, "train/loss": 0.41234, "val/avg": 0.79, "val/worst_group": 0.6, "train/extra": 1.0}
    assert progress.epoch_line("train_erm", 2, 20, metrics, 12.2, 221.0) == (
        "[train_erm] epoch 2 (3/20): loss 0.4123, val avg 0.790, worst-group 0.600 (12 s; ETA 3 min 41 s)")
    assert progress.epoch_line("x", 19, 20, {"train/loss": -0.02}, 1.0, None) == (
        "[x] epoch 19 (20/20): loss -0.0200 (1.0 s)")


def test_bars_only_draw_on_a_terminal_and_clear_when_the_task_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress, "on_terminal", lambda: False)
    reporter = progress.TerminalReporter()
    reporter.advance("x", 1, 3, "it")
    assert not reporter.bars  # a log gets no bar
    monkeypatch.setattr(progress, "on_terminal", lambda: True)
    reporter.advance("x", 1, 3, "it")
    assert reporter.bars["x"].n == 1 and reporter.bars["x"].total == 3
    reporter.advance("x", 2, 3, "it")
    assert reporter.bars["x"].n == 2
    reporter.advance("x", 3, 3, "it")
    assert not reporter.bars
    reporter.advance("y", 1, 3, "it")
    reporter.close()  # a stage that failed inside a loop: its bar is cleared
    assert not reporter.bars
