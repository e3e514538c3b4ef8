"""CNC with the ε margin (``loss.epsilon``): ε = 0 trains exactly as CNC did before it took a margin, and the
shipped default's stage 2 reads ε (a changed value changes its first-epoch loss)."""

from __future__ import annotations

import pytest
import torch
import yaml

from debias import losses
from debias.core.runtime import seed_everything
from debias.core.trees import merge
from debias.schema import validate
from debias.schema.applicability import RunContext, unread
from debias.training.methods import Stage2Inputs, setup_method
from tests.conftest import committed_text
from tests.losses.test_cnc import _cnc_before_epsilon
from tests.test_methods import inputs
from tests.test_training import tiny_split

CPU = torch.device("cpu")


def _cnc_two_sided_before_epsilon(anchors, positives, negatives, negatives2, temperature, epsilon):
    """Eq. 14 on the pre-margin loss; the training passes ``loss.epsilon``, 0 here."""
    assert epsilon == 0
    one = _cnc_before_epsilon(anchors[..., 0, :], positives, negatives, temperature)
    return one + _cnc_before_epsilon(positives[..., 0, :], anchors, negatives2, temperature)


def _train(setup_inputs: Stage2Inputs, epochs: int) -> tuple[list[dict[str, float]], dict[str, torch.Tensor]]:
    setup = setup_method(setup_inputs)
    history = [setup.task.train_epoch(epoch) for epoch in range(epochs)]
    return history, setup.model.state_dict()


def _with_epsilon(epsilon: float) -> Stage2Inputs:
    made = inputs("cnc")
    made.params.loss.epsilon = epsilon
    return made


def test_epsilon_zero_trains_the_same_history_and_weights_as_cnc_before_the_margin(monkeypatch) -> None:
    history, weights = _train(_with_epsilon(0.0), 2)
    with monkeypatch.context() as patched:
        patched.setattr(losses, "cnc_two_sided", _cnc_two_sided_before_epsilon)
        before_history, before_weights = _train(_with_epsilon(0.0), 2)
    assert history == before_history
    assert all(torch.equal(value, before_weights[key]) for key, value in weights.items())
    other_history, _ = _train(_with_epsilon(0.5), 1)  # the margin is read: another value trains otherwise
    assert other_history[0]["train/contrastive"] != before_history[0]["train/contrastive"]


def _default_inputs(epsilon: float) -> Stage2Inputs:
    """The committed params.yaml's stage 2 (whatever its method and schedule) with ``loss.epsilon`` set, on a tiny
    split standing in for the data."""
    params = validate(merge(yaml.safe_load(committed_text("params.yaml")), {"loss": {"epsilon": epsilon}}))
    train = tiny_split(240)
    splits = {"train": train, "val": tiny_split(60, seed=1), "test": tiny_split(60, seed=2)}
    return Stage2Inputs(splits, train.a.clone(), train.a != train.y, None, params, CPU, seed_everything(0),
                        inferred_group=train.y * 3 + train.a)


@pytest.mark.slow
def test_the_shipped_defaults_first_epoch_loss_moves_by_more_than_one_percent_with_epsilon() -> None:
    """README's canonical experiment (``-S loss.epsilon=0.25``) asks the default a real question: its stage 2 reads ε,
    and ε = 0.25 moves the first epoch's loss by more than 1 % against ε = 0."""
    params = _default_inputs(0.0).params
    assert unread("loss.epsilon", RunContext(params)) is None
    params.stage2.cnc.anchor_fraction = min(params.stage2.cnc.anchor_fraction, 0.25)  # one short epoch is enough
    first = {}
    for epsilon in (0.0, 0.25):
        made = _default_inputs(epsilon)
        made.params.stage2.cnc.anchor_fraction = params.stage2.cnc.anchor_fraction
        first[epsilon] = setup_method(made).task.train_epoch(0)["train/loss"]
    assert abs(first[0.25] - first[0.0]) > 0.01 * abs(first[0.0]), first
