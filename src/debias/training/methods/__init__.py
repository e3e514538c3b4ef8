"""Stage-2 methods behind a registry (``stage2.method``); each trains a fresh encoder.

A method family is one subpackage here: its ``__init__.py`` declares the family's methods
(:func:`registry.register_method`: params section and the source of each default, display name, memory plan, the
params that apply, whether the head is CE-trained, the temperature key, ...) with pydantic only, and its
``train.py`` holds the training code the declaration names. The registry finds every subpackage
(:func:`registry.discover`); nothing else lists them. docs/extending.md walks through adding one.

``classifier``  ``erm`` (a second ERM run with stage 2's optimiser settings) and ``jtt`` (ERM errors
                present 1 + upweight times per epoch, JTT's run_expt.py): cross-entropy, head trained with the encoder.
``supcon``      ``supcon`` / ``eps_supcon`` / ``eps_supinfonce``: shuffled batches; loss =
                alpha * L_con(z/|z|, y) + lambda * FairKL(z/|z|, y, b) with b the bias labels from
                infer_groups (true or inferred), or the released code's objective (loss.fairkl.variant:
                released, alpha^2 on L_con); no projection head.
``cnc``         CNC (App. B): two-sided contrastive batches from inferred labels;
                loss = lambda * cnc_two_sided + (1 - lambda) * CE on every batch point.
``selfsup``     ``wcl``: difficulty-weighted contrastive learning between two augmented views, with a
                jointly trained triplet (biased) encoder; labels unused.
``lff``         ``lff``: Learning from Failure, a GCE-trained biased model and a relative-difficulty weighted
                debiased model trained together (the debiased one is the stage's model).
``groupdro``    ``groupdro``: Group DRO on the groups table's ``inferred_group`` (true groups with
                ``groups.method: true``, else the inferred ones).
``dclhcl``      ``dcl`` / ``hcl``: WCL's comparison rows, self-supervised two-view InfoNCE with debiased (and
                hard) negatives; labels unused.

Modules shared by the families: ``registry`` (the declarations' registry, torch-free), ``base`` (the inputs every
method gets and the helpers the families share), ``views`` (augmented views by the data's modality, for ``wcl``,
``dcl`` and ``hcl``), ``head`` (the per-epoch linear head of methods that learn no classifier themselves) and
``run`` (:func:`train_stage2`: builds the registered method, trains it, writes the stage's outputs).

This package's ``__init__`` stays light (every declaration imports the registry through it, and the params schema
imports the registry); the training names below are imported from their modules on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from debias.training.methods.registry import (MethodSpec, discover, head_trained_methods, method_spec,
                                              register_method, register_module)

_LAZY = {"Stage2Inputs": "base", "Stage2Setup": "base", "setup_method": "base", "fit_head": "head",
         "jtt_pool": "classifier.train", "stage2_validator": "run", "train_stage2": "run"}

__all__ = ["METHODS", "MethodSpec", "head_trained_methods", "method_spec", "register_method", "register_module",
           *_LAZY]


def __getattr__(name: str) -> Any:
    """The training names (torch) imported on first use: ``from debias.training.methods import train_stage2``;
    ``METHODS``: every registered method, the declarations imported first (:func:`registry.discover`)."""
    if name == "METHODS":
        return discover()
    if name in _LAZY:
        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
