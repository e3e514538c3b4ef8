"""Will one training step fit in memory? Checked before training starts, naming the param to lower.

A run that does not fit should say so, and how to reduce it, instead of being killed by the
operating system (CPU) or dying deep inside a CUDA allocation. Before the first epoch, training asks the check
the stage harness installs (:data:`CHECK`, through :mod:`debias.core.resources`), and
:func:`check_classifier_fits` (``train_erm``) and :func:`check_stage2_fits` (``train_stage2``)
estimate the memory of one training step and of one evaluation batch on the training device:

- weights, gradients and optimiser state (Adam: 2 tensors per weight, SGD with momentum: 1);
- activations autograd keeps for the backward pass, per image, measured by a probe forward of
  a copy of the real model on 2 and 4 images (saved-tensor hooks; the difference is per image),
  times the images one step forwards at once (``batch_size``; CNC: ``forward_chunk`` contrastive
  batches of 2M + 2N images; WCL: two views through two encoders), with a margin for the
  transient buffers of the backward pass;
- the B x B matrices of the contrastive losses;

and compare it with what the device has free (CUDA: ``torch.cuda.mem_get_info``; CPU:
``MemAvailable`` in ``/proc/meminfo`` and the cgroup limit; elsewhere no check). A step that
does not fit raises :class:`ResourceError` naming the param, its value and the largest value
that fits. The stage harness turns a real out-of-memory error into the same kind of advice
(:func:`out_of_memory_advice`).

Under ``torchrun`` with W ranks (:mod:`debias.core.distributed`) each rank forwards its shard of the
batch (``ceil(images / W)``) but keeps the loss's B x B matrices of the whole gathered batch; on
CUDA every rank has its own GPU, on the CPU the W processes share the machine's memory, so the
step (and the evaluation batch every rank runs) is counted W times. One process: W = 1, as before.

``DEBIAS_MEMORY_CHECK=off`` skips the check (a machine setting, not a param).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from debias.core import distributed
from debias.core.errors import ResourceError
from debias.core.resources import StepPlan

BACKWARD_MARGIN = 1.75  # activations x this: gradients of activations and allocator slack during backward
USABLE_FRACTION = 0.9  # of the free memory, the rest for the interpreter, data loading and fragmentation
PROBE_SIZES = (2, 4)


# --------------------------------------------------------------------------- what is free


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def _cgroup_free_bytes() -> int | None:
    """Room left under the cgroup's memory limit (v2, then v1), or None without a limit."""
    root = Path("/sys/fs/cgroup")
    limit, used = _read_int(root / "memory.max"), _read_int(root / "memory.current")
    if limit is None:
        limit, used = _read_int(root / "memory/memory.limit_in_bytes"), _read_int(root / "memory/memory.usage_in_bytes")
    if limit is None or used is None or limit >= 1 << 60:  # "max" or v1's "unlimited"
        return None
    return max(limit - used, 0)


def _meminfo_available_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def available_bytes(device: torch.device) -> int | None:
    """Free memory for a new allocation on ``device``; None where it cannot be known (no check then)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type == "cpu":
        known = [v for v in (_meminfo_available_bytes(), _cgroup_free_bytes()) if v is not None]
        return min(known) if known else None
    if device.type == "mps":
        try:
            return int(torch.mps.recommended_max_memory() - torch.mps.driver_allocated_memory())
        except Exception:  # older torch
            return None
    return None


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.0f} MiB"


# --------------------------------------------------------------------------- what a step needs


@dataclass(frozen=True)
class Profile:
    """Memory of one network: weights, activations kept for backward per image, evaluation peak per image."""

    weight_bytes: int
    train_bytes_per_image: float
    eval_bytes_per_image: float


def _tensor_bytes(t: torch.Tensor) -> tuple[Any, int]:
    try:
        storage = t.untyped_storage()
        return (storage.data_ptr(), str(t.device)), storage.nbytes()
    except (RuntimeError, NotImplementedError):
        return id(t), t.numel() * t.element_size()


def _probe(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    """(bytes autograd saves for backward, largest single module output) in a training forward of ``x``."""
    saved: dict[Any, int] = {}
    largest = 0

    def pack(t: torch.Tensor) -> torch.Tensor:
        key, nbytes = _tensor_bytes(t)
        saved[key] = nbytes
        return t

    def record(module: nn.Module, inputs: Any, output: Any) -> None:
        nonlocal largest
        if isinstance(output, torch.Tensor):
            largest = max(largest, output.numel() * output.element_size())

    hooks = [m.register_forward_hook(record) for m in model.modules() if not list(m.children())]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = model(x)
        saved[("output", 0)] = out.numel() * out.element_size()
    finally:
        for hook in hooks:
            hook.remove()
    return sum(saved.values()), largest


def profile(model: nn.Module, image_shape: tuple[int, ...], device: torch.device) -> Profile:
    """Probe a copy of ``model`` (its weights, BatchNorm statistics and the RNG stay untouched)."""
    probe_model = copy.deepcopy(model).to(device).train()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    results = []
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        for n in PROBE_SIZES:
            x = torch.zeros((n, *image_shape), dtype=torch.uint8, device=device)
            results.append(_probe(probe_model, x))
    (saved_small, largest_small), (saved_large, largest_large) = results
    step = PROBE_SIZES[1] - PROBE_SIZES[0]
    per_image = max(saved_large - saved_small, 0) / step
    largest_per_image = max(largest_large - largest_small, 0) / step
    image_bytes = math.prod(image_shape) * 4  # the float copy of the input
    return Profile(weight_bytes, per_image + image_bytes, 3 * largest_per_image + image_bytes)


def distributed_plan(plan: StepPlan, device: torch.device) -> StepPlan:
    """``plan`` for this run's ranks: W ranks share a step; on the CPU (one memory) all W count, on CUDA one."""
    ranks = distributed.world_size()
    return dataclasses.replace(plan, ranks=ranks, copies=ranks if device.type != "cuda" else 1)


def optimizer_state_tensors(optimizer: torch.optim.Optimizer) -> int:
    """Tensors of state the optimiser keeps per weight."""
    if isinstance(optimizer, torch.optim.Adam):
        return 2
    momentum = optimizer.defaults.get("momentum", 0) if isinstance(optimizer, torch.optim.SGD) else 1
    return 1 if momentum else 0


def trained_weight_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"])


def step_bytes(prof: Profile, plan: StepPlan, value: int, fixed: int) -> float:
    """Bytes one training step at ``plan.key = value`` needs on the device (all ``plan.copies`` processes)."""
    side = value * plan.images_per_unit
    local = -(-side // plan.ranks)  # this rank's shard of the batch
    activations = BACKWARD_MARGIN * prof.train_bytes_per_image * local * plan.forwards
    return plan.copies * (fixed + activations + plan.pairwise * 4.0 * side * side)


def largest_value_that_fits(prof: Profile, plan: StepPlan, fixed: int, usable: float) -> int:
    """The largest value of ``plan.key`` whose step fits in ``usable`` bytes (0 if none)."""
    low, high = 0, max(plan.value, 1)
    while low < high:
        mid = (low + high + 1) // 2
        if step_bytes(prof, plan, mid, fixed) <= usable:
            low = mid
        else:
            high = mid - 1
    return low


def check_fits(prof: Profile, plan: StepPlan, fixed_bytes: int, device: torch.device, model_name: str,
               eval_key: str | None = None, eval_batch_size: int | None = None, eval_max: int | None = None,
               free: int | None = None, hint_if_none_fits: str = "") -> None:
    """Raise :class:`ResourceError` when a training step or an evaluation batch would not fit."""
    free = available_bytes(device) if free is None else free
    if free is None:
        return
    usable = USABLE_FRACTION * free
    where = device.type + (f" ({plan.copies} processes)" if plan.copies > 1 else "")
    value = min(plan.value, plan.max_value) if plan.max_value is not None else plan.value
    need = step_bytes(prof, plan, value, fixed_bytes)
    if need > usable:
        fits = largest_value_that_fits(prof, dataclasses.replace(plan, value=value), fixed_bytes, usable)
        what = (f"lower {plan.key} to {fits} or less" if fits >= 1 else
                f"even {plan.key} = 1 does not fit{hint_if_none_fits}; use a smaller model.name or a device with "
                "more memory")
        raise ResourceError(
            f"{plan.key} = {plan.value} does not fit in memory: one training step of {model_name} needs about "
            f"{gib(need)} on {where}, {gib(free)} is free. To reduce it, {what} "
            "(DEBIAS_MEMORY_CHECK=off skips this check)")
    if eval_key is not None and eval_batch_size is not None:
        batch = min(eval_batch_size, eval_max) if eval_max is not None else eval_batch_size
        need = plan.copies * (prof.weight_bytes + prof.eval_bytes_per_image * batch)
        if need > usable:
            fits = int(max(usable / plan.copies - prof.weight_bytes, 0) // max(prof.eval_bytes_per_image, 1))
            raise ResourceError(
                f"{eval_key} = {eval_batch_size} does not fit in memory: evaluating {model_name} on {batch} images "
                f"at once needs about {gib(need)} on {where}, {gib(free)} is free. To reduce it, lower "
                f"{eval_key} to {max(fits, 1)} or less (DEBIAS_MEMORY_CHECK=off skips this check)")


def _enabled() -> bool:
    setting = os.environ.get("DEBIAS_MEMORY_CHECK", "on").strip().lower()
    if setting not in ("on", "off"):
        raise ValueError(f"DEBIAS_MEMORY_CHECK = '{setting}'; allowed: on, off")
    return setting == "on"


def _profile_or_none(model: nn.Module, image_shape: tuple[int, ...], device: torch.device) -> Profile | None:
    try:
        return profile(model, image_shape, device)
    except Exception as exc:  # the check is advice: never the reason a run fails
        warnings.warn(f"memory check skipped: the probe forward failed ({type(exc).__name__}: {exc})")
        return None


# --------------------------------------------------------------------------- the checks training calls


def check_classifier_fits(model: nn.Module, optimizer: torch.optim.Optimizer, model_name: str, prefix: str,
                          batch_size: int, eval_batch_size: int, n_train: int, n_eval: int,
                          image_shape: tuple[int, ...], device: torch.device) -> None:
    """ERM / JTT / stage-2 ERM: ``batch_size`` images per step, ``eval_batch_size`` per evaluation batch."""
    if not _enabled():
        return
    prof = _profile_or_none(model, image_shape, device)
    if prof is None:
        return
    fixed = prof.weight_bytes + trained_weight_bytes(optimizer) * (1 + optimizer_state_tensors(optimizer))
    plan = distributed_plan(StepPlan(f"{prefix}.batch_size", batch_size, max_value=n_train), device)
    check_fits(prof, plan, fixed, device, model_name, f"{prefix}.eval_batch_size", eval_batch_size, n_eval)


def check_stage2_fits(method: str, networks: list[nn.Module], optimizer: torch.optim.Optimizer, params: Any,
                      n_train: int, n_eval: int, image_shape: tuple[int, ...], device: torch.device) -> None:
    """The step of ``stage2.method`` as its declaration plans it (``MethodSpec.memory_plan``: e.g. CNC per forward
    chunk, contrastive losses with their B x B matrices)."""
    if not _enabled():
        return
    from debias.training.methods.registry import method_spec

    s2 = params.stage2
    prof = _profile_or_none(networks[0], image_shape, device)
    if prof is None:
        return
    fixed = (sum(p.numel() * p.element_size() for net in networks for p in net.parameters())
             + trained_weight_bytes(optimizer) * (1 + optimizer_state_tensors(optimizer)))
    planned = method_spec(method).memory_plan
    plan = (planned(params, n_train) if planned is not None  # the method's own plan, else ERM's: one forward
            else StepPlan("stage2.batch_size", s2.batch_size, max_value=n_train))
    check_fits(prof, distributed_plan(plan, device), fixed, device, params.model.name, "stage2.eval_batch_size",
               s2.eval_batch_size, n_eval, hint_if_none_fits=plan.hint)


class Check:
    """:class:`debias.core.resources.MemoryCheck` as the stage harness installs it: the two checks above."""

    def classifier(self, model: nn.Module, optimizer: torch.optim.Optimizer, model_name: str, prefix: str,
                   batch_size: int, eval_batch_size: int, n_train: int, n_eval: int,
                   image_shape: tuple[int, ...], device: torch.device) -> None:
        check_classifier_fits(model, optimizer, model_name, prefix, batch_size, eval_batch_size, n_train, n_eval,
                              image_shape, device)

    def stage2(self, method: str, networks: list[nn.Module], optimizer: torch.optim.Optimizer, params: Any,
               n_train: int, n_eval: int, image_shape: tuple[int, ...], device: torch.device) -> None:
        check_stage2_fits(method, networks, optimizer, params, n_train, n_eval, image_shape, device)


CHECK = Check()


# --------------------------------------------------------------------------- after the fact: a real OOM


OOM_MARKERS = ("out of memory", "can't allocate memory", "cannot allocate memory", "not enough memory")


def is_out_of_memory(exc: BaseException) -> bool:
    """A device or host allocation failure (torch's OutOfMemoryError, a CPU allocator error, MemoryError)."""
    if isinstance(exc, MemoryError):
        return True
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and any(marker in str(exc).lower() for marker in OOM_MARKERS)


def out_of_memory_advice(stage: str, params: Any | None) -> str:
    """Which params of ``stage`` to lower after it ran out of memory, with their current values."""

    def now(dotted: str) -> str:
        value: Any = params
        try:
            for part in dotted.split("."):
                value = getattr(value, part)
        except AttributeError:
            return dotted
        return f"{dotted} (now {value})"

    keys: list[str]
    if stage == "train_erm":
        keys = ["erm.batch_size", "erm.eval_batch_size"]
    elif stage == "train_contrastive":
        from debias.training.methods.registry import METHODS

        spec = METHODS.get(getattr(getattr(params, "stage2", None), "method", None))
        keys = [*(spec.memory_advice if spec else ("stage2.batch_size",)), "stage2.eval_batch_size"]
    elif stage == "evaluate":
        keys = ["evaluate.block_size", "evaluate.umap.max_points"]
    else:
        keys = ["data.max_per_split"]
    listed = ", ".join(now(k) for k in keys) if params is not None else ", ".join(keys)
    return f"lower {listed}, or use a smaller model.name or a device with more memory"
