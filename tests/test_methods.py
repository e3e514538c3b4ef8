"""Stage-2 methods: each trains on a tiny dataset and lowers its loss; errors; JTT pool; CNC resume."""

from __future__ import annotations

import math

import pytest
import torch

from torch import nn

from debias import losses
from debias.core.runtime import seed_everything
from debias.data.augment import random_shift, view
from debias.params import ParamsError
from debias.schema import validate
from debias.training.loop import fit
from debias.training.methods import (METHODS, Stage2Inputs, fit_head, head_trained_methods, jtt_pool, setup_method,
                                     stage2_validator)
from debias.training.methods.supcon.train import (fairkl_activity, fairkl_summary, fairkl_warnings, objective,
                                            stratified_batches)
from tests.losses.reference import RELEASED_CASES, ref_released_objective, unit
from tests.test_training import tiny_split

CPU = torch.device("cpu")


def inputs(method: str, inferred: torch.Tensor | None = None, **overrides) -> Stage2Inputs:
    """A tiny stage-2 setup; ``overrides`` update ``stage2`` (a dict value updates that subsection)."""
    train, val = tiny_split(120), tiny_split(60, seed=1)
    stage2 = {"method": method, "optimizer": "adam", "lr": 3e-3, "batch_size": 32,
              "cnc": {"num_positives": 4, "num_negatives": 4, "accumulation": 2, "forward_chunk": 1, "temperature": 0.1,
                      "anchor_fraction": 0.25},
              "wcl": {"projection_dim": 16}}
    for key, value in overrides.items():
        stage2[key] = {**stage2.get(key, {}), **value} if isinstance(value, dict) else value
    params = validate({"stage2": stage2, "loss": {"temperature": 0.1, "fairkl": {"weight": 0.5}}})
    inferred = train.a.clone() if inferred is None else inferred
    return Stage2Inputs({"train": train, "val": val, "test": val}, inferred, inferred != train.y, None, params, CPU,
                        seed_everything(0), inferred_group=train.y * 3 + inferred)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_method_lowers_its_loss(method: str) -> None:
    setup = setup_method(inputs(method))
    first = setup.task.train_epoch(0)["train/loss"]
    for epoch in range(1, 6):
        last = setup.task.train_epoch(epoch)["train/loss"]
    assert last < first, (method, first, last)


def test_registry_holds_every_method_of_the_papers() -> None:
    """The papers' methods are registered; a method added beside them needs no edit here (the registry is the list)."""
    assert set(METHODS) >= {"cnc", "supcon", "eps_supcon", "eps_supinfonce", "wcl", "jtt", "erm",
                            "lff", "groupdro", "dcl", "hcl"}
    assert head_trained_methods() >= {"erm", "jtt", "cnc"}
    assert not head_trained_methods() & {"supcon", "eps_supcon", "eps_supinfonce", "wcl"}


@pytest.mark.parametrize("method, activation", [("eps_supinfonce", nn.Tanh), ("supcon", nn.Tanh), ("cnc", nn.ReLU),
                                                ("wcl", nn.ReLU), ("erm", nn.ReLU)])
def test_the_feature_layer_ends_in_each_papers_activation(method: str, activation: type) -> None:
    """auto: Tanh for the contrastive losses used without a projection head (FairKL authors' encoder), ReLU for
    CNC's LeNet-5, WCL (projection head) and the CE baselines; an explicit choice applies to every method."""
    setup = setup_method(inputs(method))
    assert isinstance(setup.model.encoder.features[-1], activation)
    assert setup.model.encoder.options["feature_activation"] == activation.__name__.lower()
    forced = inputs(method)
    forced.params.model.feature_activation = "relu"
    assert isinstance(setup_method(forced).model.encoder.features[-1], nn.ReLU)
    with pytest.raises(ParamsError, match="feature_activation = tanh"):
        validate({"model": {"name": "resnet18", "feature_activation": "tanh"}})


def test_a_cnc_epoch_is_one_two_sided_batch_per_anchor() -> None:
    train = tiny_split(120)
    setup = setup_method(inputs("cnc", cnc={"anchor_fraction": 1.0}))  # stage2.cnc.anchor_fraction, not |anchors| / M
    anchors = int((train.a == train.y).sum())
    assert len(setup.task.sampler) == anchors
    setup = setup_method(inputs("cnc", cnc={"anchor_fraction": 0.5}))
    assert len(setup.task.sampler) == round(0.5 * anchors)


def _reference_wcl(z_d: list[torch.Tensor], z_b: list[torch.Tensor], t: float, tau_plus: float) -> tuple[float, float]:
    """WCL's two losses by loops in float64, written from the paper (Sec. 5.2, 6): every one of the 2B views is an
    anchor, its other view the positive, the other 2B - 2 views its negatives; w = 1 + Dd~ / (Dd~ + Db~) with each
    distance divided by its largest (view, negative) distance in the batch; g' Chuang et al.'s debiased sum."""
    zd, zb = torch.cat(z_d).double(), torch.cat(z_b).double()
    n, b = len(zd), len(zd) // 2
    negatives = {k: [j for j in range(n) if j != k and j != (k + b) % n] for k in range(n)}
    dd = {(k, j): float((zd[k] - zd[j]).norm()) for k in range(n) for j in negatives[k]}
    db = {(k, j): float((zb[k] - zb[j]).norm()) for k in range(n) for j in negatives[k]}
    max_d, max_b = max(dd.values()), max(db.values())
    weighted, triplet = 0.0, 0.0
    for k in range(n):
        p = (k + b) % n
        s_pos = float(zd[k] @ zd[p]) / t
        total = sum((1 + (dd[k, j] / max_d) / (dd[k, j] / max_d + db[k, j] / max_b)) * math.exp(float(zd[k] @ zd[j]) / t)
                    for j in negatives[k])
        m = len(negatives[k])
        g = max((total - tau_plus * m * math.exp(s_pos)) / (1 - tau_plus), m * math.exp(-1 / t))
        weighted += -math.log(math.exp(s_pos) / (math.exp(s_pos) + g)) / n
        d_pos = float((zb[k] - zb[p]).square().sum())
        d_neg = sum(float((zb[k] - zb[j]).square().sum()) for j in negatives[k]) / m
        triplet += (d_pos - (d_neg - tau_plus * d_pos) / (1 - tau_plus)) / n
    return weighted, triplet


def test_wcl_trains_on_two_colour_destroying_views_against_all_2b_minus_2_negatives() -> None:
    setup = setup_method(inputs("wcl", wcl={"grayscale_p": 1.0, "tau_plus": 0.1}))
    task = setup.task
    index = torch.arange(6)
    state = task.generator.get_state()
    loss, weighted, triplet = task.batch_loss(index)
    # the same views again from the same generator state, through the encoders and projection heads
    task.generator.set_state(state)
    rows = task.train.x[index]
    first, second = task.views(rows, task.generator), task.views(rows, task.generator)
    assert first.shape == second.shape == task.train.x[index].shape and not torch.equal(first, second)
    assert torch.equal(first[:, 0], first[:, 1]) and torch.equal(first[:, 1], first[:, 2])  # grayscale: no colour
    with torch.no_grad():
        z_d = [nn.functional.normalize(task.projector(task.model.embed(v)), dim=1) for v in (first, second)]
        z_b = [nn.functional.normalize(task.biased_projector(task.biased.embed(v)), dim=1) for v in (first, second)]
    assert z_d[0].shape[1] == task.params.stage2.wcl.projection_dim  # the losses see the projection head
    ref_weighted, ref_triplet = _reference_wcl(z_d, z_b, task.params.stage2.wcl.temperature, 0.1)
    assert float(weighted) == pytest.approx(ref_weighted, rel=1e-4)
    assert float(triplet) == pytest.approx(ref_triplet, rel=1e-4, abs=1e-5)
    assert float(loss) == pytest.approx(ref_weighted + ref_triplet, rel=1e-4)


def test_fairkl_activity_counts_its_pair_sets_and_names_a_starved_side() -> None:
    y = torch.tensor([0, 0, 0, 1, 1, 1])
    b = torch.tensor([0, 0, 1, 1, 1, 1])  # one bias-conflicting point (index 2)
    activity = fairkl_activity(y, b)
    brute = {name: 0 for name in losses.FAIRKL_SETS}
    for i in range(6):
        for j in range(i + 1, 6):
            kind = ("pos" if y[i] == y[j] else "neg") + ("_aligned" if b[i] == b[j] else "_conflicting")
            brute[kind] += 1
    assert {k.removeprefix("fairkl_pairs_"): v for k, v in activity.items() if "pairs" in k} == brute
    assert activity["fairkl_pos_active"] == 1.0 and activity["fairkl_neg_active"] == 1.0
    aligned = fairkl_activity(y, y.clone())  # no conflicting point: both sides inactive
    assert aligned["fairkl_pos_active"] == 0.0 and aligned["fairkl_neg_active"] == 0.0
    params = inputs("eps_supinfonce").params
    history = [{"epoch": float(e), "train/fairkl_pos_active": 0.1, "train/fairkl_neg_active": 0.9,
                **{f"train/fairkl_pairs_{name}": 1.0 for name in losses.FAIRKL_SETS}} for e in range(2)]
    (message,) = fairkl_warnings(fairkl_summary(history, params))
    assert message.startswith("fairkl-starved: ") and "positive side" in message and "stratified" in message
    assert "FairKL contributes 0" in message
    params.loss.fairkl.variant = "released"  # no side is zeroed there: an empty set's mean is 0
    (message,) = fairkl_warnings(fairkl_summary(history, params))
    assert "empty set's mean taken as 0" in message and "contributes 0" not in message


def test_stratified_batches_hold_minority_points_and_every_other_point_once() -> None:
    minority = torch.zeros(100, dtype=torch.bool)
    minority[[3, 50, 77]] = True
    batches = stratified_batches(minority, 16, 4, torch.Generator().manual_seed(0))
    assert all(int(minority[batch].sum()) == 4 for batch in batches)
    majority = torch.cat([batch[~minority[batch]] for batch in batches])
    assert torch.equal(majority.sort().values, torch.nonzero(~minority).flatten())
    setup = setup_method(inputs("eps_supinfonce", batch_size=16))
    setup.task.params.loss.fairkl.sampler = "stratified"
    metrics = setup.task.train_epoch(0)
    assert metrics["train/fairkl_pos_active"] == 1.0 and metrics["train/fairkl_neg_active"] == 1.0


def test_cnc_without_inferred_minority_names_the_class() -> None:
    train = tiny_split(120)
    with pytest.raises(ValueError, match=r"class \d has no training points whose inferred label differs"):
        setup_method(inputs("cnc", inferred=train.y.clone()))


def test_jtt_upweights_errors_and_needs_some() -> None:
    """lambda_up extra copies, as JTT's run_expt.py (ConcatDataset of the set and up_weight copies of the errors)."""
    minority = torch.tensor([False, True, False, True])
    pool = jtt_pool(4, minority, upweight=3)
    assert torch.bincount(pool, minlength=4).tolist() == [1, 4, 1, 4]
    assert len(jtt_pool(10, torch.arange(10) < 2, upweight=20)) == 10 + 2 * 20
    with pytest.raises(ParamsError, match="stage2.jtt.upweight"):
        validate({"stage2": {"jtt": {"upweight": 2.5}}})
    train = tiny_split(120)
    with pytest.raises(ValueError, match="jtt: infer_groups found no inferred minority"):
        setup_method(inputs("jtt", inferred=train.y.clone()))


@pytest.mark.slow
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


@pytest.mark.slow
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


RELEASED_FORMS = {"eps_supinfonce": ("supinfonce", 0.5), "eps_supcon": ("supcon", 0.25), "supcon": ("supcon", 0.0)}


@pytest.mark.parametrize("method", sorted(RELEASED_FORMS))
@pytest.mark.parametrize("alpha, lam", [(0.03, 0.75), (0.5, 0.25), (0.3, 0.0)])
def test_released_objective_gets_alpha_and_lambda_as_configured(method: str, alpha: float, lam: float) -> None:
    """loss.fairkl.variant released: the method's loss is main_infonce.py's criterion (alpha applied twice with
    FairKL, once without; tau / 0.07; eps-SupCon's own epsilon and lambda) against the float64 reference."""
    y, bias = RELEASED_CASES["mixed"]
    z = unit(len(y), 5, seed=9)
    params = validate({"stage2": {"method": method},
                       "loss": {"alpha": alpha, "epsilon": 0.5, "temperature": 0.1,
                                "fairkl": {"variant": "released", "weight": lam},
                                "eps_supcon": {"epsilon": 0.25, "fairkl_weight": lam}}})
    form, eps = RELEASED_FORMS[method]
    loss, terms = objective(z, torch.tensor(y), torch.tensor(bias), method, params)
    assert loss.item() == pytest.approx(ref_released_objective(z, y, bias, alpha, lam, eps, 0.1, form), rel=1e-10)
    assert ("fairkl" in terms) == (lam > 0)


@pytest.mark.parametrize("variant", ["kl", "mean"])
def test_paper_objective_gets_alpha_lambda_and_eps_supcons_own_values(variant: str) -> None:
    """kl / mean: alpha * L_con + lambda * FairKL (Eq. 11); eps_supcon reads loss.eps_supcon (FairKL Table 6)."""
    y, bias = (torch.tensor(v) for v in RELEASED_CASES["three_bias"])
    z = unit(len(y), 5, seed=2)
    params = validate({"loss": {"alpha": 0.2, "epsilon": 0.5, "temperature": 0.1,
                                "fairkl": {"variant": variant, "weight": 0.6},
                                "eps_supcon": {"epsilon": 0.25, "fairkl_weight": 0.3}}})
    reg = losses.fairkl(z, y, bias, variant)
    loss, _ = objective(z, y, bias, "eps_supinfonce", params)
    assert loss.item() == pytest.approx((0.2 * losses.eps_supinfonce(z, y, 0.5, 0.1) + 0.6 * reg).item(), rel=1e-12)
    loss, _ = objective(z, y, bias, "eps_supcon", params)
    assert loss.item() == pytest.approx((0.2 * losses.eps_supcon(z, y, 0.25, 0.1) + 0.3 * reg).item(), rel=1e-12)
    loss, terms = objective(z, y, None, "supcon", params)  # no bias labels: FairKL left out
    assert loss.item() == pytest.approx(0.2 * losses.supcon(z, y, 0.1).item(), rel=1e-12) and "fairkl" not in terms


def test_a_released_training_step_logs_the_composed_loss() -> None:
    """Through the task's step: the logged loss is alpha^2 * contrastive + lambda * fairkl, batch by batch."""
    setup = inputs("eps_supinfonce")
    setup.params.loss.alpha, setup.params.loss.fairkl.weight = 0.4, 0.7
    setup.params.loss.fairkl.variant = "released"
    row = setup_method(setup).task.train_epoch(0)
    expected = 0.4 ** 2 * row["train/contrastive"] + 0.7 * row["train/fairkl"]
    assert row["train/loss"] == pytest.approx(expected, rel=1e-5)


def _official_two_view(out_1: torch.Tensor, out_2: torch.Tensor, t: float, tau_plus: float,
                       beta: float | None) -> float:
    """The criterion of the official DCL code (chingyaoc/DCL main.py) and, with ``beta``, HCL's (joshr17/HCL
    image/main.py), on the normalised projections ``out_1``, ``out_2``, written as loops in float64:
    ``Ng = max((-tau+ N pos + sum_neg w e^s) / (1 - tau+), N e^{-1/t})``, ``loss = mean -log(pos / (pos + Ng))``,
    ``w = 1`` (DCL) or ``e^{beta s} / mean_neg e^{beta s}`` (HCL)."""
    out = torch.cat([out_1, out_2]).double()
    rows, batch = out.shape[0], out_1.shape[0]
    n = rows - 2
    total = 0.0
    for k in range(rows):
        partner = (k + batch) % rows
        pos = math.exp(float(out[k] @ out[partner]) / t)
        negs = [math.exp(float(out[k] @ out[j]) / t) for j in range(rows) if j not in (k, partner)]
        if beta is None:
            weighted = sum(negs)
        else:
            imp = [v ** beta for v in negs]
            weighted = sum(i * v for i, v in zip(imp, negs)) / (sum(imp) / len(imp))
        ng = max((-tau_plus * n * pos + weighted) / (1 - tau_plus), n * math.exp(-1 / t))
        total += -math.log(pos / (pos + ng))
    return total / rows


@pytest.mark.parametrize("method", ["dcl", "hcl"])
def test_dcl_and_hcl_train_a_128d_projection_head_with_the_official_criterion(method: str) -> None:
    """Like the official DCL / HCL code (and our WCL): the loss is computed on a 128-d projection head after the
    encoder, trained with it; tau+ null is 1 / number of classes; the views are WCL's (colour strength 1.0)."""
    setup_inputs = inputs(method)
    setup = setup_method(setup_inputs)
    task = setup.task
    train = setup_inputs.splits["train"]
    assert task.tau_plus == pytest.approx(1 / train.n_classes)
    trained = {id(p) for group in setup.optimizer.param_groups for p in group["params"]}
    assert all(id(p) in trained for p in task.projector.parameters())
    g = torch.Generator().manual_seed(3)
    rows = train.x[:16]
    first, second = task.views(rows, g), task.views(rows, g)
    with torch.no_grad():
        z1, z2 = task.project(first), task.project(second)
        got = float(task.batch_loss(first, second, 16))
    assert z1.shape == (16, 128)
    hcl = setup_inputs.params.stage2.hcl
    beta = hcl.beta if method == "hcl" else None
    assert got == pytest.approx(_official_two_view(z1, z2, 0.5, 1 / train.n_classes, beta), rel=1e-5)
    assert setup_inputs.params.stage2.wcl.colour_strength == 1.0


def test_cnc_short_pools_shrink_cuts_m_and_n_to_the_smallest_pool_as_the_released_loader() -> None:
    """short_pools: shrink = contrastive_supervised_loader.py's adjust_num_pos_neg_ (min over the pools); replace
    keeps M and N and draws short pools with replacement."""
    setup = inputs("cnc", cnc={"num_positives": 50, "num_negatives": 60})
    replace = setup_method(setup).task.sampler.report()
    assert (replace["num_anchors"], replace["num_negatives"]) == (50, 60) and replace["short_pools"]
    classes = [e for e in replace["classes"].values() if e["skipped"] is None]
    smallest_pos = min(min(e["anchor_pool"], e["positive_pool"]) for e in classes)
    smallest_neg = min(s for e in classes for s in (e["negative_pool"], *e["negatives2_pools"].values()))
    setup.params.stage2.cnc.short_pools = "shrink"
    shrunk = setup_method(setup).task.sampler.report()
    assert (shrunk["num_anchors"], shrunk["num_negatives"]) == (min(50, smallest_pos), min(60, smallest_neg))
    assert not shrunk["short_pools"]
