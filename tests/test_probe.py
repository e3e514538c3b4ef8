"""Linear probe: reaches a linear rule's perfect accuracy, picks C by validation worst-group accuracy,
fits on half of validation when asked (DFR-style), and returns every key the report reads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from debias.data.store import BiasedSplit
from debias.evaluation.linear import select_c, stratified_halves
from debias.evaluation.probe import (FrozenEncoder, flat_scalars, head_is_trained, load_encoders, probe_encoders,
                                     probe_report, split_tables)
from debias.metrics import SCALAR_KEYS
from debias.models import build_model, save_network
from debias.schema import ProbeParams

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one torch thread (two threads on a shared 2-core machine run up to 10x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def labels_only(y: torch.Tensor, a: torch.Tensor, n_classes: int, n_attrs: int) -> BiasedSplit:
    """A split whose images are placeholders: the probe reads features given beside it."""
    return BiasedSplit(torch.zeros(len(y), 3, 1, 1, dtype=torch.uint8), y, a, a == y, n_classes, n_attrs)


def linear_world(n: int, n_classes: int, seed: int, class_weights: list[float] | None = None
                 ) -> tuple[torch.Tensor, BiasedSplit]:
    """Features whose first n_classes coordinates hold a one-hot class code plus noise: a linear rule is exact."""
    g = torch.Generator().manual_seed(seed)
    weights = torch.tensor(class_weights or [1.0] * n_classes)
    y = torch.multinomial(weights, n, replacement=True, generator=g)
    a = torch.randint(0, n_classes, (n,), generator=g)
    z = torch.randn(n, 6, generator=g) * 0.1
    z[:, :n_classes] += 3.0 * torch.nn.functional.one_hot(y, n_classes)
    z[:, 5] += a.float()  # an attribute coordinate the probe must not need
    return z, labels_only(y, a, n_classes, n_classes)


def test_probe_reaches_a_perfect_linear_rule() -> None:
    features, splits = {}, {}
    for seed, name in enumerate(("train", "val", "test")):
        features[name], splits[name] = linear_world(300, 3, seed)
    out = probe_report(features, splits, ProbeParams(c_grid=[0.1, 1.0]), seed=0)
    for name in ("test", "val"):
        assert out[name]["avg"] == 1.0 and out[name]["worst_group"] == 1.0
        assert out[name]["unbiased"] == 1.0 and out[name]["conflicting"] == 1.0
    assert out["n_fit"] == 300 and out["n_select"] == 300 and out["train_split"] == "train"


def test_select_c_prefers_worst_group_then_average_then_earliest() -> None:
    scores = [{"worst_group": 0.5, "avg": 0.9}, {"worst_group": 0.7, "avg": 0.6},
              {"worst_group": 0.7, "avg": 0.8}, {"worst_group": 0.7, "avg": 0.8}]
    assert select_c(scores) == 2
    assert select_c(scores[:2]) == 1
    assert select_c([{"worst_group": 0.2, "avg": 0.3}]) == 0


@pytest.mark.parametrize("grid", [[1e-6, 10.0], [10.0, 1e-6]])
def test_probe_chooses_c_by_validation_worst_group(grid: list[float]) -> None:
    # Imbalanced training classes: C = 1e-6 leaves only the (unpenalised) intercept, so it always predicts
    # the majority class (worst group 0); C = 10 separates the classes.
    train_z, train = linear_world(400, 2, seed=0, class_weights=[0.8, 0.2])
    val_z, val = linear_world(200, 2, seed=1)
    test_z, test = linear_world(200, 2, seed=2)
    out = probe_report({"train": train_z, "val": val_z, "test": test_z}, {"train": train, "val": val, "test": test},
                       ProbeParams(c_grid=grid), seed=0)
    assert out["c"] == 10.0
    by_c = {entry["c"]: entry for entry in out["val_scores"]}
    assert set(by_c) == {1e-6, 10.0}
    assert by_c[1e-6]["worst_group"] == 0.0 and by_c[10.0]["worst_group"] == 1.0
    assert out["val"]["worst_group"] == by_c[10.0]["worst_group"]


def test_probe_trained_on_validation_halves() -> None:
    val_z, val = linear_world(301, 3, seed=1)
    test_z, test = linear_world(120, 3, seed=2)
    params = ProbeParams(train_split="val", c_grid=[1.0], standardize=False)
    out = probe_report({"val": val_z, "test": test_z}, {"val": val, "test": test}, params, seed=4)
    assert out["train_split"] == "val"
    assert out["n_fit"] + out["n_select"] == 301 and abs(out["n_fit"] - out["n_select"]) <= val.n_groups
    assert out["val"]["n"] == out["n_select"]
    assert out["test"]["avg"] == 1.0
    assert probe_report({"val": val_z, "test": test_z}, {"val": val, "test": test}, params, seed=4) == out


def test_stratified_halves_split_every_label() -> None:
    labels = torch.tensor([0] * 7 + [1] * 4 + [2] * 1 + [3] * 10)[torch.randperm(22, generator=torch.Generator().manual_seed(0))]
    first, second = stratified_halves(labels, seed=3)
    assert torch.equal(torch.cat([first, second]).sort().values, torch.arange(22))
    counts_first = torch.bincount(labels[first], minlength=4)
    counts_second = torch.bincount(labels[second], minlength=4)
    assert (counts_first - counts_second).abs().max() <= 1
    again = stratified_halves(labels, seed=3)
    assert torch.equal(again[0], first) and torch.equal(again[1], second)
    assert not torch.equal(stratified_halves(labels, seed=4)[0], first)


def tiny_split(n: int, seed: int, n_classes: int = 5, n_attrs: int = 5) -> BiasedSplit:
    g = torch.Generator().manual_seed(seed)
    y = torch.arange(n) % n_classes
    a = torch.randint(0, n_attrs, (n,), generator=g)
    x = torch.randint(0, 256, (n, 3, 28, 28), generator=g, dtype=torch.uint8)
    return BiasedSplit(x, y, a, a == y, n_classes, n_attrs)


def test_probe_encoders_output_has_every_key_the_report_needs() -> None:
    torch.manual_seed(0)
    splits = {"train": tiny_split(100, 0), "val": tiny_split(60, 1), "test": tiny_split(60, 2)}
    encoders = {
        "erm": FrozenEncoder(build_model("lenet5", 5, 28), "erm"),
        "stage2": FrozenEncoder(build_model("lenet5", 5, 28), "supcon", {"method": "supcon"}),
        "later": FrozenEncoder(None, "none", note="models/later.pt not found"),
    }
    results = probe_encoders(encoders, splits, ProbeParams(c_grid=[0.1, 1.0], max_iter=200), seed=0, device=CPU)
    metrics, tables = split_tables(results)

    erm = metrics["erm"]
    assert erm["trained"] is True and erm["method"] == "erm"
    assert set(erm) == {"trained", "method", "probe", "head"}
    probe = erm["probe"]
    assert set(probe) == {"c", "train_split", "n_fit", "n_select", "val_scores", "test", "val"}
    assert probe["c"] in (0.1, 1.0) and [s["c"] for s in probe["val_scores"]] == [0.1, 1.0]
    for report in (probe["test"], probe["val"], erm["head"]["test"], erm["head"]["val"]):
        assert set(SCALAR_KEYS) | {"n"} == set(report)
    assert "head" not in metrics["stage2"] and metrics["stage2"]["method"] == "supcon"
    assert metrics["later"] == {"trained": False, "note": "models/later.pt not found"}

    for table in (tables["erm"]["probe"]["test"], tables["erm"]["head"]["val"], tables["stage2"]["probe"]["val"]):
        assert set(table) == {"per_group", "group_counts", "empty_groups"}
        assert len(table["per_group"]) == 5 and len(table["per_group"][0]) == 5
    assert "later" not in tables

    flat = flat_scalars(metrics)
    for key in ("erm.probe.test.worst_group", "erm.probe.val.avg", "erm.head.test.unbiased", "erm.probe.c",
                "stage2.probe.test.conflicting"):
        assert key in flat
    assert not any(key.startswith("later") for key in flat)


def test_load_encoders_and_head_rule(tmp_path: Path) -> None:
    network = build_model("lenet5", 5, 28)
    save_network(str(tmp_path / "erm.pt"), network, "lenet5", 5, 28, selected_epoch=3)
    save_network(str(tmp_path / "stage2.pt"), network, "lenet5", 5, 28, method="cnc", head_trained=True)
    encoders = load_encoders({"erm": tmp_path / "erm.pt", "stage2": tmp_path / "stage2.pt"})
    assert encoders["erm"].method == "erm" and encoders["stage2"].method == "cnc"
    assert encoders["erm"].meta == {"selected_epoch": 3}
    # the checkpoint records it (the registry's fact); without the record only ERM's head counts as trained
    assert head_is_trained(encoders["erm"]) and head_is_trained(encoders["stage2"])
    assert not head_is_trained(FrozenEncoder(network, "cnc", {"method": "cnc"}))
    assert not head_is_trained(FrozenEncoder(network, "cnc", {"method": "cnc", "head_trained": False}))
    assert not head_is_trained(FrozenEncoder(network, "eps_supinfonce"))

    missing = load_encoders({"erm": tmp_path / "erm.pt", "stage2": tmp_path / "none.pt"})
    assert not missing["stage2"].trained and "not trained" in missing["stage2"].note
    with pytest.raises(FileNotFoundError):
        load_encoders({"erm": tmp_path / "none.pt"})


def test_probe_variants_come_from_registries_matching_the_params() -> None:
    """probe.method and probe.postprocess name registered variants (each subpackage of evaluation/probes/ declares
    itself); the splits a variant reads are its own; an unknown name is refused naming the param."""
    from typing import get_args

    from debias.evaluation.probe import probe_splits
    from debias.evaluation.variants import (NO_POSTPROCESS, POSTPROCESSINGS, PROBES, postprocessing, probe_variant,
                                            register_probe)

    assert set(PROBES) == set(get_args(ProbeParams.model_fields["method"].annotation)) == {"logistic", "dfr"}
    assert {NO_POSTPROCESS, *POSTPROCESSINGS} == set(get_args(ProbeParams.model_fields["postprocess"].annotation))
    assert postprocessing("none") is None and postprocessing("equalized_odds").binary
    assert probe_splits(ProbeParams(train_split="train")) == ("train", "val", "test")
    assert probe_splits(ProbeParams(train_split="val")) == ("val", "test")
    assert probe_splits(ProbeParams(method="dfr", train_split="train")) == ("val", "test")
    with pytest.raises(ValueError, match="probe.method = 'svm' is not registered; allowed: dfr, logistic"):
        probe_variant("svm")
    with pytest.raises(ValueError, match="probe.postprocess = 'platt' is not registered; allowed: none, equalized_odds"):
        postprocessing("platt")
    with pytest.raises(ValueError, match="probe.method 'dfr' is registered twice"):
        register_probe("dfr", lambda params: ("val",))(lambda *args: None)
