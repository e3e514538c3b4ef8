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

import json
import os
import random
import sys
from pathlib import Path

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


def queue_workers(root: str | Path | None = None, cwd: Path | None = None) -> int:
    """How many of DVC's experiment-queue workers (``dvc queue start -j N``) are alive for this repository, when
    this process runs inside a queued experiment; 0 otherwise.

    A queued experiment runs in ``<root>/.dvc/tmp/exps/tmpXXXX`` (``dvc exp run --temp``: ``.../exps/standalone/``)
    with ``$DVC_ROOT`` naming the main repository; each worker is a ``dvc exp queue-worker`` process that DVC
    records as ``.dvc/tmp/exps/celery/dvc-exp-worker-<n>.json`` (``pid``, ``returncode`` None while it runs) and
    that runs one experiment at a time. A worker counts while its process is alive and still a queue worker.
    """
    root = root or os.environ.get("DVC_ROOT")
    if not root:
        return 0
    exps = (Path(root) / ".dvc" / "tmp" / "exps").resolve()
    if (cwd or Path.cwd()).resolve().parent != exps:
        return 0
    alive = 0
    for info in (exps / "celery").glob("dvc-exp-worker-*.json"):
        try:
            record = json.loads(info.read_text())
            pid = int(record["pid"])
            if record.get("returncode") is not None:
                continue
            if Path("/proc").is_dir():  # Linux: the pid must still be a queue worker (pids are reused)
                if b"queue-worker" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                    continue
            else:
                os.kill(pid, 0)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        alive += 1
    return alive


def default_threads() -> int | None:
    """The thread count when ``DEBIAS_THREADS`` is unset: cores / queue workers (at least 1) inside a queued
    experiment with more than one worker alive, else None (each library's default).

    Two queued experiments on 2 cores, each stage taking the libraries' default of one thread per core, ran
    train_contrastive ~8x slower than alone (75 s against 9 s): 4 busy threads on 2 cores wait on each other.
    """
    workers = queue_workers()
    return max(1, usable_cores() // workers) if workers > 1 else None


def configure_threads() -> None:
    """``DEBIAS_THREADS``: torch's thread count, and the same cap on every BLAS / OpenMP pool.

    Capping only torch left numpy's and scipy's OpenBLAS at one thread per core: on 2 cores shared
    with other jobs, one logistic-regression fit of the probe took 9-33 s with 2 BLAS threads (each
    call waits for a descheduled thread) and 0.8 s with 1. Pools already loaded are capped with
    threadpoolctl, later ones through the environment variables they read when they load.
    Unset, :func:`default_threads` decides (cores / workers in DVC's queue) and the choice is printed.
    """
    threads = os.environ.get("DEBIAS_THREADS")
    if not threads:
        automatic = default_threads()
        if automatic is None:
            return
        threads = str(automatic)
        print(f"[debias] DEBIAS_THREADS unset: {queue_workers()} DVC queue workers share {usable_cores()} cores, "
              f"{threads} thread(s) per stage process", file=sys.stderr)
    if threads:
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
