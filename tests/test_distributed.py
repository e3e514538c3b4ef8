"""Multi-process training (torchrun, gloo on the CPU) gives the single-process gradients and metrics.

* gradients: 2 spawned gloo processes, each holding its shard of one global batch (13 rows: shards
  of 7 and 6), gather the features with ``all_gather_rows``, evaluate every loss of the project on
  the gathered batch and sum their gradients; the result must be the gradient of the same loss on
  the whole batch in one process, and one rank's gradient alone must not be.
* whole runs: ERM, eps-SupInfoNCE + FairKL and CNC train 2 epochs on a tiny biased split under
  ``python -m debias.harness.launch`` with ``DEBIAS_NPROC=2`` (``torchrun --standalone --nproc_per_node=2``)
  and in one process (this one, one thread, meanwhile); the metrics agree, and only rank 0 writes.
* the pure helpers: shard sizes, the launcher's command lines, the memory plan, rank 1's stage run.
"""

from __future__ import annotations

import json
import os
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from debias import losses
from debias.core import distributed
from debias.data.store import BiasedSplit, save_split
from debias.harness import memory
from debias.harness.launch import exit_code_of_failure, nproc_from_env, single_process_command, torchrun_arguments
from debias.models import build_model
from tests.conftest import REPO

GLOBAL_BATCH = 13  # odd: the two shards differ in size (7 and 6)
# One step in float32 (part a): the sharded gradient differs from the whole-batch one only by the order of
# float32 sums, a relative error of about sqrt(terms) * 2^-24 (~1e-6 for the few hundred terms per weight
# here); 1e-5 leaves a margin of 10 on any machine, while a wrong gather or sum is off by > 1e-2
# (own_deviation below). Whole trainings (part b) run in float64: summation-order differences start at
# ~1e-16 relative and, amplified by the at most ~40 optimiser steps of these runs (even 10^6-fold), stay
# below 1e-9; the tolerances leave two orders of magnitude on top, independent of the machine's thread
# count and SIMD width. In float32 the same runs drift apart by up to 5e-3 (chaotic amplification of 1e-7).
GRADIENT_RTOL = 1e-5  # |g_2proc - g_1proc| / max |g_1proc|, one float32 step
LOSS_RTOL = 1e-7  # per-epoch training losses of 2 processes vs 1, float64
ACCURACY_ATOL = 1e-9  # the same images, augmentations and (to float64 rounding) weights: the same predictions
WEIGHT_RTOL = 1e-7  # max |w_2proc - w_1proc| / max |w_1proc| per trained tensor, float64
HEAD_TRAINED = {"erm", "cnc"}  # heads trained with cross-entropy (the others: a probe refitted every epoch)


# --------------------------------------------------------------------------- (a) gradients, 2 spawned processes


def _batch(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 256, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    return x, torch.arange(n) % 3, torch.randint(0, 2, (n,), generator=g)


def _ce(models, x, y, bias, gather):
    (model,) = models
    return F.cross_entropy(gather(model(x)), y)


def _eps_supinfonce_fairkl(models, x, y, bias, gather):
    (model,) = models
    z = gather(F.normalize(model.embed(x), dim=1))
    return losses.eps_supinfonce(z, y, 0.25, 0.1) + 0.5 * losses.fairkl(z, y, bias, "kl")


def _supcon(models, x, y, bias, gather):
    (model,) = models
    z = gather(F.normalize(model.embed(x), dim=1))
    return losses.supcon(z, y, 0.1) + losses.eps_supcon(z, y, 0.25, 0.1)


def _cnc(models, x, y, bias, gather):
    """One forward chunk of CNCTask: 13 images = one contrastive batch of M = 3 (+ anchors), N = 3 (+ N2 = 4)."""
    (model,) = models
    z, logits = model.embed_and_classify(x)
    z, logits = gather(z), gather(logits)
    a, p, n, n2 = F.normalize(z, dim=1).split([3, 3, 3, 4])
    return 0.75 * losses.cnc_two_sided(a, p, n, n2, 0.05) + 0.25 * F.cross_entropy(logits, y)


def _wcl(models, x, y, bias, gather):
    model, biased = models
    anchor, positive = x, x.flip(-1)
    zs = [gather(F.normalize(m.embed(v), dim=1)) for m in (model, biased) for v in (anchor, positive)]
    return losses.wcl_loss(*zs, temperature=0.5, tau_plus=0.1)


CASES = {"cross_entropy": (_ce, 1), "eps_supinfonce+fairkl": (_eps_supinfonce_fairkl, 1),
         "supcon+eps_supcon": (_supcon, 1), "cnc": (_cnc, 1), "wcl": (_wcl, 2)}


def _models(count: int) -> list[torch.nn.Module]:
    torch.manual_seed(0)  # the same initial weights on every rank, as seed_everything gives
    return [build_model("lenet5", 3, 28) for _ in range(count)]


def _gradients(models: list[torch.nn.Module]) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for m in models for p in m.parameters()]


def _gradient_worker(rank: int, world: int, init_file: str, result_file: str) -> None:
    """One rank: for every case, the single-process gradient on the whole batch, then the sharded one."""
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    x, y, bias = _batch(GLOBAL_BATCH)
    results = {}
    for name, (loss_fn, count) in CASES.items():
        models = _models(count)
        reference_loss = loss_fn(models, x, y, bias, lambda t: t)  # one process: the whole batch, no gather
        reference_loss.backward()
        reference = _gradients(models)
        for m in models:
            m.zero_grad(set_to_none=True)
        local = distributed.shard_slice(GLOBAL_BATCH)
        loss = loss_fn(models, x[local], y, bias, lambda t: distributed.all_gather_rows(t, GLOBAL_BATCH))
        loss.backward()
        own = _gradients(models)
        distributed.sum_gradients([p for m in models for p in m.parameters()])
        summed = _gradients(models)
        scale = max(float(g.abs().max()) for g in reference if g is not None)

        def deviation(grads: list[torch.Tensor | None]) -> float:
            return max(float((g - r).abs().max()) for g, r in zip(grads, reference) if r is not None) / scale

        results[name] = {
            "rows": local.stop - local.start,
            "loss": float(loss.detach()), "reference_loss": float(reference_loss.detach()),
            "none_pattern_equal": [g is None for g in summed] == [g is None for g in reference],
            "summed_deviation": deviation(summed), "own_deviation": deviation(own), "scale": scale,
        }
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, results)
    if rank == 0:
        Path(result_file).write_text(json.dumps(gathered))
    torch.distributed.destroy_process_group()


@pytest.fixture(scope="module")
def gradient_results(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    folder = tmp_path_factory.mktemp("gather")
    result_file = folder / "results.json"
    torch.multiprocessing.spawn(_gradient_worker, args=(2, str(folder / "init"), str(result_file)), nprocs=2,
                                join=True)
    return json.loads(result_file.read_text())


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_sharded_gather_and_gradient_sum_give_the_single_process_gradient(case: str, gradient_results) -> None:
    per_rank = [results[case] for results in gradient_results]
    assert [r["rows"] for r in per_rank] == [7, 6]  # unequal shards
    for r in per_rank:
        assert r["loss"] == pytest.approx(r["reference_loss"], rel=1e-6)  # every rank: the global batch's loss
        assert r["none_pattern_equal"]  # unused parameters (the head of contrastive losses) keep grad None
        assert r["summed_deviation"] < GRADIENT_RTOL, r
        assert r["own_deviation"] > 1e-2, r  # one rank's share alone is not the gradient: the test can fail


# --------------------------------------------------------------------------- (b) whole runs under torchrun

DRIVER = r'''
"""Train every config of DATA/configs.json, tracking off; outputs under FOLDER/<config>/."""
import json, os, sys
from pathlib import Path

import torch

from debias.data.store import load_split
from debias.harness.tracking import stage_run
from debias.schema import validate
from debias.training.erm import train_erm
from debias.training.methods import train_stage2
from debias.training.outputs import StageOutputs


def train_all(data: Path, folder: Path) -> None:
    """In float64 (see the tolerances): the default dtype is set here and restored for the calling process."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        _train_all(data, folder)
    finally:
        torch.set_default_dtype(previous)


def _train_all(data: Path, folder: Path) -> None:
    splits = {name: load_split(data / f"{name}.pt") for name in ("train", "val", "test")}
    for name, config in json.loads((data / "configs.json").read_text()).items():
        params = validate(config)
        out = StageOutputs(model=folder / name / "model.pt", embeddings_dir=folder / name / "embeddings",
                           metrics=folder / name / "metrics.json", curves=folder / name / "curves.csv",
                           resume=folder / name / "resume.pt")
        with stage_run(name, config, record_path=folder / name / "run.json") as run:
            if name == "erm":
                train_erm(splits, params.model.name, params.erm, params.seed, run, out)
            else:
                inferred = splits["train"].a.clone()  # groups.method true
                train_stage2(params, splits, inferred, inferred != splits["train"].y, None, run, out)


if __name__ == "__main__":  # DRIVER DATA WORK: rank r writes under WORK/rank<r>, so rank 1's writes would show
    torch.set_num_threads(1)
    folder = Path(sys.argv[2]).resolve() / f"rank{os.environ.get('RANK', '0')}"
    folder.mkdir(parents=True, exist_ok=True)
    train_all(Path(sys.argv[1]).resolve(), folder)
'''

# Batch sizes leave unequal shards (ERM: 13 x 9 + 3 rows -> 5/4 and 2/1; eps: 13 -> 7/6); every config augments.
CONFIGS = {
    "erm": {"seed": 3, "erm": {"epochs": 2, "batch_size": 9, "lr": 0.01, "optimizer": "adam",
                               "selection": "best_worst_group", "augment_shift": 2, "lr_milestones": [1]}},
    # SGD, not Adam: Adam's update hardly changes when every gradient is scaled, SGD's does
    # ReLU features: with the supcon family's default Tanh this tiny SGD run (lr 0.05) ended at chance in one
    # process (train accuracy 1/3) and not in two (0.625): its per-epoch L-BFGS head then follows rounding
    # differences; the comparison needs a well-conditioned run
    "eps_supinfonce_fairkl": {"seed": 3, "model": {"feature_activation": "relu"},
                              "stage2": {"method": "eps_supinfonce", "epochs": 2, "batch_size": 13,
                                                    "optimizer": "sgd", "lr": 0.05, "augment_shift": 2,
                                                    "selection": "best_worst_group"},
                              "loss": {"temperature": 0.1, "epsilon": 0.25, "fairkl": {"weight": 0.1}}},
    "cnc": {"seed": 3, "stage2": {"method": "cnc", "epochs": 2, "optimizer": "adam", "lr": 0.02, "augment_shift": 2,
                                  "selection": "best_worst_group",  # 3 batches per step: chunks of 2 and 1
                                  "cnc": {"num_positives": 4, "num_negatives": 3, "anchor_fraction": 0.12,
                                          "accumulation": 3, "forward_chunk": 2, "skip_empty_classes": True,
                                          "temperature": 0.1}}},
}


def tiny_split(n: int, seed: int, n_classes: int = 3) -> BiasedSplit:
    """Colour patch = bias attribute (aligned with the class w.p. 0.8), stripe = class."""
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % n_classes
    a = torch.where(torch.rand(n, generator=g) < 0.8, y, torch.randint(0, n_classes, (n,), generator=g))
    x = torch.randint(0, 40, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    x[torch.arange(n), a, :6, :6] = 250
    x[torch.arange(n), :, 10 + 4 * y, 10:20] = 200
    return BiasedSplit(x, y, a, a == y, n_classes, n_classes)


def _env(nproc: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(DEBIAS_TRACKING="off", DEBIAS_THREADS="1", OMP_NUM_THREADS="1", DEBIAS_NPROC=str(nproc),
               PYTHONPATH=os.pathsep.join([str(REPO / "src"), env.get("PYTHONPATH", "")]))
    return env


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The driver under ``DEBIAS_NPROC=2 python -m debias.harness.launch`` (2 torchrun workers) and, meanwhile,
    in this process (one process, one thread); their output folders."""
    root = tmp_path_factory.mktemp("torchrun")
    data = root / "data"
    data.mkdir()
    for name, (n, seed) in {"train": (120, 0), "val": (60, 1), "test": (60, 2)}.items():
        save_split(data / f"{name}.pt", tiny_split(n, seed))
    (data / "configs.json").write_text(json.dumps(CONFIGS))
    driver = root / "driver.py"
    driver.write_text(DRIVER)
    started = time.monotonic()
    torchrun = subprocess.Popen([sys.executable, "-m", "debias.harness.launch", str(driver), str(data), str(root / "nproc2")],
                                env=_env(2), cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    threads = torch.get_num_threads()
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("DEBIAS_TRACKING", "off")
            for name in ("DEBIAS_MEMORY_CHECK", "DEBIAS_DEVICE", "WORLD_SIZE", "RANK"):
                env.delenv(name, raising=False)
            torch.set_num_threads(1)
            runpy.run_path(str(driver))["train_all"](data, root / "nproc1" / "rank0")
    finally:
        torch.set_num_threads(threads)
        out, err = torchrun.communicate(timeout=300)
    assert torchrun.returncode == 0, f"DEBIAS_NPROC=2 failed:\n{out}\n{err}"
    print(f"2 processes under torchrun and 1 in-process: {time.monotonic() - started:.1f} s")
    return {nproc: root / f"nproc{nproc}" for nproc in (1, 2)}


def _curves(path: Path) -> list[dict[str, float]]:
    header, *rows = path.read_text().splitlines()
    keys = header.split(",")
    return [{k: float(v) for k, v in zip(keys, row.split(",")) if v} for row in rows]


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CONFIGS))
def test_two_processes_train_like_one(name: str, runs: dict[int, Path]) -> None:
    one, two = runs[1] / "rank0" / name, runs[2] / "rank0" / name
    metrics_one, metrics_two = (json.loads((d / "metrics.json").read_text()) for d in (one, two))
    assert metrics_two["selected_epoch"] == metrics_one["selected_epoch"]
    for split in ("train", "val", "test"):
        for key, value in metrics_one[split].items():
            assert metrics_two[split][key] == pytest.approx(value, abs=ACCURACY_ATOL), (split, key)
    curves_one, curves_two = _curves(one / "curves.csv"), _curves(two / "curves.csv")
    assert len(curves_one) == len(curves_two) == 2
    for row_one, row_two in zip(curves_one, curves_two):
        assert row_two.keys() == row_one.keys()
        for key, value in row_one.items():
            assert row_two[key] == pytest.approx(value, rel=LOSS_RTOL, abs=1e-12), key
    weights_one = torch.load(one / "model.pt", weights_only=True)["state_dict"]
    weights_two = torch.load(two / "model.pt", weights_only=True)["state_dict"]
    for key, value in weights_one.items():
        if key.startswith("head") and name not in HEAD_TRAINED:
            continue  # an L-BFGS probe fitted after training: ill-conditioned, compared through its metrics above
        deviation = float((weights_two[key] - value).abs().max() / value.abs().max().clamp_min(1e-12))
        assert deviation < WEIGHT_RTOL, (key, deviation)


@pytest.mark.slow
def test_only_rank_0_writes(runs: dict[int, Path]) -> None:
    rank0, rank1 = runs[2] / "rank0", runs[2] / "rank1"
    assert [p for p in rank1.rglob("*")] == []  # rank 1 wrote nothing: no output, record or resume state
    written = sorted(str(p.relative_to(rank0)) for p in rank0.rglob("*") if p.is_file())
    reference = sorted(str(p.relative_to(runs[1] / "rank0")) for p in (runs[1] / "rank0").rglob("*") if p.is_file())
    assert written == reference  # the same files as one process, the resume state deleted
    assert not any(name.endswith("resume.pt") for name in written)
    assert "erm/run.json" in written and "cnc/metrics_info.json" in written


# --------------------------------------------------------------------------- (c) pure helpers


def test_shards_are_contiguous_balanced_and_cover_the_batch() -> None:
    assert distributed.shard_sizes(13, 2) == [7, 6]
    assert distributed.shard_sizes(5, 4) == [2, 1, 1, 1]
    assert distributed.shard_sizes(1, 2) == [1, 0]
    assert distributed.shard_slice(13) == slice(0, 13)  # one process: the whole batch
    index = torch.arange(5)
    assert distributed.shard(index) is index and distributed.all_gather_rows(index, 5) is index
    assert not distributed.active() and distributed.world_size() == 1 and distributed.is_main()


def test_launcher_commands_and_settings() -> None:
    assert nproc_from_env({}) == 1 and nproc_from_env({"DEBIAS_NPROC": "4"}) == 4
    for bad in ("0", "two", "-1"):
        with pytest.raises(ValueError, match="DEBIAS_NPROC"):
            nproc_from_env({"DEBIAS_NPROC": bad})
    assert torchrun_arguments("pipeline/train_erm.py", ["--x"], 2) == [
        "--standalone", "--nproc_per_node=2", "pipeline/train_erm.py", "--x"]
    assert single_process_command("pipeline/train_erm.py", []) == [sys.executable, "pipeline/train_erm.py"]
    assert (exit_code_of_failure(2), exit_code_of_failure(-9), exit_code_of_failure(0)) == (2, 137, 1)


def test_launcher_rejects_a_bad_nproc_with_one_message() -> None:
    done = subprocess.run([sys.executable, "-m", "debias.harness.launch", "pipeline/train_erm.py"], cwd=REPO,
                          env={**_env(1), "DEBIAS_NPROC": "zero"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "DEBIAS_NPROC = 'zero'" in done.stderr and "Traceback" not in done.stderr


def test_memory_plan_counts_each_rank_s_shard_and_the_shared_cpu() -> None:
    prof = memory.Profile(weight_bytes=1000, train_bytes_per_image=100.0, eval_bytes_per_image=10.0)
    one = memory.StepPlan("stage2.batch_size", 256, pairwise=8)
    cuda = memory.StepPlan("stage2.batch_size", 256, pairwise=8, ranks=2, copies=1)
    cpu = memory.StepPlan("stage2.batch_size", 256, pairwise=8, ranks=2, copies=2)
    activations = memory.BACKWARD_MARGIN * 100.0 * 256
    assert memory.step_bytes(prof, one, 256, 1000) == 1000 + activations + 8 * 4.0 * 256**2
    assert memory.step_bytes(prof, cuda, 256, 1000) == 1000 + activations / 2 + 8 * 4.0 * 256**2
    assert memory.step_bytes(prof, cpu, 256, 1000) == 2 * memory.step_bytes(prof, cuda, 256, 1000)
    assert memory.distributed_plan(one, torch.device("cpu")) == one  # one process: the plan is unchanged


def test_rank_1_opens_no_mlflow_run_and_writes_no_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from debias.harness.tracking import stage_run

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("DEBIAS_TRACKING", "required")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # unreachable: rank 0 would fail here
    with stage_run("train_erm", {"seed": 0}, record_path=tmp_path / "run.json") as run:
        assert not run.active
    assert not (tmp_path / "run.json").exists()
