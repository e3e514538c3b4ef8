"""The epoch loop every training stage shares: validation, selection, resumable checkpoints.

A :class:`Task` knows how to run one training epoch and holds the state that must survive
an interruption (modules, its sampler/generator). :func:`fit` runs epochs, validates after
each, keeps the selected weights (the rule of :mod:`debias.training.selection`: ``last``,
``best_worst_group``, or a label-free ``best_worst_class`` / ``best_worst_inferred_group``;
:func:`selection_score`) and describes the choice (:func:`describe_selection`: the rule,
the epoch, whether it was degenerate and why), and, after every epoch, atomically saves a resume state: modules,
optimizer, scheduler, RNG states, the task's sampler state, history and the best weights.
Rerunning after a kill continues from the last completed epoch and ends with the same
result as an uninterrupted run (CPU, same seed). The resume state is keyed by everything the
result depends on (:func:`resume_key`: the params the stage reads, the content of its training
inputs, the code version); a state saved for another key is ignored, saying which part differs; one that
lacks a part or contradicts the run (an epoch past its last, a history of another length:
:func:`resume_problem`) is ignored with a warning naming the file and what is wrong; a resume says so in
the log, and the state is deleted on success.

Divergence stops training at the end of the epoch where it happens: a task records every step's loss on the
device (:class:`StepMetrics`; no host sync inside a step) and reads it once per epoch, and ``fit`` checks the
weights after every epoch; either raises :class:`TrainingDiverged` naming the epoch, the first non-finite step
and the params to lower (``divergence_advice``).

Under ``torchrun`` (:mod:`debias.core.distributed`) every rank runs ``fit``: all ranks load the resume
state (and must agree on the epoch it resumes from), only rank 0 saves or deletes it; each
epoch's metrics are rank 0's, broadcast, so every rank takes the same selection decision, and
rank 0's weights are broadcast after validation, so the selected weights are the same on every rank.
"""

from __future__ import annotations

import copy
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from debias.core import distributed
from debias.core import progress
from debias.core.environment import numbers_environment
from debias.core.errors import TrainingDiverged
from debias.core.fingerprint import code_version, digest, tensor_digest
from debias.core.io import CorruptFileError, load_torch, save_torch
from debias.data.store import BiasedSplit
from debias.training.selection import (FRAGILE_IMAGES, RULES, SELECTION_RULES, computable_rules,  # noqa: F401
                                       describe_selection, selection_margin, selection_score,
                                       won_by_images)  # (re-exported)


class Task(Protocol):
    def modules(self) -> dict[str, nn.Module]: ...

    def train_epoch(self, epoch: int) -> dict[str, float]: ...

    def extra_state(self) -> dict[str, Any]: ...

    def load_extra_state(self, state: dict[str, Any]) -> None: ...


# The training split is held on an accelerator when it takes at most this fraction of the device's memory (ours, a
# safety margin, not measured: the 54k Fashion-MNIST digits take 42 MB of 80 GB; full-size CelebA images would not);
# a larger split stays in host memory and each batch is copied after its gather.
RESIDENT_FRACTION = 0.25


def fits_on_device(split: BiasedSplit, device: torch.device) -> bool:
    """Whether ``split``'s tensors take at most ``RESIDENT_FRACTION`` of ``device``'s memory (CUDA; elsewhere: yes)."""
    if device.type != "cuda":
        return True
    size = sum(t.numel() * t.element_size() for t in (split.x, split.y, split.a, split.aligned) if t is not None)
    return size <= RESIDENT_FRACTION * torch.cuda.get_device_properties(device).total_memory


def on_device(split: BiasedSplit, device: torch.device) -> BiasedSplit:
    """``split`` with its tensors on ``device`` where it fits (:func:`fits_on_device`; itself where they are there
    already or it does not fit): a task's training data is held where it trains, so a step gathers its batch by index
    there instead of copying it from the host. Tasks gather on ``split.x.device`` and move the batch to theirs."""
    if split.x.device == device or not fits_on_device(split, device):
        return split
    a, aligned = (None if t is None else t.to(device) for t in (split.a, split.aligned))  # None: no bias labels
    return BiasedSplit(split.x.to(device), split.y.to(device), a, aligned, split.n_classes, split.n_attrs,
                       split.feature_names)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device`` without a host sync: a non-blocking copy (a no-op where it is there already)."""
    return t.to(device, non_blocking=True)


def gather_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` for a 1-D integer ``index`` (a batch of training images), the same tensor by ``index_select``,
    which on the CPU gathers image rows faster than advanced indexing."""
    return t.index_select(0, index)


def cut_batches(order: torch.Tensor, batch_size: int) -> list[torch.Tensor]:
    """``order`` (an epoch's indices) cut into training batches of ``batch_size``; a last batch of a single index is
    merged into the one before (which then holds ``batch_size + 1``). A batch of one breaks BatchNorm in training
    mode (torch: "Expected more than 1 value per channel"; the tabular MLP's layers) and is a one-sample step
    elsewhere; merging keeps every index in the epoch exactly once."""
    batches = list(order.split(batch_size))
    if len(batches) > 1 and len(batches[-1]) == 1:
        batches[-2:] = [torch.cat(batches[-2:])]
    return batches


def device_batches(batches: list[torch.Tensor], device: torch.device) -> list[torch.Tensor]:
    """The epoch's index batches on ``device``, copied in one transfer (on the CPU: ``batches`` themselves)."""
    if not batches or batches[0].device == device:
        return batches
    return list(to_device(torch.cat(batches), device).split([len(b) for b in batches]))


class GeneratorTask:
    """Base of tasks whose state besides their modules is one ``torch.Generator`` (data order, augmentation)."""

    model: nn.Module
    generator: torch.Generator

    def modules(self) -> dict[str, nn.Module]:
        return {"model": self.model}

    def extra_state(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_extra_state(self, state: dict[str, Any]) -> None:
        self.generator.set_state(state["generator"])


class NonFiniteLoss(ArithmeticError):
    """Raised by a task when a step's loss is NaN or infinite; :func:`fit` adds the epoch and the advice."""

    def __init__(self, step: int, value: float, what: str = "loss") -> None:
        super().__init__(f"{what} = {value} at step {step}")
        self.step, self.value, self.what = step, value, what


def ensure_finite(loss: torch.Tensor, step: int, what: str = "loss") -> None:
    """Raise :class:`NonFiniteLoss` if ``loss`` holds NaN or infinity (one host sync per step)."""
    if not bool(torch.isfinite(loss.detach()).all()):
        raise NonFiniteLoss(step, float(loss.detach().float().flatten()[0]), what)


def _accumulator_dtype(device: torch.device) -> torch.dtype:
    """float64 sums where the device has it (MPS has no float64: float32 there)."""
    return torch.float32 if device.type == "mps" else torch.float64


class StepMetrics:
    """An epoch's step scalars and the first non-finite loss, kept on the device where they are computed.

    ``add(**scalars)`` and ``watch(loss, step)`` keep the tensors (detached) and fold them into sums every
    ``FOLD`` steps with a few tensor ops, never reading a value back to the host, so a step never waits for the
    device and costs next to nothing more on the CPU; :meth:`read` / :meth:`means` read everything at once (one
    transfer per epoch), raising :class:`NonFiniteLoss` for the first step whose loss was NaN or infinite
    (training ran on to the epoch's end; its weights are then non-finite too, and ``fit`` stops there).
    """

    FOLD = 256  # steps between folds: bounds the tensors held, amortises the fold's ops

    def __init__(self) -> None:
        self.pending: dict[str, list[torch.Tensor | float]] = {}
        self.sums: dict[str, torch.Tensor | float] = {}
        self.count = 0
        self.losses: list[torch.Tensor] = []  # watched losses not folded yet, each [1]
        self.steps: list[int] = []  # the step of every watched loss
        self.bad: torch.Tensor | None = None  # [position in self.steps of the first non-finite loss (-1: none), value]

    def add(self, **values: torch.Tensor | float) -> None:
        for key, value in values.items():
            self.pending.setdefault(key, []).append(value.detach() if isinstance(value, torch.Tensor) else value)
        self.count += 1
        if self.count % self.FOLD == 0:
            self._fold()

    def watch(self, loss: torch.Tensor, step: int) -> None:
        """Keep ``loss`` (a scalar tensor) to find the epoch's first non-finite one; no host sync."""
        self.losses.append(loss.detach().reshape(-1)[:1])
        self.steps.append(step)
        if len(self.losses) >= self.FOLD:
            self._fold_losses()

    def _fold(self) -> None:
        for key, values in self.pending.items():
            if not values:
                continue
            if isinstance(values[0], torch.Tensor):
                total = torch.stack(values).to(_accumulator_dtype(values[0].device)).sum()  # type: ignore[arg-type]
            else:
                total = float(sum(values))  # type: ignore[arg-type]
            old = self.sums.get(key)
            self.sums[key] = total if old is None else old + total
            values.clear()

    def _fold_losses(self) -> None:
        if not self.losses:
            return
        chunk = torch.cat(self.losses)
        offset = len(self.steps) - len(self.losses)
        self.losses = []
        value_dtype = _accumulator_dtype(chunk.device)
        if self.bad is None:
            self.bad = torch.full((2,), -1.0, dtype=value_dtype, device=chunk.device)  # a fill: no host copy
        bad = ~torch.isfinite(chunk)
        first = bad.to(torch.int8).argmax()
        value = chunk.index_select(0, first.reshape(1))[0]  # (chunk[first] would read `first` on the host)
        found = torch.stack([(first + offset).to(value_dtype), value.to(value_dtype)])
        self.bad = torch.where((self.bad[0] < 0) & bad.any(), found, self.bad)

    def read(self) -> dict[str, float]:
        """The sums as floats (one host transfer); raises :class:`NonFiniteLoss` for a watched non-finite loss."""
        self._fold()
        self._fold_losses()
        keys = [k for k, v in self.sums.items() if isinstance(v, torch.Tensor)]
        tensors = [self.sums[k].to("cpu", torch.float64).reshape(1) for k in keys]  # type: ignore[union-attr]
        if self.bad is not None:
            tensors.append(self.bad.to("cpu", torch.float64))
        values = torch.cat(tensors).tolist() if tensors else []
        if self.bad is not None and values[len(keys)] >= 0:
            raise NonFiniteLoss(self.steps[int(values[len(keys)])], values[len(keys) + 1])
        return {**{k: float(v) for k, v in self.sums.items() if not isinstance(v, torch.Tensor)},
                **dict(zip(keys, values))}

    def means(self, prefix: str = "train/") -> dict[str, float]:
        """``{prefix + key: sum / steps}`` (see :meth:`read`)."""
        return {f"{prefix}{k}": v / max(self.count, 1) for k, v in self.read().items()}


def nonfinite_weights(modules: dict[str, nn.Module]) -> list[str]:
    """Names of the parameters and buffers (``module.name``) holding NaN or infinity."""
    bad = []
    for module_name, module in modules.items():
        for name, tensor in list(module.named_parameters()) + list(module.named_buffers()):
            if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad.append(f"{module_name}.{name}")
    return bad


def resume_key(params: dict[str, Any], inputs: dict[str, Any]) -> dict[str, str]:
    """What a training result depends on, hashed per part: ``params`` (every param the stage reads),
    ``data`` (the content of its input tensors: splits, inferred labels, initial weights) and ``code``."""
    return {"params": digest(params), "data": tensor_digest(inputs), "code": code_version()}


def _key_difference(saved: Any, key: dict[str, str]) -> list[str]:
    if not isinstance(saved, dict):
        return ["format"]
    return [part for part in key if saved.get(part) != key[part]]


# What a resume state holds (fit saves them after every epoch); one without any of them is not resumed from.
RESUME_KEYS = ("key", "epoch", "modules", "optimizer", "scheduler", "task", "rng", "history", "best_epoch",
               "best_score", "best_state")


def resume_problem(saved: dict[str, Any], epochs: int, modules: list[str]) -> str | None:
    """What makes ``saved`` (a resume state of the same key) unusable for a run of ``epochs`` epochs training
    ``modules``, in words: a part missing, an epoch outside the run, a history or selected epoch that contradicts
    the epoch done, other modules; None when it is whole and consistent."""
    missing = [key for key in RESUME_KEYS if key not in saved]
    if missing:
        return f"it lacks {', '.join(missing)}"
    epoch, history, best = saved["epoch"], saved["history"], saved["best_epoch"]
    if not isinstance(epoch, int) or isinstance(epoch, bool) or not 0 <= epoch < epochs:
        return f"it claims epoch {epoch!r} done, and this run has epochs 0 .. {epochs - 1}"
    if not isinstance(history, list) or len(history) != epoch + 1:
        held = f"{len(history)} epochs" if isinstance(history, list) else f"a {type(history).__name__}"
        return f"its history holds {held} where epoch {epoch} done means {epoch + 1}"
    if not isinstance(best, int) or isinstance(best, bool) or not 0 <= best <= epoch:
        return f"its selected epoch {best!r} is not among the epochs done (0 .. {epoch})"
    for part in ("modules", "best_state"):
        found = saved[part]
        if not isinstance(found, dict) or sorted(found) != sorted(modules):
            shown = sorted(found) if isinstance(found, dict) else f"a {type(found).__name__}"
            return f"its {part} are {shown}, this run trains {sorted(modules)}"
    return None


@dataclass
class FitResult:
    history: list[dict[str, float]]
    selected_epoch: int
    selected_state: dict[str, dict[str, torch.Tensor]]
    resumed_from: int | None = None
    extras: dict[str, Any] = field(default_factory=dict)
    selection: dict[str, Any] = field(default_factory=dict)  # describe_selection(): rule, epoch, degenerate, reason
    # epoch -> module states of every other rule's pick (selection["picks"]) than the selected epoch, so the stage can
    # say what each rule's model gives on test (RulePicks)
    pick_states: dict[int, dict[str, dict[str, torch.Tensor]]] = field(default_factory=dict)
    # every process that trained the run: its epochs ([first, last]) and its environment
    # (debias.core.environment.numbers_environment); more than one when it resumed an interrupted run
    trained_by: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RulePicks:
    """The running best epoch of every selection rule an epoch's validation numbers allow (``best``: rule ->
    (score, epoch)), and the module states of those epochs other than the selected one (``states``), so each rule's
    model is at hand after training without keeping every epoch (at most one state per rule)."""

    best: dict[str, tuple[tuple[float, ...], int]] = field(default_factory=dict)
    states: dict[int, dict[str, dict[str, torch.Tensor]]] = field(default_factory=dict)
    dropped: set[str] = field(default_factory=set)  # rules an epoch lacked the number of (never picked)

    def update(self, metrics: dict[str, float], epoch: int, task: "Task", selected_epoch: int,
               previous: tuple[int, dict[str, dict[str, torch.Tensor]] | None]) -> None:
        """Fold in epoch ``epoch`` (``task`` holds its weights; ``previous``: the epoch and states the selection kept
        before this epoch); keep a state only for epochs some rule holds and the selection does not keep."""
        allowed = computable_rules(metrics)
        self.dropped |= set(RULES) - set(allowed)
        for name in allowed:
            if name in self.dropped:
                continue
            score = selection_score(metrics, name)
            if name not in self.best or score > self.best[name][0]:
                self.best[name] = (score, epoch)
        held = {e for name, (_, e) in self.best.items() if name not in self.dropped} - {selected_epoch}
        previous_epoch, previous_state = previous
        if previous_epoch in held and previous_epoch not in self.states and previous_state is not None:
            self.states[previous_epoch] = previous_state  # the selection moved on; another rule still holds it
        if epoch in held and epoch not in self.states:
            self.states[epoch] = _module_states(task)
        self.states = {e: state for e, state in self.states.items() if e in held}

    def saved(self) -> dict[str, Any]:
        return {"best": {name: [list(score), e] for name, (score, e) in self.best.items()},
                "states": self.states, "dropped": sorted(self.dropped)}

    @classmethod
    def restored(cls, saved: dict[str, Any] | None) -> "RulePicks":
        """From :meth:`saved` (None: a resume state written before rule picks were kept: start empty)."""
        if not saved:
            return cls()
        return cls({name: (tuple(score), int(e)) for name, (score, e) in saved["best"].items()},
                   {int(e): state for e, state in saved["states"].items()}, set(saved["dropped"]))


def _rng_state() -> dict[str, Any]:
    """Global RNG states in a form ``torch.load(weights_only=True)`` accepts (tensors, ints, strings)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"torch": torch.get_rng_state(), "python": random.getstate(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))


def _module_states(task: Task) -> dict[str, dict[str, torch.Tensor]]:
    return {name: copy.deepcopy(module.state_dict()) for name, module in task.modules().items()}


def fit(task: Task, optimizer: torch.optim.Optimizer, epochs: int, validate: Callable[[], dict[str, float]],
        selection: str = "last", scheduler: Any | None = None, state_path: str | Path | None = None,
        state_key: dict[str, str] | None = None, on_epoch: Callable[[int, dict[str, float]], None] | None = None,
        label: str = "training", divergence_advice: str = "the learning rate") -> FitResult:
    """Train ``epochs`` epochs; return the history and the selected weights.

    ``state_key`` (:func:`resume_key`) ties the resume state at ``state_path`` to its inputs; ``label`` names
    the stage in messages, ``divergence_advice`` the params to lower when training diverges. After every epoch
    the epoch, its metrics, its time and the ETA are reported (:func:`debias.core.progress.epoch`; the stage
    harness writes them as one line to stderr).
    """
    history: list[dict[str, float]] = []
    best_epoch, best_score, best_state = -1, None, None
    picks = RulePicks()
    start, resumed_from = 0, None
    trained_by: list[dict[str, Any]] = []
    state_path = Path(state_path) if state_path else None

    state_key = state_key or {}
    if state_path is not None and state_path.exists():
        try:
            saved = load_torch(state_path, "resume-state", ("epoch", "modules", "optimizer", "key"))
        except CorruptFileError as exc:
            warnings.warn(f"ignoring unreadable resume state ({exc}); training starts over")
            saved = None  # a torn resume state is not worth failing for: start over
        differs = _key_difference(saved["key"], state_key) if saved is not None else []
        if saved is not None and differs and distributed.is_main():
            print(f"[{label}] ignoring the resume state {state_path} of an interrupted run: it was saved for other "
                  f"{' and '.join(differs)} than this run's; training starts over", flush=True)
        problem = resume_problem(saved, epochs, list(task.modules())) if saved is not None and not differs else None
        if problem is not None:  # never resumed from, nor failed for: the next epoch's state replaces it
            warnings.warn(f"ignoring the resume state {state_path}: {problem}; training starts over")
            saved = None
        if saved is not None and not differs:
            fresh = (_module_states(task), copy.deepcopy(optimizer.state_dict()), _rng_state(),
                     None if scheduler is None else scheduler.state_dict(), task.extra_state())
            try:
                for name, module in task.modules().items():
                    module.load_state_dict(saved["modules"][name])
                optimizer.load_state_dict(saved["optimizer"])
                if scheduler is not None and saved.get("scheduler") is not None:
                    scheduler.load_state_dict(saved["scheduler"])
                task.load_extra_state(saved["task"])
                _set_rng_state(saved["rng"])
                history = list(saved["history"])
                if any(not isinstance(row, dict) or "epoch" not in row for row in history):
                    raise ValueError("its history has epochs without their number")
                best_epoch, best_state = saved["best_epoch"], saved["best_state"]
                best_score = None if saved["best_score"] is None else tuple(saved["best_score"])
                picks = RulePicks.restored(saved.get("rule_picks"))
                trained_by = list(saved.get("trained_by") or [{"epochs": [0, saved["epoch"]]}])
            except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:  # a state of another layout
                _restore_fresh(task, optimizer, scheduler, fresh)
                history, best_epoch, best_score, best_state, picks = [], -1, None, None, RulePicks()
                trained_by = []
                reason = " ".join(str(exc).split())[:300]
                warnings.warn(f"ignoring the resume state {state_path}: it does not fit this run ({type(exc).__name__}: "
                              f"{reason}); training starts over")
            else:
                start = resumed_from = saved["epoch"] + 1
                if distributed.is_main():
                    print(f"[{label}] resuming an interrupted run from epoch {start} ({state_path}: same params, "
                          f"training data and code)", flush=True)
    distributed.agree(start, "the epoch to resume from (every rank reads rank 0's resume state)")
    distributed.broadcast_modules(task.modules().values())

    loop_started = time.monotonic()
    here = {"epochs": [start, epochs - 1], **numbers_environment(_device_of(task))}
    for epoch in range(start, epochs):
        epoch_started = time.monotonic()
        for module in task.modules().values():
            module.train()
        try:
            metrics = {"epoch": float(epoch), **task.train_epoch(epoch)}
        except NonFiniteLoss as exc:
            raise TrainingDiverged(f"{label}: the training {exc.what} became {exc.value} at epoch {epoch}, step "
                                   f"{exc.step}: training diverged; lower {divergence_advice}") from None
        bad = nonfinite_weights(task.modules())
        if bad:
            raise TrainingDiverged(f"{label}: weights became NaN or infinite during epoch {epoch} ({', '.join(bad[:3])}"
                                   f"{' ...' if len(bad) > 3 else ''}): training diverged; lower {divergence_advice}")
        if scheduler is not None:
            scheduler.step()
        for module in task.modules().values():
            module.eval()
        metrics.update(validate())
        metrics = distributed.broadcast_object(metrics)  # rank 0's numbers: one selection decision everywhere
        distributed.broadcast_modules(task.modules().values())  # rank 0's weights (BatchNorm statistics, head)
        history.append(metrics)
        score = selection_score(metrics, selection)
        previous = (best_epoch, best_state)
        if best_score is None or score > best_score:
            best_epoch, best_score, best_state = epoch, score, _module_states(task)
        picks.update(metrics, epoch, task, best_epoch, previous)
        if on_epoch is not None:
            on_epoch(epoch, metrics)
        now = time.monotonic()  # ETA: the mean time of this run's epochs (training + validation) so far
        eta = (now - loop_started) / (epoch + 1 - start) * (epochs - epoch - 1) if epoch + 1 < epochs else None
        progress.epoch(label, epoch, epochs, metrics, now - epoch_started, eta)
        if state_path is not None and distributed.is_main():
            save_torch(state_path, {
                "key": state_key, "epoch": epoch, "modules": _module_states(task),
                "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict() if scheduler is not None else None,
                "task": task.extra_state(), "rng": _rng_state(), "history": history,
                "best_epoch": best_epoch, "best_score": None if best_score is None else list(best_score),
                "best_state": best_state, "rule_picks": picks.saved(),
                "trained_by": [*trained_by, {**here, "epochs": [start, epoch]}],
            }, kind="resume-state")

    assert best_state is not None, "fit ran no epoch"
    block = describe_selection(history, best_epoch, selection)
    states = {e: picks.states[e] for e in set(block["picks"].values()) if e in picks.states}
    return FitResult(history, best_epoch, best_state, resumed_from, selection=block, pick_states=states,
                     trained_by=[*trained_by, here])


def _device_of(task: Task) -> torch.device:
    """The device the task's modules train on (the CPU when they hold no parameter)."""
    for module in task.modules().values():
        for parameter in module.parameters():
            return parameter.device
    return torch.device("cpu")


def _restore_fresh(task: Task, optimizer: torch.optim.Optimizer, scheduler: Any | None, fresh: tuple) -> None:
    """Put back the modules, optimizer, random streams, scheduler and task state a failed resume may have half
    replaced (:func:`fit`): training then starts over exactly as without a resume state."""
    modules, optimizer_state, rng, scheduler_state, task_state = fresh
    for name, module in task.modules().items():
        module.load_state_dict(modules[name])
    optimizer.load_state_dict(optimizer_state)
    _set_rng_state(rng)
    if scheduler is not None:
        scheduler.load_state_dict(scheduler_state)
    task.load_extra_state(task_state)


def finish(state_path: str | Path | None) -> None:
    """Delete the resume state once the stage's outputs are written (rank 0 only: it owns the file)."""
    if state_path is not None and distributed.is_main():
        Path(state_path).unlink(missing_ok=True)


def build_optimizer(parameters: Any, name: str, lr: float, momentum: float, weight_decay: float,
                    graph_device: torch.device | None = None) -> torch.optim.Optimizer:
    """``sgd`` (with momentum) or ``adam``, from params.

    ``graph_device`` (a CUDA device): built to be captured in a CUDA graph (:mod:`debias.training.captured`): the
    learning rate a 0-dim tensor there (a scheduler ``fill_``s it, so the graph reads the new rate), Adam with
    ``capturable=True`` (its step counters on the device), SGD ``fused`` (the implementation that takes a tensor
    learning rate without reading it back to the host); the same update rule.

    Otherwise ``foreach=True`` on every device: PyTorch's default on the CPU is its one-tensor-at-a-time loop, a
    few small ops per parameter tensor and step; the foreach kernels run the same ops in the same order, so the
    parameters come out bit-identical (a test checks it), in less time per update (measured on LeNet-5:
    benchmarks/results/optimizer_step.md)."""
    rate: float | torch.Tensor = lr if graph_device is None else torch.tensor(lr, device=graph_device)
    graph = graph_device is not None
    if name == "sgd":
        return torch.optim.SGD(parameters, lr=rate, momentum=momentum, weight_decay=weight_decay,
                               **({"fused": True} if graph else {"foreach": True}))
    if name == "adam":
        return torch.optim.Adam(parameters, lr=rate, weight_decay=weight_decay,
                                **({"capturable": True} if graph else {"foreach": True}))
    raise ValueError(f"optimizer = '{name}'; allowed: sgd, adam")


def build_scheduler(optimizer: torch.optim.Optimizer, milestones: list[int], gamma: float) -> Any | None:
    """Step decay at the given epochs (FairKL's Biased-MNIST schedule), or none."""
    if not milestones:
        return None
    return torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=gamma)
