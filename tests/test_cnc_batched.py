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
from debias.schema import validate
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


@pytest.mark.slow
def test_an_epoch_with_one_forward_per_step_trains_the_same_weights_as_per_batch_forwards(float64) -> None:
    grouped, per_batch = cnc_setup(forward_chunk=K), cnc_setup(forward_chunk=1)
    assert len(grouped.task.sampler) >= 2 * K  # several optimiser steps
    first, second = grouped.task.train_epoch(0), per_batch.task.train_epoch(0)
    for a, b in zip(grouped.model.parameters(), per_batch.model.parameters()):
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-12)
    assert math.isfinite(first["train/loss"]) and math.isfinite(second["train/loss"])


@pytest.mark.slow
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


def _head_and_encoder_gradients_per_step(head_gradient: str, epochs: int) -> list[tuple[list[torch.Tensor], list[torch.Tensor]]]:
    """(head gradients, encoder gradients) at every optimiser step; lr 1e-12, so every step sees the same weights (to
    float precision) and the same draws of the sampler in both modes."""
    train = tiny_split(60)
    params = validate({"model": {"name": "mlp"}, "stage2": {
        "method": "cnc", "optimizer": "sgd", "lr": 1e-12, "momentum": 0.0, "weight_decay": 0.0, "augment_shift": 0,
        "cnc": {"num_positives": 2, "num_negatives": 2, "accumulation": 2, "forward_chunk": 2, "temperature": 0.1,
                "anchor_fraction": 0.3, "skip_empty_classes": True, "encoder_mode": "eval",
                "head_gradient": head_gradient}}})
    inferred = train.a.clone()
    torch.manual_seed(0)
    setup = setup_method(Stage2Inputs({"train": train}, inferred, inferred != train.y, None, params,
                                      torch.device("cpu"), seed_everything(0)))
    seen: list[tuple[list[torch.Tensor], list[torch.Tensor]]] = []
    step = setup.task.optimizer.step

    def recording_step(*args, **kwargs):
        seen.append(([p.grad.clone() for p in setup.model.head.parameters()],
                     [p.grad.clone() for p in setup.model.encoder.parameters() if p.grad is not None]))
        return step(*args, **kwargs)

    setup.task.optimizer.step = recording_step
    for epoch in range(epochs):
        setup.model.train()
        setup.task.train_epoch(epoch)
    return seen


def test_head_gradient_epoch_sum_steps_the_head_with_the_epochs_running_sum() -> None:
    """``head_gradient: epoch_sum`` (the released code's classifier, zeroed once per epoch): the head's gradient at
    step k of an epoch is the sum of the per-step head gradients g_1..g_k of that epoch, restarting at each epoch;
    the encoder's is its own step's, as with ``step``."""
    per_step = _head_and_encoder_gradients_per_step("step", epochs=2)
    summed = _head_and_encoder_gradients_per_step("epoch_sum", epochs=2)
    assert len(per_step) == len(summed) and len(per_step) % 2 == 0 and len(per_step) >= 4
    steps_per_epoch = len(per_step) // 2
    for epoch in range(2):
        running = [torch.zeros_like(g) for g in per_step[0][0]]
        for k in range(epoch * steps_per_epoch, (epoch + 1) * steps_per_epoch):
            (head, encoder), (head_sum, encoder_sum) = per_step[k], summed[k]
            running = [r + g for r, g in zip(running, head)]
            for expected, got in zip(running, head_sum):
                torch.testing.assert_close(got, expected)
            for expected, got in zip(encoder, encoder_sum):
                torch.testing.assert_close(got, expected)
    # the sum is not the step's own gradient once an epoch has two steps with different batches
    assert not torch.allclose(summed[1][0][0], per_step[1][0][0])
