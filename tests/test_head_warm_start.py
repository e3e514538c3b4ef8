"""The per-epoch head warm-started from the previous epoch's fit: the same selection as a cold start, fewer
L-BFGS iterations."""

from __future__ import annotations

import pytest
import torch

from debias.core.runtime import seed_everything
from debias.params import HeadParams
from debias.schema import validate
from debias.training.loop import fit
from debias.training.methods import Stage2Inputs, fit_head, setup_method, stage2_validator
from debias.training.methods import head as head_module
from tests.test_training import tiny_split


def run(warm_start: bool, monkeypatch) -> tuple[object, list[int], torch.Tensor]:
    """Four epochs of eps-SupInfoNCE + FairKL, best validation worst-group selection; the head's L-BFGS iterations
    per epoch and the selected head's validation logits."""
    train, val = tiny_split(160), tiny_split(90, seed=1)
    params = validate({"stage2": {"method": "eps_supinfonce", "optimizer": "adam", "lr": 3e-3, "batch_size": 32,
                                  "epochs": 4, "head": {"warm_start": warm_start}},
                       "loss": {"fairkl": {"weight": 0.5}}})
    inferred = train.a.clone()
    splits = {"train": train, "val": val, "test": val}
    setup = setup_method(Stage2Inputs(splits, inferred, inferred != train.y, None, params, torch.device("cpu"),
                                      seed_everything(0)))
    iterations: list[int] = []

    def counted(*args, **kwargs) -> int:
        iterations.append(fit_head(*args, **kwargs))
        return iterations[-1]

    monkeypatch.setattr(head_module, "fit_head", counted)
    s2 = params.stage2
    result = fit(setup.task, setup.optimizer, s2.epochs, stage2_validator(setup.model, splits, s2.method, 64,
                                                                        torch.device("cpu"), s2.head),
                 selection="best_worst_group")
    setup.model.load_state_dict(result.selected_state["model"])
    setup.model.eval()
    with torch.no_grad():
        logits = setup.model(val.x)
    return result, iterations, logits


@pytest.mark.slow
def test_a_warm_started_head_selects_the_same_epoch_with_the_same_metrics(monkeypatch) -> None:
    cold, _, cold_logits = run(False, monkeypatch)
    warm, _, warm_logits = run(True, monkeypatch)
    assert warm.selected_epoch == cold.selected_epoch
    for a, b in zip(cold.history, warm.history):  # the encoder's training never reads the head
        assert a["train/loss"] == b["train/loss"]
        for key in ("val/worst_group", "val/avg", "val/unbiased"):
            assert a[key] == pytest.approx(b[key], abs=1.5 / 90), key  # at most one validation point flips
    assert cold.history[warm.selected_epoch]["val/avg"] == pytest.approx(warm.history[warm.selected_epoch]["val/avg"],
                                                                          abs=1.5 / 90)
    # both heads solve the same convex problem to L-BFGS's tolerance: their predictions agree
    assert (cold_logits.argmax(1) == warm_logits.argmax(1)).float().mean() >= 0.97


def test_the_head_starts_from_zero_unless_warm_started() -> None:
    setup = setup_method(Stage2Inputs({"train": tiny_split(60)}, tiny_split(60).a, torch.zeros(60, dtype=torch.bool),
                                      None, validate({"stage2": {"method": "supcon"}}), torch.device("cpu"),
                                      seed_everything(0)))
    model, train = setup.model, tiny_split(60)
    first = fit_head(model, train, 32, torch.device("cpu"), max_iter=200)
    again_warm = fit_head(model, train, 32, torch.device("cpu"), max_iter=200, warm_start=True)
    again_cold = fit_head(model, train, 32, torch.device("cpu"), max_iter=200)
    assert again_warm < first and again_cold == first  # from the optimum: (almost) nothing to do
    assert HeadParams().warm_start is True and HeadParams().tolerance == 1e-7
