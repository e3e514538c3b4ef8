"""The epoch loop: selection of the best-validation epoch, and resume after an interruption."""

from __future__ import annotations

import pytest
import torch

from debias.data.store import BiasedSplit
from debias.models import build_model
from debias.runtime import seed_everything
from debias.training.erm import ClassifierTask, evaluate, validator
from debias.training.loop import build_optimizer, fit


def tiny_split(n: int = 96, seed: int = 0) -> BiasedSplit:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 3, (n,), generator=g)
    a = torch.where(torch.rand(n, generator=g) < 0.8, y, torch.randint(0, 3, (n,), generator=g))
    x = torch.randint(0, 40, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    x[torch.arange(n), a, :6, :6] = 250  # colour patch = bias attribute
    x[torch.arange(n), :, 10 + 4 * y, 10:20] = 200  # a stripe = class
    return BiasedSplit(x, y, a, a == y, 3, 3)


class Interrupt(Exception):
    pass


def run(epochs: int, state_path=None, interrupt_at: int | None = None, selection: str = "last"):
    generator = seed_everything(0)
    train, val = tiny_split(), tiny_split(seed=1)
    model = build_model("lenet5", 3, 28)
    optimizer = build_optimizer(model.parameters(), "adam", 3e-3, 0.9, 0.0)
    task = ClassifierTask(model, optimizer, train, 16, generator, torch.device("cpu"), progress=False)
    if interrupt_at is not None:
        original = task.train_epoch

        def train_epoch(epoch: int):
            if epoch == interrupt_at:
                raise Interrupt
            return original(epoch)

        task.train_epoch = train_epoch  # type: ignore[method-assign]
    result = fit(task, optimizer, epochs, validator(model, val, 64, torch.device("cpu")), selection=selection,
                 state_path=state_path, state_key={"params": "k"})
    return model, result


def test_training_lowers_the_loss() -> None:
    _, result = run(4)
    assert result.history[-1]["train/loss"] < result.history[0]["train/loss"]


def test_selection_keeps_the_best_validation_epoch() -> None:
    model, result = run(5, selection="best_worst_group")
    scores = [row["val/worst_group"] for row in result.history]
    assert result.selected_epoch == scores.index(max(scores))
    model.load_state_dict(result.selected_state["model"])
    assert evaluate(model, tiny_split(seed=1), 64, torch.device("cpu"))["worst_group"] == pytest.approx(max(scores))
    _, last = run(5, selection="last")
    assert last.selected_epoch == 4


def test_resume_after_interruption_matches_an_uninterrupted_run(tmp_path) -> None:
    reference, ref_result = run(4)
    state = tmp_path / "resume.pt"
    with pytest.raises(Interrupt):
        run(4, state_path=state, interrupt_at=2)
    assert state.exists()
    resumed, result = run(4, state_path=state)
    assert result.resumed_from == 2
    assert [row["train/loss"] for row in result.history] == [row["train/loss"] for row in ref_result.history]
    for key, value in reference.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[key]), key


def test_resume_state_from_other_params_is_ignored(tmp_path) -> None:
    state = tmp_path / "resume.pt"
    with pytest.raises(Interrupt):
        run(3, state_path=state, interrupt_at=1)
    generator = seed_everything(0)
    model = build_model("lenet5", 3, 28)
    optimizer = build_optimizer(model.parameters(), "adam", 3e-3, 0.9, 0.0)
    task = ClassifierTask(model, optimizer, tiny_split(), 16, generator, torch.device("cpu"), progress=False)
    result = fit(task, optimizer, 1, validator(model, tiny_split(seed=1), 64, torch.device("cpu")),
                 state_path=state, state_key={"params": "other"})
    assert result.resumed_from is None
