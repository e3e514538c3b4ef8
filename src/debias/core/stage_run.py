"""The handle a stage's body logs through: what research code may call on the stage's run, and nothing else.

The stage harness opens one MLflow run per stage and hands the body an object with these methods
(:class:`debias.harness.tracking.StageRun` implements them; a no-op one where tracking is off). Research code
reads no result of them: logging records what a stage computed and never feeds a value back into it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol


class StageRun(Protocol):
    """Where a stage logs its metrics, files, model, warnings and run-record notes."""

    def log_metrics(self, values: dict[str, float | str | None], step: int | None = None) -> None:
        """Record scalar metrics (at ``step``: a curve)."""

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        """Record a file the stage wrote."""

    def log_model(self, model: Any, name: str | None = None, checkpoint: str | Path | None = None,
                  input_example: Any = None) -> object:
        """Record a trained network with its checkpoint and an input example (what it returns is never read)."""

    def log_warnings(self, warnings: list[str]) -> None:
        """Record the training-health warnings of the stage."""

    def note(self, key: str, value: Any) -> None:
        """Keep a fact for the stage's run record."""
