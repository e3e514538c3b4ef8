"""Machine settings: seeding turns on deterministic algorithms without loading TorchInductor."""

from __future__ import annotations

import subprocess
import sys


def test_seed_everything_sets_deterministic_algorithms_without_importing_inductor() -> None:
    code = ("import sys, torch; from debias.runtime import seed_everything; seed_everything(0); "
            "print(torch.are_deterministic_algorithms_enabled(), "
            "torch.is_deterministic_algorithms_warn_only_enabled(), 'torch._inductor' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["True", "True", "False"]
