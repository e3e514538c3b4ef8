"""Machine settings (device, threads, seeding) from environment variables, never params.

``DEBIAS_DEVICE``   cuda | mps | cpu (default: CUDA, then MPS, then CPU)
``DEBIAS_THREADS``  CPU threads of torch and of the BLAS / OpenMP pools under numpy, scipy and
                    scikit-learn (default: each library's choice, usually one per core; in an experiment
                    run by DVC's queue with N workers alive, cores / N: :func:`default_threads`); per
                    process; also the image-decoding threads of the image-file sources (default: one per core)
``DEBIAS_NPROC``    training processes on this machine (default 1): the training stages start through
                    ``python -m debias.harness.launch``, which runs ``torchrun --standalone
                    --nproc_per_node=$DEBIAS_NPROC`` when it is above 1 (one per GPU on CUDA, nccl; any
                    number on the CPU, gloo); same global batch, same data order and metrics as one
                    process (:mod:`debias.core.distributed`, :mod:`debias.harness.launch`)
``DEBIAS_FORKSERVER``  ``0`` runs every stage in a process of its own instead of a fork of the warm server
                    (:mod:`debias.harness.forkserver`; default: the server, on Linux where no CUDA device is visible)
``DEBIAS_FORKSERVER_IDLE``  seconds the fork server waits for a next stage before it leaves (default 300)
Machine settings stay out of params.yaml so that DVC does not rerun stages when they change.
"""

from __future__ import annotations

import os
import random
import sys

import numpy as np
import torch

from debias.core.errors import DeviceError


def pick_device() -> torch.device:
    """``DEBIAS_DEVICE`` if set (it must exist on this machine), else CUDA, then MPS, then CPU."""
    wanted = os.environ.get("DEBIAS_DEVICE", "").strip().lower()
    mps = getattr(torch.backends, "mps", None)
    mps_available = mps is not None and mps.is_available()
    if wanted:
        if wanted not in ("cuda", "mps", "cpu") and not (wanted.startswith("cuda:") and wanted[5:].isascii() and wanted[5:].isdigit()):
            raise DeviceError(f"DEBIAS_DEVICE = '{wanted[:40]}'; allowed: cuda, cuda:N, mps, cpu")
        if wanted.startswith("cuda"):
            if not torch.cuda.is_available():
                raise DeviceError(f"DEBIAS_DEVICE = '{wanted}' but this machine has no usable CUDA device; "
                                  "unset DEBIAS_DEVICE (picks the best available) or set it to cpu")
            index = int(wanted[5:]) if ":" in wanted else 0
            if index >= torch.cuda.device_count():
                raise DeviceError(f"DEBIAS_DEVICE = '{wanted}' but this machine has {torch.cuda.device_count()} "
                                  "CUDA device(s), numbered from 0")
        if wanted == "mps" and not mps_available:
            raise DeviceError("DEBIAS_DEVICE = 'mps' but this machine has no usable MPS (Apple GPU) device; "
                              "unset DEBIAS_DEVICE (picks the best available) or set it to cpu")
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if mps_available:
        return torch.device("mps")
    return torch.device("cpu")


# Read by OpenBLAS / MKL / OpenMP runtimes when they load (scipy's OpenBLAS and scikit-learn's OpenMP load lazily).
THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, else ``os.cpu_count()``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


# The thread count of a stage process when DEBIAS_THREADS is unset (ours): one, in `dvc repro`, `dvc exp run`, the
# queue's experiments and SLURM tasks alike. DVC's run-cache does not key runs on it and it changes the numbers (the
# order of float sums: ERM's test average 0.3311 at 2 threads, 0.3333 at 1, the same params), so every run of the
# canonical flow trains at the same count and none restores another's; on 2 cores shared by 2 queued experiments
# more threads than cores ran train_contrastive ~8x slower (75 s against 9 s). DEBIAS_THREADS sets another count,
# recorded in every training stage's environment (compare and the report flag runs that differ).
DEFAULT_THREADS = 1


def configure_threads() -> None:
    """``DEBIAS_THREADS``: torch's thread count, and the same cap on every BLAS / OpenMP pool.

    Capping only torch left numpy's and scipy's OpenBLAS at one thread per core: on 2 cores shared
    with other jobs, one logistic-regression fit of the probe took 9-33 s with 2 BLAS threads (each
    call waits for a descheduled thread) and 0.8 s with 1. Pools already loaded are capped with
    threadpoolctl, later ones through the environment variables they read when they load.
    Unset: :data:`DEFAULT_THREADS` (one), the same in every run of the canonical flow.
    """
    threads = os.environ.get("DEBIAS_THREADS") or str(DEFAULT_THREADS)
    if not (threads.isascii() and threads.isdigit()) or int(threads) < 1:  # '²'.isdigit() is True; int('²') fails
        raise ValueError(f"DEBIAS_THREADS = '{threads}'; allowed: a whole number >= 1")
    torch.set_num_threads(int(threads))
    for name in THREAD_VARIABLES:
        os.environ[name] = threads
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:  # scikit-learn brings it; without it only the variables apply
        return
    threadpool_limits(int(threads))


def use_deterministic_algorithms() -> None:
    """``torch.use_deterministic_algorithms(True, warn_only=True)`` without its import of torch._inductor.

    torch's function also sets TorchInductor's ``deterministic`` flag, importing torch._inductor and
    torch._dynamo for it: ~2.5 s in every stage process, for a compiler the pipeline never uses. The
    eager flag is the same; inductor's is set too when something has already imported it.
    """
    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None:  # a torch without the private setter: the public function
        torch.use_deterministic_algorithms(True, warn_only=True)
        return
    setter(True, warn_only=True)
    inductor_config = sys.modules.get("torch._inductor.config")
    if inductor_config is not None:
        inductor_config.deterministic = True


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch Generator for data order (CPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    use_deterministic_algorithms()
    return torch.Generator().manual_seed(seed)
