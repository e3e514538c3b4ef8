"""A param that applies but weighs almost nothing is warned about (negligible-param), as is one changed where the run does
not read it (unread-param): the supcon family's default objective gives ε almost no weight, the default CNC none."""

from __future__ import annotations

import copy

import pytest
import torch
import yaml
from debias.losses import RELEASED_BASE_TEMPERATURE
from debias.schema import validate
from debias.schema.applicability import RELEASED_BASE_TEMPERATURE as APPLICABILITY_BASE
from debias.schema.applicability import NEGLIGIBLE_SHARE, RunContext, loss_weights, weak, weak_warnings
from debias.training.methods.supcon.train import objective
from tests.conftest import committed_text

RELEASED_SMALL_ALPHA = {"variant": "released", "alpha": 0.03, "weight": 0.5}  # the committed default objective
KL_ALPHA_1 = {"variant": "kl", "alpha": 1.0, "weight": 0.5}  # Eq. 11 with the contrastive term at full weight
# The stage-2 loss on one fixed batch, and its gradient, must move by more than this fraction between ε 0.25 and 0.5
# (ratios of float64 values on the same batch; the default moves by ~2-3 %, the earlier objective by ~0.04 %).
EPSILON_EFFECT = 0.01


def committed(**loss: object) -> dict:
    """The committed params.yaml as a dict with stage 2 eps-SupInfoNCE at ε 0.5, ``loss`` keys (alpha, variant, weight,
    epsilon) replaced."""
    raw = yaml.safe_load(committed_text("params.yaml"))
    raw = copy.deepcopy(raw)
    raw["stage2"]["method"] = "eps_supinfonce"
    raw["loss"]["epsilon"] = 0.5  # FairKL Table 6's eps-SupInfoNCE margin (params.yaml's is the default CNC's)
    for key, value in loss.items():
        if key in ("variant", "weight"):
            raw["loss"]["fairkl"][key] = value
        else:
            raw["loss"][key] = value
    return raw


def fixed_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """64 normalised features clustered by class (class centre + unit noise in 16 dimensions, as a partly trained
    encoder's), 5 classes, a bias label aligned with the class for 90 % of the points."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(64) % 5
    b = torch.where(torch.rand(64, generator=g) < 0.9, y, (y + 1) % 5)
    centres = torch.randn(5, 16, generator=g, dtype=torch.float64)
    z = centres[y] + torch.randn(64, 16, generator=g, dtype=torch.float64)
    return torch.nn.functional.normalize(z, dim=1), y, b


def stage2_loss(raw: dict, epsilon: float) -> tuple[float, torch.Tensor]:
    """The stage-2 objective of ``raw`` with ``loss.epsilon`` on :func:`fixed_batch`, and its gradient there."""
    raw = copy.deepcopy(raw)
    raw["loss"]["epsilon"] = epsilon
    params = validate(raw)
    z, y, b = fixed_batch()
    z.requires_grad_(True)
    loss, _ = objective(z, y, b, params.stage2.method, params)
    loss.backward()
    return float(loss.detach()), z.grad


def relative_change(raw: dict) -> tuple[float, float]:
    """(loss, gradient) change between ε 0.25 and 0.5, relative to the larger loss / the ε 0.5 gradient's norm."""
    (low, grad_low), (high, grad_high) = stage2_loss(raw, 0.25), stage2_loss(raw, 0.5)
    return abs(high - low) / max(abs(low), abs(high)), float((grad_high - grad_low).norm() / grad_high.norm())


def test_loss_weights_follow_the_objectives_composition() -> None:
    assert APPLICABILITY_BASE == RELEASED_BASE_TEMPERATURE  # the losses' own scale, restated without torch
    old = validate(committed(**RELEASED_SMALL_ALPHA))
    weights = loss_weights(old)
    assert weights["contrastive"] == pytest.approx(0.03 ** 2 * old.loss.temperature / 0.07)
    assert weights["fairkl"] == 0.5
    no_fairkl = validate(committed(variant="released", alpha=0.03, weight=0.0))
    assert loss_weights(no_fairkl)["contrastive"] == pytest.approx(0.03 * old.loss.temperature / 0.07)
    paper = validate(committed(variant="kl", alpha=1.0, weight=0.75))
    assert loss_weights(paper) == {"contrastive": 1.0, "fairkl": 0.75}


def test_epsilon_under_the_released_objective_at_alpha_003_is_warned() -> None:
    old = RunContext(validate(committed(**RELEASED_SMALL_ALPHA)))
    reason = weak("loss.epsilon", old)
    assert reason is not None and "0.26%" in reason and "loss.alpha" in reason
    (message,) = weak_warnings(old)
    assert message.startswith("negligible-param: loss.epsilon = ")
    # the term weighs enough: no warning (alpha 1 under either objective)
    for loss in ({"variant": "released", "alpha": 1.0}, KL_ALPHA_1):
        assert weak_warnings(RunContext(validate(committed(**loss)))) == [], loss
    # the committed supcon-family objective is the released one at alpha 0.03: its epsilon is warned
    assert weak_warnings(RunContext(validate(committed()))) == weak_warnings(old)
    # eps_supcon's own epsilon is judged for eps_supcon; loss.epsilon is not read there
    raw = committed(**RELEASED_SMALL_ALPHA)
    raw["stage2"]["method"] = "eps_supcon"
    found = weak_warnings(RunContext(validate(raw)))
    assert [m.split(" =")[0] for m in found] == ["negligible-param: loss.eps_supcon.epsilon"]
    # a method that does not read loss.* at all: nothing to warn about (the param does not apply)
    raw["stage2"]["method"] = "cnc"
    assert weak_warnings(RunContext(validate(raw))) == []


@pytest.mark.slow
def test_check_params_prints_the_warning_and_still_passes(tmp_path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(committed(**RELEASED_SMALL_ALPHA)))
    assert cli_main(["check-params", str(path)]) == 0
    out = capsys.readouterr().out
    assert "WARNING negligible-param: loss.epsilon = 0.5" in out
    path.write_text(yaml.safe_dump(committed(**KL_ALPHA_1)))
    assert cli_main(["check-params", str(path)]) == 0
    assert "negligible-param" not in capsys.readouterr().out
    path.write_text(yaml.safe_dump(committed()))  # the committed supcon-family objective says so of itself
    assert cli_main(["check-params", str(path)]) == 0
    assert "WARNING negligible-param: loss.epsilon = 0.5" in capsys.readouterr().out


def test_a_param_the_run_does_not_read_is_an_unread_param_warning(tmp_path, capsys) -> None:
    """``-S loss.temperature=...`` under CNC (whose loss reads only ``loss.epsilon`` of ``loss.*``) is valid but warned
    as unread-param by check-params and by the report (against the committed params.yaml); a param the run reads
    (ε under CNC and under eps-SupInfoNCE) is not."""
    from debias.schema.applicability import unread, unread_warnings
    from debias.tools.cli import main as cli_main

    raw = committed()
    raw["stage2"]["method"] = "cnc"
    cnc = RunContext(validate(raw))
    assert "stage2.method cnc" in unread("loss.temperature", cnc)
    assert unread("loss.epsilon", cnc) is None and unread("stage2.cnc.temperature", cnc) is None
    assert unread("loss.epsilon", RunContext(validate(committed()))) is None
    (found,) = unread_warnings(cnc, {"loss.temperature": 0.2, "loss.epsilon": 0.25, "stage2.cnc.temperature": 0.1})
    assert found.startswith("unread-param: loss.temperature = 0.2: not read under stage2.method cnc: changing it"), found
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["check-params", str(path), "-S", "loss.temperature=0.2", "-S", "loss.epsilon=0.25"]) == 0
    out = capsys.readouterr().out
    assert "WARNING unread-param: loss.temperature = 0.2: not read under stage2.method cnc" in out
    assert "unread-param: loss.epsilon" not in out
    path.write_text(yaml.safe_dump(committed()))
    assert cli_main(["check-params", str(path), "-S", "loss.epsilon=0.25"]) == 0
    assert "unread-param" not in capsys.readouterr().out


def test_each_margin_applies_only_where_its_method_reads_it() -> None:
    """loss.epsilon is the margin of eps_supinfonce and CNC; eps_supcon reads its own (loss.eps_supcon.*), supcon none."""
    from debias.schema.applicability import applies

    raw = committed()
    expected = {"eps_supinfonce": (True, False), "cnc": (True, False), "eps_supcon": (False, True),
                "supcon": (False, False), "wcl": (False, False)}
    for method, (epsilon, eps_supcon) in expected.items():
        raw["stage2"]["method"] = method
        context = RunContext(validate(raw))
        assert applies("loss.epsilon", context) is epsilon, method
        assert applies("loss.eps_supcon.epsilon", context) is eps_supcon, method
        assert applies("loss.eps_supcon.fairkl_weight", context) is eps_supcon, method


def test_epsilon_changes_the_stage2_loss_only_where_its_term_weighs() -> None:
    """kl at alpha 1: ε 0.25 and 0.5 give stage-2 losses (and gradients) apart by more than EPSILON_EFFECT on a fixed
    batch; the committed default (released, alpha 0.03) does not, as its negligible-param warning says."""
    loss, gradient = relative_change(committed(**KL_ALPHA_1))
    assert loss > EPSILON_EFFECT and gradient > EPSILON_EFFECT, (loss, gradient)
    for objective in (RELEASED_SMALL_ALPHA, {}):
        loss, gradient = relative_change(committed(**objective))
        assert loss < EPSILON_EFFECT and gradient < EPSILON_EFFECT, (objective, loss, gradient)
    assert NEGLIGIBLE_SHARE == EPSILON_EFFECT  # the warning's threshold is the effect this test calls visible


@pytest.mark.parametrize("loss,warned", [(RELEASED_SMALL_ALPHA, True), (KL_ALPHA_1, False)])
def test_a_negligible_param_is_a_warning_of_the_stage_2_run(tmp_path, loss, warned) -> None:
    """The run itself records ``negligible-param`` among train_contrastive's warnings (so the report, MLflow and
    ``debias compare`` show it as they show every stage warning); under kl at alpha 1 ε weighs enough."""
    import json

    from debias.harness.tracking import StageRun
    from debias.training.methods import train_stage2
    from debias.training.outputs import StageOutputs
    from tests.test_training import tiny_split

    values = committed(**loss)
    values["stage2"].update(epochs=1, batch_size=32)
    values["groups"]["method"] = "true"
    params = validate(values)
    train, val = tiny_split(64), tiny_split(32, seed=1)
    outputs = StageOutputs(model=tmp_path / "stage2.pt", embeddings_dir=tmp_path / "stage2",
                           metrics=tmp_path / "stage2_train.json", curves=tmp_path / "curves.csv",
                           resume=tmp_path / "resume.pt")
    train_stage2(params, {"train": train, "val": val, "test": val}, train.a.clone(), train.a != train.y, None,
                 StageRun(None, None), outputs, params_warnings=weak_warnings(RunContext(params)))
    found = [w for w in json.loads(outputs.metrics.read_text()).get("warnings", []) if w.startswith("negligible-param")]
    # the stage hands train_stage2 what the params say of the run (research code imports no schema module)
    from tests.conftest import REPO

    assert "params_warnings=weak_warnings(RunContext(params))" in (REPO / "pipeline/train_contrastive.py").read_text()
    assert bool(found) == warned, found
    if warned:
        assert found[0].startswith("negligible-param: loss.epsilon = ")


# A loss term weighted exactly 0 leaves the params only it reads unread: (method, the zero weight, the params only
# that term reads with other values, the same weight non-zero). Each is checked against training itself below.
ZERO_TERMS = {
    "cnc contrastive": ("cnc", {"stage2.cnc.contrastive_weight": 0.0},
                        {"loss.epsilon": 0.5, "stage2.cnc.temperature": 0.5}, {"stage2.cnc.contrastive_weight": 0.5}),
    "fairkl": ("eps_supinfonce", {"loss.fairkl.weight": 0.0},
               {"loss.fairkl.sampler": "stratified", "loss.fairkl.minority_per_batch": 4,
                "loss.fairkl.variance_floor": 0.01}, {"loss.fairkl.weight": 0.5}),
    "supcon-family contrastive": ("eps_supinfonce", {"loss.alpha": 0.0}, {"loss.epsilon": 0.5, "loss.temperature": 0.5},
                                  {"loss.alpha": 1.0}),
}


def set_params(params, values: dict) -> None:
    """Assign each dotted ``key: value`` of ``values`` on the params object."""
    for key, value in values.items():
        *parents, leaf = key.split(".")
        target = params
        for part in parents:
            target = getattr(target, part)
        setattr(target, leaf, value)


@pytest.mark.parametrize("case", sorted(ZERO_TERMS))
def test_the_params_of_a_term_weighted_zero_are_unread_and_read_again_when_it_weighs(case: str) -> None:
    from debias.schema.applicability import applies, unread, unread_warnings
    from tests.test_methods import inputs

    method, zero, changed, weighed = ZERO_TERMS[case]
    params = inputs(method).params
    set_params(params, zero)
    context = RunContext(params)
    (weight_key, _), = zero.items()
    for key in changed:
        assert not applies(key, context), key
        assert unread(key, context).startswith(f"not read under {weight_key} 0.0: only the loss's "), unread(key, context)
    found = unread_warnings(context, changed)
    assert [m.split(" =")[0] for m in found] == [f"unread-param: {key}" for key in changed]
    set_params(params, weighed)
    assert all(unread(key, RunContext(params)) is None for key in changed)
    assert unread_warnings(RunContext(params), changed) == []


def _trained_weights(method: str, values: dict) -> dict[str, torch.Tensor]:
    """The weights after one epoch of stage 2 on the tiny split, with the dotted params ``values`` set."""
    from debias.training.methods import setup_method
    from tests.test_methods import inputs

    made = inputs(method)
    set_params(made.params, values)
    setup = setup_method(made)
    setup.task.train_epoch(0)
    return setup.model.state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(ZERO_TERMS))
def test_a_term_weighted_zero_trains_the_same_weights_whatever_its_params(case: str) -> None:
    """What the unread-param warning claims, held against training: the params of the term weighted 0 change no
    weight; with the term weighted, the same change does."""
    method, zero, changed, weighed = ZERO_TERMS[case]
    base, other = _trained_weights(method, zero), _trained_weights(method, {**zero, **changed})
    assert all(torch.equal(value, other[key]) for key, value in base.items())
    base, other = _trained_weights(method, weighed), _trained_weights(method, {**weighed, **changed})
    assert not all(torch.equal(value, other[key]) for key, value in base.items())


def test_check_params_names_the_params_of_a_term_weighted_zero(tmp_path, capsys) -> None:
    from debias.tools.cli import main as cli_main

    raw = committed()
    raw["stage2"]["method"] = "cnc"
    raw["stage2"]["cnc"]["contrastive_weight"] = 0
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["check-params", str(path), "-S", "loss.epsilon=0.25", "-S", "stage2.cnc.temperature=0.1",
                     "-S", "stage2.cnc.num_positives=8"]) == 0
    out = capsys.readouterr().out
    for key in ("loss.epsilon = 0.25", "stage2.cnc.temperature = 0.1"):
        assert (f"WARNING unread-param: {key}: not read under stage2.cnc.contrastive_weight 0.0: only the loss's "
                "contrastive term reads it") in out, out
    assert "unread-param: stage2.cnc.num_positives" not in out  # the CE term trains on the batches it draws
