"""Machine settings (device, threads, seeding) from environment variables, never params.

``DEBIAS_DEVICE``   cuda | mps | cpu (default: CUDA, then MPS, then CPU)
``DEBIAS_THREADS``  torch CPU threads (default: torch's choice)
Machine settings stay out of params.yaml so that DVC does not rerun stages when they change.
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch


def pick_device() -> torch.device:
    """``DEBIAS_DEVICE`` if set, else CUDA, then MPS, then CPU."""
    wanted = os.environ.get("DEBIAS_DEVICE", "").strip().lower()
    if wanted:
        if wanted not in ("cuda", "mps", "cpu") and not wanted.startswith("cuda:"):
            raise ValueError(f"DEBIAS_DEVICE = '{wanted}'; allowed: cuda, cuda:N, mps, cpu")
        if wanted.startswith("cuda") and not torch.cuda.is_available():
            raise RuntimeError(f"DEBIAS_DEVICE = '{wanted}' but CUDA is not available on this machine")
        return torch.device(wanted)
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def configure_threads() -> None:
    threads = os.environ.get("DEBIAS_THREADS")
    if threads:
        if not threads.isdigit() or int(threads) < 1:
            raise ValueError(f"DEBIAS_THREADS = '{threads}'; allowed: a whole number >= 1")
        torch.set_num_threads(int(threads))


def seed_everything(seed: int) -> torch.Generator:
    """Seed Python, NumPy and torch; return a torch Generator for data order (CPU)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)
    return torch.Generator().manual_seed(seed)
