"""A training step launched once: captured as a CUDA graph and replayed (``stage2.speed.step`` or ``erm.step``:
``cuda_graph``), and the
eager step every other setting (and the CPU) runs.

A capturable task splits its step in two (:class:`SplitStep`):

- ``step_inputs(index) -> dict[str, Tensor]``: what differs from one step to the next: the batch's indices and the
  random draws of its augmentation (drawn on the host from the task's generator, so the same numbers on every device,
  and copied to the device without a sync);
- ``step_compute(inputs) -> dict[str, Tensor]``: the device work of the step: gather, forward, loss, backward,
  optimiser step. It reads nothing but ``inputs`` and tensors the task holds at fixed addresses (modules, optimiser
  state, training data, state it updates in place), never reads a value back to the host, and returns the step's
  scalars (``loss`` among them) as device tensors.

:class:`EagerStep` runs ``step_compute(inputs)``: the default, and the CPU path. :class:`CapturedStep` keeps one slot
per input signature (the names, shapes and dtypes of the inputs; an epoch has at most two: full batches and its odd
last batch, :func:`~debias.training.loop.cut_batches`). A slot's first ``warmup`` calls run eagerly (on a side stream:
torch's CUDA-graph docs warm up there before capture; lazy initialisation such as optimiser state and library handles
happens then), the next call captures ``step_compute`` on static copies of the inputs into a ``torch.cuda.CUDAGraph``
(capture runs nothing) and replays it; every later call copies its inputs into the slot's static buffers, replays,
and returns clones of the static outputs (the next replay overwrites them). Each slot's graph has its own memory pool
(torch's default), so graphs of different signatures never share memory they read.

Requirements of the captured path, enforced by :func:`check_capturable` (a ``ParamsError`` naming
``stage2.speed.step``): a CUDA device; a method whose registry entry declares its step capturable
(``MethodSpec.capturable``); one process (no ``torchrun``: the ranks' collectives are not captured); the training split
held on the device (:func:`~debias.training.loop.fits_on_device`); no bf16 autocast nor compiled encoder (autocast's
weight-cast cache under capture gives other results, pytorch/pytorch#71631; compile is not combined, untested). The
optimiser is built graph-safe (:func:`debias.training.loop.build_optimizer` with ``graph_device``): the learning rate
a 0-dim tensor on the device, so a scheduler's ``fill_`` reaches the graph, Adam with ``capturable=True``, SGD with
``fused=True`` (the implementation that takes a tensor learning rate without reading it back).

On the CPU :class:`CapturedStep` with ``capture=False`` runs the same slots and static buffers without a graph:
``step_compute`` on the static inputs, its results copied into static outputs, clones returned: the buffer discipline
(inputs copied in every step, one slot per signature, outputs cloned) is tested there (tests/test_captured_step.py).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from debias.core.errors import ParamsError
from debias.params.optim import CUDA_GRAPH, EAGER, capture_problems  # noqa: F401 (EAGER, CUDA_GRAPH: re-exported)
from debias.data.augment import shift_draws

StepInputs = dict[str, torch.Tensor]
StepOutputs = dict[str, torch.Tensor]
Compute = Callable[[StepInputs], StepOutputs]

# stage2.speed.step values
STEP_MODES = (EAGER, CUDA_GRAPH)

# Eager calls of a slot before its capture: torch's CUDA-graph docs ("Whole-network capture") warm up 3 iterations
# on a side stream before capturing; lazy initialisation (optimiser state, cuBLAS handles, autograd's streams) happens
# in the first, the other two follow the documented recipe.
WARMUP_STEPS = 3


def shift_inputs(index: torch.Tensor, images: torch.Tensor, max_shift: int, generator: torch.Generator) -> StepInputs:
    """A step's inputs: the batch's ``index`` and, where ``images`` (the training data) are shifted by up to
    ``max_shift`` pixels, the offsets ``dy``, ``dx`` drawn from ``generator`` (:func:`~debias.data.augment.shift_draws`)
    and copied without a sync to ``images``' device."""
    draws = shift_draws((len(index), *images.shape[1:]), max_shift, generator)
    if draws is None:
        return {"index": index}
    return {"index": index, "dy": draws[0].to(images.device, non_blocking=True),
            "dx": draws[1].to(images.device, non_blocking=True)}


class SplitStep(Protocol):
    """A task whose step is ``step_compute(step_inputs(index))`` (see the module docstring)."""

    def step_inputs(self, index: torch.Tensor) -> StepInputs: ...

    def step_compute(self, inputs: StepInputs) -> StepOutputs: ...


class EagerStep:
    """``step_compute(inputs)``, launched op by op: the default, and the only path on the CPU."""

    def __init__(self, compute: Compute) -> None:
        self.compute = compute

    def __call__(self, inputs: StepInputs) -> StepOutputs:
        return self.compute(inputs)


def signature(inputs: StepInputs) -> tuple:
    """What a captured graph is specific to: each input's name, shape and dtype."""
    return tuple((name, tuple(t.shape), t.dtype) for name, t in sorted(inputs.items()))


@dataclass
class Slot:
    """One input signature's static buffers and graph (None on the CPU, or before capture)."""

    calls: int = 0
    inputs: StepInputs = field(default_factory=dict)
    outputs: StepOutputs = field(default_factory=dict)
    graph: Any = None  # torch.cuda.CUDAGraph once captured


class CapturedStep:
    """``step_compute`` captured once per input signature and replayed (see the module docstring).

    ``capture``: a CUDA graph (CUDA only); ``False`` runs the static buffers without a graph (the CPU check of the
    mechanism). ``warmup``: eager calls of each slot before its capture (:data:`WARMUP_STEPS`)."""

    def __init__(self, compute: Compute, device: torch.device, capture: bool = True,
                 warmup: int = WARMUP_STEPS) -> None:
        if capture and device.type != "cuda":
            raise ParamsError(f"a step of {CUDA_GRAPH} (stage2.speed.step, erm.step) needs a CUDA device; this run trains on "
                              f"{device.type}; allowed there: {EAGER}")
        if warmup < 1:
            raise ValueError(f"warmup = {warmup}: a slot needs at least one eager call before its capture "
                             "(lazy initialisation must not happen during capture)")
        self.compute, self.device, self.capture, self.warmup = compute, device, capture, warmup
        self.slots: dict[tuple, Slot] = {}
        self.stream = torch.cuda.Stream(device) if capture else None  # warm-up and capture, as torch's docs

    @property
    def graphs(self) -> int:
        """How many graphs (or, on the CPU, static slots) have been built."""
        return sum(1 for slot in self.slots.values() if slot.outputs)

    def __call__(self, inputs: StepInputs) -> StepOutputs:
        slot = self.slots.setdefault(signature(inputs), Slot())
        slot.calls += 1
        if slot.calls <= self.warmup:
            return self._eager(inputs)
        if not slot.inputs:
            slot.inputs = {name: torch.empty_like(t) for name, t in inputs.items()}
        for name, t in inputs.items():
            slot.inputs[name].copy_(t, non_blocking=True)
        if self.capture:
            if slot.graph is None:
                self._capture(slot)
            slot.graph.replay()
        else:
            results = self.compute(slot.inputs)
            if not slot.outputs:
                slot.outputs = {name: torch.empty_like(t) for name, t in results.items()}
            for name, t in results.items():
                slot.outputs[name].copy_(t.detach())
        return {name: t.clone() for name, t in slot.outputs.items()}

    def _eager(self, inputs: StepInputs) -> StepOutputs:
        if not self.capture:
            return self.compute(inputs)
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)
        with torch.cuda.stream(self.stream), warnings.catch_warnings():
            # Adam(capturable=True) warns once when it steps outside a graph: the warm-up steps do, on purpose
            warnings.filterwarnings("ignore", message=".*capturable=True.*")
            outputs = self.compute(inputs)
        current.wait_stream(self.stream)
        for t in outputs.values():
            t.record_stream(current)  # made on the side stream, read on the current one
        return outputs

    def _capture(self, slot: Slot) -> None:
        graph = torch.cuda.CUDAGraph()
        current = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(current)  # the static inputs' copies first
        with torch.cuda.graph(graph, stream=self.stream):
            slot.outputs = self.compute(slot.inputs)
        current.wait_stream(self.stream)
        slot.graph = graph


StepRunner = Callable[[StepInputs], StepOutputs]


def step_runner(mode: str, compute: Compute, device: torch.device) -> StepRunner:
    """The runner of ``mode`` (``stage2.speed.step``, ``erm.step``; :data:`STEP_RUNNERS`) for a task's
    ``step_compute`` on ``device``."""
    if mode not in STEP_RUNNERS:
        raise ParamsError(f"step = '{mode}' (stage2.speed.step, erm.step); allowed: {', '.join(STEP_RUNNERS)}")
    return STEP_RUNNERS[mode](compute, device)


# stage2.speed.step / erm.step -> the runner of a task's step
STEP_RUNNERS: dict[str, Callable[[Compute, torch.device], StepRunner]] = {
    EAGER: lambda compute, device: EagerStep(compute),
    CUDA_GRAPH: lambda compute, device: CapturedStep(compute, device),
}


def check_capturable(key: str, mode: str, method: str, capturable: bool, reason: str, device: torch.device,
                     world_size: int, data_on_device: bool, autocast: str = "none", compiled: bool = False) -> None:
    """Refuse ``key = cuda_graph`` (``stage2.speed.step``, ``erm.step``) where the step cannot be captured, saying why
    and what is allowed (see the module docstring); nothing for ``eager``."""
    if mode == EAGER:
        return
    problems = capture_problems(method, capturable, reason, autocast, compiled)
    if device.type != "cuda":
        problems.append(f"this run trains on {device.type}, and a CUDA graph needs a CUDA device")
    if world_size > 1:
        problems.append(f"{world_size} ranks (torchrun): the ranks' collectives are not captured")
    if not data_on_device:
        problems.append("the training split does not fit in the device's memory (loop.RESIDENT_FRACTION), so "
                        "its batches are gathered on the host")
    if problems:
        raise ParamsError(f"{key} = {mode} cannot run: {'; '.join(problems)}; allowed: {EAGER} "
                          f"(the default)")
