"""Progress on stderr: one line per training epoch, bars for long loops, a line per timed step.

Research code reports progress through :mod:`debias.core.progress`; the stage harness installs
:class:`TerminalReporter` (:func:`debias.harness.stage.main`), which shows it here.

Readable in both places a stage's output goes: under a terminal (stderr a TTY) the bars (tqdm) redraw in place
and are cleared when done; anywhere else (``dvc repro`` piped to a log, a queue worker, a SLURM job) the bars
are off and only whole lines are written, so a log holds no carriage returns and no per-batch lines. Only rank 0
of a ``torchrun`` job writes. Every line starts with ``[stage]`` like the stages' other messages.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from tqdm.auto import tqdm

from debias.core import distributed

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


def say(line: str) -> None:
    """Write one line to stderr (rank 0 only), through tqdm so that a bar on screen is redrawn below it."""
    if distributed.is_main():
        tqdm.write(line, file=sys.stderr)
        sys.stderr.flush()


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

    def __init__(self) -> None:
        self.bars: dict[str, Any] = {}

    def advance(self, task: str, done: int, total: int, unit: str) -> None:
        if not (on_terminal() and distributed.is_main()):
            return
        bar = self.bars.get(task)
        if bar is None:
            bar = self.bars[task] = tqdm(desc=task, total=total, unit=unit, leave=False, file=sys.stderr,
                                         mininterval=0.5, dynamic_ncols=True)
        bar.update(done - bar.n)
        if done >= total:
            self.bars.pop(task).close()

    def step_ended(self, label: str, what: str, seconds: float) -> None:
        say(f"[{label}] {what}: {duration(seconds)}")

    def epoch_ended(self, label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str], seconds: float,
                    eta: float | None) -> None:
        say(epoch_line(label, epoch, epochs, metrics, seconds, eta))

    def close(self) -> None:
        """Clear the bars of tasks that did not end (a stage that failed inside a loop)."""
        for bar in self.bars.values():
            bar.close()
        self.bars.clear()
