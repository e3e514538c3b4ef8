"""Resource limits: a run that would not fit says so, and which param to lower to what, before
training starts; a real out-of-memory error during a stage gets the same kind of advice."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from debias.harness import memory
from debias.harness.memory import ResourceError
from debias.models import build_model
from debias.schema import validate
from tests.faults.conftest import (
    PYTHON,
    assert_clean_failure,
    run_entrypoint_in_process,
    snapshot,
    stage_env,
    write_driver,
    write_params,
)

CPU = torch.device("cpu")
MiB = 2**20


def suggested(message: str, key: str) -> int:
    match = re.search(rf"lower {re.escape(key)} to (\d+) or less", message)
    assert match, message
    return int(match.group(1))


# --------------------------------------------------------------------------- the estimate and the check


def test_free_memory_is_read_from_the_machine() -> None:
    free = memory.available_bytes(CPU)
    assert free is not None and 0 < free
    total = int(next(line for line in Path("/proc/meminfo").read_text().splitlines()
                     if line.startswith("MemTotal:")).split()[1]) * 1024
    assert free <= total


def test_the_probe_grows_with_the_model_and_leaves_it_untouched() -> None:
    small, large = build_model("lenet5", 10, 16), build_model("resnet18", 10, 16)
    before = {k: v.clone() for k, v in large.state_dict().items()}
    rng = torch.get_rng_state()
    p_small, p_large = memory.profile(small, (3, 16, 16), CPU), memory.profile(large, (3, 16, 16), CPU)
    assert 0 < p_small.train_bytes_per_image < p_large.train_bytes_per_image
    assert p_small.weight_bytes < p_large.weight_bytes
    assert all(torch.equal(before[k], v) for k, v in large.state_dict().items())  # BatchNorm statistics too
    assert torch.equal(torch.get_rng_state(), rng)


def test_a_batch_that_does_not_fit_names_the_param_and_a_value_that_fits(monkeypatch) -> None:
    model = build_model("resnet18", 10, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    prof = memory.profile(model, (3, 16, 16), CPU)
    monkeypatch.setattr(memory, "profile", lambda *args: prof)  # probe once, check three times
    monkeypatch.setattr(memory, "available_bytes", lambda device: 400 * MiB)
    args = (256, 50_000, 10_000, (3, 16, 16), CPU)
    with pytest.raises(ResourceError) as info:
        memory.check_classifier_fits(model, optimizer, "resnet18", "erm", 4096, *args)
    message = str(info.value)
    assert message.startswith("erm.batch_size = 4096 does not fit in memory")
    assert "resnet18" in message and "is free" in message
    fits = suggested(message, "erm.batch_size")
    assert 1 <= fits < 4096
    memory.check_classifier_fits(model, optimizer, "resnet18", "erm", fits, *args)
    with pytest.raises(ResourceError):
        memory.check_classifier_fits(model, optimizer, "resnet18", "erm", fits + 1, *args)


def test_the_batch_is_capped_by_the_data(monkeypatch) -> None:
    """batch_size 65536 on 100 training images forwards 100 images: no false alarm."""
    model = build_model("lenet5", 10, 28)
    optimizer = torch.optim.Adam(model.parameters())
    monkeypatch.setattr(memory, "available_bytes", lambda device: 200 * MiB)
    memory.check_classifier_fits(model, optimizer, "lenet5", "erm", 65536, 1024, 100, 100, (3, 28, 28), CPU)


def test_an_evaluation_batch_that_does_not_fit_names_eval_batch_size(monkeypatch) -> None:
    model = build_model("lenet5", 10, 28)
    optimizer = torch.optim.Adam(model.parameters())
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64 * MiB)
    with pytest.raises(ResourceError, match=r"erm\.eval_batch_size = 65536 does not fit") as info:
        memory.check_classifier_fits(model, optimizer, "lenet5", "erm", 8, 65536, 60_000, 60_000, (3, 28, 28), CPU)
    assert suggested(str(info.value), "erm.eval_batch_size") >= 1


def _stage2(method: str, **stage2) -> object:
    return validate({"model": {"name": "lenet5"}, "stage2": {"method": method, **stage2},
                     "loss": {"fairkl": {"weight": 0.5}}})


def test_cnc_names_forward_chunk_then_m_and_n(monkeypatch) -> None:
    model = build_model("lenet5", 5, 28)
    optimizer = torch.optim.Adam(model.parameters())
    params = _stage2("cnc", cnc={"num_positives": 1024, "num_negatives": 1024, "forward_chunk": 32, "accumulation": 32})
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2048 * MiB)
    with pytest.raises(ResourceError) as info:
        memory.check_stage2_fits("cnc", [model], optimizer, params, 5000, 5000, (3, 28, 28), CPU)
    assert str(info.value).startswith("stage2.cnc.forward_chunk = 32 does not fit")
    fits = suggested(str(info.value), "stage2.cnc.forward_chunk")
    assert 1 <= fits < 32
    monkeypatch.setattr(memory, "available_bytes", lambda device: 64 * MiB)
    with pytest.raises(ResourceError) as info:
        memory.check_stage2_fits("cnc", [model], optimizer, params, 5000, 5000, (3, 28, 28), CPU)
    assert "even stage2.cnc.forward_chunk = 1 does not fit" in str(info.value)
    assert "stage2.cnc.num_positives (1024)" in str(info.value) and "stage2.cnc.num_negatives (1024)" in str(info.value)


def test_contrastive_losses_count_their_batch_by_batch_matrices(monkeypatch) -> None:
    """eps-SupInfoNCE + FairKL at batch 32768: the B x B matrices alone are tens of GiB."""
    model = build_model("lenet5", 10, 28)
    optimizer = torch.optim.Adam(model.encoder.parameters())
    params = _stage2("eps_supinfonce", batch_size=32768)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 16 * 2**30)
    with pytest.raises(ResourceError) as info:
        memory.check_stage2_fits("eps_supinfonce", [model], optimizer, params, 60_000, 10_000, (3, 28, 28), CPU)
    fits = suggested(str(info.value), "stage2.batch_size")
    assert 256 <= fits < 32768  # the papers' 256 fits in 16 GiB; the quadratic term is what limits it
    memory.check_stage2_fits("eps_supinfonce", [model], optimizer, _stage2("eps_supinfonce", batch_size=fits),
                             60_000, 10_000, (3, 28, 28), CPU)


def test_the_check_can_be_switched_off_and_never_fails_a_run_itself(monkeypatch) -> None:
    model = build_model("lenet5", 10, 28)
    optimizer = torch.optim.Adam(model.parameters())
    monkeypatch.setattr(memory, "available_bytes", lambda device: 1)
    monkeypatch.setenv("DEBIAS_MEMORY_CHECK", "off")
    memory.check_classifier_fits(model, optimizer, "lenet5", "erm", 32, 32, 100, 100, (3, 28, 28), CPU)
    monkeypatch.setenv("DEBIAS_MEMORY_CHECK", "on")
    monkeypatch.setattr(memory, "profile", lambda *a: (_ for _ in ()).throw(RuntimeError("probe broke")))
    with pytest.warns(UserWarning, match="memory check skipped"):
        memory.check_classifier_fits(model, optimizer, "lenet5", "erm", 32, 32, 100, 100, (3, 28, 28), CPU)


@pytest.mark.parametrize("error, expected", [
    (torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"), True),
    (RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 88 GB"), True),
    (MemoryError(), True),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), False),
    (ValueError("out of memory"), False),
])
def test_out_of_memory_errors_are_recognised(error: BaseException, expected: bool) -> None:
    assert memory.is_out_of_memory(error) is expected


# --------------------------------------------------------------------------- through the real stages

SMALL_MACHINE = """
import runpy, sys
from debias.harness import memory

memory.available_bytes = lambda device: int(sys.argv[1])  # a machine with this much free memory
runpy.run_path("pipeline/train_erm.py", run_name="__main__")
"""


def test_train_erm_that_would_not_fit_stops_before_training_and_says_what_to_lower(prepared_workspace: Path,
                                                                                  tmp_path: Path, monkeypatch,
                                                                                  capsys) -> None:
    """On a machine with 8 MiB free, erm.batch_size 128 does not fit: exit 2 before the first epoch,
    naming the param and a value; with that value the same stage trains."""
    ws = prepared_workspace
    driver = write_driver(tmp_path, "small_machine.py", SMALL_MACHINE)
    write_params(ws, {"erm": {"batch_size": 128, "eval_batch_size": 16, "epochs": 1}})
    before = snapshot(ws)
    done = subprocess.run([PYTHON, str(driver), str(8 * MiB)], cwd=ws, env=stage_env(), capture_output=True,
                          text=True, check=False, timeout=120)
    assert_clean_failure(done, "erm.batch_size = 128 does not fit in memory", "lenet5", stage="train_erm")
    assert snapshot(ws) == before  # no output, no resume state
    fits = suggested(done.stderr, "erm.batch_size")
    write_params(ws, {"erm": {"batch_size": fits, "eval_batch_size": 16, "epochs": 1}})
    monkeypatch.setattr(memory, "available_bytes", lambda device: 8 * MiB)  # the same small machine, in-process
    done = run_entrypoint_in_process(ws, "train_erm", monkeypatch, capsys)
    assert done.returncode == 0, done.stderr


def test_out_of_memory_during_training_gets_advice_not_a_traceback(prepared_workspace: Path, monkeypatch,
                                                                   capsys) -> None:
    import debias.training.erm as erm_module

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 15.7 GiB total)")

    monkeypatch.setattr(erm_module, "fit", oom)
    done = run_entrypoint_in_process(prepared_workspace, "train_erm", monkeypatch, capsys)
    assert_clean_failure(done, "out of memory", "Tried to allocate 20.00 GiB", "erm.batch_size (now 32)",
                         "erm.eval_batch_size (now 1024)", stage="train_erm")


def test_cpu_allocator_failure_in_stage2_names_the_cnc_knobs(prepared_workspace: Path, monkeypatch, capsys) -> None:
    import debias.training.methods.run as methods_module

    def oom(*args, **kwargs):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 94371840000 bytes. Error code 12 (Cannot allocate memory)")

    monkeypatch.setattr(methods_module, "fit", oom)
    cnc = yaml.safe_load((prepared_workspace / "params.yaml").read_text())["stage2"]["cnc"]  # this test's own copy
    done = run_entrypoint_in_process(prepared_workspace, "train_contrastive", monkeypatch, capsys)
    assert_clean_failure(done, "out of memory", f"stage2.cnc.forward_chunk (now {cnc['forward_chunk']})",
                         f"stage2.cnc.num_positives (now {cnc['num_positives']})",
                         f"stage2.cnc.num_negatives (now {cnc['num_negatives']})", stage="train_contrastive")


def test_other_runtime_errors_still_show_their_traceback(prepared_workspace: Path, monkeypatch) -> None:
    """The out-of-memory handler does not swallow programming errors."""
    import runpy

    import debias.training.erm as erm_module

    def bug(*args, **kwargs):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied (4x84 and 120x10)")

    monkeypatch.setattr(erm_module, "fit", bug)
    monkeypatch.chdir(prepared_workspace)
    monkeypatch.delenv("DEBIAS_DEBUG", raising=False)
    with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
        runpy.run_path("pipeline/train_erm.py", run_name="__main__")
