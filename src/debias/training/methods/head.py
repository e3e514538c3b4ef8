"""The per-epoch linear head of methods that learn no classifier themselves (contrastive, self-supervised).

After every epoch the head is fitted on the frozen training features (:func:`fit_head`: multinomial
logistic regression, full-batch L-BFGS, no gradient into the encoder), so every epoch has a
validation worst-group accuracy for checkpoint selection; the linear_probe stage refits it with its
own regularisation search.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from debias.data.store import BiasedSplit
from debias.models import Network
from debias.params import HeadParams
from debias.training.classifier import predict, validator


def fit_head(model: Network, train: BiasedSplit, batch_size: int, device: torch.device,
             weight_decay: float = HeadParams().weight_decay, max_iter: int = HeadParams().max_iter,
             warm_start: bool = False, tolerance: float = HeadParams().tolerance) -> int:
    """Fit ``model.head`` to the frozen training features: min CE(W f(z) + b, y) + weight_decay * |W|^2 (L-BFGS),
    f(z) = z or z / |z| (``model.head_input``).

    Starts from zero, or (``warm_start``) from the head as it is (the previous epoch's fit); stops after
    ``max_iter`` iterations or once every gradient entry is below ``tolerance`` (L-BFGS's ``tolerance_grad``).
    The features stay on ``device``. Returns the iterations L-BFGS ran."""
    z, _ = predict(model, train.x, batch_size, device, keep_on_device=True)
    z = model.head_features(z)  # what the head reads at prediction time (z, or z / |z|: stage2.head.features)
    y = train.y.to(device, non_blocking=True)
    head = model.head
    if not warm_start:
        nn.init.zeros_(head.weight)
        nn.init.zeros_(head.bias)
    optimizer = torch.optim.LBFGS(head.parameters(), lr=1.0, max_iter=max_iter, history_size=20,
                                  line_search_fn="strong_wolfe", tolerance_grad=tolerance)

    def closure() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = F.cross_entropy(head(z), y) + weight_decay * head.weight.square().sum()
        loss.backward()
        return loss

    optimizer.step(closure)
    return int(optimizer.state[head.weight].get("n_iter", 0))


def head_validator(model: Network, splits: dict[str, BiasedSplit], head_trained: bool, batch_size: int,
                   device: torch.device, head: HeadParams,
                   val_inferred_group: torch.Tensor | None = None) -> Callable[[], dict[str, float]]:
    """Validation scalars (per inferred group too, given ``val_inferred_group``); without a jointly trained head the
    head is fitted first (:func:`fit_head`, ``head``: ``stage2.head``)."""
    check = validator(model, splits["val"], batch_size, device, val_inferred_group)
    if head_trained:
        return check

    def refit_then_check() -> dict[str, float]:
        fit_head(model, splits["train"], batch_size, device, head.weight_decay, head.max_iter, head.warm_start,
                 head.tolerance)
        return check()

    return refit_then_check
