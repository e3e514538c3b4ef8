"""The epoch loop: selection of the best-validation epoch, and resume after an interruption."""

from __future__ import annotations

import pytest
import torch

from debias.core.runtime import seed_everything
from debias.data.store import BiasedSplit
from debias.models import build_model
from debias.training.classifier import ClassifierTask, evaluate, validator
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


class ScriptedTask:
    """A task whose 'training' does nothing: validation returns scripted metrics, one row per epoch."""

    def __init__(self) -> None:
        self.model = torch.nn.Linear(1, 1)

    def modules(self):
        return {"model": self.model}

    def train_epoch(self, epoch: int):
        with torch.no_grad():
            self.model.weight.fill_(float(epoch))  # the selected weights tell which epoch was kept
        return {"train/loss": 1.0}

    def extra_state(self):
        return {}

    def load_extra_state(self, state) -> None:
        pass


def scripted_fit(rows: list[tuple[float, float, float]], selection: str = "best_worst_group"):
    """fit() over epochs whose validation (worst-group, unbiased, average) accuracies are ``rows``."""
    task = ScriptedTask()
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.0)
    script = iter(rows)

    def validate():
        worst, unbiased, avg = next(script)
        return {"val/worst_group": worst, "val/unbiased": unbiased, "val/avg": avg}

    result = fit(task, optimizer, len(rows), validate, selection=selection)
    assert float(result.selected_state["model"]["weight"]) == result.selected_epoch
    return result


def test_selection_ties_never_fall_back_to_the_first_epoch_by_accident() -> None:
    # worst-group 0 at every epoch: the rule has nothing to choose by; unbiased accuracy, then average, decide
    result = scripted_fit([(0.0, 0.20, 0.20), (0.0, 0.31, 0.33), (0.0, 0.38, 0.36), (0.0, 0.38, 0.41), (0.0, 0.30, 0.5)])
    assert result.selected_epoch == 3
    assert result.selection["degenerate"] and result.selection["rule"] == "best_worst_group"
    assert "0 at every epoch" in result.selection["reason"] and "epoch 3" in result.selection["reason"]
    # a worst-group tie between later epochs is broken by unbiased accuracy, and is not degenerate
    tied = scripted_fit([(0.1, 0.5, 0.5), (0.4, 0.6, 0.6), (0.4, 0.7, 0.6), (0.3, 0.9, 0.9)])
    assert tied.selected_epoch == 2 and not tied.selection["degenerate"]
    assert "tie" in tied.selection["reason"]
    # the first epoch kept while later ones ran: degenerate
    first = scripted_fit([(0.5, 0.5, 0.5), (0.2, 0.9, 0.9), (0.1, 0.9, 0.9)])
    assert first.selected_epoch == 0 and first.selection["degenerate"]
    assert "first epoch" in first.selection["reason"]
    assert "the later epochs' validation worst-group: 0.200, 0.100" in first.selection["reason"]  # plateau or decline
    # last: the last epoch, never degenerate
    last = scripted_fit([(0.0, 0.2, 0.2), (0.0, 0.1, 0.1)], selection="last")
    assert last.selected_epoch == 1 and not last.selection["degenerate"]


def test_health_checks_name_a_collapsed_representation_and_chance_accuracy() -> None:
    from debias.core import health

    g = torch.Generator().manual_seed(0)
    z = torch.randn(50, 8, generator=g)
    u = torch.nn.functional.normalize(z.double(), dim=1)
    brute = torch.cdist(u, u).square().sum() / (50 * 49)
    assert health.feature_spread(z) == pytest.approx(float(brute), rel=1e-9)
    assert health.collapse_warning(z, "val") is None
    collapsed = torch.ones(50, 8) + 1e-3 * torch.randn(50, 8, generator=g)
    message = health.collapse_warning(collapsed, "the val split")
    assert message.startswith("collapsed-representation: ") and "\n" not in message
    y = torch.tensor([0] * 30 + [1] * 10 + [2] * 10)
    assert health.chance_level(y, 3) == 0.6
    assert health.chance_warning(0.62, 0.6, "test average").startswith("chance-level: ")
    assert health.chance_warning(0.9, 0.6, "test average") is None


def test_a_model_following_the_bias_attribute_is_not_called_chance_level() -> None:
    """A balanced binary split (shapes: the class, the background): a model predicting the background is at chance on
    average (half right) but right on every bias-aligned sample, so it learned the shortcut, not nothing: no
    chance-level warning; a constant prediction, at chance on the aligned samples too, still gets one."""
    from debias.core import health
    from debias.data.store import BiasedSplit
    from debias.metrics.accuracy import accuracy_report
    from debias.training.outputs import health_warnings

    y = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1] * 5)
    a = torch.tensor([0, 0, 1, 1, 1, 1, 0, 0] * 5)  # the background: half of each class aligned with it
    split = BiasedSplit(torch.zeros(40, 3, 4, 4, dtype=torch.uint8), y, a, a == y, 2, 2)
    z = torch.randn(40, 8, generator=torch.Generator().manual_seed(0))
    for prediction, flagged in ((a, False), (torch.zeros_like(y), True), (1 - y, True)):
        report = accuracy_report(prediction, y, a, split.aligned, 2, 2)
        assert report["avg"] <= 0.5
        found = [w for w in health_warnings(z, report["avg"], split, "test", report["aligned"])
                 if w.startswith("chance-level")]
        assert bool(found) == flagged, (prediction, report["aligned"], found)
    assert health.chance_warning(0.5, 0.5, "test average", aligned=(0.97, 0.5)) is None
    assert health.chance_warning(0.5, 0.5, "test average", aligned=(0.52, 0.5)).startswith("chance-level: ")


def test_every_warning_code_is_documented_and_an_unknown_one_is_refused() -> None:
    import re
    from pathlib import Path

    from debias.core import health

    src = Path(health.__file__).parents[1]  # the whole package (health lives in debias/core)
    used = {code for path in src.rglob("*.py") for code in re.findall(r'warning\(\s*"([a-z-]+)"', path.read_text())}
    assert len(used) >= 6 and used <= set(health.CODES)  # each code a stage emits has a meaning for the legends
    assert health.warning("chance-level", "a\n  b") == "chance-level: a b"
    with pytest.raises(ValueError, match="unknown warning code 'chance_level'"):
        health.warning("chance_level", "typo")


def test_a_training_stage_writes_its_selection_and_warnings(tmp_path, capsys) -> None:
    """write_outputs puts the selection block, the warnings and the settings that shape numbers (threads, processes,
    device, torch) into the metrics JSON and prints each warning."""
    import json

    from debias.harness.tracking import StageRun
    from debias.training.outputs import StageOutputs, write_outputs

    model, result = run(3, selection="best_worst_group")
    with torch.no_grad():  # an encoder whose features are constant: collapsed, and its head at chance
        model.encoder.features[-2].weight.zero_()
    result.selected_state = {"model": {k: v.clone() for k, v in model.state_dict().items()}}
    result.selection = {"rule": "best_worst_group", "selected_epoch": 0, "degenerate": True,
                        "reason": "validation worst-group accuracy was 0 at every epoch (3); epoch 0 kept"}
    out = StageOutputs(model=tmp_path / "m.pt", embeddings_dir=tmp_path / "emb", metrics=tmp_path / "metrics.json",
                       curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    splits = {"train": tiny_split(), "val": tiny_split(seed=1), "test": tiny_split(seed=2)}
    write_outputs(model, "lenet5", result, splits, StageRun(None, None), out, 64, torch.device("cpu"), "stage2 x",
                  warnings=["fairkl-starved: a method's own warning"])
    metrics = json.loads(out.metrics.read_text())
    assert metrics["selection"]["degenerate"] and metrics["selection"]["selected_epoch"] == 0
    codes = [w.split(":")[0] for w in metrics["warnings"]]
    assert codes[:2] == ["fairkl-starved", "degenerate-selection"]
    assert {"collapsed-representation", "chance-level"} <= set(codes)
    printed = capsys.readouterr().out
    assert all(f"WARNING {w}" in printed for w in metrics["warnings"])
    assert metrics["environment"]["threads"] == torch.get_num_threads() and metrics["environment"]["processes"] == 1
    assert metrics["environment"]["device"] == "cpu" and metrics["environment"]["torch"] == torch.__version__


def test_unstable_training_fires_on_a_spike_or_a_high_end_and_not_on_a_smooth_or_noisy_loss() -> None:
    import math
    import random

    from debias.core import health
    from debias.params import HealthParams

    limits = HealthParams()
    check = lambda losses: health.instability_warning(losses, limits.loss_spike, limits.loss_end,  # noqa: E731
                                                      limits.loss_min_fall)
    smooth = [2.0 * math.exp(-t / 4) + 0.05 for t in range(30)]
    rng = random.Random(0)
    noisy = [value * (1 + rng.uniform(-0.1, 0.1)) for value in smooth]  # +-10 % epoch to epoch, still converging
    assert check(smooth) is None and check(noisy) is None
    # negative losses (eps-SupInfoNCE) that fall steadily: no warning either
    assert check([5.5 - 0.2 * t for t in range(30)]) is None
    # the default run's shape: 5.5 falling to 0.28, a jump to 1.9 (31 % of the fall), recovery
    spiky = [5.5, 4.6, 3.9, 3.1, 2.4, 1.8, 1.3, 1.0, 0.63, 0.28, 1.9, 3.4, 2.6, 1.3, 0.6, 0.2]
    message = check(spiky)
    assert message is not None and message.startswith("unstable-training: ")
    assert "from 0.28 at epoch 9 to 1.9 at epoch 10" in message and "31%" in message
    # a bump one tenth as high (3 % of the fall) is noise, not instability
    assert check(spiky[:10] + [0.44, 0.35, 0.3, 0.25, 0.2]) is None
    # a loss that drifts back up and ends far above its minimum (no single jump above the spike threshold)
    drifting = [4.0, 3.0, 2.0, 1.0, 0.5, 0.9, 1.3, 1.5]
    assert check(drifting[:6]) is None
    assert "ended at 1.5" in check(drifting)
    # a negative-going loss with a spike: scale-free
    assert check([1.0, 0.2, -0.5, -1.0, 0.5, -0.9]) is not None
    # a loss that barely moved is not judged (no convergence to lose), nor a history too short to judge
    assert check([1.0, 0.99, 1.01, 0.995]) is None and check([1.0, 3.0]) is None


def test_a_training_stage_carries_the_instability_warning_into_its_metrics(tmp_path) -> None:
    import json

    from debias.harness.tracking import StageRun
    from debias.training.outputs import StageOutputs, write_outputs

    model, result = run(4)
    for row, loss in zip(result.history, (2.0, 0.5, 1.6, 0.4)):
        row["train/loss"] = loss
    out = StageOutputs(model=tmp_path / "m.pt", embeddings_dir=tmp_path / "emb", metrics=tmp_path / "metrics.json",
                       curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    splits = {"train": tiny_split(), "val": tiny_split(seed=1), "test": tiny_split(seed=2)}
    write_outputs(model, "lenet5", result, splits, StageRun(None, None), out, 64, torch.device("cpu"), "erm")
    warnings = json.loads(out.metrics.read_text())["warnings"]
    assert any(w.startswith("unstable-training: ") and "epoch 2" in w for w in warnings), warnings


# --------------------------------------------------------------------------- a last batch of one


def _tabular_split(n: int, features: int = 6) -> BiasedSplit:
    generator = torch.Generator().manual_seed(0)
    y = torch.arange(n) % 2
    a = (torch.arange(n) // 2) % 2
    x = torch.randn(n, features, generator=generator) + y[:, None].float()
    return BiasedSplit(x, y, a, a == y, 2, 2, tuple(f"f{i}" for i in range(features)))


@pytest.mark.parametrize("batches", [1, 3])
def test_a_batchnorm_mlp_trains_on_a_split_one_past_a_multiple_of_the_batch_size(batches: int) -> None:
    from debias.training.loop import cut_batches
    from debias.training.methods.base import group_balanced_batches, shuffled_batches

    batch = 8
    n = batches * batch + 1  # Adult with data.max_per_split = 257 and batch 32 (or 256) is this case
    split = _tabular_split(n)
    model = build_model("mlp", 2, (split.x.shape[1],))
    assert any(isinstance(m, torch.nn.BatchNorm1d) for m in model.modules())
    model.train()
    with pytest.raises(ValueError, match="Expected more than 1 value per channel"):
        model(split.x[:1])  # what a last batch of one did
    optimizer = build_optimizer(model.parameters(), "sgd", 0.01, 0.9, 0.0)
    task = ClassifierTask(model, optimizer, split, batch, torch.Generator().manual_seed(0), torch.device("cpu"),
                          progress=False)
    metrics = task.train_epoch(0)  # ERM, JTT and the classifier baselines
    assert torch.isfinite(torch.tensor(metrics["train/loss"]))
    for cut in (cut_batches(torch.randperm(n), batch), shuffled_batches(n, batch, torch.Generator().manual_seed(1))):
        assert [len(b) for b in cut] == [batch] * (batches - 1) + [batch + 1]  # merged into the one before
        assert sorted(torch.cat(cut).tolist()) == list(range(n))  # every index once
    balanced = group_balanced_batches(split.a * 2 + split.y, batch, torch.Generator().manual_seed(2))
    assert [len(b) for b in balanced] == [batch] * (batches - 1) + [batch + 1]
    assert [len(b) for b in cut_batches(torch.arange(2 * batch + 2), batch)] == [batch, batch, 2]  # untouched
    assert [len(b) for b in cut_batches(torch.arange(1), batch)] == [1]  # nothing to merge into



def _tampered(state, change) -> None:
    """The resume state at ``state`` rewritten with ``change`` applied to its payload."""
    from debias.core.io import load_torch, save_torch

    saved = load_torch(state, "resume-state")
    change(saved)
    save_torch(state, saved, kind="resume-state")


def scripted_run(epochs: int, state, interrupt_at: int | None = None):
    """fit() of a :class:`ScriptedTask` (its weight is the last epoch trained) with a resume state at ``state``."""
    task = ScriptedTask()
    if interrupt_at is not None:
        original = task.train_epoch

        def train_epoch(epoch: int):
            if epoch == interrupt_at:
                raise Interrupt
            return original(epoch)

        task.train_epoch = train_epoch  # type: ignore[method-assign]
    optimizer = torch.optim.SGD(task.model.parameters(), lr=0.0)
    validate = lambda: {"val/worst_group": 0.5, "val/unbiased": 0.5, "val/avg": 0.5}  # noqa: E731
    return fit(task, optimizer, epochs, validate, state_path=state, state_key={"params": "k"})


def _shape_changed(saved) -> None:
    saved["modules"]["model"]["weight"] = torch.zeros(2, 2)


@pytest.mark.parametrize(("change", "problem"), [
    (lambda s: s.update(history=[{"loss": 1.0} for _ in s["history"]]),
     "it does not fit this run (ValueError: its history has epochs without their number)"),
    (_shape_changed, "it does not fit this run (RuntimeError: Error(s) in loading state_dict for"),
    (lambda s: s["optimizer"].update(param_groups=[]),
     "it does not fit this run (ValueError: loaded state dict has a different number of parameter groups"),
])
def test_a_resume_state_that_does_not_load_is_named_and_training_starts_over_from_fresh_weights(tmp_path, change,
                                                                                              problem) -> None:
    """The right key but content of another layout (history entries without their epoch, a tensor of another shape,
    an optimizer without parameter groups): a warning names the file and what failed, anything half-loaded is put
    back, and the run trains every epoch exactly as an uninterrupted one (no traceback on every rerun)."""
    state = tmp_path / "resume.pt"
    fresh = scripted_run(4, None)
    with pytest.raises(Interrupt):
        scripted_run(4, state, interrupt_at=2)
    _tampered(state, change)
    with pytest.warns(UserWarning) as caught:
        result = scripted_run(4, state)
    (message,) = [str(w.message) for w in caught if "resume state" in str(w.message)]
    assert message.startswith(f"ignoring the resume state {state}: {problem}") and message.endswith("; training starts over")
    assert result.resumed_from is None and result.history == fresh.history
    assert float(result.selected_state["model"]["weight"]) == float(fresh.selected_state["model"]["weight"])


@pytest.mark.parametrize(("change", "problem"), [
    (lambda s: s.pop("history"), "it lacks history"),
    (lambda s: s.update(epoch=500), "it claims epoch 500 done, and this run has epochs 0 .. 3"),
    (lambda s: s.update(history=s["history"] * 3), "its history holds 6 epochs where epoch 1 done means 2"),
    (lambda s: s.update(best_epoch=7), "its selected epoch 7 is not among the epochs done (0 .. 1)"),
    (lambda s: s.update(modules={"other": s["modules"]["model"]}), "its modules are ['other'], this run trains "
                                                                    "['model']"),
])
def test_an_invalid_resume_state_is_named_with_what_is_wrong_and_training_starts_over(tmp_path, change,
                                                                                    problem) -> None:
    """A resume state with the same key but a missing part or numbers that contradict the run (epoch 500 of 4) is
    never resumed from (a KeyError on every rerun, or epoch 1's weights kept as the 4-epoch result): a warning
    names the file and what is wrong, and the run trains every epoch, as an uninterrupted one."""
    state = tmp_path / "resume.pt"
    with pytest.raises(Interrupt):
        scripted_run(4, state, interrupt_at=2)
    _tampered(state, change)
    with pytest.warns(UserWarning) as caught:
        result = scripted_run(4, state)
    assert [str(w.message) for w in caught if "resume state" in str(w.message)] == [
        f"ignoring the resume state {state}: {problem}; training starts over"]
    assert result.resumed_from is None and len(result.history) == 4
    assert result.selected_epoch == 3 and float(result.selected_state["model"]["weight"]) == 3.0
    assert scripted_run(4, state).resumed_from == 4  # the state the run saved replaced it (all 4 epochs done)


@pytest.mark.parametrize("name", ["adam", "sgd"])
def test_the_built_optimiser_runs_pytorchs_one_tensor_update_bit_for_bit(name: str) -> None:
    """build_optimizer's foreach kernels (a speed choice on the CPU) leave the trained weights exactly those of
    PyTorch's one-tensor-at-a-time update, with weight decay, momentum and a learning-rate drop in the run."""
    from debias.training.loop import build_scheduler

    weights = []
    for reference in (False, True):
        torch.manual_seed(0)
        model = build_model("lenet5", 3, 28)
        if reference:
            kind = {"adam": torch.optim.Adam, "sgd": torch.optim.SGD}[name]
            extra = {"momentum": 0.9} if name == "sgd" else {}
            optimizer = kind(model.parameters(), lr=3e-3, weight_decay=1e-4, foreach=False, **extra)
        else:
            optimizer = build_optimizer(model.parameters(), name, 3e-3, 0.9, 1e-4)
            assert optimizer.param_groups[0]["foreach"] is True
        scheduler = build_scheduler(optimizer, [6], 0.1)
        split = tiny_split()
        for step in range(12):
            rows = slice(8 * step, 8 * step + 8)
            loss = torch.nn.functional.cross_entropy(model(split.x[rows].float() / 255), split.y[rows])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            scheduler.step()
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.manual_seed(0)
    start = torch.cat([p.detach().flatten() for p in build_model("lenet5", 3, 28).parameters()])
    assert not torch.equal(weights[0], start)  # it trained
    assert torch.equal(weights[0], weights[1])
