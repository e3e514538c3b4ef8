"""The settings that shape numbers (threads, processes, device, torch build) are recorded with each training stage's
metrics, and ``debias compare`` and the report warn when the runs they put side by side differ in them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from debias.core.environment import ENVIRONMENT_KEYS, environment_differences, environment_tags, numbers_environment
from debias.core.headline import DETAILED
from debias.tools.compare.collect import Experiment
from debias.tools.compare import data as compare_data, terminal as compare_terminal

ONE_THREAD = {"threads": 1, "processes": 1, "device": "cpu", "torch": "2.5.0", "build": "cpu", "cpu": "AVX2"}


def test_this_process_records_its_threads_processes_device_and_torch_build() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        found = numbers_environment(torch.device("cpu"))
    finally:
        torch.set_num_threads(threads)
    assert found == {"threads": 1, "processes": 1, "device": "cpu", "torch": torch.__version__,
                     "build": f"cuda {torch.version.cuda}" if torch.version.cuda else found["build"],
                     "cpu": torch.backends.cpu.get_cpu_capability()}
    assert type(found["torch"]) is str  # a plain str: resume states load weights-only
    assert list(found) == list(ENVIRONMENT_KEYS)
    assert environment_tags(found)["debias.env.threads"] == "1"


def test_differences_name_each_differing_setting_with_its_runs_and_skip_runs_that_recorded_none() -> None:
    four = dict(ONE_THREAD, threads=4)
    assert environment_differences({"a": ONE_THREAD, "b": dict(ONE_THREAD), "old": None}) == []
    assert environment_differences({"a": ONE_THREAD, "b": four, "c": ONE_THREAD, "old": {}}) == [
        "torch threads: 1 (a, c), 4 (b)"]
    gpu = dict(ONE_THREAD, device="cuda (NVIDIA H100)", build="cuda 12.1", processes=2)
    assert environment_differences({"ERM": ONE_THREAD, "stage 2": gpu}) == [
        "training processes: 1 (ERM), 2 (stage 2)", "device: cpu (ERM), cuda (NVIDIA H100) (stage 2)",
        "torch build: cpu (ERM), cuda 12.1 (stage 2)"]


def _experiment(name: str, seed: int, environment: dict | None) -> Experiment:
    files = {str(DETAILED["train_erm"]): json.dumps({"warnings": [], "environment": environment}),
             str(DETAILED["train_contrastive"]): json.dumps({"warnings": [], "environment": environment})}
    metrics = {key: 0.5 for key in compare_data.METRIC_KEYS}
    return Experiment(name, "experiment", {"seed": seed, "stage2.method": "cnc"}, metrics, rev=f"rev-{name}",
                      timestamp=f"2026-11-23T10:0{seed}:00", reader=lambda path: files.get(str(path)))


def test_compare_warns_when_the_experiments_were_trained_under_other_settings() -> None:
    same = compare_data.build_comparison([_experiment("s0", 0, ONE_THREAD), _experiment("s1", 1, ONE_THREAD)])
    assert not [note for note in same.notes if "settings" in note]
    mixed = compare_data.build_comparison([_experiment("s0", 0, ONE_THREAD), _experiment("s1", 1, dict(ONE_THREAD, threads=2)),
                                           _experiment("s2", 2, None)])
    warnings = [note for note in mixed.notes if note.startswith("WARNING")]
    assert warnings == [f"WARNING the experiments' {label} models were trained under different settings that change "
                        "numbers: torch threads: 1 (s0), 2 (s1)" for label in ("ERM", "stage 2")]
    text = compare_terminal.terminal_text(mixed)
    assert "\nWARNING the experiments' ERM models were trained under different settings" in text


def test_the_report_warns_when_erm_and_stage2_were_trained_under_other_settings(tmp_path: Path) -> None:
    from debias.report.inputs import ReportInputs
    from debias.report.sections.results import environment_notes

    def inputs(erm: dict | None, stage2: dict | None) -> ReportInputs:
        return ReportInputs({"erm": {"environment": erm}, "stage2": {"environment": stage2}}, {}, {}, {}, None, None,
                            None, [])

    assert environment_notes(inputs(ONE_THREAD, dict(ONE_THREAD))) == []
    assert environment_notes(inputs(ONE_THREAD, None)) == []  # a file written before the environment was recorded
    [note] = environment_notes(inputs(ONE_THREAD, dict(ONE_THREAD, device="mps")))
    assert note.text == ("WARNING ERM and stage 2 were trained under different settings that change numbers: "
                         "device: cpu (ERM), mps (stage 2).")


@pytest.mark.slow
def test_an_isa_override_is_recorded(tmp_path) -> None:
    """ATEN_CPU_CAPABILITY=default picks torch's plain kernels, which round sums otherwise: the recorded environment
    says so (a run-cache entry or a compared run of another instruction set is then named)."""
    import subprocess
    import sys

    code = "import torch; from debias.core.environment import numbers_environment as n; print(n(torch.device('cpu'))['cpu'])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                          env={**os.environ, "ATEN_CPU_CAPABILITY": "default"})
    assert done.stdout.strip() == "DEFAULT"
    assert numbers_environment(torch.device("cpu"))["cpu"] == torch.backends.cpu.get_cpu_capability()


def test_a_run_resumed_under_other_settings_lists_every_process_and_is_warned() -> None:
    from debias.training.loop import FitResult
    from debias.training.outputs import resumed_environment_warnings

    first = {"epochs": [0, 3], **ONE_THREAD}
    second = {"epochs": [4, 9], **dict(ONE_THREAD, threads=2)}
    resumed = FitResult([], 0, {}, resumed_from=4, trained_by=[first, second])
    (found,) = resumed_environment_warnings(resumed)
    assert found.startswith("mixed-environment: this run resumed an interrupted one under other settings")
    assert "torch threads: 1 (epochs 0-3), 2 (epochs 4-9)" in found
    same = FitResult([], 0, {}, resumed_from=4, trained_by=[first, {**first, "epochs": [4, 9]}])
    assert resumed_environment_warnings(same) == []
