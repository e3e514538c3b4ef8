"""Sync-free training steps: no step of any stage-2 method (nor ERM's) reads a value back from the device.

On the CPU the test counts host reads (``aten._local_scalar_dense``: ``.item()``, ``bool(t)``, ``float(t)``; ops whose
output size depends on values: ``nonzero``, ``unique``, ``bincount``, ``masked_select``, boolean indexing; and
``Tensor.tolist`` / ``Tensor.numpy``) in whole epochs of two lengths: the count must not grow with the number of
steps (the epoch's metrics are read once, at its end). Reads by host-side bookkeeping that never touches the device
are not counted: torch's optimisers keep their ``step`` counters on the CPU, and the CNC sampler draws its index
groups with a CPU generator (one non-blocking copy per step moves them). On a CUDA machine the same epochs run under
``torch.cuda.set_sync_debug_mode("error")`` (skipped without a GPU).
"""

from __future__ import annotations

import collections
import traceback

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from debias.core.runtime import seed_everything
from debias.schema import validate
from debias.training.loop import NonFiniteLoss, StepMetrics
from debias.training.methods import METHODS, Stage2Inputs, setup_method
from tests.test_training import tiny_split

# ops whose result needs the device's values on the host (a sync on CUDA)
HOST_READS = {"_local_scalar_dense", "nonzero", "_unique", "_unique2", "unique_dim", "unique_consecutive",
              "masked_select", "bincount", "repeat_interleave"}
HOST_SIDE = ("torch/optim/", "debias/training/methods/cnc/sampling.py")  # CPU-only bookkeeping (see the module docstring)


def _host_side() -> bool:
    return any(part in frame.filename for frame in traceback.extract_stack() for part in HOST_SIDE)


class HostReads(TorchDispatchMode):
    """Counts the host reads of the code run inside it (``ops``: name -> count)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()

    def record(self, name: str) -> None:
        if not _host_side():
            self.ops[name] += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in HOST_READS:
            self.record(name)
        elif name.startswith("index") and len(args) > 1 and isinstance(args[1], (list, tuple)) and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.record(f"{name} (boolean mask)")
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._patched = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy")}
        for name, original in self._patched.items():
            def reading(tensor, *a, _name=name, _original=original, **k):
                self.record(_name)
                return _original(tensor, *a, **k)
            setattr(torch.Tensor, name, reading)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, original in self._patched.items():
            setattr(torch.Tensor, name, original)
        return super().__exit__(*exc)


def stage2_inputs(method: str, n: int, device: torch.device) -> Stage2Inputs:
    """A tiny stage-2 setup of ``n`` training points (batches of 32), every method's extras on."""
    train, val = tiny_split(n), tiny_split(60, seed=1)
    params = validate({"stage2": {"method": method, "optimizer": "adam", "lr": 1e-3, "batch_size": 32,
                                  "augment_shift": 2,
                                  "cnc": {"num_positives": 4, "num_negatives": 4, "accumulation": 2, "forward_chunk": 1,
                                          "anchor_fraction": 0.25},
                                  "wcl": {"projection_dim": 16}},
                       "loss": {"fairkl": {"weight": 0.5}}})
    inferred = train.a.clone()
    return Stage2Inputs({"train": train, "val": val, "test": val}, inferred, inferred != train.y, None, params, device,
                        seed_everything(0), inferred_group=train.y * 3 + inferred)


def epoch_reads(method: str, n: int) -> collections.Counter[str]:
    setup = setup_method(stage2_inputs(method, n, torch.device("cpu")))
    setup.task.train_epoch(0)  # lazy initialisations (optimiser state) out of the count
    with HostReads() as reads:
        setup.task.train_epoch(1)
    return reads.ops


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_no_step_reads_from_the_device(method: str) -> None:
    """A method's epoch reads the device a fixed number of times (its metrics, once), whatever its length."""
    short, long = epoch_reads(method, 128), epoch_reads(method, 256)
    assert short == long, f"{method}: host reads grow with the steps of an epoch: {dict(short)} then {dict(long)}"
    assert sum(short.values()) <= 2, f"{method}: {dict(short)}"


def test_the_probe_sees_the_reads_it_must_forbid() -> None:
    """The counting itself: each kind of host read is seen (else the test above would pass vacuously)."""
    t = torch.arange(6.0)
    with HostReads() as reads:
        t.sum().item()
        bool(t.any())
        torch.unique(t)
        t[t > 2]
        t.tolist()
    assert {"_local_scalar_dense", "_unique2", "tolist"} <= set(reads.ops)
    assert any("boolean mask" in name or name == "nonzero" for name in reads.ops), dict(reads.ops)


@pytest.mark.parametrize("fold", [256, 2])  # folded at the end only, or every two steps
def test_a_non_finite_loss_is_reported_once_per_epoch_with_its_first_step(fold: int, monkeypatch) -> None:
    monkeypatch.setattr(StepMetrics, "FOLD", fold)
    metrics = StepMetrics()
    for step, value in zip([0, 1, 3, 4, 5], [1.0, 2.0, float("nan"), float("inf"), 3.0]):  # step 2 skipped
        metrics.watch(torch.tensor(value), step)
        metrics.add(loss=torch.tensor(value))
    with pytest.raises(NonFiniteLoss) as info:
        metrics.means()
    assert info.value.step == 3 and info.value.value != info.value.value  # the first one: NaN at step 3
    fine = StepMetrics()
    for step, value in enumerate([1.0, 2.0, 4.0]):
        fine.watch(torch.tensor(value, dtype=torch.float32), step)
        fine.add(loss=torch.tensor(value), count=1.0)
    assert fine.means() == {"train/loss": pytest.approx(7 / 3), "train/count": 1.0}


_read = StepMetrics.read


def read_unchecked(self: StepMetrics) -> dict[str, float]:
    """``StepMetrics.read`` (the epoch's one host read, after its last step) outside the sync check around it."""
    torch.cuda.set_sync_debug_mode(0)
    try:
        return _read(self)
    finally:
        torch.cuda.set_sync_debug_mode("error")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_cuda_epoch_never_synchronises_inside_a_step(method: str, monkeypatch) -> None:
    """Every step of an epoch under ``torch.cuda.set_sync_debug_mode("error")``; only the epoch's metrics are read."""
    monkeypatch.setattr(StepMetrics, "read", read_unchecked)
    setup = setup_method(stage2_inputs(method, 128, torch.device("cuda")))
    setup.task.train_epoch(0)  # lazy initialisations (cuBLAS handles, optimiser state) outside the check
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        setup.task.train_epoch(1)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_a_split_is_held_on_the_accelerator_only_where_it_fits(monkeypatch) -> None:
    """Training data moves to a CUDA device only up to RESIDENT_FRACTION of its memory; a larger split stays in host
    memory (its batches are gathered there and copied)."""
    from types import SimpleNamespace

    from debias.training import loop

    split = tiny_split(100)  # 100 x 3 x 28 x 28 bytes of images + labels: ~240 kB
    size = sum(t.numel() * t.element_size() for t in (split.x, split.y, split.a, split.aligned))
    cuda = torch.device("cuda")
    for total, fits in ((4 * size, True), (4 * size - 8, False)):
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device, total=total: SimpleNamespace(
            total_memory=total))
        assert loop.fits_on_device(split, cuda) is fits
    assert loop.on_device(split, cuda) is split  # does not fit: the host split itself, nothing copied
    assert loop.fits_on_device(split, torch.device("cpu"))


def test_gather_rows_is_indexing_by_rows() -> None:
    """The steps gather their batch with ``gather_rows`` (index_select): the same tensor as ``x[index]``, repeated and
    unsorted indices included, for the uint8 images and float feature rows the splits hold."""
    from debias.training.loop import gather_rows

    generator = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (50, 3, 8, 8), generator=generator, dtype=torch.uint8)
    features = torch.randn(50, 7, generator=generator)
    index = torch.tensor([49, 0, 7, 7, 3, 20])
    for x in (images, features):
        rows = gather_rows(x, index)
        assert rows.dtype == x.dtype and rows.is_contiguous() and torch.equal(rows, x[index])
    assert gather_rows(images, index[:0]).shape == (0, 3, 8, 8)
