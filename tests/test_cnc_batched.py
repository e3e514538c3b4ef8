"""CNC's accumulated contrastive batches encoded in one forward pass give Alg. 3's gradient.

The reference is the per-batch loop written from the algorithm: every two-sided batch (anchors, positives,
negatives, second-side negatives) forwarded alone, its loss lambda * (L(anchor_1, positives, negatives) +
L(positive_1, anchors, negatives2)) + (1 - lambda) * mean CE over its points (CNC Eq. 14 / 15, App. B), the step's
loss the mean over its batches. LeNet-5 (no BatchNorm), float64: one pass over the whole group must give the same
gradient; so must a whole epoch trained with ``forward_chunk = accumulation`` against ``forward_chunk = 1``.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from debias.core.runtime import seed_everything
from debias.params import validate
from debias.training.methods import Stage2Inputs, setup_method
from tests.test_training import tiny_split

M, N, K = 4, 3, 5  # positives, negatives per side, contrastive batches per step


@pytest.fixture
def float64():
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(before)


def cnc_setup(forward_chunk: int, model: str = "lenet5"):
    train = tiny_split(150)
    params = validate({"model": {"name": model}, "stage2": {
        "method": "cnc", "optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "augment_shift": 2,
        "cnc": {"num_positives": M, "num_negatives": N, "accumulation": K, "forward_chunk": forward_chunk,
                "temperature": 0.1, "anchor_fraction": 0.5, "skip_empty_classes": True}}})
    inferred = train.a.clone()
    torch.manual_seed(0)
    return setup_method(Stage2Inputs({"train": train}, inferred, inferred != train.y, None, params,
                                     torch.device("cpu"), seed_everything(0)))


def reference_loss(model, x: torch.Tensor, y: torch.Tensor, lam: float, t: float) -> torch.Tensor:
    """Alg. 3's step loss, batch by batch, straight from the formula (each batch forwarded alone)."""
    width = 2 * M + 2 * N
    total = 0.0
    for b in range(K):
        rows = slice(b * width, (b + 1) * width)
        z, logits = model.embed_and_classify(x[rows])
        z = z / z.norm(dim=1, keepdim=True)
        anchors, positives, negatives, negatives2 = z.split([M, M, N, N])

        def side(anchor: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
            s_pos, s_neg = pos @ anchor / t, neg @ anchor / t
            denominator = torch.logsumexp(torch.cat([s_pos, s_neg]), 0)
            return -(s_pos - denominator).mean()

        contrastive = side(anchors[0], positives, negatives) + side(positives[0], anchors, negatives2)
        total = total + lam * contrastive + (1 - lam) * F.cross_entropy(logits, y[rows])
    return total / K


def gradients(model) -> list[torch.Tensor]:
    return [p.grad.clone() for p in model.parameters()]


def test_one_forward_over_the_accumulated_batches_gives_the_per_batch_gradient(float64) -> None:
    setup = cnc_setup(forward_chunk=K)
    task, model = setup.task, setup.model
    cnc = task.params.stage2.cnc
    x, y, sizes = task._step_inputs(K)
    contrastive, ce = task._chunk_loss(x, y, sizes)  # the whole group in one pass
    (cnc.contrastive_weight * contrastive + (1 - cnc.contrastive_weight) * ce).backward()
    grouped = gradients(model)
    model.zero_grad(set_to_none=True)
    reference_loss(model, x, y, cnc.contrastive_weight, cnc.temperature).backward()
    for ours, ref in zip(grouped, gradients(model)):
        assert torch.allclose(ours, ref, rtol=1e-9, atol=1e-12)
    assert any(g.abs().max() > 0 for g in grouped)


def test_an_epoch_with_one_forward_per_step_trains_the_same_weights_as_per_batch_forwards(float64) -> None:
    grouped, per_batch = cnc_setup(forward_chunk=K), cnc_setup(forward_chunk=1)
    assert len(grouped.task.sampler) >= 2 * K  # several optimiser steps
    first, second = grouped.task.train_epoch(0), per_batch.task.train_epoch(0)
    for a, b in zip(grouped.model.parameters(), per_batch.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
    assert math.isfinite(first["train/loss"]) and math.isfinite(second["train/loss"])


def test_with_batchnorm_one_forward_normalises_over_the_whole_group() -> None:
    """A BatchNorm encoder (resnet18) sees the group's batch statistics in one pass, one batch's per batch: the
    gradients differ; ``forward_chunk: 1`` is the per-batch path."""
    grouped, per_batch = cnc_setup(forward_chunk=K, model="resnet18"), cnc_setup(forward_chunk=1, model="resnet18")
    per_batch.model.load_state_dict(grouped.model.state_dict())
    x, y, sizes = grouped.task._step_inputs(K)
    for setup, chunk in ((grouped, K), (per_batch, 1)):
        width = sum(sizes)
        for start in range(0, K, chunk):
            rows = slice(start * width, (start + chunk) * width)
            contrastive, ce = setup.task._chunk_loss(x[rows], y[rows], sizes)
            ((0.75 * contrastive + 0.25 * ce) * (chunk / K)).backward()
    differs = [not torch.allclose(a.grad, b.grad, rtol=1e-4, atol=1e-6)
               for a, b in zip(grouped.model.parameters(), per_batch.model.parameters()) if a.grad is not None]
    assert any(differs)


def _batchnorm_statistics(model) -> list[torch.Tensor]:
    return [t.clone() for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)
            for t in (m.running_mean, m.running_var)]


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_encoder_mode_eval_freezes_batchnorm_as_the_released_code(mode) -> None:
    """``stage2.cnc.encoder_mode: eval`` (train_supervised_contrast.py's encoder.eval()): a stage-2 epoch leaves the
    encoder's BatchNorm running statistics as they were, while the weights still train; ``train`` updates them."""
    train = tiny_split(60)
    params = validate({"model": {"name": "mlp"}, "stage2": {
        "method": "cnc", "optimizer": "sgd", "lr": 0.05, "momentum": 0.0, "weight_decay": 0.0, "augment_shift": 0,
        "cnc": {"num_positives": 2, "num_negatives": 2, "accumulation": 2, "forward_chunk": 2, "temperature": 0.1,
                "anchor_fraction": 0.2, "skip_empty_classes": True, "encoder_mode": mode}}})
    inferred = train.a.clone()
    torch.manual_seed(0)
    setup = setup_method(Stage2Inputs({"train": train}, inferred, inferred != train.y, None, params,
                                      torch.device("cpu"), seed_everything(0)))
    statistics = _batchnorm_statistics(setup.model)
    weights = [p.detach().clone() for p in setup.model.encoder.parameters()]
    assert statistics, "the mlp encoder has BatchNorm layers"
    setup.model.train()  # what the loop does before every epoch
    setup.task.train_epoch(0)
    frozen = all(torch.equal(a, b) for a, b in zip(statistics, _batchnorm_statistics(setup.model)))
    assert frozen == (mode == "eval")
    assert any(not torch.equal(a, b) for a, b in zip(weights, setup.model.encoder.parameters()))
