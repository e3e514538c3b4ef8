"""The comparison baselines' training steps (LfF, GroupDRO, DCL/HCL), the views by modality, soft bias scores."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from debias import losses
from debias.core.runtime import seed_everything
from debias.data.store import BiasedSplit
from debias.groups import infer_groups, load_groups, save_groups
from debias.schema import validate
from debias.training.methods import Stage2Inputs, setup_method
from debias.training.methods import views
from debias.training.methods.base import group_balanced_batches
from debias.training.methods.groupdro.train import compact_groups
from debias.training.methods.lff.train import LossEMA
from debias.training.methods.selfsup import train as selfsup
from tests.test_training import tiny_split

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tabular_split(n: int = 64, seed: int = 0) -> BiasedSplit:
    """Feature vectors: two numeric columns and a 3-value one-hot column; y from the first, a from the one-hot."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    a = torch.randint(0, 2, (n,), generator=g)
    colour = torch.randint(0, 3, (n,), generator=g)
    x = torch.cat([(2 * y.float() - 1)[:, None] + 0.3 * torch.randn(n, 1, generator=g), torch.randn(n, 1, generator=g),
                   F.one_hot(colour, 3).float()], 1)
    return BiasedSplit(x, y, a, a == y, 2, 2, ("age", "hours", "colour=a", "colour=b", "colour=c"))


def stage2_inputs(method: str, train: BiasedSplit, overrides: dict | None = None, **extra) -> Stage2Inputs:
    params = validate({"model": {"name": "mlp", "mlp": {"hidden": [16, 8]}} if train.modality == "tabular" else {},
                       "stage2": {"method": method, "optimizer": "adam", "lr": 3e-3, "batch_size": 16,
                                  "augment_shift": 0, **(overrides or {})}})
    inferred = train.a.clone()
    return Stage2Inputs({"train": train, "val": train, "test": train}, inferred, inferred != train.y, None, params,
                        CPU, seed_everything(0), **extra)


# --------------------------------------------------------------------------- LfF


def test_lff_loss_ema_starts_at_the_first_loss_and_normalises_by_the_class_maximum() -> None:
    ema = LossEMA(torch.tensor([0, 0, 1, 1]), 2, alpha=0.7)
    ema.update(torch.tensor([0, 1, 2]), torch.tensor([1.0, 2.0, 4.0]))
    assert ema.value.tolist() == [1.0, 2.0, 4.0, 0.0]  # first losses set the average
    ema.update(torch.tensor([0]), torch.tensor([3.0]))
    assert ema.value[0].item() == pytest.approx(0.7 * 1.0 + 0.3 * 3.0)  # 1.6
    assert ema.normalised(torch.tensor([0, 1, 2, 3])).tolist() == pytest.approx([1.6 / 2.0, 1.0, 1.0, 0.0])
    restored = LossEMA(torch.tensor([0, 0, 1, 1]), 2, alpha=0.7)
    restored.load_state_dict(ema.state_dict())
    assert torch.equal(restored.value, ema.value) and torch.equal(restored.seen, ema.seen)


def test_lff_step_weights_the_debiased_ce_by_relative_difficulty() -> None:
    train = tabular_split()
    setup = setup_method(stage2_inputs("lff", train, {"lff": {"q": 0.7, "ema_alpha": 0.7}}))
    task = setup.task
    index = torch.arange(16)
    with torch.no_grad():
        ce_b = F.cross_entropy(task.biased(train.x[index]), train.y[index], reduction="none")
        ce_d = F.cross_entropy(task.model(train.x[index]), train.y[index], reduction="none")
        gce = losses.generalized_cross_entropy(task.biased(train.x[index]), train.y[index], 0.7)
    # first step: the EMAs are the batch's losses; every other point of the class is 0, so the class maximum is
    # the batch's maximum per class
    top_b = torch.stack([ce_b[train.y[index] == c].max() for c in (0, 1)])[train.y[index]]
    top_d = torch.stack([ce_d[train.y[index] == c].max() for c in (0, 1)])[train.y[index]]
    weight = (ce_b / top_b) / (ce_b / top_b + ce_d / top_d)
    parts = task.step(index, 0)
    assert parts["weight"].item() == pytest.approx(weight.mean().item(), rel=1e-5)
    assert parts["loss"].item() == pytest.approx((gce + (weight * ce_d).mean()).item(), rel=1e-5)
    assert set(task.extra_state()) >= {"ema_biased", "ema_debiased", "generator"}
    assert set(task.modules()) == {"model", "biased"} and setup.model is task.model  # the debiased one is kept


# --------------------------------------------------------------------------- GroupDRO


def test_groupdro_step_moves_weight_to_the_worst_group_as_alg_1() -> None:
    assert [t.tolist() for t in compact_groups(torch.tensor([7, 2, 7, 9]))] == [[1, 0, 1, 2], [2, 7, 9]]
    train = tabular_split()
    groups = train.y * 2 + train.a
    setup = setup_method(stage2_inputs("groupdro", train, {"groupdro": {"step_size": 0.5, "adjustment": 1.0}},
                                       inferred_group=groups))
    task = setup.task
    assert task.q.tolist() == [0.25] * 4
    index = torch.arange(16)
    with torch.no_grad():
        per_sample = F.cross_entropy(task.model(train.x[index]), train.y[index], reduction="none").double()
    batch = groups[index]
    present = torch.tensor([bool((batch == g).any()) for g in range(4)])
    mean = torch.tensor([per_sample[batch == g].mean().item() if present[g] else 0.0 for g in range(4)],
                        dtype=torch.float64)
    adjusted = mean + 1.0 / torch.bincount(groups, minlength=4).double().sqrt()
    expected = torch.where(present, 0.25 * torch.exp(0.5 * adjusted), 0.0)  # Alg. 1, then renormalised
    expected = torch.where(present, expected / expected.sum() * 0.25 * present.sum(), 0.25)
    parts = task.step(index, 0)
    assert torch.allclose(task.q, expected, atol=1e-6)
    assert parts["loss"].item() == pytest.approx(float((expected * mean).sum()), rel=1e-5)
    assert torch.equal(task.extra_state()["q"], task.q)
    with pytest.raises(ValueError, match="groupdro needs the groups table's inferred_group"):
        setup_method(stage2_inputs("groupdro", train))


def test_groupdro_draws_group_balanced_batches_with_replacement_unless_told_not_to() -> None:
    groups = torch.cat([torch.zeros(9000, dtype=torch.long), torch.ones(900, dtype=torch.long),
                        torch.full((100,), 2, dtype=torch.long)])  # 90 % / 9 % / 1 %
    batches = group_balanced_batches(groups, 32, torch.Generator().manual_seed(0))
    index = torch.cat(batches)
    assert len(index) == len(groups) and all(len(b) == 32 for b in batches[:-1])
    share = torch.bincount(groups[index], minlength=3).double() / len(index)
    # each group 1/3: binomial std sqrt(p(1-p)/n) = 0.0047 at n = 10,000; 6 std of margin
    assert torch.allclose(share, torch.full((3,), 1 / 3, dtype=torch.float64), atol=0.03)
    # the 1 % group's ~3,333 draws reach every one of its 100 points (P(a point is missed) = e^-33 per point)
    assert len(torch.unique(index[groups[index] == 2])) == 100
    again = group_balanced_batches(groups, 32, torch.Generator().manual_seed(0))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))

    train = tabular_split()
    minority = (torch.arange(len(train)) < 4).long()  # 4 points in group 1
    for balanced, expect_share in ((True, 0.5), (False, 4 / len(train))):
        setup = setup_method(stage2_inputs("groupdro", train, {"groupdro": {"balanced_sampling": balanced}},
                                           inferred_group=minority))
        drawn = torch.cat([torch.cat(setup.task.batches()) for _ in range(50)])
        assert len(drawn) == 50 * len(train)
        share = float(minority[drawn].double().mean())
        assert abs(share - expect_share) < (0.1 if balanced else 1e-9)


# --------------------------------------------------------------------------- views by modality


@pytest.mark.parametrize("method", ["dcl", "hcl", "wcl"])
def test_self_supervised_methods_use_scarf_views_on_feature_vectors(method, monkeypatch) -> None:
    train = tabular_split()
    calls = []
    original = views.tabular_view

    def recording(x, generator, **options):
        calls.append(options)
        return original(x, generator, **options)

    monkeypatch.setattr(views, "tabular_view", recording)
    setup = setup_method(stage2_inputs(method, train, {"tabular_view": {"corruption_rate": 0.4}}))
    metrics = setup.task.train_epoch(0)
    assert math.isfinite(metrics["train/loss"])
    assert len(calls) == 2 * 4  # two views of each of the 4 batches
    assert all(c["corruption_rate"] == 0.4 and c["pool"] is train.x for c in calls)
    assert calls[0]["groups"].tolist() == [0, 1, 2, 2, 2]  # the one-hot columns are one feature


def test_dcl_and_hcl_use_wcls_simclr_views_on_images(monkeypatch) -> None:
    """The same views as WCL (stage2.wcl's options, colour strength 1.0), so the rows differ only in the loss."""
    shapes, options = [], []
    original = selfsup.simclr_view

    def recording(x, g, **kw):
        shapes.append(tuple(x.shape))
        options.append(kw)
        return original(x, g, **kw)

    monkeypatch.setattr(selfsup, "simclr_view", recording)
    monkeypatch.setattr(views, "tabular_view", lambda *a, **k: pytest.fail("images took tabular views"))
    setup = setup_method(stage2_inputs("hcl", tiny_split(32), {"batch_size": 16}))
    setup.task.train_epoch(0)
    assert shapes == [(16, 3, 28, 28)] * 4
    assert all(kw["brightness"] == 0.8 and kw["hue"] == 0.2 and kw["crop_scale"] == (0.2, 1.0) for kw in options)


# --------------------------------------------------------------------------- soft bias scores


def test_soft_groups_store_the_bias_capturing_models_scores_and_fairkl_reads_them(tmp_path, monkeypatch) -> None:
    train = tiny_split(24)
    logits = torch.randn(24, 3, generator=torch.Generator().manual_seed(0)) * 3
    params = validate({"groups": {"method": "soft", "soft": {"temperature": 2.0}}}).groups
    soft = infer_groups("soft", train, torch.zeros(24, 4), logits, params, seed=0)
    assert torch.allclose(soft.bias_scores, torch.softmax(logits / 2.0, 1), atol=1e-6)
    assert torch.equal(soft.inferred_label, logits.argmax(1)) and torch.equal(soft.minority, logits.argmax(1) != train.y)
    save_groups(tmp_path / "g.parquet", soft)
    loaded = load_groups(tmp_path / "g.parquet", y=train.y)
    assert torch.allclose(loaded.bias_scores, soft.bias_scores) and torch.equal(loaded.inferred_label, soft.inferred_label)
    hard = infer_groups("pred", train, torch.zeros(24, 4), logits, params, seed=0)
    save_groups(tmp_path / "h.parquet", hard)
    assert load_groups(tmp_path / "h.parquet").bias_scores is None

    seen = []
    original = losses.fairkl
    monkeypatch.setattr(losses, "fairkl", lambda z, y, bias, variant, **kw: seen.append(bias) or original(z, y, bias, variant, **kw))
    inputs = stage2_inputs("eps_supinfonce", train, bias_scores=loaded.bias_scores)
    inputs.params.loss.fairkl.weight = 1.0
    setup_method(inputs).task.train_epoch(0)
    assert seen and all(b.dtype == torch.float32 and b.shape[1] == 3 for b in seen)


# --------------------------------------------------------------------------- resume


def _fit(method: str, state_path, interrupt_at: int | None = None):
    from debias.training.loop import fit
    from debias.training.methods import stage2_validator

    train = tabular_split()
    setup = setup_method(stage2_inputs(method, train, inferred_group=train.y * 2 + train.a))
    if interrupt_at is not None:
        original = setup.task.train_epoch

        def train_epoch(epoch: int):
            if epoch == interrupt_at:
                raise KeyboardInterrupt
            return original(epoch)

        setup.task.train_epoch = train_epoch
    check = stage2_validator(setup.model, {"train": train, "val": train}, method, 64, CPU)
    result = fit(setup.task, setup.optimizer, 3, check, state_path=state_path, state_key={"params": "k"})
    return setup.task, result


@pytest.mark.parametrize("method", ["lff", "groupdro", "dcl", "hcl", "wcl", "jtt", "erm", "cnc", "eps_supinfonce"])
def test_every_methods_report_and_warnings_take_the_training_history(method) -> None:
    """train_stage2 calls ``setup.report(history)`` and ``setup.warnings(history)`` after training (LfF's and
    GroupDRO's reports once took no argument and failed only there, at the end of a benchmark run)."""
    train = tiny_split(48)
    setup = setup_method(stage2_inputs(method, train, inferred_group=train.g))
    history = [{"epoch": 0.0, "train/loss": 1.0}]
    assert isinstance(setup.report(history), dict) and isinstance(setup.warnings(history), list)


@pytest.mark.parametrize("method", ["lff", "groupdro"])
def test_lff_and_groupdro_resume_with_their_state(method, tmp_path) -> None:
    reference, ref = _fit(method, None)
    with pytest.raises(KeyboardInterrupt):
        _fit(method, tmp_path / "state.pt", interrupt_at=2)
    resumed, result = _fit(method, tmp_path / "state.pt")
    assert result.resumed_from == 2
    assert [h["train/loss"] for h in result.history] == [h["train/loss"] for h in ref.history]
    for name, module in reference.modules().items():
        assert all(torch.equal(v, resumed.modules()[name].state_dict()[k]) for k, v in module.state_dict().items())
    if method == "lff":
        assert torch.equal(resumed.ema_biased.value, reference.ema_biased.value)
    else:
        assert torch.equal(resumed.q, reference.q)
