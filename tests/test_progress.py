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


class FakeClock:
    """A clock a test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_heartbeat_is_due_only_after_interval_seconds_without_a_line() -> None:
    clock, lines = FakeClock(), []
    beat = progress.Heartbeat(lambda: f"at {clock.now:.0f}", interval=15, write=lines.append, clock=clock)
    clock.now += 14.9
    assert not beat.tick() and lines == []
    clock.now += 0.1
    assert beat.tick() and lines == ["at 1015"]
    clock.now += 10
    beat.said()  # a line written elsewhere: the next is due 15 s after it
    clock.now += 14
    assert not beat.tick()
    clock.now += 1
    assert beat.tick() and lines == ["at 1015", "at 1040"]

    def broken() -> str:
        raise OSError("log gone")

    beat = progress.Heartbeat(broken, 15, lines.append, clock)
    clock.now += 15
    assert beat.tick() and lines[-1] == "still working (progress unreadable: OSError: log gone)"


def gaps(stamps: list[float]) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:])]


@pytest.mark.slow
def test_a_slow_silent_block_still_gets_a_line_per_interval_from_the_thread() -> None:
    """The block below says nothing for 2.5 s; with the heartbeat open a line comes at least every interval (plus a
    wake-up's slack): no gap as long as the silent block."""
    import time

    stamps: list[float] = []
    started = time.monotonic()
    with progress.Heartbeat(lambda: "working", interval=0.3, write=lambda line: stamps.append(time.monotonic())):
        time.sleep(2.5)
    stamps = [started, *stamps, time.monotonic()]
    assert len(stamps) >= 2 + 4 and max(gaps(stamps)) < 1.5, gaps(stamps)


def test_the_stage_heartbeat_says_the_step_the_loop_count_and_the_epoch_with_its_eta() -> None:
    clock = FakeClock()
    activity = progress.StageActivity("train_erm", clock)
    reporter = progress.TerminalReporter(activity)
    clock.now += 3
    assert activity.line() == "[train_erm] still working: starting (params, checks, MLflow run); 3.0 s since the stage started"
    reporter.step_started("train_erm", "loading the splits")
    assert "still working: loading the splits;" in activity.line()
    reporter.advance("linear probe: C grid", 2, 5, "C")
    assert "still working: linear probe: C grid 2/5 C;" in activity.line()
    reporter.epoch_ended("train_erm", 2, 20, {"train/loss": 0.5}, 4.0, 120.0)
    clock.now += 20
    assert activity.line() == ("[train_erm] still working: epoch 3/20 done, training the next; ETA 1 min 40 s; "
                               "23 s since the stage started")


@pytest.mark.slow
def test_a_stage_says_where_it_is_while_its_body_is_silent(tmp_path, monkeypatch, capsys) -> None:
    """The harness's heartbeat runs from the stage's start: a body silent for 2 s past an epoch gets lines on
    stderr saying the epoch and its ETA, at least one per interval."""
    import time

    from debias.core import progress as reported
    from debias.harness.stage import main

    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))
    (tmp_path / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DEBIAS_TRACKING", "off")
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)

    def body(params, run) -> None:
        reported.epoch("train_erm", 0, 4, {"train/loss": 1.0}, 0.5, 60.0)
        time.sleep(2.0)

    main("train_erm", body)
    beats = [line for line in capsys.readouterr().err.splitlines() if "still working" in line]
    assert len(beats) >= 3, beats
    assert beats[-1].startswith("[train_erm] still working: epoch 1/4 done, training the next; ETA ")


@pytest.mark.slow
def test_compare_says_it_started_at_once_and_keeps_saying_it_works(monkeypatch, capsys) -> None:
    """`debias compare` printed nothing for its first 20 s on a loaded machine (imports, then `dvc exp show`): its
    first line now comes before any of that, and a line per interval follows while it gathers."""
    import time

    from debias.tools import cli

    seen = []

    def slow(args) -> int:
        seen.append(capsys.readouterr().err)  # what was printed before the work began
        time.sleep(1.5)
        return 0

    monkeypatch.setattr(cli, "_compare", slow)
    monkeypatch.setattr(progress, "HEARTBEAT_S", 0.3)
    assert cli.main(["compare", "--no-mlflow"]) == 0
    assert seen[0].startswith("[compare] starting (")
    beats = [line for line in capsys.readouterr().err.splitlines() if line.startswith("[compare] still working, ")]
    assert len(beats) >= 3, beats


@pytest.mark.slow
def test_the_stage_heartbeat_counts_from_the_stage_command_s_start_not_from_after_its_imports() -> None:
    """'10 s since the stage started' was said 58 s after the stage's command started (its imports not counted)."""
    import os
    import subprocess
    import sys

    clock = FakeClock()
    activity = progress.StageActivity("train_erm", clock, age=48.0)
    clock.now += 10
    assert activity.line().endswith("; 58 s since the stage started")
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        import time

        time.sleep(1.5)
        age = progress.process_age(sleeper.pid)
        assert age is not None and 1.0 <= age <= 30, age
        assert progress.process_age(os.getpid()) >= age  # pytest started before it
        os.environ["DEBIAS_LAUNCHER_PID"] = str(sleeper.pid)
        assert abs(progress.stage_age() - progress.process_age(sleeper.pid)) < 1.0  # the launcher's, not this one's
    finally:
        os.environ.pop("DEBIAS_LAUNCHER_PID", None)
        sleeper.kill()
        sleeper.wait()
    assert progress.process_age(2**22 + 7) is None  # no such process
