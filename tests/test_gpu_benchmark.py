"""benchmarks/gpu.py: its smoke path runs on the CPU and writes a row per stage naming the device; bad options are
refused before any work."""

from __future__ import annotations

import csv

import pytest

from benchmarks import gpu


@pytest.mark.slow
def test_the_quick_cpu_run_times_every_stage_up_to_training(tmp_path) -> None:
    out = tmp_path / "gpu"
    assert gpu.main(["--device", "cpu", "--quick", "--threads", "1", "--seeds", "3", "--out", str(out)]) == 0
    lines = [line for line in out.with_suffix(".csv").read_text().splitlines() if not line.startswith("#")]
    rows = list(csv.DictReader(lines))
    table, rows = rows[-1], rows[:-1]  # the whole table's row comes last
    assert (table["setting"], table["method"], table["seed"], table["stage"]) == ("all", "all", "all", "table")
    assert float(table["wall_s"]) >= sum(float(row["wall_s"]) for row in rows) and table["exit"] == "0"
    assert int(table["steps"]) == sum(int(row["steps"]) for row in rows if row["steps"])
    assert table["idle_fraction"] == ""  # CUDA only
    assert "Whole table: 1 row(s)" in out.with_suffix(".md").read_text()
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


def test_the_whole_tables_row_sums_its_rows_and_samples_the_device_over_the_table(tmp_path) -> None:
    """Two rows run at once: the table's wall is its own (not the rows' sum), its steps the rows' sum, its idle
    fraction the share of the table-wide sampler's samples at 0 % utilisation."""
    def row(seed: int, stage: str, wall: float, steps: int | None, status: int = 0) -> dict:
        return {"device": "cuda: X", "setting": "s", "method": "m", "seed": seed, "stage": stage, "wall_s": wall,
                "steps": steps, "steps_per_s": None, "peak_memory_mib": 10.0, "idle_fraction": 0.5, "concurrent": 2,
                "test_avg": None, "test_unbiased": None, "test_worst_group": None, "exit": status}

    rows = [row(0, "train_erm", 30.0, 300), row(0, "evaluate", 10.0, None), row(1, "train_erm", 32.0, 300)]
    monitor = gpu.DeviceMonitor("cpu", 100)
    monitor.samples = [(0.0, 100.0), (50.0, 900.0), (97.0, 800.0), (0.0, 120.0)]
    table = gpu.table_row(rows, 45.0, monitor, "cuda: X", 2)
    assert (table["wall_s"], table["steps"], table["steps_per_s"]) == (45.0, 600, round(600 / 45.0, 2))
    assert (table["peak_memory_mib"], table["idle_fraction"], table["concurrent"], table["exit"]) == (900.0, 0.5, 2, 0)
    assert gpu.table_row([*rows, row(2, "train_erm", 1.0, 10, status=3)], 46.0, monitor, "cuda: X", 2)["exit"] == 3
    gpu.write(tmp_path / "o", rows, ["Command: `x`"], table)
    lines = [line for line in (tmp_path / "o.csv").read_text().splitlines() if not line.startswith("#")]
    assert list(csv.DictReader(lines))[-1]["stage"] == "table"
    text = (tmp_path / "o.md").read_text()
    assert "Whole table: 2 row(s) of 3 stage(s), 2 at once: 45.0 s wall (stage walls summed: 72.0 s, 1.60x)" in text
    assert "device idle over the table: 50.0%" in text


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
