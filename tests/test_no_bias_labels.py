"""Data without bias labels: an image folder without attribute column (or ``bias.protocol: none``) runs end to end
on inferred groups, and every number that needs the true attribute says so ("needs bias labels"), never 0, NaN
or a dropped key; what needs no attribute (per-class and worst-class accuracy, accuracy per inferred group with
its n and Wilson interval, the inferred groups' sizes) is computed and checked here against hand computations.
The whole pipeline on an image folder without bias labels, and what its outputs say, is checked in
tests/test_trace.py (on the pipeline it traces)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from debias.core.errors import NEEDS_BIAS_LABELS, NeedsBiasLabels
from debias.metrics import accuracy_report, class_accuracies, fairness_report, inferred_group_accuracies, scalars


# --------------------------------------------------------------------------- the metrics, by hand


def test_per_class_and_worst_class_accuracy_match_a_hand_count() -> None:
    """Class 0: 3 of 4 right; class 1: 1 of 2; class 2: 2 of 2; class 3 absent (None, not 0)."""
    y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 2, 2])
    found = class_accuracies(pred, y, n_classes=4)
    assert found["per_class"] == [0.75, 0.5, 1.0, None]
    assert found["class_counts"] == [4, 2, 2, 0]
    assert found["worst_class"] == 0.5


def test_accuracy_report_without_attribute_computes_what_it_can_and_marks_the_rest() -> None:
    y = torch.tensor([0, 0, 0, 0, 1, 1, 2, 2])
    pred = torch.tensor([0, 0, 0, 1, 1, 0, 2, 2])
    report = accuracy_report(pred, y, None, None, n_classes=3, n_attrs=0)
    assert report["avg"] == 6 / 8 and report["n"] == 8 and report["worst_class"] == 0.5
    assert report["per_class"] == [0.75, 0.5, 1.0] and report["bias_labels"] is False
    for key in ("unbiased", "worst_group", "aligned", "conflicting", "per_group", "group_counts", "empty_groups"):
        assert report[key] == NEEDS_BIAS_LABELS, key
    assert scalars(report) == {"avg": 0.75, "unbiased": NEEDS_BIAS_LABELS, "worst_group": NEEDS_BIAS_LABELS,
                               "aligned": NEEDS_BIAS_LABELS, "conflicting": NEEDS_BIAS_LABELS, "worst_class": 0.5}
    fairness = fairness_report(pred[:6].clamp(max=1), y[:6].clamp(max=1), None, n_classes=2)
    assert fairness["equalized_odds_difference"] == NEEDS_BIAS_LABELS and NEEDS_BIAS_LABELS in fairness["reason"]


def test_accuracy_report_with_attribute_keeps_its_keys() -> None:
    y = torch.tensor([0, 0, 1, 1])
    a = torch.tensor([0, 1, 0, 1])
    pred = torch.tensor([0, 1, 1, 1])
    report = accuracy_report(pred, y, a, a == y, n_classes=2, n_attrs=2)
    assert report["worst_group"] == 0.0 and "worst_class" not in report and "worst_class" not in scalars(report)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    """The Wilson score interval written from its formula (Wilson 1927)."""
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return centre - half, centre + half


def test_accuracy_per_inferred_group_has_its_n_and_a_wilson_interval() -> None:
    """Cells (class, inferred group): (0, 0) 3 of 4 right, (0, 1) 0 of 1, (1, 1) 2 of 3; at 95 % (z = 1.959964)."""
    y = torch.tensor([0, 0, 0, 0, 0, 1, 1, 1])
    inferred = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    pred = torch.tensor([0, 0, 0, 1, 1, 1, 1, 0])
    rows = inferred_group_accuracies(pred, y, inferred, confidence=0.95)
    assert [(r["y"], r["group"], r["n"], r["correct"]) for r in rows] == [(0, 0, 4, 3), (0, 1, 1, 0), (1, 1, 3, 2)]
    for row in rows:
        assert row["accuracy"] == row["correct"] / row["n"]
        low, high = _wilson(row["correct"], row["n"], 1.959963984540054)
        assert row["low"] == pytest.approx(low, abs=1e-9) and row["high"] == pytest.approx(high, abs=1e-9)
    assert all("low" not in row for row in inferred_group_accuracies(pred, y, inferred, confidence=None))


def test_the_groups_report_without_attribute_gives_sizes_and_erm_accuracy_per_inferred_group() -> None:
    from debias.data.store import BiasedSplit
    from debias.groups.inference import GroupInference, groups_report

    y = torch.tensor([0, 0, 0, 1, 1, 1])
    label = torch.tensor([0, 0, 1, 1, 1, 0])
    train = BiasedSplit(torch.zeros(6, 3, 4, 4, dtype=torch.uint8), y, None, None, 2, 0)
    inference = GroupInference(label, y * 2 + label, label != y)
    report = groups_report("pred", inference, train, erm_pred=torch.tensor([0, 1, 1, 1, 1, 1]))
    assert report["n_inferred_minority"] == 2 and report["inferred_minority_per_class"] == [1, 1]
    assert [(r["y"], r["group"], r["n"], r["correct"]) for r in report["inferred_groups"]] == [
        (0, 0, 2, 1), (0, 1, 1, 0), (1, 0, 1, 1), (1, 1, 2, 2)]
    assert report["minority_recall"] == report["matched_accuracy"] == NEEDS_BIAS_LABELS


# --------------------------------------------------------------------------- data and params


def test_a_split_without_attribute_refuses_its_groups_and_round_trips(tmp_path: Path) -> None:
    from debias.data.store import BiasedSplit, load_split, save_split

    split = BiasedSplit(torch.zeros(4, 3, 8, 8, dtype=torch.uint8), torch.tensor([0, 1, 0, 1]), None, None, 2, 0)
    with pytest.raises(NeedsBiasLabels, match="needs bias labels"):
        _ = split.g
    save_split(tmp_path / "s.pt", split)
    loaded = load_split(tmp_path / "s.pt")
    assert loaded.a is None and loaded.aligned is None and not loaded.has_attribute
    assert loaded.class_counts().tolist() == [2, 2]


def test_an_image_folder_without_attribute_column_reads_without_a(tmp_path: Path) -> None:
    from debias.data.bias import inject_bias, resolve_protocol
    from debias.data.sources import load_source
    from debias.params import BiasParams, DataParams
    from debias.tools.cli import main as cli_main

    root = tmp_path / "shapes"
    assert cli_main(["example-folder", str(root), "--n-train", "16", "--n-eval", "8", "--size", "16",
                     "--no-attribute"]) == 0
    assert list(pd.read_csv(root / "metadata.csv").columns) == ["img_filename", "y", "split"]
    data = DataParams(source="imagefolder", image_size=16, imagefolder={"root": str(root), "attribute_column": None})
    splits = load_source(data, tmp_path, 0)
    assert all(split.a is None for split in splits.values())
    assert resolve_protocol("auto", splits, "imagefolder", "given") == "none"
    biased = inject_bias(splits, BiasParams(), 0, source="imagefolder", source_protocol="given")
    assert biased["train"].a is None and biased["train"].n_attrs == 0 and len(biased["train"]) == 16


def test_an_npz_without_a_under_protocol_none_keeps_no_attribute_and_given_is_refused() -> None:
    """An npz without ``a`` is coloured by ``auto`` (its digits' protocol); ``none`` keeps it without bias labels,
    ``given`` says which protocol to name instead."""
    from debias.core.errors import BiasProtocolError
    from debias.data.bias import inject_bias
    from debias.data.raw import RawSplit
    from debias.params import BiasParams

    rng = np.random.default_rng(0)
    splits = {name: RawSplit(rng.integers(0, 255, (6, 8, 8), dtype=np.uint8), np.array([0, 1, 2, 0, 1, 2]))
              for name in ("train", "val", "test")}
    biased = inject_bias(splits, BiasParams(protocol="none"), 0, source="npz", source_protocol="foreground")
    assert biased["test"].a is None and biased["test"].n_classes == 3 and biased["test"].x.shape == (6, 3, 8, 8)
    with pytest.raises(BiasProtocolError, match="bias.protocol = none for data without bias labels"):
        inject_bias(splits, BiasParams(protocol="given"), 0, source="npz", source_protocol="foreground")


def test_compare_reads_the_keys_an_mlflow_run_tags_as_needing_bias_labels() -> None:
    from debias.tools.compare.collect import kept_value, rejected_values, tagged_needs_bias_labels

    tags = {"debias.needs_bias_labels": f"erm_worst, s2_unbiased, train.val.x: {NEEDS_BIAS_LABELS}"}
    assert tagged_needs_bias_labels(tags) == {"erm_worst": NEEDS_BIAS_LABELS, "s2_unbiased": NEEDS_BIAS_LABELS}
    assert kept_value(NEEDS_BIAS_LABELS) and not kept_value("text")
    assert rejected_values({"erm_worst": NEEDS_BIAS_LABELS, "s2_avg": float("nan")}) == {"s2_avg": "NaN"}


@pytest.mark.parametrize("key, value, allowed", [
    ("groups.method", "true", "pred, cluster, soft"),
    ("stage2.selection", "best_worst_group", "last, best_worst_class, best_worst_inferred_group"),
    ("stage2.selection", "best_unbiased", "last, best_worst_class, best_worst_inferred_group"),
    ("erm.selection", "best_worst_group", "last, best_worst_class"),
    ("probe.method", "dfr", "logistic"),
    ("probe.postprocess", "equalized_odds", "none"),
])
def test_choices_that_read_the_attribute_are_refused_up_front(key: str, value: str, allowed: str) -> None:
    from debias.params import ParamsError
    from debias.schema import validate
    from tests.conftest import committed_text

    params = yaml.safe_load(committed_text("params.yaml"))
    params["data"].update(source="imagefolder", imagefolder={"root": "x", "attribute_column": None})
    params["erm"]["selection"] = params["stage2"]["selection"] = "last"
    params["groups"]["method"] = "pred"
    section, name = key.split(".")
    params[section][name] = value
    with pytest.raises(ParamsError) as caught:
        validate(params)
    assert (f"{key} = {value} needs bias labels, and the data has none (data.imagefolder.attribute_column is null); "
            f"allowed without them: {allowed}") in str(caught.value)
    params[section][name] = allowed.split(", ")[0]
    assert validate(params).bias_labels is False


def test_the_mlflow_logger_names_the_keys_that_need_bias_labels() -> None:
    """No number is logged for them; the run's tag lists them with the one wording."""
    from debias.harness.tracking.artifacts import StageRun

    logged: dict = {"metrics": [], "tags": {}}

    class Client:
        def log_batch(self, run_id, metrics=()):
            logged["metrics"] += [(m.key, m.value) for m in metrics]

        def set_tag(self, run_id, key, value):
            logged["tags"][key] = value

    run = StageRun(Client(), "r")  # a run id: active, logging through the client
    run.log_metrics({"test.avg": 0.5, "test.worst_group": NEEDS_BIAS_LABELS, "test.unbiased": NEEDS_BIAS_LABELS})
    assert logged["metrics"] == [("test.avg", 0.5)]
    assert logged["tags"] == {"debias.needs_bias_labels": f"test.unbiased, test.worst_group: {NEEDS_BIAS_LABELS}"}
