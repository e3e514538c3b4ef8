"""Cross-entropy baselines: ``erm`` (a second ERM run with stage 2's optimiser settings, for seed-matched
comparisons) and ``jtt`` (JTT: the inferred minority, ERM's errors when groups.method is pred, present
1 + upweight times per epoch, as the official run_expt.py concatenates ``up_weight`` extra copies of them to the
training set)."""

from __future__ import annotations

import torch

from debias.training.classifier import ClassifierTask
from debias.training.methods.base import Stage2Inputs, Stage2Setup, fresh_model, stage2_optimiser


def erm_method(inputs: Stage2Inputs) -> Stage2Setup:
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.parameters())
    task = ClassifierTask(model, optimizer, inputs.splits["train"], inputs.params.stage2.batch_size,
                          inputs.generator, inputs.device, augment_shift=inputs.params.stage2.augment_shift)
    return Stage2Setup(task, model, optimizer, scheduler)


def jtt_pool(n: int, minority: torch.Tensor, upweight: int) -> torch.Tensor:
    """Indices one JTT epoch visits: every point once plus ``upweight`` extra copies of each minority point
    (``1 + upweight`` in all), as JTT's run_expt.py: ``ConcatDataset([train, Subset(train, errors * up_weight)])``."""
    errors = torch.nonzero(minority).flatten()
    return torch.cat([torch.arange(n), errors.repeat(upweight)])


def jtt_method(inputs: Stage2Inputs) -> Stage2Setup:
    if not bool(inputs.minority.any()):
        raise ValueError("stage2.method = jtt: infer_groups found no inferred minority (error) point to upweight; "
                         "check groups.method, or train ERM less (JTT needs ERM errors)")
    model = fresh_model(inputs)
    optimizer, scheduler = stage2_optimiser(inputs, model.parameters())
    train = inputs.splits["train"]
    pool = jtt_pool(len(train), inputs.minority, inputs.params.stage2.jtt.upweight)
    task = ClassifierTask(model, optimizer, train, inputs.params.stage2.batch_size, inputs.generator,
                          inputs.device, pool=pool, augment_shift=inputs.params.stage2.augment_shift)
    facts = {"jtt_error_points": int(inputs.minority.sum()), "jtt_epoch_size": len(pool)}
    return Stage2Setup(task, model, optimizer, scheduler, report=lambda history: facts)
