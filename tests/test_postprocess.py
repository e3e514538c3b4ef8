"""DFR (last-layer retraining on group-balanced validation data), equalized-odds post-processing (fairlearn's
ThresholdOptimizer) and the fairness blocks of the probe's reports."""

from __future__ import annotations

import pytest
import torch

from debias.data.store import BiasedSplit
from debias.evaluation.probes.dfr.fit import balanced_subset
from debias.evaluation.probes.equalized_odds.fit import (equalized_odds_fit, equalized_odds_predict,
                                                          equalized_odds_report)
from debias.evaluation.linear import fit_logistic
from debias.evaluation.probe import probe_report, split_tables
from debias.metrics import fairness_report
from debias.schema import ProbeParams, validate


@pytest.fixture(autouse=True)
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def split_of(y: torch.Tensor, a: torch.Tensor, n_classes: int = 2, n_attrs: int = 2) -> BiasedSplit:
    return BiasedSplit(torch.zeros(len(y), 3, 1, 1, dtype=torch.uint8), y, a, a == y, n_classes, n_attrs)


def test_balanced_subset_draws_every_group_down_to_the_smallest() -> None:
    groups = torch.tensor([0] * 9 + [1] * 3 + [3] * 5)  # group 2 absent: ignored, not a group of size 0
    generator = torch.Generator().manual_seed(0)
    first = balanced_subset(groups, generator)
    assert torch.bincount(groups[first], minlength=4).tolist() == [3, 3, 0, 3]
    assert torch.equal(first, first.sort().values) and len(set(first.tolist())) == 9
    assert set(first[groups[first] == 1].tolist()) == {9, 10, 11}  # the smallest group is kept whole
    second = balanced_subset(groups, generator)
    assert not torch.equal(first, second)  # a fresh draw per retrain


def spurious_world(n: int, seed: int, p_aligned: float) -> tuple[torch.Tensor, BiasedSplit]:
    """y from a weak core coordinate, a from a strong spurious one, a = y with probability p_aligned."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    a = torch.where(torch.rand(n, generator=g) < p_aligned, y, 1 - y)
    z = torch.randn(n, 4, generator=g) * 0.3
    z[:, 0] += 0.6 * (2 * y.float() - 1) + torch.randn(n, generator=g)  # core: separates y with much overlap
    z[:, 1] += 3.0 * (2 * a.float() - 1)  # spurious: clean
    return z, split_of(y, a)


@pytest.mark.slow
def test_dfr_retrains_on_balanced_validation_and_beats_the_biased_fit() -> None:
    train_z, train = spurious_world(600, 0, 0.98)
    val_z, val = spurious_world(400, 1, 0.5)
    test_z, test = spurious_world(400, 2, 0.5)
    features = {"train": train_z, "val": val_z, "test": test_z}
    splits = {"train": train, "val": val, "test": test}
    biased = probe_report(features, splits, ProbeParams(c_grid=[100.0]), seed=0)
    params = validate({"probe": {"method": "dfr", "dfr": {"c_grid": [1.0, 0.01], "retrains": 3}}}).probe
    dfr = probe_report(features, splits, params, seed=0)
    assert dfr["method"] == "dfr" and dfr["train_split"] == "val" and dfr["retrains"] == 3
    assert dfr["n_balanced"] == 4 * int(torch.bincount(val.g).min())
    assert dfr["n_fit"] % 4 == 0 and dfr["n_fit"] <= dfr["n_balanced"]  # balanced subset of the first half
    assert dfr["test"]["worst_group"] > biased["test"]["worst_group"] + 0.2
    assert {entry["c"] for entry in dfr["val_scores"]} == {1.0, 0.01}
    assert probe_report(features, splits, params, seed=0) == dfr  # seeded


def test_dfr_fits_more_than_two_classes() -> None:
    """CMNIST* has 5 classes, Biased-MNIST 10: scikit-learn >= 1.8 refuses liblinear there (a benchmark run failed on
    it), so DFR fits the same L1 penalty multinomially; the averaged classifier predicts every class."""
    g = torch.Generator().manual_seed(0)

    def world(n: int) -> tuple[torch.Tensor, BiasedSplit]:
        y, a = torch.randint(0, 3, (n,), generator=g), torch.randint(0, 3, (n,), generator=g)
        z = torch.randn(n, 6, generator=g) * 0.3
        z[torch.arange(n), y] += 2.0  # class k lifts coordinate k
        return z, split_of(y, a, n_classes=3, n_attrs=3)

    (train_z, train), (val_z, val), (test_z, test) = world(150), world(300), world(150)
    params = validate({"probe": {"method": "dfr", "dfr": {"c_grid": [1.0], "retrains": 2}}}).probe
    dfr = probe_report({"train": train_z, "val": val_z, "test": test_z}, {"train": train, "val": val, "test": test},
                       params, seed=0)
    assert dfr["method"] == "dfr" and dfr["test"]["avg"] > 0.9


@pytest.mark.slow
def test_equalized_odds_post_processing_finds_the_obvious_thresholds() -> None:
    # Scores separate the classes perfectly within each group, at different places: group 0 at 0.5, group 1 at
    # 0.72. One threshold (0.5) gives group 1 every negative as positive (FPR 1 against 0); per-group
    # thresholds reach TPR 1, FPR 0 in both groups, so equalized odds costs no accuracy.
    score = torch.tensor([0.62, 0.66, 0.70, 0.31, 0.35, 0.38, 0.82, 0.86, 0.90, 0.57, 0.60, 0.64]).repeat(10)
    y = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 1, 0, 0, 0]).repeat(10)
    a = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1]).repeat(10)
    x = score[:, None]
    model = fit_logistic(x, y, c=1e4, max_iter=1000, standardize=False, seed=0)  # a monotone map of the score
    before = torch.from_numpy(model.predict(x.double().numpy()))
    unfair = fairness_report(before, y, a, 2)
    assert unfair["equalized_odds_difference"] > 0.3
    optimiser = equalized_odds_fit(model, x, y, a)
    after = equalized_odds_predict(optimiser, x, a, seed=0)
    assert torch.equal(after, y)  # TPR 1 and FPR 0 in both groups
    fair = fairness_report(after, y, a, 2)
    assert fair["equalized_odds_difference"] == 0.0 and fair["per_group"]["1"]["fpr"] == 0.0


def test_probe_reports_fairness_and_post_processing_for_binary_tasks() -> None:
    features, splits = {}, {}
    for seed, name in enumerate(("train", "val", "test")):
        features[name], splits[name] = spurious_world(300, seed, 0.9 if name == "train" else 0.5)
    params = validate({"probe": {"c_grid": [1.0], "postprocess": "equalized_odds"}}).probe
    out = probe_report(features, splits, params, seed=0)
    assert "equalized_odds" not in out  # probe_report is the probe alone; probe_encoder adds the post-processing
    assert set(out["test"]["fairness"]) >= {"equalized_odds_difference", "demographic_parity_difference", "per_group"}
    kept, tables = split_tables({"probe": out})
    assert "per_group" not in kept["probe"]["test"]["fairness"] and "notes" not in kept["probe"]["test"]["fairness"]
    assert set(tables["probe"]["test"]["fairness"]["per_group"]) == {"0", "1"}
    model = fit_logistic(features["val"], splits["val"].y, 1.0, 1000, True, 0)
    post = equalized_odds_report(model, features, splits, torch.arange(300), seed=0)
    assert post["n_fit"] == 300 and post["test"]["fairness"]["equalized_odds_difference"] is not None
    three = {name: split_of(s.y, s.a, 3, 2) for name, s in splits.items()}
    assert "needs a binary task" in equalized_odds_report(model, features, three, torch.arange(300), seed=0)["note"]


def test_training_stage_metrics_carry_a_fairness_block_for_binary_tasks(tmp_path) -> None:
    from debias.models import build_model
    from debias.training.outputs import export_embeddings, groups_entry, metrics_entry

    g = torch.Generator().manual_seed(0)
    y, a = torch.randint(0, 2, (40,), generator=g), torch.randint(0, 2, (40,), generator=g)
    binary = BiasedSplit(torch.randn(40, 5, generator=g), y, a, a == y, 2, 2)
    model = build_model("mlp", 2, (5,))
    reports = export_embeddings(model, {"test": binary}, tmp_path, 64, torch.device("cpu"))
    entry, tables = metrics_entry(reports["test"]), groups_entry(reports["test"])
    assert set(entry["fairness"]) == {"equalized_odds_difference", "equalized_odds_mean",
                                      "demographic_parity_difference", "accuracy_difference"}
    assert set(tables["fairness"]["per_group"]) == {"0", "1"} and "notes" in tables["fairness"]
    three = BiasedSplit(torch.randn(40, 5, generator=g), y, a, a == y, 3, 2)
    reports = export_embeddings(build_model("mlp", 3, (5,)), {"test": three}, tmp_path, 64, torch.device("cpu"))
    assert "fairness" not in metrics_entry(reports["test"]) and "fairness" not in groups_entry(reports["test"])


def test_report_adds_a_fairness_table_for_binary_tasks_only(tmp_path) -> None:
    from debias.core import paths
    from debias.core.io import load_json, save_json
    from debias.report.inputs import load_inputs
    from debias.report.sections.base import result_rows
    from debias.report.sections.results import fairness_blocks
    from tests.test_report import write_inputs

    root = write_inputs(tmp_path)
    inputs = load_inputs(root)
    assert fairness_blocks(result_rows(inputs, {"erm": "ERM", "stage2": "stage 2"}), inputs) == []
    fairness = {"equalized_odds_difference": 0.114, "equalized_odds_mean": 0.08, "demographic_parity_difference": 0.2,
                "accuracy_difference": 0.1}
    metrics = root / paths.METRICS
    erm = load_json(metrics / "erm.json")
    erm["test"]["fairness"] = fairness
    save_json(metrics / "erm.json", erm)
    groups = load_json(metrics / "erm_groups.json")
    groups["test"]["fairness"] = {"per_group": {"0": {"tpr": 0.5, "fpr": 0.1}, "1": {"tpr": 0.7, "fpr": 0.2}}}
    save_json(metrics / "erm_groups.json", groups)
    probe = load_json(metrics / "probe.json")
    probe["erm"]["probe"]["test"]["fairness"] = fairness
    probe["erm"]["probe"]["equalized_odds"] = {"test": {"avg": 0.6, "fairness": {**fairness, "equalized_odds_difference": 0.05}}}
    save_json(metrics / "probe.json", probe)
    inputs = load_inputs(root)
    heading, table = fairness_blocks(result_rows(inputs, {"erm": "ERM", "stage2": "stage 2"}), inputs)
    assert [row[0] for row in table.rows] == ["ERM", "ERM linear probe", "ERM linear probe + equalized-odds post-processing"]
    assert table.rows[0][2] == "0.114" and table.rows[0][-1] == "a=0: 50.0 / 10.0 · a=1: 70.0 / 20.0"
    assert table.rows[2][2] == "0.050"
