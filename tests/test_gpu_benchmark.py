"""benchmarks/gpu.py: its smoke path runs on the CPU and writes a row per stage naming the device; bad options are
refused before any work."""

from __future__ import annotations

import csv
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

import gpu  # noqa: E402


@pytest.mark.slow
def test_the_quick_cpu_run_times_every_stage_up_to_training(tmp_path) -> None:
    out = tmp_path / "gpu"
    assert gpu.main(["--device", "cpu", "--quick", "--threads", "1", "--seeds", "3", "--out", str(out)]) == 0
    lines = [line for line in out.with_suffix(".csv").read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    assert [row["stage"] for row in rows][-1] == "train_contrastive"
    assert {row["device"] for row in rows} == {rows[0]["device"]} and rows[0]["device"].startswith("cpu: ")
    training = {row["stage"]: row for row in rows if row["steps"]}
    assert set(training) == {"train_erm", "train_contrastive"}
    assert all(float(row["steps_per_s"]) > 0 for row in training.values())
    assert {row["seed"] for row in rows} == {"3"} and {row["concurrent"] for row in rows} == {"1"}
    for row in training.values():  # the kept model's test accuracies, from the stage's own metrics file
        assert 0 <= float(row["test_worst_group"]) <= float(row["test_unbiased"]) <= 1 and row["test_avg"] != ""
    assert all(row["test_avg"] == "" for row in rows if not row["steps"])
    assert all(row["peak_memory_mib"] == "" and row["idle_fraction"] == "" for row in rows)  # CUDA only
    assert "Device: cpu" in out.with_suffix(".md").read_text()


def test_bad_options_are_refused_naming_them(tmp_path) -> None:
    with pytest.raises(SystemExit, match="--raw"):
        gpu.main(["--device", "cpu", "--raw", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    with pytest.raises(SystemExit, match="--stages nope"):
        gpu.main(["--device", "cpu", "--quick", "--stages", "nope", "--out", str(tmp_path / "o")])
    for options, message in ((["--until", "nope"], "--until nope: not a stage"), (["--parallel", "0"], "--parallel 0"),
                             (["--set", "stage2.epochs"], "expected KEY=VALUE")):
        with pytest.raises(SystemExit, match=message):
            gpu.main(["--device", "cpu", "--quick", *options, "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o.csv").exists()  # refused before any work
