"""What every stage-2 method's training code shares: its inputs, its setup, and the helpers the families use.

A method's ``setup(inputs: Stage2Inputs) -> Stage2Setup`` is named by its declaration
(:mod:`debias.training.methods.registry`, which also holds :class:`MethodSpec`: whether its linear head is trained
with cross-entropy together with the encoder, which temperature param it reads, the feature activation its
paper's encoder ends in, its params section, memory plan and the params that apply to it).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from debias.core import distributed, progress
from debias.data.augment import shifted
from debias.data.store import BiasedSplit
from debias.models import Network, build_model
from debias.params import Params, SpeedParams
from debias.training.captured import (CUDA_GRAPH, EAGER, EagerStep, StepInputs, StepOutputs, StepRunner, shift_inputs,
                                      check_capturable, step_runner)
from debias.training.methods.registry import METHODS, MethodSpec, head_trained_methods, method_spec  # noqa: F401
from debias.training.loop import (GeneratorTask, StepMetrics, build_optimizer, build_scheduler, cut_batches,
                                  device_batches, fits_on_device, gather_rows, on_device, to_device)  # noqa: F401  (the last three: methods' helpers)


@dataclass
class Stage2Inputs:
    """Everything a method may use: splits, inferred bias labels, ERM weights, params, device, RNG."""

    splits: dict[str, BiasedSplit]
    inferred: torch.Tensor  # inferred bias label per training point
    minority: torch.Tensor  # bool: inferred minority per training point
    erm_state: dict[str, torch.Tensor] | None
    params: Params
    device: torch.device
    generator: torch.Generator
    inferred_group: torch.Tensor | None = None  # int64 [N] group per training point (groups table; GroupDRO)
    bias_scores: torch.Tensor | None = None  # float [N, K] soft bias scores (groups.method soft; FairKL)


History = list[dict[str, float]]  # fit's per-epoch metrics


def _nothing(history: History) -> dict[str, Any]:
    return {}


def _no_warnings(history: History) -> list[str]:
    return []


@dataclass
class Stage2Setup:
    task: Any  # a training.loop.Task
    model: Network
    optimizer: torch.optim.Optimizer
    scheduler: Any | None
    report: Callable[[History], dict[str, Any]] = _nothing  # method facts for stage2_train_info.json, after training
    warnings: Callable[[History], list[str]] = _no_warnings  # the method's own warnings (debias.core.health), after training


MethodFn = Callable[[Stage2Inputs], Stage2Setup]


def setup_method(inputs: Stage2Inputs) -> Stage2Setup:
    """Build the task of ``stage2.method`` from the registry, its step run by ``stage2.speed.step``'s runner
    (:mod:`debias.training.captured`; a ``ParamsError`` before any work where the step cannot be captured)."""
    spec = method_spec(inputs.params.stage2.method)
    speed = inputs.params.stage2.speed
    check_capturable("stage2.speed.step", speed.step, spec.name, spec.capturable, spec.capture_note, inputs.device,
                     distributed.world_size(), fits_on_device(inputs.splits["train"], inputs.device), speed.autocast,
                     speed.compile)
    setup = spec.setup_fn()(inputs)
    if speed.step != EAGER:
        setup.task.runner = step_runner(speed.step, setup.task.step_compute, inputs.device)
    return setup


def fresh_model(inputs: Stage2Inputs) -> Network:
    """A freshly initialised network of ``params.model`` for the training split's classes and input shape, its feature
    layer ending in the method's activation where ``model.feature_activation`` is ``auto``."""
    train = inputs.splits["train"]
    activation = method_spec(inputs.params.stage2.method).feature_activation
    model = build_model(inputs.params.model, train.n_classes, tuple(train.x.shape[1:]), activation).to(inputs.device)
    return apply_speed(model, inputs.params.stage2.speed)


AUTOCAST_DTYPES = {"none": None, "bf16": torch.bfloat16}


def apply_speed(model: Network, speed: SpeedParams) -> Network:
    """``model`` with ``stage2.speed``'s opt-in settings: bf16 autocast of the encoder's forward, convolution weights
    channels-last, the encoder compiled in place (its parameter names, hence checkpoints, unchanged)."""
    model.autocast = AUTOCAST_DTYPES[speed.autocast]
    if speed.channels_last:
        model.to(memory_format=torch.channels_last)
    if speed.compile:
        model.encoder.compile()
    return model


def class_prior(tau_plus: float | None, n_classes: int, name: str) -> float:
    """tau+ of the debiased-negative estimators: ``tau_plus``, or ``1 / n_classes`` where it is None (DCL's class
    prior under uniform classes); ``name`` is the parameter, for the error."""
    if tau_plus is not None:
        return tau_plus
    if n_classes < 2:
        raise ValueError(f"{name} = null means 1 / number of classes, but the training split has {n_classes} class; "
                         f"set {name} in [0, 1)")
    return 1.0 / n_classes


def stage2_optimiser(inputs: Stage2Inputs, parameters: Any) -> tuple[torch.optim.Optimizer, Any | None]:
    """The optimiser and lr schedule of ``params.stage2`` over ``parameters``."""
    s2 = inputs.params.stage2
    graph_device = inputs.device if s2.speed.step == CUDA_GRAPH else None  # graph-safe (build_optimizer)
    optimizer = build_optimizer(parameters, s2.optimizer, s2.lr, s2.momentum, s2.weight_decay, graph_device)
    return optimizer, build_scheduler(optimizer, s2.lr_milestones, s2.lr_gamma)


def shuffled_batches(n: int, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Every index of ``range(n)`` once, in a random order, cut into batches (the last may be smaller; one of a
    single index joins the one before: :func:`~debias.training.loop.cut_batches`)."""
    return cut_batches(torch.randperm(n, generator=generator), batch_size)


def group_balanced_batches(groups: torch.Tensor, batch_size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """``len(groups)`` indices drawn with replacement, ``P(i) = 1 / (G n_{g(i)})`` (every group equally likely),
    cut into batches: an epoch of Sagawa et al.'s group-balanced sampling (their ``--reweight_groups``)."""
    counts = torch.bincount(groups)
    weights = 1.0 / counts[groups].double()
    return cut_batches(torch.multinomial(weights, len(groups), replacement=True, generator=generator), batch_size)


def epoch_steps(batches: list[torch.Tensor], epoch: int,
                device: torch.device | None = None) -> Iterator[tuple[int, torch.Tensor]]:
    """``(step, index)`` over an epoch's batches (moved to ``device`` at once, :func:`device_batches`), each
    reported done (:func:`debias.core.progress.advance`) when the caller asks for the next."""
    batches = batches if device is None else device_batches(batches, device)
    for step, index in enumerate(batches):
        yield step, index
        progress.advance(f"epoch {epoch}", step + 1, len(batches), unit="batch")


class StepTask(GeneratorTask):
    """A task whose epoch is ``self.batches()`` (default: one shuffled pass in ``stage2.batch_size`` batches), each
    given to ``self.step(index, step)`` (returning that step's scalars as tensors, ``loss`` among them; the index on
    the training data's device); needs ``train``, ``params``, ``generator`` and ``device``.

    ``step`` is ``self.runner(self.step_inputs(index))``: a subclass writes :meth:`step_inputs` (the batch's indices
    and host-side draws) and :meth:`step_compute` (the device work), as :mod:`debias.training.captured` describes;
    ``runner`` is :class:`~debias.training.captured.EagerStep` unless ``stage2.speed.step`` replaces it."""

    runner: StepRunner | None = None

    def batches(self) -> list[torch.Tensor]:
        return shuffled_batches(len(self.train), self.params.stage2.batch_size, self.generator)

    def step_inputs(self, index: torch.Tensor) -> StepInputs:
        """The batch's indices and its shift draws (``stage2.augment_shift``), on the training data's device."""
        return shift_inputs(index, self.train.x, self.params.stage2.augment_shift, self.generator)

    def batch_images(self, inputs: StepInputs) -> torch.Tensor:
        """The global batch's images, gathered and shifted by the drawn offsets, this rank's shard on the device."""
        index = inputs["index"]
        x = gather_rows(self.train.x, index)
        if "dy" in inputs:
            x = shifted(x, inputs["dy"], inputs["dx"], self.params.stage2.augment_shift)
        return to_device(x[distributed.shard_slice(len(index))], self.device)

    def step(self, index: torch.Tensor, step: int) -> dict[str, torch.Tensor]:
        """One training step on the rows ``index`` (``step``: its number in the epoch, unused by the device work)."""
        if self.runner is None:
            self.runner = EagerStep(self.step_compute)
        return self.runner(self.step_inputs(index))

    def train_epoch(self, epoch: int) -> dict[str, float]:
        metrics = Progress()
        for step, index in epoch_steps(self.batches(), epoch, self.train.x.device):
            values = self.step(index, step)
            metrics.watch(values["loss"], step)
            metrics.add(**values)
        return metrics.means()


def normalise(z: torch.Tensor) -> torch.Tensor:
    return F.normalize(z, dim=1)


class Progress(StepMetrics):
    """Running sums for the epoch's returned metrics, kept on the device (:class:`debias.training.loop.StepMetrics`:
    read once per epoch, never inside a step)."""
