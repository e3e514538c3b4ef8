"""The captured training step (``stage2.speed.step: cuda_graph``, :mod:`debias.training.captured`) gives the eager
step's losses and weights.

On the CPU the mechanism runs without the graph (``CapturedStep(capture=False)``): one slot of static input and output
buffers per batch shape, inputs copied in every step, the step's device work run on the static inputs, clones of the
static outputs returned. Every method that declares its step capturable trains 3 epochs of 4 steps (32, 32, 32 and an
odd last batch of 5) eagerly and through the static runner from the same seed; every step's outputs and the final
weights must be exactly equal: the same kernels run on the same values and shapes, only copied through other memory.
The check is shown to fail for the bugs it is there for: outputs returned without a clone (the next step overwrites
them), inputs copied only once (every replay would train on the first batch), and one buffer for both batch shapes.

On a CUDA device (skipped without one) the real capture runs, the step's epoch after the captures under
``torch.cuda.set_sync_debug_mode("error")``, against the eager step with the same graph-safe optimiser (tensor
learning rate, Adam capturable, SGD fused) and a scheduler that lowers the learning rate after the first epoch.
"""

from __future__ import annotations

import pytest
import torch

from debias.core.runtime import seed_everything
from debias.params import ParamsError
from debias.schema import validate
from debias.training import captured
from debias.training.captured import CapturedStep, EagerStep
from debias.training.methods import METHODS, Stage2Inputs, setup_method
from debias.training.methods.registry import MethodSpec
from tests.test_training import tiny_split

N_TRAIN, BATCH = 101, 32  # batches of 32, 32, 32 and 5: two shapes, each replayed
CAPTURABLE = sorted(name for name, spec in METHODS.items() if spec.capturable)


def inputs(method: str, device: torch.device, **stage2) -> Stage2Inputs:
    """A tiny stage-2 setup (every method's extras on, as tests/test_sync_free.py), seeded afresh."""
    train, val = tiny_split(N_TRAIN), tiny_split(60, seed=1)
    params = validate({"stage2": {"method": method, "optimizer": "adam", "lr": 1e-3, "batch_size": BATCH,
                                  "augment_shift": 2, **stage2},
                       "loss": {"fairkl": {"weight": 0.5}}})
    inferred = train.a.clone()
    return Stage2Inputs({"train": train, "val": val, "test": val}, inferred, inferred != train.y, None, params, device,
                        seed_everything(0), inferred_group=train.y * 3 + inferred)


class Recorded:
    """Wraps a step runner and keeps every step's returned outputs as returned (no copy: an output the runner reuses
    for the next step shows up as a changed value)."""

    def __init__(self, runner) -> None:
        self.runner, self.steps = runner, []

    def __call__(self, step_inputs):
        out = self.runner(step_inputs)
        self.steps.append(out)
        return out


def train(method: str, runner_of, epochs: int = 3, device: torch.device = torch.device("cpu"), sync_check_from=None,
          **stage2):
    """``epochs`` epochs of ``method`` with its task's runner replaced by ``runner_of(task)``; (recorded steps, epoch
    metrics, the final weights, the runner)."""
    setup = setup_method(inputs(method, device, **stage2))
    runner = runner_of(setup.task)
    setup.task.runner = recorded = Recorded(runner)
    history = []
    for epoch in range(epochs):
        checked = sync_check_from is not None and epoch >= sync_check_from
        if checked:
            torch.cuda.synchronize()
            torch.cuda.set_sync_debug_mode("error")
        try:
            for module in setup.task.modules().values():
                module.train()
            history.append(setup.task.train_epoch(epoch) if not checked else _epoch_unchecked_read(setup.task, epoch))
        finally:
            if checked:
                torch.cuda.set_sync_debug_mode(0)
        if setup.scheduler is not None:
            setup.scheduler.step()
    weights = {f"{name}.{key}": value.detach().cpu().clone() for name, module in setup.task.modules().items()
               for key, value in module.state_dict().items()}
    steps = [{k: v.detach().cpu().clone() for k, v in out.items()} for out in recorded.steps]
    return steps, history, weights, runner


def _epoch_unchecked_read(task, epoch: int) -> dict[str, float]:
    """``task.train_epoch`` with the epoch's one metrics read (after its last step) outside the sync check."""
    from debias.training.loop import StepMetrics
    from tests.test_sync_free import read_unchecked

    read = StepMetrics.read
    StepMetrics.read = read_unchecked
    try:
        return task.train_epoch(epoch)
    finally:
        StepMetrics.read = read


def static_runner(task, warmup: int = 1) -> CapturedStep:
    return CapturedStep(task.step_compute, torch.device("cpu"), capture=False, warmup=warmup)


def assert_same(eager, other, rtol: float = 0.0, atol: float = 0.0) -> None:
    (steps_a, history_a, weights_a, _), (steps_b, history_b, weights_b, _) = eager, other
    assert len(steps_a) == len(steps_b) >= 12
    for number, (a, b) in enumerate(zip(steps_a, steps_b)):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=rtol, atol=atol, msg=lambda m: f"step {number}, {key}: {m}")
    assert [h.keys() for h in history_a] == [h.keys() for h in history_b]
    for epoch, (a, b) in enumerate(zip(history_a, history_b)):  # pytest.approx compares no list of dicts (pytest 9.2)
        for key in a:
            assert b[key] == pytest.approx(a[key], rel=rtol, abs=atol), f"epoch {epoch}, {key}"
    for key in weights_a:
        torch.testing.assert_close(weights_b[key], weights_a[key], rtol=rtol, atol=atol, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("method", CAPTURABLE)
def test_the_static_buffer_runner_gives_the_eager_steps_exactly(method: str) -> None:
    """3 epochs, every step's outputs and the final weights: equal (the same kernels on the same values)."""
    eager = train(method, lambda task: EagerStep(task.step_compute))
    static = train(method, static_runner)
    runner = static[3]
    assert len(runner.slots) == 2 and all(slot.calls >= 3 for slot in runner.slots.values())  # both shapes replayed
    assert runner.graphs == 2
    assert_same(eager, static)


class NoClone(CapturedStep):
    """A broken runner: returns the static outputs themselves."""

    def __call__(self, step_inputs):
        out = super().__call__(step_inputs)
        slot = self.slots[captured.signature(step_inputs)]
        return slot.outputs if slot.calls > self.warmup else out


class InputsOnce(CapturedStep):
    """A broken runner: copies the inputs into a slot only when it is built (every replay trains on that batch)."""

    def __call__(self, step_inputs):
        slot = self.slots.get(captured.signature(step_inputs))
        if slot is not None and slot.inputs:
            slot.calls += 1
            results = self.compute(slot.inputs)
            for name, t in results.items():
                slot.outputs[name].copy_(t.detach())
            return {name: t.clone() for name, t in slot.outputs.items()}
        return super().__call__(step_inputs)


@pytest.mark.parametrize("broken", [NoClone, InputsOnce, "one slot for both shapes"])
def test_the_comparison_fails_for_the_bugs_it_guards_against(broken, monkeypatch) -> None:
    eager = train("erm", lambda task: EagerStep(task.step_compute))
    if broken == "one slot for both shapes":
        monkeypatch.setattr(captured, "signature", lambda step_inputs: tuple(sorted(step_inputs)))
        with pytest.raises(RuntimeError):  # the last batch's 5 indices copied into the 32-row buffer
            train("erm", static_runner)
        return
    other = train("erm", lambda task: broken(task.step_compute, torch.device("cpu"), capture=False, warmup=1))
    with pytest.raises(AssertionError):
        assert_same(eager, other)


def test_every_method_declares_a_capturable_step_or_says_why_not() -> None:
    """A capturable method's task splits its step (step_inputs, step_compute, a runner); any other says why not."""
    default_note = MethodSpec.__dataclass_fields__["capture_note"].default
    for name, spec in METHODS.items():
        if spec.capturable:
            task = setup_method(inputs(name, torch.device("cpu"))).task
            assert callable(task.step_inputs) and callable(task.step_compute) and hasattr(task, "runner"), name
        else:
            assert spec.capture_note != default_note and "host" in spec.capture_note, name
    assert {"erm", "eps_supinfonce"} <= set(CAPTURABLE)


def test_a_capture_is_refused_where_it_cannot_run() -> None:
    """cuda_graph on the CPU, for a method without a capturable step, or with bf16 autocast: a ParamsError naming
    stage2.speed.step, why, and what is allowed; eager runs everywhere."""
    with pytest.raises(ParamsError, match=r"stage2\.speed\.step = cuda_graph.*trains on cpu.*allowed: eager"):
        setup_method(inputs("eps_supinfonce", torch.device("cpu"), speed={"step": "cuda_graph"}))
    with pytest.raises(ParamsError, match=r"stage2\.method = cnc has no capturable step \(.*host-side sampler"):
        setup_method(inputs("cnc", torch.device("cpu"), speed={"step": "cuda_graph"}))
    with pytest.raises(ParamsError, match=r"stage2\.speed\.autocast = bf16.*allowed with cuda_graph: "
                                          r"stage2\.speed\.autocast none"):
        setup_method(inputs("erm", torch.device("cpu"), speed={"step": "cuda_graph", "autocast": "bf16"}))
    with pytest.raises(ParamsError, match=r"allowed with cuda_graph: stage2\.speed\.compile false"):
        setup_method(inputs("erm", torch.device("cpu"), speed={"step": "cuda_graph", "compile": True}))
    with pytest.raises(ParamsError, match=r"needs a CUDA device"):
        CapturedStep(lambda step_inputs: step_inputs, torch.device("cpu"))
    assert isinstance(setup_method(inputs("erm", torch.device("cpu"))).task.runner, EagerStep)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("method", CAPTURABLE)
def test_the_cuda_graph_gives_the_eager_steps(method: str) -> None:
    """The real capture against the eager step with the same graph-safe optimiser, over 5 epochs of 4 steps (the
    learning rate lowered after the first: the scheduler reaches the graph); the last epoch, all replays, never
    synchronises. Tolerance: float32 rtol 1e-5 / atol 1e-6, the same kernels replayed; cuBLAS may pick another
    algorithm on the capture stream, a difference in the last bits of a sum."""
    cuda = torch.device("cuda")
    graph_params = {"speed": {"step": "cuda_graph"}, "lr_milestones": [1], "lr_gamma": 0.1}
    eager = train(method, lambda task: EagerStep(task.step_compute), epochs=5, device=cuda, **graph_params)
    graphed = train(method, lambda task: task.runner, epochs=5, device=cuda, sync_check_from=4, **graph_params)
    runner = graphed[3]
    assert isinstance(runner, CapturedStep) and runner.capture and runner.graphs == 2
    (steps_a, history_a, weights_a, _), (steps_b, history_b, weights_b, _) = eager, graphed
    assert len(steps_a) == len(steps_b) == 20
    for number, (a, b) in enumerate(zip(steps_a, steps_b)):
        for key in a:
            torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"step {number}, {key}: {m}")
    for key in weights_a:
        torch.testing.assert_close(weights_b[key], weights_a[key], rtol=1e-5, atol=1e-6, msg=lambda m: f"{key}: {m}")


@pytest.mark.parametrize("name, flag", [("adam", "capturable"), ("sgd", "fused")])
def test_a_graph_safe_optimiser_holds_its_learning_rate_in_one_tensor_the_schedule_fills(name: str, flag: str) -> None:
    """The graph reads the learning rate from a fixed address: the schedule must change that tensor in place."""
    from debias.training.loop import build_optimizer, build_scheduler

    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = build_optimizer([weight], name, 0.1, 0.9, 0.0, graph_device=torch.device("cpu"))
    group = optimizer.param_groups[0]
    rate = group["lr"]
    assert isinstance(rate, torch.Tensor) and rate.dim() == 0 and group[flag] is True
    scheduler = build_scheduler(optimizer, [1], 0.1)
    scheduler.step()
    assert group["lr"] is rate and float(rate) == pytest.approx(0.01, rel=1e-6)  # float32 of 0.1 * 0.1
    plain = build_optimizer([weight], name, 0.1, 0.9, 0.0).param_groups[0]
    assert plain["lr"] == 0.1 and not plain.get(flag)


def test_erm_step_cuda_graph_is_refused_on_the_cpu_before_any_work(tmp_path, monkeypatch) -> None:
    """``erm.step: cuda_graph`` on the CPU: a ParamsError naming erm.step, before training writes any output."""
    monkeypatch.setenv("DEBIAS_DEVICE", "cpu")  # the CPU on a CUDA machine too
    from debias.harness.tracking import StageRun
    from debias.training.erm import train_erm
    from debias.training.outputs import StageOutputs

    out = StageOutputs(model=tmp_path / "model.pt", embeddings_dir=tmp_path / "embeddings",
                       metrics=tmp_path / "metrics.json", curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    splits = {"train": tiny_split(N_TRAIN), "val": tiny_split(60, seed=1), "test": tiny_split(60, seed=2)}
    params = validate({"erm": {"epochs": 1, "batch_size": BATCH, "step": "cuda_graph"}})
    with pytest.raises(ParamsError, match=r"erm\.step = cuda_graph cannot run: this run trains on cpu.*allowed: eager"):
        train_erm(splits, "lenet5", params.erm, 0, StageRun(None, None), out)
    assert not any(tmp_path.iterdir())


def test_check_params_refuses_what_the_params_alone_rule_out(tmp_path, capsys) -> None:
    """cuda_graph under CNC, with bf16 autocast or with a compiled encoder: refused by check-params (and by every
    stage's params check, before `dvc exp run` trains ERM), each reason named; eager stays valid."""
    import yaml

    from debias.tools.cli import main as cli_main
    from tests.conftest import committed_text

    raw = yaml.safe_load(committed_text("params.yaml"))
    raw["stage2"]["method"] = "cnc"
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["check-params", str(path), "-S", "stage2.speed.step=cuda_graph"]) == 2
    assert "stage2.method = cnc has no capturable step" in capsys.readouterr().err
    raw["stage2"]["method"] = "eps_supinfonce"
    path.write_text(yaml.safe_dump(raw))
    assert cli_main(["check-params", str(path), "-S", "stage2.speed.step=cuda_graph", "-S",
                     "stage2.speed.autocast=bf16", "-S", "stage2.speed.compile=true"]) == 2
    err = capsys.readouterr().err
    assert "stage2.speed.autocast = bf16" in err and "stage2.speed.compile = true" in err
    assert cli_main(["check-params", str(path), "-S", "stage2.speed.step=cuda_graph"]) == 0  # a GPU run decides
