"""Multi-process training under ``torchrun``: process group, ranks, sharded batches, gathers, reductions.

A process started by ``torchrun`` (``python -m debias.harness.launch`` starts it when ``DEBIAS_NPROC`` > 1)
finds ``WORLD_SIZE``, ``RANK`` and ``LOCAL_RANK`` in its environment. :func:`init_from_env` joins the
process group (gloo on the CPU; nccl on CUDA, each rank on ``cuda:LOCAL_RANK``). Without those
variables, or with ``WORLD_SIZE=1``, nothing is initialised and every helper below is the identity
(or does nothing): a single-process run executes exactly the operations it executed before this
module existed, with bit-identical results.

How training uses it (``training/classifier.py``, ``training/methods/``, ``training/loop.py``)
-------------------------------------------------------------------------------------------
1. Every rank draws the same *global* batch: the same seeded generator gives the same permutation
   (or CNC batches) and the same augmentation of the whole batch, so the data order is the
   single-process run's.
2. Each rank forwards its contiguous shard of the batch (:func:`shard_slice`, sizes differ by at
   most one row, so a short last batch is fine).
3. Features and logits are gathered with :func:`all_gather_rows`: forward, every rank's rows in
   rank order (= the global batch); backward, only the rows this rank computed get their gradient.
4. Every rank evaluates the single-process loss on the gathered global batch (the same value on
   every rank: contrastive negatives come from all ranks; cross-entropy is the global mean).
5. :func:`sum_gradients` sums the parameter gradients over ranks before the optimiser step.

Why the result is the single-process gradient: with ``L`` the loss of the global batch and
``z_i`` the rows, rank ``r``'s backward yields ``sum_{i in r} dL/dz_i * dz_i/dtheta`` (the gather
passes back only its own rows); summed over ranks that is ``dL/dtheta`` (up to the order of float
additions). ``tests/test_distributed.py`` checks it numerically for every loss.

Why not ``DistributedDataParallel``: DDP *averages* gradients, hooks the reduction into a
``forward`` that must go through the wrapper, and needs ``find_unused_parameters`` / ``no_sync``
for what these tasks do: call ``embed`` and ``embed_and_classify`` (not ``forward``), leave the
head unused (contrastive methods), forward twice per step (WCL's two views) and accumulate
several forwards per step (CNC). One flat all-reduce after ``backward`` (:func:`sum_gradients`)
is exact for all of them and leaves the training loops as they were; these models are small, so
the overlap of communication with the backward pass that DDP would add is not worth it.

BatchNorm layers (``simpleconv``, ``resnet18``) normalise over each rank's shard, as under DDP
without SyncBatchNorm; :func:`broadcast_modules` gives every rank rank 0's weights and running
statistics after each epoch. Single node only (``torchrun --standalone``): every rank reads
the resume state that rank 0 wrote.
"""

from __future__ import annotations

import atexit
import os
from collections.abc import Iterable
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.autograd.function import FunctionCtx

T = TypeVar("T")

__all__ = [
    "launched",
    "active",
    "init_from_env",
    "world_size",
    "rank",
    "is_main",
    "barrier",
    "shard_sizes",
    "shard_slice",
    "shard",
    "all_gather_rows",
    "sum_gradients",
    "all_reduce",
    "agree",
    "broadcast_object",
    "broadcast_modules",
    "describe",
]


# --------------------------------------------------------------------------- who am I


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"{name} = '{value}' (set by torchrun); expected a whole number >= 0")
    return int(value)


def launched() -> bool:
    """True when the environment says this process is one of several (torchrun's ``WORLD_SIZE`` > 1)."""
    return _env_int("WORLD_SIZE", 1) > 1


def active() -> bool:
    """True once this process has joined a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Number of ranks: the process group's size, else torchrun's ``WORLD_SIZE``, else 1."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _env_int("WORLD_SIZE", 1) if launched() else 1


def rank() -> int:
    """This process's rank: the process group's, else torchrun's ``RANK``, else 0."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _env_int("RANK", 0) if launched() else 0


def is_main() -> bool:
    """Rank 0: the one process that writes outputs and talks to MLflow (always true in one process)."""
    return rank() == 0


def _shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def init_from_env(device: torch.device) -> torch.device:
    """Join torchrun's process group if launched by it; return the device this rank trains on.

    Not launched (no ``WORLD_SIZE`` or ``WORLD_SIZE=1``): returns ``device`` unchanged and
    initialises nothing. Launched: CUDA devices become ``cuda:LOCAL_RANK`` (one GPU per process;
    select GPUs with ``CUDA_VISIBLE_DEVICES``; too few raise ``ValueError``) with the nccl backend;
    the CPU uses gloo; other devices (MPS) raise ``ValueError``. Idempotent: a second call returns
    the same device. The group is destroyed when the interpreter exits.
    """
    if not launched():
        return device
    if device.type == "cuda":
        local_rank, visible = _env_int("LOCAL_RANK", 0), torch.cuda.device_count()
        if local_rank >= visible:
            raise ValueError(f"local rank {local_rank} has no GPU: {visible} visible, one per process is needed; "
                             "lower DEBIAS_NPROC to the number of GPUs (or use DEBIAS_DEVICE=cpu)")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    elif device.type == "cpu":
        backend = "gloo"
    else:
        raise ValueError(f"multi-process training runs on CUDA (nccl) or on the CPU (gloo), not on {device.type}; "
                         "set DEBIAS_DEVICE=cpu, or DEBIAS_NPROC=1 for one process")
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://")
        atexit.register(_shutdown)
    return device


def barrier() -> None:
    """Wait until every rank arrives (nothing in one process)."""
    if active():
        dist.barrier()


# --------------------------------------------------------------------------- sharding a batch


def shard_sizes(n: int, world: int | None = None) -> list[int]:
    """Rows of each rank when a batch of ``n`` rows is split over ``world`` ranks (default: this run's).

    Contiguous and balanced: sizes differ by at most one, the first ``n % world`` ranks get the
    extra row (``torch.tensor_split``'s rule); ``sum(shard_sizes(n)) == n``; a rank may get 0 rows
    when ``n < world``.
    """
    world = world_size() if world is None else world
    if world < 1 or n < 0:
        raise ValueError(f"shard_sizes needs n >= 0 and world >= 1, got n={n}, world={world}")
    return [n // world + (1 if r < n % world else 0) for r in range(world)]


def shard_slice(n: int) -> slice:
    """This rank's rows of a batch of ``n`` rows (``slice(0, n)`` in one process)."""
    sizes = shard_sizes(n)
    start = sum(sizes[: rank()])
    return slice(start, start + sizes[rank()])


def shard(rows: torch.Tensor) -> torch.Tensor:
    """This rank's contiguous part of ``rows`` (e.g. a batch's index tensor); ``rows`` itself in one process."""
    if not active():
        return rows
    return rows[shard_slice(rows.shape[0])]


class _GatherRows(torch.autograd.Function):
    """Concatenate every rank's rows; the backward passes back only this rank's rows' gradient."""

    @staticmethod
    def forward(ctx: FunctionCtx, local: torch.Tensor,  # type: ignore[override]
                sizes: tuple[int, ...]) -> torch.Tensor:
        me = dist.get_rank()
        ctx.start = sum(sizes[:me])  # type: ignore[attr-defined]
        ctx.stop = ctx.start + sizes[me]  # type: ignore[attr-defined]
        longest = max(sizes)
        padded = local.new_zeros((longest, *local.shape[1:]))
        padded[: local.shape[0]] = local
        buffers = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(buffers, padded)
        return torch.cat([buffer[:size] for buffer, size in zip(buffers, sizes)])

    @staticmethod
    def backward(ctx: FunctionCtx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return grad[ctx.start : ctx.stop], None  # type: ignore[attr-defined]


def all_gather_rows(local: torch.Tensor, total: int) -> torch.Tensor:
    """The global batch ``[total, ...]`` from every rank's shard ``local = batch[shard_slice(total)]``.

    Differentiable: every rank must evaluate the same loss ``L`` on the result; this rank's
    backward then receives ``dL/d local`` (its own rows only, no communication), and
    :func:`sum_gradients` adds the ranks' parameter gradients into the single-process gradient.
    Returns ``local`` itself in one process. Shards may differ in size (padded for the
    collective, trimmed after).
    """
    if not active():
        return local
    sizes = tuple(shard_sizes(total))
    if local.shape[0] != sizes[rank()]:
        raise ValueError(f"rank {rank()} holds {local.shape[0]} rows, but its shard of {total} rows is {sizes[rank()]}")
    if total == 0:
        return local
    return _GatherRows.apply(local.contiguous(), sizes)


# --------------------------------------------------------------------------- reductions


def sum_gradients(parameters: torch.optim.Optimizer | Iterable[torch.Tensor]) -> None:
    """Sum the gradients of ``parameters`` (or of an optimiser's) over ranks, in place (nothing in one process).

    Call between ``backward()`` and ``optimizer.step()``; every rank must pass the same parameters
    in the same order. One flat all-reduce per dtype and device. A parameter keeps ``grad = None``
    only if it has none on every rank (a rank that forwarded no rows contributes zeros), so
    optimisers that skip gradient-less parameters (Adam's weight decay, momentum) behave as in
    one process.
    """
    if not active():
        return
    if isinstance(parameters, torch.optim.Optimizer):
        params = [p for group in parameters.param_groups for p in group["params"]]
    else:
        params = list(parameters)
    if not params:
        return
    has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.float32, device=params[0].device)
    dist.all_reduce(has_grad)
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for p, flag in zip(params, has_grad.tolist()):
        if flag > 0:
            groups.setdefault((p.device, p.dtype), []).append(p)
    for group in groups.values():
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
        dist.all_reduce(flat)
        offset = 0
        for p in group:
            summed = flat[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
            if p.grad is None:
                p.grad = summed.clone()
            else:
                p.grad.copy_(summed)


def all_reduce(values: torch.Tensor, op: str = "sum") -> torch.Tensor:
    """``values`` reduced over ranks (``sum``, ``min`` or ``max``) as a new tensor; a copy in one process."""
    if op not in ("sum", "min", "max"):
        raise ValueError(f"op = '{op}'; allowed: sum, min, max")
    out = values.clone()
    if active():
        dist.all_reduce(out, op=getattr(dist.ReduceOp, op.upper()))
    return out


def agree(value: float, what: str) -> None:
    """Raise ``RuntimeError`` naming ``what`` unless every rank passes the same ``value`` (a no-op in one process)."""
    if not active():
        return
    local = torch.tensor([float(value)], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        local = local.cuda()
    low, high = float(all_reduce(local, "min")), float(all_reduce(local, "max"))
    if low != high:
        raise RuntimeError(f"ranks disagree on {what}: values from {low} to {high} (rank {rank()} has {value})")


def broadcast_object(obj: T, src: int = 0) -> T:
    """Rank ``src``'s ``obj`` (any picklable value) on every rank; ``obj`` itself in one process."""
    if not active():
        return obj
    box = [obj if rank() == src else None]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def broadcast_modules(modules: Iterable[nn.Module], src: int = 0) -> None:
    """Copy rank ``src``'s parameters and buffers into every rank's modules, in place (nothing in one process)."""
    if not active():
        return
    with torch.no_grad():
        for module in modules:
            for tensor in [*module.parameters(), *module.buffers()]:
                dist.broadcast(tensor.data, src=src)


def describe() -> str:
    """``rank r of w`` for messages; empty in one process."""
    return f"rank {rank()} of {world_size()}" if world_size() > 1 else ""
