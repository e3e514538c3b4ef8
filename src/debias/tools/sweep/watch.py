"""What a running sweep says while nothing finishes: a line at least every 15 s (:class:`SweepWatch` under a
:class:`debias.harness.progress.Heartbeat`) naming each running run with its stage, its epoch and that stage's ETA,
read from the output the runs already write (DVC's ``Running stage '...'`` lines and the stages' epoch and
heartbeat lines in a queue task's log, a shared upstream run's log, a SLURM task's log), and the sweep's ETA from
the experiments finished so far. Only files are read here (never ``dvc``), so a line never waits on a slow command."""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from debias.harness.progress import duration

STAGE_LINE = re.compile(r"^Running stage '([^']+)'")
SKIPPED_LINE = re.compile(r"^Stage '([^']+)' (?:is cached|didn't change)")
# a stage's own lines: "[train_erm] epoch 2 (3/20): ... (12 s; ETA 3 min 41 s)" and its heartbeat's
EPOCH_LINE = re.compile(r"^\[([\w.-]+)\] epoch \d+ \((\d+)/(\d+)\):")
ETA_PART = re.compile(r"ETA ((?:\d+ h )?(?:\d+ min )?\d+(?:\.\d)? s|\d+ h \d+ min)")
TAIL_BYTES = 64_000  # how much of a log's end is read: its last stage and epoch lines are there


@dataclass
class RunProgress:
    """Where one run stands, from its log: the stage running (None before the first), the epoch reached of that
    stage (``done`` of ``total``) and the ETA that stage last printed, as seconds from when it was printed."""

    stage: str | None = None
    done: int | None = None
    total: int | None = None
    eta_s: float | None = None

    def text(self, age_s: float = 0.0) -> str:
        """``'train_contrastive epoch 2/3 (ETA 12 s)'``, ``'linear_probe'``, ``'starting'``; ``age_s``: how long
        ago the log was last written (taken off the ETA)."""
        if self.stage is None:
            return "starting"
        shown = self.stage
        if self.done is not None:
            shown += f" epoch {self.done}/{self.total}"
        if self.eta_s is not None:
            shown += f" (ETA {duration(max(0.0, self.eta_s - age_s))})"
        return shown


def seconds(text: str) -> float:
    """``'3 min 41 s'`` -> 221.0, ``'2 h 05 min'`` -> 7500.0 (what :func:`debias.harness.progress.duration` writes)."""
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?) (h|min|s)", text):
        total += float(number) * {"h": 3600, "min": 60, "s": 1}[unit]
    return total


def parse_progress(text: str) -> RunProgress:
    """The last stage DVC ran in ``text`` (a run's output) and that stage's last epoch and ETA."""
    found = RunProgress()
    for line in text.splitlines():
        line = line.strip()
        started = STAGE_LINE.match(line)
        if started:
            found = RunProgress(started.group(1))
            continue
        skipped = SKIPPED_LINE.match(line)
        if skipped and skipped.group(1) == found.stage:  # not running it after all
            found = RunProgress()
            continue
        if found.stage is None or not line.startswith(f"[{found.stage}]"):
            continue
        epoch = EPOCH_LINE.match(line)
        if epoch:
            found.done, found.total = int(epoch.group(2)), int(epoch.group(3))
        eta = ETA_PART.search(line)
        if eta:
            found.eta_s = seconds(eta.group(1))
    return found


def read_progress(log: Path | None) -> tuple[RunProgress, float]:
    """The progress in the end of file ``log`` and how long ago it was last written (a missing log: starting)."""
    if log is None:
        return RunProgress(), 0.0
    try:
        with open(log, "rb") as handle:
            size = handle.seek(0, 2)
            handle.seek(max(0, size - TAIL_BYTES))
            text = handle.read().decode(errors="replace")
        age = max(0.0, time.time() - log.stat().st_mtime)
    except OSError:
        return RunProgress(), 0.0
    return parse_progress(text), age


def sweep_eta(durations: list[float], running_ages: list[float], remaining: int, workers: int) -> float | None:
    """Seconds left for the ``remaining`` runs not finished (those running, of ages ``running_ages``, included) at
    the mean of the finished runs' own ``durations``, ``workers`` at a time: the work left shared out, but never
    less than the slowest running run's rest; None before a run finished. (Time since the phase started over the
    runs done counted the first run's start-up and its workers' parallel runs as its own: 37 min, where 9 were left.)"""
    if not durations:
        return None
    if remaining <= 0:
        return 0.0
    mean = sum(durations) / len(durations)
    left = [max(0.0, mean - age) for age in running_ages]
    work = (remaining - len(running_ages)) * mean + sum(left)
    return max(work / max(1, workers), max(left, default=0.0))


class SweepWatch:
    """The sweep's state as its waiting loop last saw it (what it does, the runs running and their logs, counts),
    and :meth:`line`, the heartbeat's description of it. The loop sets; the heartbeat thread reads."""

    def __init__(self, label: str = "sweep", started: float | None = None) -> None:
        self.label = label
        self.started = time.time() if started is None else started
        self.lock = threading.Lock()
        self.doing = "starting"
        self.logs: dict[str, Path | None] = {}  # running run -> its log
        self.counts = ""  # e.g. "2/6 experiments done, 2 running, 2 queued"
        self.done, self.total, self.phase_started, self.what = 0, 0, self.started, "the sweep"
        self.workers = 1  # runs at once in this phase
        self.run_started: dict[str, float] = {}  # running run -> when it was first seen running
        self.durations: list[float] = []  # the finished runs' own durations, this phase
        self.beat: Any = None  # the Heartbeat writing this watch's lines, once one runs (:meth:`say` goes through it)

    def say(self, line: str) -> None:
        """Write ``line`` (through the heartbeat, one writer at a time, counting as a line said)."""
        if self.beat is not None:
            self.beat.say(line)
        else:
            print(line, flush=True)

    def phase(self, doing: str, total: int = 0, what: str = "the experiments", workers: int = 1) -> None:
        """A new phase (shared upstream, the experiments): its words, how many runs it has, ``workers`` at a time,
        and what its ETA is of."""
        with self.lock:
            self.doing, self.total, self.done, self.phase_started, self.what = doing, total, 0, time.time(), what
            self.logs, self.counts, self.workers, self.run_started, self.durations = {}, "", workers, {}, []

    def _running(self, names: set[str], now: float) -> None:
        """Note the runs that started (first seen) and those that ended (their durations), ``names`` running now."""
        for name in names - set(self.run_started):
            self.run_started[name] = now
        for name in set(self.run_started) - names:
            self.durations.append(now - self.run_started.pop(name))

    def update(self, doing: str | None = None, logs: dict[str, Path | None] | None = None, counts: str | None = None,
               done: int | None = None) -> None:
        with self.lock:
            if doing is not None:
                self.doing = doing
            if logs is not None:
                self.logs = dict(logs)
                self._running(set(self.logs), time.time())
            if counts is not None:
                self.counts = counts
            if done is not None:
                self.done = done

    def started_run(self, name: str, log: Path | None) -> None:
        with self.lock:
            self.logs[name] = log
            self._running(set(self.logs), time.time())

    def ended_run(self, name: str) -> None:
        with self.lock:
            self.logs.pop(name, None)
            self._running(set(self.logs), time.time())

    def line(self, now: float | None = None) -> str:
        """``'[sweep] 2/6 experiments done, 2 running, 2 queued; eps-epsilon0-seed1: train_contrastive epoch 2/3
        (ETA 12 s), ...; 95 s since the start, ETA of the experiments 3 min 10 s'``."""
        now = time.time() if now is None else now
        with self.lock:
            doing, logs, counts = self.doing, dict(self.logs), self.counts
            done, total, what, workers = self.done, self.total, self.what, self.workers
            durations, ages = list(self.durations), [now - t for t in self.run_started.values()]
        runs = []
        for name, log in sorted(logs.items()):
            progress, age = read_progress(log)
            runs.append(f"{name}: {progress.text(age)}")
        eta = sweep_eta(durations, ages, total - done, workers)
        parts = [counts or doing, *(["running " + ", ".join(runs)] if runs else []),
                 f"{duration(now - self.started)} since the start"
                 + ("" if eta is None else f", ETA of {what} {duration(eta)}")]
        return f"[{self.label}] " + "; ".join(parts)
