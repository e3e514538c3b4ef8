"""Progress as a side channel: research code reports how far it has come; whoever runs it decides what to show.

A loop iterates over its own plain range or list and, after each item, calls :func:`advance`; a long step runs
under :func:`step` (reported as it begins and when it ends); a training loop calls :func:`epoch` after each epoch with the epoch's metrics. Each call hands
its facts to the :class:`Reporter` installed with :func:`reporting` (the stage harness installs the one that
writes to stderr, :class:`debias.harness.progress.TerminalReporter`) and returns None; with none installed it does
nothing. No value ever comes back from a reporter into the code that reports, so what a stage computes is the same
with any reporter or none, and the reporter is not a dependency of any stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Mapping
from typing import Protocol


class Reporter(Protocol):
    """Receives progress; every method returns None (its result is never read)."""

    def advance(self, task: str, done: int, total: int, unit: str) -> None:
        """``done`` of ``total`` items of ``task`` are finished (``done == total``: the task ended)."""

    def step_started(self, label: str, what: str) -> None:
        """The step ``what`` of stage ``label`` began (optional: a reporter without it is not told)."""

    def step_ended(self, label: str, what: str, seconds: float) -> None:
        """The step ``what`` of stage ``label`` finished after ``seconds``."""

    def epoch_ended(self, label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str],
                    seconds: float, eta: float | None) -> None:
        """Epoch ``epoch`` (from 0) of ``epochs`` ended with ``metrics`` after ``seconds``; ``eta``: seconds left."""


_installed: Reporter | None = None


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Send the reports made inside the block to ``reporter`` (None: to no one); the previous one afterwards."""
    global _installed
    previous, _installed = _installed, reporter
    try:
        yield
    finally:
        _installed = previous


def advance(task: str, done: int, total: int, unit: str = "it") -> None:
    """Report that ``done`` of ``total`` items of ``task`` are finished."""
    if _installed is not None:
        _installed.advance(task, done, total, unit)


@contextlib.contextmanager
def step(label: str, what: str) -> Iterator[None]:
    """Report the step ``what`` of ``label`` as it begins (to a reporter that listens for it), time the block and
    report it when it ends (nothing when it fails)."""
    started = time.monotonic()
    begun = getattr(_installed, "step_started", None)
    if begun is not None:
        begun(label, what)
    yield
    if _installed is not None:
        _installed.step_ended(label, what, time.monotonic() - started)


def epoch(label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str], seconds: float,
          eta: float | None) -> None:
    """Report an ended training epoch (a copy of ``metrics``: the reporter cannot change the caller's)."""
    if _installed is not None:
        _installed.epoch_ended(label, epoch, epochs, dict(metrics), seconds, eta)
