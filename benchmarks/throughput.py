"""The throughput benchmarks' training data: speed.yaml's ``throughput`` base params with the dataset path filled in,
the biased training split they make, and its seeded subsets.

Imports only the debias APIs every commit since 11a1806 shares (``params.validate``, ``data.sources.load_source``,
``data.bias.inject_bias``, ``BiasedSplit.subset``), so ``steps_ab.py``'s worker can run it against an older tree
(``PYTHONPATH=OLD_TREE/src``); speed.py, speed_settings.py and steps_ab.py build their data here.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch


def fill_npz(tree: Any, npz: Path) -> Any:
    """Replace the placeholder NPZ by the dataset path, everywhere in a config tree."""
    if isinstance(tree, dict):
        return {k: fill_npz(v, npz) for k, v in tree.items()}
    return str(npz) if tree == "NPZ" else tree


def throughput_train(config: dict, npz: Path) -> tuple[dict, Any]:
    """The throughput config's base params (NPZ filled in) and the biased training split they make."""
    from debias.data.bias import inject_bias
    from debias.data.sources import load_source
    from debias.schema import validate

    base = fill_npz(config["base"], npz)
    params = validate(base)
    with tempfile.TemporaryDirectory() as raw_dir:
        train = inject_bias(load_source(params.data, Path(raw_dir), params.seed), params.bias, params.seed,
                            source=params.data.source)["train"]
    return base, train


def subset(split: Any, size: int, seed: int) -> Any:
    """``size`` points of the BiasedSplit ``split``, drawn with ``seed``, in their original order."""
    if size > len(split):
        raise SystemExit(f"{size} samples asked for, the training split holds {len(split)}: lower the steps")
    return split.subset(torch.randperm(len(split), generator=torch.Generator().manual_seed(seed))[:size].sort().values)
