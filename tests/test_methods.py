"""Stage-2 methods: each trains on a tiny dataset and lowers its loss; errors; JTT pool; CNC resume."""

from __future__ import annotations

import pytest
import torch

from debias.data.augment import random_shift, view
from debias.params import validate
from debias.runtime import seed_everything
from debias.training.loop import fit
from debias.training.methods import METHODS, Stage2Inputs, fit_head, jtt_pool, setup_method, stage2_validator
from tests.test_training import tiny_split

CPU = torch.device("cpu")


def inputs(method: str, inferred: torch.Tensor | None = None, **overrides) -> Stage2Inputs:
    train, val = tiny_split(120), tiny_split(60, seed=1)
    params = validate({"stage2": {"method": method, "optimizer": "adam", "lr": 3e-3, "batch_size": 32,
                                  "cnc": {"num_positives": 4, "num_negatives": 4, "accumulation": 2,
                                          "forward_chunk": 1}, **overrides},
                       "loss": {"temperature": 0.1, "fairkl": {"weight": 0.5}}})
    inferred = train.a.clone() if inferred is None else inferred
    return Stage2Inputs({"train": train, "val": val, "test": val}, inferred, inferred != train.y, None, params, CPU,
                        seed_everything(0), inferred_group=train.y * 3 + inferred)


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_lowers_its_loss(method: str) -> None:
    setup = setup_method(inputs(method))
    first = setup.task.train_epoch(0)["train/loss"]
    for epoch in range(1, 6):
        last = setup.task.train_epoch(epoch)["train/loss"]
    assert last < first, (method, first, last)


def test_registry_holds_every_method_of_the_papers() -> None:
    assert set(METHODS) == {"cnc", "supcon", "eps_supcon", "eps_supinfonce", "wcl", "jtt", "erm",
                            "lff", "groupdro", "dcl", "hcl"}


def test_cnc_without_inferred_minority_names_the_class() -> None:
    train = tiny_split(120)
    with pytest.raises(ValueError, match=r"class \d has no training points whose inferred label differs"):
        setup_method(inputs("cnc", inferred=train.y.clone()))


def test_jtt_upweights_errors_and_needs_some() -> None:
    minority = torch.tensor([False, True, False, True])
    pool = jtt_pool(4, minority, upweight=3)
    assert torch.bincount(pool, minlength=4).tolist() == [1, 3, 1, 3]
    train = tiny_split(120)
    with pytest.raises(ValueError, match="jtt: infer_groups found no inferred minority"):
        setup_method(inputs("jtt", inferred=train.y.clone()))


def test_fit_head_learns_a_linear_rule_on_frozen_features() -> None:
    setup = setup_method(inputs("supcon"))
    for epoch in range(4):
        setup.task.train_epoch(epoch)
    before = {k: v.clone() for k, v in setup.model.encoder.state_dict().items()}
    fit_head(setup.model, tiny_split(120), 64, CPU)
    assert all(torch.equal(before[k], v) for k, v in setup.model.encoder.state_dict().items())  # encoder frozen
    check = stage2_validator(setup.model, {"train": tiny_split(120), "val": tiny_split(120)}, "supcon", 64, CPU)
    assert check()["val/avg"] > 0.9  # the training split itself, linearly separable after training


def _cnc_run(state_path, interrupt_at: int | None = None):
    setup = setup_method(inputs("cnc"))
    if interrupt_at is not None:
        original = setup.task.train_epoch

        def train_epoch(epoch: int):
            if epoch == interrupt_at:
                raise KeyboardInterrupt
            return original(epoch)

        setup.task.train_epoch = train_epoch
    check = stage2_validator(setup.model, {"train": tiny_split(120), "val": tiny_split(60, seed=1)}, "cnc", 64, CPU)
    result = fit(setup.task, setup.optimizer, 3, check, selection="best_worst_group", state_path=state_path,
                 state_key={"params": "k"})
    return setup.model, result


def test_cnc_resumes_with_its_sampler_state(tmp_path) -> None:
    reference, ref = _cnc_run(None)
    with pytest.raises(KeyboardInterrupt):
        _cnc_run(tmp_path / "state.pt", interrupt_at=2)
    resumed, result = _cnc_run(tmp_path / "state.pt")
    assert result.resumed_from == 2
    assert [h["train/loss"] for h in result.history] == [h["train/loss"] for h in ref.history]
    assert all(torch.equal(v, resumed.state_dict()[k]) for k, v in reference.state_dict().items())


def test_augmentations_are_batched_shifts_and_noise() -> None:
    x = torch.zeros(4, 3, 8, 8, dtype=torch.uint8)
    x[:, :, 3:5, 3:5] = 200
    g = torch.Generator().manual_seed(0)
    shifted = random_shift(x, 2, g)
    assert shifted.dtype == torch.uint8 and shifted.shape == x.shape
    assert (shifted.flatten(1) == 200).sum(1).tolist() == [12] * 4  # the square moved, never cut (|shift| <= 2)
    assert torch.equal(random_shift(x, 0, g), x)
    noisy = view(x, 0, 10.0, g)
    assert noisy.dtype == torch.float32 and 0 <= float(noisy.min()) and float(noisy.max()) <= 255
