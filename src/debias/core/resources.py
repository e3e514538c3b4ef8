"""Will a training step fit in memory? The plan a method declares, and the check the harness runs before training.

A stage-2 method declares one training step as a :class:`StepPlan` (how many images it forwards at once and which
param sets that number, :attr:`debias.training.methods.registry.MethodSpec.memory_plan`). Before the first epoch
training calls :func:`check_classifier_fits` (ERM, JTT, stage-2 ERM) or :func:`check_stage2_fits` (the method's
plan); each hands its facts to the :class:`MemoryCheck` installed with :func:`checking` (the stage harness installs
:data:`debias.harness.memory.CHECK`, which estimates the step and raises :class:`~debias.core.errors.ResourceError`
naming the param to lower when it does not fit). A check returns None and nothing comes back from it: it either
lets training start, unchanged, or stops it. With none installed (a test calling training directly) nothing is
checked.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # a method's declaration imports StepPlan: this module stays free of torch
    import torch
    from torch import nn


@dataclass(frozen=True)
class StepPlan:
    """How many images one training step forwards at once, and which param sets it.

    ``images = value * images_per_unit * forwards`` (value capped at ``max_value``); the loss
    keeps ``pairwise`` float matrices of side ``value * images_per_unit`` (contrastive losses).
    ``ranks`` processes share a step (each forwards ``ceil(images / ranks)``, every one keeps the
    whole pairwise matrices); ``copies`` of those processes share this device's memory.
    """

    key: str
    value: int
    images_per_unit: int = 1
    forwards: int = 1
    max_value: int | None = None
    pairwise: int = 0
    ranks: int = 1
    copies: int = 1
    hint: str = ""  # appended to the advice when even value 1 does not fit (what else sets the step's size)


class MemoryCheck(Protocol):
    """Checks a training step before training starts; returns None or raises ResourceError."""

    def classifier(self, model: nn.Module, optimizer: torch.optim.Optimizer, model_name: str, prefix: str,
                   batch_size: int, eval_batch_size: int, n_train: int, n_eval: int,
                   image_shape: tuple[int, ...], device: torch.device) -> None:
        """A classifier's step: ``<prefix>.batch_size`` images per step, ``<prefix>.eval_batch_size`` per batch."""

    def stage2(self, method: str, networks: list[nn.Module], optimizer: torch.optim.Optimizer, params: Any,
               n_train: int, n_eval: int, image_shape: tuple[int, ...], device: torch.device) -> None:
        """The step of ``stage2.method`` as its declaration plans it."""


_installed: MemoryCheck | None = None


@contextlib.contextmanager
def checking(check: MemoryCheck | None) -> Iterator[None]:
    """Run the checks made inside the block with ``check`` (None: none); the previous one afterwards."""
    global _installed
    previous, _installed = _installed, check
    try:
        yield
    finally:
        _installed = previous


def check_classifier_fits(model: nn.Module, optimizer: torch.optim.Optimizer, model_name: str, prefix: str,
                          batch_size: int, eval_batch_size: int, n_train: int, n_eval: int,
                          image_shape: tuple[int, ...], device: torch.device) -> None:
    """Check a classifier's training step and evaluation batch with the installed check (none: nothing)."""
    if _installed is not None:
        _installed.classifier(model, optimizer, model_name, prefix, batch_size, eval_batch_size, n_train, n_eval,
                              image_shape, device)


def check_stage2_fits(method: str, networks: list[nn.Module], optimizer: torch.optim.Optimizer, params: Any,
                      n_train: int, n_eval: int, image_shape: tuple[int, ...], device: torch.device) -> None:
    """Check the step of ``stage2.method`` with the installed check (none: nothing)."""
    if _installed is not None:
        _installed.stage2(method, networks, optimizer, params, n_train, n_eval, image_shape, device)
