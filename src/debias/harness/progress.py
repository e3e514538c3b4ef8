"""Progress on stderr: one line per training epoch, bars for long loops, a line per timed step.

Research code reports progress through :mod:`debias.core.progress`; the stage harness installs
:class:`TerminalReporter` (:func:`debias.harness.stage.main`), which shows it here.

While a stage runs, :class:`Heartbeat` writes a line whenever it has said nothing for :data:`HEARTBEAT_S` seconds
(what it is doing: starting, a step, a loop's count, the epoch reached with its ETA), so a slow start, a long step
or a loaded machine never leaves its log silent (:func:`stage_heartbeat`).

Readable in both places a stage's output goes: under a terminal (stderr a TTY) the bars (tqdm) redraw in place
and are cleared when done; anywhere else (``dvc repro`` piped to a log, a queue worker, a SLURM job) the bars
are off and only whole lines are written, so a log holds no carriage returns and no per-batch lines. Only rank 0
of a ``torchrun`` job writes. Every line starts with ``[stage]`` like the stages' other messages.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from tqdm.auto import tqdm

# The per-epoch metrics an epoch line shows, in this order, with their short names: the training loss and
# accuracy, then the three validation accuracies the default selection reads (selection.selection_score).
EPOCH_FIELDS = (("train/loss", "loss"), ("train/acc", "train acc"), ("val/avg", "val avg"),
                ("val/unbiased", "unbiased"), ("val/worst_group", "worst-group"))


def on_terminal() -> bool:
    """Whether stderr is a terminal (bars redraw there; elsewhere only whole lines are written)."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False


# Ours: a heartbeat line at least this often while work goes on. Its promise is a line every 15 s; the 5 s left are
# for a thread woken late on a loaded machine (two busy processes per core delayed wake-ups by up to seconds).
HEARTBEAT_S = 10.0

# The running stage's heartbeat (stage_heartbeat): say() tells it a line was written.
_stage_beat: Heartbeat | None = None


def is_main() -> bool:
    """Rank 0 of a ``torchrun`` job, or the only process (imported here: the distributed module imports torch, which
    a sweep's or compare's heartbeat does not need)."""
    from debias.core import distributed

    return distributed.is_main()


def say(line: str) -> None:
    """Write one line to stderr (rank 0 only), through tqdm so that a bar on screen is redrawn below it."""
    if is_main():
        tqdm.write(line, file=sys.stderr)
        sys.stderr.flush()
        if _stage_beat is not None:
            _stage_beat.said()


class Heartbeat:
    """While open (a context manager), a daemon thread writes ``describe()`` whenever ``interval`` seconds (default
    :data:`HEARTBEAT_S`) passed since the last line (this one's, or one :meth:`said` marks); :meth:`tick` is that
    check, once. ``clock`` is read for every check (a test passes its own). A ``describe`` that raises is reported
    in the line, never fatal."""

    def __init__(self, describe: Callable[[], str], interval: float | None = None,
                 write: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.describe, self.clock = describe, clock
        self.interval = HEARTBEAT_S if interval is None else interval
        self.write = write or (lambda line: print(line, flush=True))
        self.last = clock()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    def said(self) -> None:
        """A line was written elsewhere: the next heartbeat is due ``interval`` from now."""
        self.last = self.clock()

    def say(self, line: str) -> None:
        """Write ``line`` (one writer at a time with the heartbeat) and count it as said."""
        with self.lock:
            self.write(line)
            self.last = self.clock()

    def tick(self) -> bool:
        """Write the description if ``interval`` passed since the last line; whether it did."""
        if self.clock() - self.last < self.interval:
            return False
        try:
            line = self.describe()
        except Exception as exc:  # a progress file half-written, a race: say so and keep beating
            line = f"still working (progress unreadable: {type(exc).__name__}: {str(exc)[:200]})"
        self.say(line)
        return True

    def _beat(self) -> None:
        while not self.stopped.wait(min(1.0, self.interval / 4)):
            self.tick()

    def __enter__(self) -> Heartbeat:
        self.last = self.clock()
        self.thread = threading.Thread(target=self._beat, name="debias-heartbeat", daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)


class StageActivity:
    """What a stage is doing, in words, for its heartbeat: told by :class:`TerminalReporter` (a step begun or ended,
    a loop's count, an epoch ended with its ETA)."""

    def __init__(self, label: str, clock: Callable[[], float] = time.monotonic, age: float = 0.0) -> None:
        self.label, self.clock = label, clock
        self.started = clock() - age  # ``age``: seconds the stage's process ran before this (its imports)
        self.doing = "starting (params, checks, MLflow run)"
        self.eta_at: float | None = None  # when the training is expected to end (clock time)

    def set(self, doing: str, eta: float | None = None) -> None:
        self.doing = doing
        self.eta_at = None if eta is None else self.clock() + eta

    def line(self) -> str:
        """``'[train_erm] still working: epoch 3/20 done; ETA 1 min 05 s; 45 s since the stage started'``."""
        now = self.clock()
        eta = "" if self.eta_at is None else f"; ETA {duration(max(0.0, self.eta_at - now))}"
        elapsed = duration(now - self.started)
        return f"[{self.label}] still working: {self.doing}{eta}; {elapsed} since the stage started"


@contextlib.contextmanager
def stage_heartbeat(label: str, interval: float | None = None) -> Iterator[StageActivity]:
    """A heartbeat for the stage ``label`` while the block runs (rank 0 only): a line on stderr whenever the stage
    said nothing for ``interval`` seconds. Yields the :class:`StageActivity` its reporter keeps current."""
    global _stage_beat
    activity = StageActivity(label, age=stage_age())
    if not is_main():
        yield activity
        return
    previous = _stage_beat
    with Heartbeat(activity.line, interval, write=lambda line: say(line)) as beat:
        _stage_beat = beat
        try:
            yield activity
        finally:
            _stage_beat = previous


def process_age(pid: int) -> float | None:
    """Seconds since process ``pid`` started (its start in clock ticks since boot, ``/proc/<pid>/stat``, against
    ``/proc/uptime``); None where that cannot be read."""
    import os
    from pathlib import Path

    try:
        start_ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return max(0.0, uptime - start_ticks / os.sysconf("SC_CLK_TCK"))


def stage_age() -> float:
    """Seconds since the stage's command started: its launcher's process (``DEBIAS_LAUNCHER_PID``, which the fork
    server's stage stands in for) or this one; its imports and checks count, as a user waiting for it sees them."""
    import os

    from debias.harness.forkserver.protocol import LAUNCHER_VARIABLE

    launcher = os.environ.get(LAUNCHER_VARIABLE, "")
    pid = int(launcher) if launcher.isdigit() else os.getpid()
    return process_age(pid) or process_age(os.getpid()) or 0.0


def duration(seconds: float) -> str:
    """``'0.4 s'``, ``'12 s'``, ``'3 min 41 s'``, ``'2 h 05 min'``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def epoch_line(label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str], seconds: float,
               eta: float | None) -> str:
    """``'[train_erm] epoch 2 (3/20): loss 0.4123, train acc 0.812, val avg 0.790, unbiased 0.741, worst-group 0.600
    (12 s; ETA 3 min 41 s)'``: the epoch index as the metrics and the selection name it (from 0), then how many
    of ``epochs`` are done; fields absent from ``metrics`` are left out."""
    shown = [f"{name} {metrics[key]}" if isinstance(metrics[key], str)  # e.g. "worst-group needs bias labels"
             else f"{name} {metrics[key]:.4f}" if key == "train/loss" else f"{name} {metrics[key]:.3f}"
             for key, name in EPOCH_FIELDS if metrics.get(key) is not None]
    timing = duration(seconds) + ("" if eta is None else f"; ETA {duration(eta)}")
    return f"[{label}] epoch {epoch} ({epoch + 1}/{epochs}): {', '.join(shown)} ({timing})"


class TerminalReporter:
    """The stage harness's :class:`debias.core.progress.Reporter`: a bar per task on a terminal (cleared when the task
    ends; nothing in a log), a line per timed step and per training epoch (rank 0 only). Returns None everywhere."""

    def __init__(self, activity: StageActivity | None = None) -> None:
        self.bars: dict[str, Any] = {}
        self.activity = activity  # kept current for the stage's heartbeat

    def advance(self, task: str, done: int, total: int, unit: str) -> None:
        if self.activity is not None:
            self.activity.set(f"{task} {done}/{total} {unit}")
        if not (on_terminal() and is_main()):
            return
        bar = self.bars.get(task)
        if bar is None:
            bar = self.bars[task] = tqdm(desc=task, total=total, unit=unit, leave=False, file=sys.stderr,
                                         mininterval=0.5, dynamic_ncols=True)
        bar.update(done - bar.n)
        if done >= total:
            self.bars.pop(task).close()

    def step_started(self, label: str, what: str) -> None:
        if self.activity is not None:
            self.activity.set(what)

    def step_ended(self, label: str, what: str, seconds: float) -> None:
        if self.activity is not None:
            self.activity.set(f"{what} done after {duration(seconds)}; the next step")
        say(f"[{label}] {what}: {duration(seconds)}")

    def epoch_ended(self, label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str], seconds: float,
                    eta: float | None) -> None:
        if self.activity is not None:
            self.activity.set(f"epoch {epoch + 1}/{epochs} done" + (", training the next" if epoch + 1 < epochs
                                                                      else ", finishing"), eta)
        say(epoch_line(label, epoch, epochs, metrics, seconds, eta))

    def close(self) -> None:
        """Clear the bars of tasks that did not end (a stage that failed inside a loop)."""
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
