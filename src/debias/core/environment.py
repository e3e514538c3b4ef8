"""The machine settings that shape a training stage's numbers, and which of them differ between runs put side by side.

The thread count, the number of training processes, the device and the torch build change the floating-point order of
a run's sums (and on a GPU, its kernels), so the same params can give other numbers under another setting. None of
them is a param (DVC reruns nothing when they change, :mod:`debias.core.runtime`): each training stage records them
in its metrics file under ``environment`` and on its MLflow run (tags ``debias.env.<key>``), and ``debias compare``
and the report say when the runs they show side by side differ in them.
"""

from __future__ import annotations

import os
import subprocess
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pathlib import Path

    import torch

# The recorded keys, in the order they are shown, with their names in words.
ENVIRONMENT_KEYS: dict[str, str] = {
    "threads": "torch threads",
    "processes": "training processes",
    "device": "device",
    "torch": "torch version",
    "build": "torch build",
    "cpu": "CPU kernels (torch's instruction set: ATEN_CPU_CAPABILITY)",
}
KEY = "environment"  # the metrics files' field


def torch_build() -> str:
    """``'cuda 12.1'``, ``'rocm 6.0'`` or ``'cpu'``: what the installed torch was built for."""
    import torch

    if torch.version.cuda:
        return f"cuda {torch.version.cuda}"
    hip = getattr(torch.version, "hip", None)
    return f"rocm {hip}" if hip else "cpu"


def device_name(device: "torch.device") -> str:
    """``'cpu'``, ``'mps'``, or ``'cuda (NVIDIA H100 80GB HBM3)'``: the device type with the GPU's model."""
    import torch

    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return device.type


def numbers_environment(device: "torch.device") -> dict[str, Any]:
    """The settings this process trains under (:data:`ENVIRONMENT_KEYS`): torch's thread count, the training
    processes (torchrun's world size), the device, the torch version and build, and the CPU kernels torch picked
    (its instruction set, which ``ATEN_CPU_CAPABILITY`` overrides: another rounds sums differently)."""
    import torch

    from debias.core.distributed import world_size

    return {"threads": torch.get_num_threads(), "processes": world_size(), "device": device_name(device),
            "torch": str(torch.__version__), "build": torch_build(), "cpu": str(torch.backends.cpu.get_cpu_capability())}


def trained_by_lines(trained_by: list[dict[str, Any]]) -> list[str]:
    """Where the processes that trained one run (a resumed run: several, each with its ``epochs``) differ in what
    shapes the numbers: ``'torch threads: 2 (epochs 0-3), 1 (epochs 4-9)'``; empty when they agree."""
    return environment_differences({f"epochs {e['epochs'][0]}-{e['epochs'][1]}": e for e in trained_by
                                    if isinstance(e, dict) and "epochs" in e})


def environment_tags(environment: dict[str, Any]) -> dict[str, str]:
    """The MLflow tags of an environment: ``debias.env.<key>`` -> the value as text."""
    return {f"debias.env.{key}": str(value) for key, value in environment.items()}


def environment_differences(runs: dict[str, dict[str, Any] | None]) -> list[str]:
    """One line per key of :data:`ENVIRONMENT_KEYS` in which ``runs`` (label -> the environment recorded, None or
    missing keys where a run recorded none) differ: ``'torch threads: 1 (ERM), 4 (stage 2)'``; empty when every
    run that recorded a key agrees on it."""
    lines = []
    for key, words in ENVIRONMENT_KEYS.items():
        values: dict[str, list[str]] = {}
        for label, environment in runs.items():
            if environment and key in environment:
                values.setdefault(str(environment[key]), []).append(label)
        if len(values) > 1:
            lines.append(f"{words}: " + ", ".join(f"{value} ({', '.join(labels)})" for value, labels in values.items()))
    return lines


def git_commit(root: "Path") -> str | None:
    """The commit the run belongs to: DVC's experiment baseline, else ``git rev-parse HEAD``."""
    if os.environ.get("DVC_EXP_BASELINE_REV"):
        return os.environ["DVC_EXP_BASELINE_REV"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
