"""Machine settings: seeding turns on deterministic algorithms without loading TorchInductor."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.slow
def test_seed_everything_sets_deterministic_algorithms_without_importing_inductor() -> None:
    code = ("import sys, torch; from debias.core.runtime import seed_everything; seed_everything(0); "
            "print(torch.are_deterministic_algorithms_enabled(), "
            "torch.is_deterministic_algorithms_warn_only_enabled(), 'torch._inductor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]


@pytest.mark.slow
def test_debias_threads_caps_torch_and_every_blas_and_openmp_pool() -> None:
    """Pools loaded before configure_threads (numpy's) and after it (scipy's, scikit-learn's) get the cap."""
    import os

    code = ("import numpy, torch; from debias.core.runtime import configure_threads; configure_threads(); "
            "import sklearn.linear_model, scipy.linalg; from threadpoolctl import threadpool_info; "
            "print(torch.get_num_threads(), sorted({p['num_threads'] for p in threadpool_info()}), "
            "len(threadpool_info()) >= 2)")
    env = {**os.environ, "DEBIAS_THREADS": "1"}
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout
    assert out.split() == ["1", "[1]", "True"]
