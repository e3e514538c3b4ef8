"""Resumable training: SIGKILL a training process mid-epoch, rerun it, and end with exactly the
metrics, curves and weights of an uninterrupted run (CPU, same seed).

A driver script calls the library's own entrypoints (``train_erm``, ``train_stage2``) with
tracking off on a tiny synthetic biased split. To kill at a known point it hooks the encoder:
once a resume state exists, the second training-mode forward of the epoch writes a marker and
sleeps, and the test SIGKILLs it there (mid-epoch; for CNC also mid-accumulation).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from debias.core.io import load_torch
from debias.data.store import BiasedSplit, save_split
from debias.models import load_network
from tests.faults.conftest import (
    PYTHON,
    run_parallel,
    sigkill,
    stage_env,
    wait_for,
    write_driver,
)

DRIVER = r"""
import json, sys, time
from pathlib import Path

import torch

torch.set_num_threads(1)
import debias.training.erm as erm_mod
import debias.training.methods.run as methods_mod
import debias.training.methods.base as methods_base  # fresh_model() builds every stage-2 network
from debias.data.store import load_split
from debias.harness.tracking import StageRun
from debias.schema import validate
from debias.training.outputs import StageOutputs

# driver.py DATA [--kill-marker FILE] WORK [WORK ...]; each WORK holds params.json and kind (erm | stage2)
args = sys.argv[1:]
data = Path(args.pop(0))
kill_marker = None
if args[0] == "--kill-marker":
    kill_marker = Path(args[1])
    args = args[2:]
works = [Path(a) for a in args]
splits = {name: load_split(data / f"{name}.pt") for name in ("train", "val", "test")}
out = None  # the current run's StageOutputs

if kill_marker is not None:
    def hooked(build):
        def build_model(*args, **kwargs):
            network = build(*args, **kwargs)
            calls = {"n": 0}

            def stall(module, inputs):
                if not module.training or not out.resume.exists():
                    return
                calls["n"] += 1
                if calls["n"] == 2:  # the second training forward after a completed epoch
                    kill_marker.write_text("stalled")
                    time.sleep(600)

            network.encoder.register_forward_pre_hook(stall)
            return network
        return build_model

    erm_mod.build_model = hooked(erm_mod.build_model)
    methods_base.build_model = hooked(methods_base.build_model)

def recording(fit):
    def wrapped(*args, **kwargs):
        result = fit(*args, **kwargs)
        (out.model.parent / "fit.json").write_text(json.dumps({"resumed_from": result.resumed_from,
                                                   "selected_epoch": result.selected_epoch,
                                                   "history": result.history}))
        return result
    return wrapped

erm_mod.fit = recording(erm_mod.fit)
methods_mod.fit = recording(methods_mod.fit)

run = StageRun(None, None)  # tracking off


def train(work: Path) -> None:
    global out
    out = StageOutputs(model=work / "model.pt", embeddings_dir=work / "embeddings", metrics=work / "metrics.json",
                       curves=work / "curves.csv", resume=work / "resume" / "state.pt")
    params = validate(json.loads((work / "params.json").read_text()))
    if (work / "kind").read_text() == "erm":
        erm_mod.train_erm(splits, params.model.name, params.erm, params.seed, run, out)
    else:
        train_split = splits["train"]
        inferred = train_split.a.clone()  # groups.method true: the bias attribute as the inferred label
        methods_mod.train_stage2(params, splits, inferred, inferred != train_split.y, None, run, out)


for folder in works:  # one or several runs, one after another
    train(folder)
print("finished", flush=True)
"""

CONFIGS = {
    "erm": {"seed": 3, "erm": {"epochs": 4, "batch_size": 16, "lr": 0.01, "optimizer": "sgd",
                               "selection": "best_worst_group", "augment_shift": 2,
                               "lr_milestones": [1, 2], "lr_gamma": 0.5}},  # the scheduler's state round-trips too
    "cnc": {"seed": 3, "stage2": {"method": "cnc", "epochs": 4, "optimizer": "adam", "lr": 1e-3,
                                  "selection": "best_worst_group", "augment_shift": 2,
                                  "cnc": {"num_positives": 4, "num_negatives": 4, "anchor_fraction": 0.06,
                                          "accumulation": 2, "forward_chunk": 1, "skip_empty_classes": True,
                                          "temperature": 0.1}}},
    "eps_supinfonce+fairkl": {"seed": 3, "stage2": {"method": "eps_supinfonce", "epochs": 4, "batch_size": 32,
                                                    "optimizer": "adam", "lr": 1e-3, "selection": "best_worst_group",
                                                    "augment_shift": 2},
                              "loss": {"temperature": 0.1, "epsilon": 0.25, "fairkl": {"weight": 0.5, "variant": "kl"}}},
}


def tiny_split(n: int, seed: int, p_aligned: float = 0.8, n_classes: int = 3) -> BiasedSplit:
    """Colour patch = bias attribute (aligned with the class w.p. p_aligned), stripe = class."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % n_classes
    a = torch.where(torch.rand(n, generator=g) < p_aligned, y, torch.randint(0, n_classes, (n,), generator=g))
    x = torch.randint(0, 40, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    x[torch.arange(n), a, :6, :6] = 250
    x[torch.arange(n), :, 10 + 4 * y, 10:20] = 200
    return BiasedSplit(x, y, a, a == y, n_classes, n_classes)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("resume-data")
    for name, (n, seed) in {"train": (120, 0), "val": (60, 1), "test": (60, 2)}.items():
        save_split(folder / f"{name}.pt", tiny_split(n, seed))
    return folder


def launch(driver: Path, data: Path, *works: Path, marker: Path | None = None) -> subprocess.Popen:
    args = [PYTHON, str(driver), str(data)] + (["--kill-marker", str(marker)] if marker else []) + [str(w) for w in works]
    return subprocess.Popen(args, env=stage_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(process: subprocess.Popen) -> None:
    out, err = process.communicate(timeout=300)
    assert process.returncode == 0, f"{out}\n{err}"


def state_dict_of(path: Path) -> dict[str, torch.Tensor]:
    return load_network(str(path))[0].state_dict()


def prepare(work: Path, name: str) -> Path:
    work.mkdir(parents=True)
    (work / "params.json").write_text(json.dumps(CONFIGS[name]))
    (work / "kind").write_text("erm" if name == "erm" else "stage2")
    return work


@pytest.fixture(scope="module")
def runs(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """For every config: an uninterrupted run, and a run SIGKILLed mid-epoch then rerun in a fresh process.

    The uninterrupted runs go one after another in one background process while the victims
    train; each victim is killed where its hook stalls; the reruns go two at a time.
    """
    root = tmp_path_factory.mktemp("resume")
    driver = write_driver(root, "train_driver.py", DRIVER)
    reference = {name: prepare(root / "reference" / name, name) for name in CONFIGS}
    interrupted = {name: prepare(root / "interrupted" / name, name) for name in CONFIGS}
    uninterrupted = launch(driver, data_dir, *reference.values())
    victims = {name: launch(driver, data_dir, work, marker=root / f"stalled-{name}") for name, work in interrupted.items()}
    states = {}
    for name, victim in victims.items():
        wait_for((root / f"stalled-{name}").exists, victim, what=f"{name} to stall mid-epoch")
        sigkill(victim)
        states[name] = load_torch(interrupted[name] / "resume" / "state.pt", "resume-state",
                                  ("epoch", "modules", "optimizer", "task", "rng", "history"))
        assert not (interrupted[name] / "model.pt").exists() and not (interrupted[name] / "metrics.json").exists()
    reruns = run_parallel({name: (lambda work=work: subprocess.run(
        [PYTHON, str(driver), str(data_dir), str(work)], env=stage_env(), capture_output=True, text=True, check=False, timeout=300))
        for name, work in interrupted.items()})
    finish(uninterrupted)
    return {name: {"reference": reference[name], "interrupted": interrupted[name], "state": states[name],
                   "rerun": reruns[name]} for name in CONFIGS}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_killed_mid_epoch_resumes_to_the_uninterrupted_result(name: str, runs, data_dir: Path) -> None:
    case = runs[name]
    reference, interrupted, state = case["reference"], case["interrupted"], case["state"]
    method = "erm" if name == "erm" else "stage2"
    killed_after = state["epoch"]
    assert 0 <= killed_after < CONFIGS[name][method]["epochs"] - 1
    assert len(state["history"]) == killed_after + 1
    assert case["rerun"].returncode == 0, case["rerun"].stderr

    if name == "cnc":
        # the sampler state round-trips: a fresh sampler over the same data takes it and gives it back,
        # at an epoch boundary, having drawn exactly the completed epochs' batches
        from debias.data.store import load_split
        from debias.training.methods.cnc.sampling import CNCBatchSampler

        train = load_split(data_dir / "train.pt")
        cnc = CONFIGS[name]["stage2"]["cnc"]
        sampler = CNCBatchSampler(train.y, train.a.clone(), cnc["num_positives"], cnc["num_negatives"], True,
                                  seed=CONFIGS[name]["seed"], skip_empty_classes=True,
                                  anchor_fraction=cnc["anchor_fraction"])
        saved = state["task"]["sampler"]
        assert saved["batches_drawn"] == len(sampler) * (killed_after + 1)
        assert saved["epoch_pos"] == 0
        sampler.load_state_dict(saved)
        again = sampler.state_dict()
        assert torch.equal(again.pop("generator"), saved["generator"])
        assert again == {k: v for k, v in saved.items() if k != "generator"}
        assert "generator" in state["task"]  # the augmentation generator is saved too

    fit_ref = json.loads((reference / "fit.json").read_text())
    fit_res = json.loads((interrupted / "fit.json").read_text())
    assert fit_ref["resumed_from"] is None
    assert fit_res["resumed_from"] == killed_after + 1, "the rerun did not continue from the last completed epoch"
    assert fit_res["history"] == fit_ref["history"]  # every epoch's metrics, exactly
    assert fit_res["selected_epoch"] == fit_ref["selected_epoch"]
    # the same metrics, but for the processes that trained each: the resumed run names both, with their epochs
    metrics_ref = json.loads((reference / "metrics.json").read_text())
    metrics_res = json.loads((interrupted / "metrics.json").read_text())
    trained_ref, trained_res = metrics_ref.pop("trained_by"), metrics_res.pop("trained_by")
    assert metrics_res == metrics_ref
    epochs = CONFIGS[name][method]["epochs"]
    assert [t["epochs"] for t in trained_ref] == [[0, epochs - 1]]
    assert [t["epochs"] for t in trained_res] == [[0, killed_after], [killed_after + 1, epochs - 1]]
    assert all({k: v for k, v in t.items() if k != "epochs"} == metrics_ref["environment"] for t in trained_res)
    assert not [w for w in metrics_res["warnings"] if w.startswith("mixed-environment")]  # the same settings
    assert (interrupted / "curves.csv").read_bytes() == (reference / "curves.csv").read_bytes()
    if method == "stage2":
        info = "metrics_info.json"
        assert (interrupted / info).read_bytes() == (reference / info).read_bytes()  # incl. the sampler report
    weights_ref, weights_res = state_dict_of(reference / "model.pt"), state_dict_of(interrupted / "model.pt")
    assert weights_ref.keys() == weights_res.keys()
    for key in weights_ref:
        assert torch.equal(weights_ref[key], weights_res[key]), key
    for split in ("train", "val", "test"):
        a = load_torch(reference / "embeddings" / f"embeddings_{split}.pt", "embeddings")
        b = load_torch(interrupted / "embeddings" / f"embeddings_{split}.pt", "embeddings")
        assert torch.equal(a["z"], b["z"]) and torch.equal(a["logits"], b["logits"])
    assert not (interrupted / "resume" / "state.pt").exists()  # removed once the outputs are written


def test_a_torn_resume_state_starts_over_with_a_warning(data_dir: Path, tmp_path: Path) -> None:
    """A resume state cut short (e.g. a disk full) is not worth failing for: training starts over."""
    from debias.data.store import load_splits
    from debias.harness.tracking import StageRun
    from debias.schema import validate
    from debias.training.erm import train_erm
    from debias.training.outputs import StageOutputs

    out = StageOutputs(model=tmp_path / "model.pt", embeddings_dir=tmp_path / "embeddings",
                       metrics=tmp_path / "metrics.json", curves=tmp_path / "curves.csv", resume=tmp_path / "state.pt")
    out.resume.write_bytes(b"PK\x03\x04 torn")
    params = validate({**CONFIGS["erm"], "erm": {**CONFIGS["erm"]["erm"], "epochs": 1, "lr_milestones": []}})
    with pytest.warns(UserWarning, match="ignoring unreadable resume state"):
        train_erm(load_splits(data_dir), params.model.name, params.erm, params.seed, StageRun(None, None), out)
    assert json.loads(out.metrics.read_text())["selected_epoch"] == 0
    assert not out.resume.exists()
