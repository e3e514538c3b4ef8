"""Tabular fairness data end to end: adult and compas sources on small files in their own formats,
feature vectors through the store and the ``given`` / ``auto`` protocols, the mlp encoder, SCARF
views and the fairness metrics. Offline always: urlopen fails unless a test serves the bytes."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from debias.core.io import CorruptFileError, save_torch
from debias.data.augment import feature_groups, random_shift, tabular_view, view
from debias.data.bias import BiasProtocolError, inject_bias, resolve_protocol, summarise
from debias.data.sources import DataSourceError, RawSplit, load_source, random_split, tabular
from debias.data.sources.tabular import RemoteFile, clean_compas, read_compas
from debias.data.store import BiasedSplit, load_raw_data, load_split, save_raw_splits, save_split
from debias.metrics import fairness_report, fairness_scalars
from debias.models import build_model, load_network, save_network
from debias.params import BiasParams, DataParams, MLPParams, ModelParams, TabularParams
from debias.tools.cli import main as cli_main
from tests.conftest import SHARED_DATASETS, committed_text, tiny_grey_digits
from tests.faults.conftest import make_workspace, run_entrypoint_in_process

# The small files these tests write in the datasets' formats are not the published ones (sha256): read on purpose.
SMALL = TabularParams(verify_sha256=False)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*args, **kwargs):
        raise urllib.error.URLError("the test is offline")

    monkeypatch.setattr(urllib.request, "urlopen", no_network)


# --------------------------------------------------------------------------- Adult in its own format

ADULT_VALUES = {  # a few real values per categorical column
    "workclass": ["Private", "State-gov", "Self-emp-not-inc"],
    "education": ["Bachelors", "HS-grad", "11th"],
    "marital-status": ["Never-married", "Married-civ-spouse"],
    "occupation": ["Adm-clerical", "Exec-managerial", "Machine-op-inspct"],
    "relationship": ["Not-in-family", "Husband", "Own-child"],
    "race": ["White", "Black"],
    "sex": ["Female", "Male"],
    "native-country": ["United-States", "Mexico"],
}
MISSING_IN = ["workclass", "occupation", "native-country"]  # the columns that hold '?' in the real files


def adult_records(n: int, start: int) -> list[dict]:
    """Rows i = start..start+n-1; every fifth (i % 5 == 2) has a '?' in one of the columns that have them."""
    records = []
    for i in range(start, start + n):
        record = {column: values[i % len(values)] for column, values in ADULT_VALUES.items()}
        record.update({"age": 20 + (i * 7) % 50, "fnlwgt": 50_000 + 1_013 * i, "education-num": 5 + i % 11,
                       "capital-gain": (i % 4) * 1_000, "capital-loss": 0, "hours-per-week": 20 + (i * 3) % 40,
                       "income": ">50K" if i % 3 == 0 else "<=50K"})
        if i % 5 == 2:
            record[MISSING_IN[i % 3]] = "?"
        records.append(record)
    return records


ADULT_ORDER = ["age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
               "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country", "income"]


def write_adult(folder: Path, n_data: int = 36, n_test: int = 14) -> list[dict]:
    """adult.data and adult.test as UCI ships them ('x, y' separators, the test file's '|1x3' first line,
    labels ending in '.', a blank last line); returns the records, data file first."""
    folder.mkdir(parents=True, exist_ok=True)
    data, test = adult_records(n_data, 0), adult_records(n_test, n_data)
    line = lambda r, dot: ", ".join(str(r[c]) for c in ADULT_ORDER) + dot  # noqa: E731
    (folder / "adult.data").write_text("\n".join(line(r, "") for r in data) + "\n\n")
    (folder / "adult.test").write_text("|1x3 Cross validator\n" + "\n".join(line(r, ".") for r in test) + "\n\n")
    return data + test


def test_adult_from_placed_files_offline(tmp_path, offline) -> None:
    records = write_adult(tmp_path / "adult")
    kept = [r for r in records if "?" not in r.values()]
    assert len(records) == 50 and len(kept) == 40  # ten rows with a '?' are dropped
    splits = load_source(DataParams(source="adult", tabular=SMALL), tmp_path, seed=3)
    assert {name: len(s) for name, s in splits.items()} == {"train": 28, "val": 6, "test": 6}  # 70/15/15
    index = random_split(40, 0.15, 0.15, seed=3)
    names = splits["train"].feature_names
    numeric = ["age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week"]
    assert names[:6] == tuple(numeric)
    assert names[6:9] == ("workclass=Private", "workclass=Self-emp-not-inc", "workclass=State-gov")  # sorted, no '?'
    assert ("sex=Female" in names and "sex=Male" in names) and len(names) == 6 + sum(map(len, ADULT_VALUES.values()))
    raw = np.array([[r[c] for c in numeric] for r in kept], dtype=np.float64)
    mean, std = raw[index["train"]].mean(0), raw[index["train"]].std(0)
    std[std == 0] = 1  # capital-loss is constant
    for name, split in splits.items():
        assert split.x.dtype == np.float32 and split.modality == "tabular"
        rows = [kept[i] for i in index[name]]
        assert split.y.tolist() == [int(r["income"] == ">50K") for r in rows]  # the test file's '.' stripped
        assert split.a.tolist() == [int(r["sex"] == "Male") for r in rows]  # 0 Female, 1 Male
        np.testing.assert_allclose(split.x[:, :6], (raw[index[name]] - mean) / std, rtol=1e-5, atol=1e-6)
        onehot = split.x[:, 6:]
        assert set(np.unique(onehot).tolist()) <= {0.0, 1.0} and (onehot.sum(1) == len(ADULT_VALUES)).all()
        sex = split.x[:, names.index("sex=Male")]
        assert sex.tolist() == split.a.astype(np.float32).tolist()  # sex stays a feature by default
    np.testing.assert_allclose(splits["train"].x[:, :3].mean(0), 0, atol=1e-6)  # statistics from train only
    np.testing.assert_allclose(splits["train"].x[:, :3].std(0), 1, atol=1e-5)


def test_adult_without_the_sensitive_feature_and_capped(tmp_path, offline) -> None:
    write_adult(tmp_path / "adult")
    params = DataParams(source="adult", max_per_split=5, tabular=TabularParams(keep_sensitive_feature=False, verify_sha256=False))
    splits = load_source(params, tmp_path, seed=1)  # seed 0 leaves the 6-row validation split without class 1
    assert all(len(s) == 5 for s in splits.values())
    assert not any(name.startswith("sex=") for name in splits["train"].feature_names)
    assert splits["train"].a is not None and splits["train"].x.shape[1] == len(splits["train"].feature_names)


def test_a_missing_dataset_names_the_folder_and_files(tmp_path, offline) -> None:
    with pytest.raises(DataSourceError, match=rf"into {tmp_path / 'adult'}.*\(adult.data, adult.test\) into"):
        load_source(DataParams(source="adult"), tmp_path, seed=0)
    with pytest.raises(DataSourceError, match=r"compas-scores-two-years.csv\) into .*compas/"):
        load_source(DataParams(source="compas"), tmp_path, seed=0)


# --------------------------------------------------------------------------- COMPAS in its own format

# ProPublica's compas-scores-two-years.csv header, in its order (decile_score and priors_count twice)
COMPAS_HEADER = (
    "id,name,first,last,compas_screening_date,sex,dob,age,age_cat,race,juv_fel_count,decile_score,juv_misd_count,"
    "juv_other_count,priors_count,days_b_screening_arrest,c_jail_in,c_jail_out,c_case_number,c_offense_date,"
    "c_arrest_date,c_days_from_compas,c_charge_degree,c_charge_desc,is_recid,r_case_number,r_charge_degree,"
    "r_days_from_arrest,r_offense_date,r_charge_desc,r_jail_in,r_jail_out,violent_recid,is_violent_recid,"
    "vr_case_number,vr_charge_degree,vr_offense_date,vr_charge_desc,type_of_assessment,decile_score,score_text,"
    "screening_date,v_type_of_assessment,v_decile_score,v_score_text,v_screening_date,in_custody,out_custody,"
    "priors_count,start,end,event,two_year_recid").split(",")

# id -> the fields that differ from a defendant who passes the filter (AA, days -1, F, Low score)
COMPAS_ROWS = {
    1: {"days_b_screening_arrest": "0"},
    2: {"days_b_screening_arrest": "31"},                        # outside the 30-day window
    3: {"days_b_screening_arrest": "-30", "race": "Caucasian"},  # on the window's edge: kept
    4: {"days_b_screening_arrest": ""},                          # no value: dropped
    5: {"is_recid": "-1"},                                       # unknown outcome
    6: {"c_charge_degree": "O"},                                 # ordinary traffic offence
    7: {"score_text": "N/A"},                                    # no COMPAS score
    8: {"race": "Hispanic"},                                     # not one of the two races
    9: {"days_b_screening_arrest": "30", "race": "Caucasian", "c_charge_degree": "M", "two_year_recid": "1"},
    10: {"days_b_screening_arrest": "-31"},
    **{i: {"race": "Caucasian" if i % 3 else "African-American", "two_year_recid": str(i % 2),
           "sex": "Female" if i % 4 == 0 else "Male", "age": str(20 + i), "priors_count": str(i % 5)}
       for i in range(11, 21)},
}
COMPAS_KEPT = [1, 3, 9, *range(11, 21)]


def compas_row(index: int, changes: dict) -> list[str]:
    row = dict.fromkeys(COMPAS_HEADER, "")
    row.update({"id": str(index), "sex": "Male", "age": "30", "age_cat": "25 - 45", "race": "African-American",
                "juv_fel_count": "0", "juv_misd_count": "1", "juv_other_count": "0", "priors_count": "2",
                "days_b_screening_arrest": "-1", "c_charge_degree": "F", "is_recid": "0", "decile_score": "3",
                "score_text": "Low", "two_year_recid": "0"})
    row.update(changes)
    return [row[column] for column in COMPAS_HEADER]


def write_compas(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "compas-scores-two-years.csv"
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(COMPAS_HEADER)
        writer.writerows(compas_row(i, changes) for i, changes in COMPAS_ROWS.items())
    return path


def test_propublica_filter_keeps_exactly_the_rows_it_should(tmp_path) -> None:
    frame, y, a = clean_compas(read_compas(write_compas(tmp_path)), ["African-American", "Caucasian"])
    assert frame["id"].tolist() == COMPAS_KEPT
    assert a.tolist() == [int(COMPAS_ROWS[i].get("race") == "Caucasian") for i in COMPAS_KEPT]  # 0 AA, 1 Caucasian
    assert y.tolist() == [int(COMPAS_ROWS[i].get("two_year_recid") == "1") for i in COMPAS_KEPT]
    # a third race, in the order given: a = its position
    frame, _, a = clean_compas(read_compas(tmp_path / "compas-scores-two-years.csv"),
                               ["Caucasian", "African-American", "Hispanic"])
    assert 8 in frame["id"].tolist() and a[frame["id"].tolist().index(8)] == 2 and a[0] == 1


def test_compas_source_features_and_splits(tmp_path, offline) -> None:
    write_compas(tmp_path / "compas")
    splits = load_source(DataParams(source="compas", tabular=SMALL), tmp_path, seed=0)
    assert {name: len(s) for name, s in splits.items()} == {"train": 9, "val": 2, "test": 2}  # 13 rows, 70/15/15
    assert splits["train"].feature_names == (
        "age", "priors_count", "juv_fel_count", "juv_misd_count", "juv_other_count",
        "sex=Female", "sex=Male", "race=African-American", "race=Caucasian", "c_charge_degree=F", "c_charge_degree=M")
    x = np.concatenate([s.x for s in splits.values()])
    caucasian = sum(COMPAS_ROWS[i].get("race") == "Caucasian" for i in COMPAS_KEPT)
    assert sorted(np.concatenate([s.a for s in splits.values()]).tolist()) == [0] * (13 - caucasian) + [1] * caucasian
    np.testing.assert_array_equal(x[:, 2:5], 0)  # constant juvenile counts: centred, std counted as 1
    np.testing.assert_allclose(splits["train"].x[:, :2].mean(0), 0, atol=1e-6)


def test_download_is_checked_and_written_once(tmp_path, monkeypatch) -> None:
    payload = write_compas(tmp_path / "served").read_bytes()
    calls = []

    def serve(url, timeout=None):
        calls.append(url)
        return io.BytesIO(payload)

    monkeypatch.setattr(urllib.request, "urlopen", serve)
    monkeypatch.setattr(tabular, "COMPAS_FILES", (RemoteFile("compas-scores-two-years.csv", "https://example.invalid/c.csv",
                                                             hashlib.sha256(payload).hexdigest(), 13, 1),))
    raw = tmp_path / "raw"
    assert sum(len(s) for s in load_source(DataParams(source="compas"), raw, seed=0).values()) == 13
    assert (raw / "compas" / "compas-scores-two-years.csv").read_bytes() == payload
    load_source(DataParams(source="compas"), raw, seed=0)
    assert calls == ["https://example.invalid/c.csv"]  # the second run uses the file in place
    monkeypatch.setattr(tabular, "COMPAS_FILES", (RemoteFile("compas-scores-two-years.csv", "https://example.invalid/c.csv",
                                                             "0" * 64, 13, 1),))
    with pytest.raises(DataSourceError, match="has sha256 .* expected 0000"):
        load_source(DataParams(source="compas"), tmp_path / "other", seed=0)
    assert not (tmp_path / "other" / "compas" / "compas-scores-two-years.csv").exists()


def test_data_path_reads_the_original_files_in_place_and_never_downloads(tmp_path, monkeypatch) -> None:
    """data.path: how dvc exp run (which checks data/raw out from the cache) and queued runs reach offline files."""
    from debias.data.sources.base import external_files

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("the source tried the network"))
    folder = tmp_path / "mine"
    write_compas(folder)
    params = DataParams(source="compas", path=str(folder), tabular=SMALL)
    assert sum(len(s) for s in load_source(params, tmp_path / "raw", seed=0).values()) == 13
    assert not (tmp_path / "raw").exists()
    assert external_files(params) == {"data.path": folder}  # fingerprinted by the source stage
    assert external_files(DataParams(source="compas")) == {}
    with pytest.raises(DataSourceError, match=r"data.path = '.*empty' lacks adult.data; put the original files"):
        load_source(DataParams(source="adult", path=str(tmp_path / "empty")), tmp_path / "raw", seed=0)


@pytest.mark.skipif(not (SHARED_DATASETS / "adult" / "adult.data").exists(),
                    reason="shared datasets are not beside the repository")
def test_real_adult_and_compas_files(tmp_path, offline) -> None:
    """The original files: 45,222 Adult rows without '?', 5,278 COMPAS rows (ProPublica's 6,172, two races)."""
    for name in ("adult", "compas"):
        (tmp_path / name).mkdir()
        for path in (SHARED_DATASETS / name).iterdir():
            os.symlink(path, tmp_path / name / path.name)
    expected = {  # (train, val, test), positives, a = 0 rows, features
        "adult": ((31_656, 6_783, 6_783), 11_208, 14_695, 104),
        "compas": ((3_694, 792, 792), 2_483, 3_175, 11),
    }
    for name, (sizes, positives, attr_zero, n_features) in expected.items():
        splits = load_source(DataParams(source=name), tmp_path, seed=0)
        assert tuple(len(splits[s]) for s in ("train", "val", "test")) == sizes
        assert sum(int(s.y.sum()) for s in splits.values()) == positives
        assert sum(int((s.a == 0).sum()) for s in splits.values()) == attr_zero
        assert splits["train"].x.shape[1] == n_features and np.isfinite(splits["train"].x).all()


def test_tabular_fractions_are_validated() -> None:
    from debias.params import ParamsError
    from debias.schema import validate

    with pytest.raises(ParamsError, match="data.tabular.val_fraction \\+ data.tabular.test_fraction = 0.9"):
        validate({"data": {"source": "adult", "tabular": {"val_fraction": 0.5, "test_fraction": 0.4}}})
    with pytest.raises(ParamsError, match="names a race twice"):
        validate({"data": {"tabular": {"compas_races": ["Caucasian", "Caucasian"]}}})


def test_check_params_accepts_adult_with_every_other_default(tmp_path, capsys) -> None:
    params = yaml.safe_load(committed_text("params.yaml"))
    params["data"]["source"] = "adult"  # what dvc exp run -S data.source=adult writes
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    assert cli_main(["check-params", str(tmp_path / "params.yaml")]) == 0
    assert "source=adult, protocol=auto" in capsys.readouterr().out


# --------------------------------------------------------------------------- store and protocols


def _feature_splits(tmp_path: Path) -> dict[str, RawSplit]:
    write_compas(tmp_path / "compas")
    return load_source(DataParams(source="compas", tabular=SMALL), tmp_path, seed=0)


def test_feature_splits_round_trip_through_the_store(tmp_path, offline) -> None:
    splits = _feature_splits(tmp_path)
    save_raw_splits(tmp_path / "splits.pt", splits, source="compas", protocol="given")
    loaded = load_raw_data(tmp_path / "splits.pt")
    assert (loaded.source, loaded.protocol) == ("compas", "given")
    for name, split in splits.items():
        again = loaded.splits[name]
        assert np.array_equal(again.x, split.x) and np.array_equal(again.a, split.a)
        assert again.feature_names == split.feature_names and again.modality == "tabular"
    biased = inject_bias(loaded.splits, BiasParams(), seed=0, source=loaded.source)
    save_split(tmp_path / "train.pt", biased["train"])
    train = load_split(tmp_path / "train.pt")
    assert train.modality == "tabular" and train.x.dtype == torch.float32
    assert torch.equal(train.x, torch.from_numpy(splits["train"].x))
    assert train.feature_names == splits["train"].feature_names


def test_the_store_names_the_file_and_what_is_allowed(tmp_path) -> None:
    y = torch.zeros(4, dtype=torch.long)
    bad = BiasedSplit(torch.zeros(4, 3, dtype=torch.float64), y, y, y.bool(), 2, 2)
    with pytest.raises(CorruptFileError, match=r"bad.pt: x is torch.float64 \(4, 3\); allowed: uint8 images \[N,3,H,W\] "
                                               r"or float32 features \[N,F\]"):
        save_split(tmp_path / "bad.pt", bad)
    nan = BiasedSplit(torch.tensor([[0.0], [float("nan")], [1.0], [2.0]]), y, y, y.bool(), 2, 2)
    with pytest.raises(CorruptFileError, match="NaN or infinite"):
        save_split(tmp_path / "nan.pt", nan)
    named = BiasedSplit(torch.zeros(4, 3), y, y, y.bool(), 2, 2, ("a", "b"))
    with pytest.raises(CorruptFileError, match="2 feature names for x with 3 feature columns"):
        save_split(tmp_path / "named.pt", named)
    grey = {"x": torch.zeros(4, 5, dtype=torch.float64), "y": y}
    save_torch(tmp_path / "raw.pt", {"source": "adult", "train": grey, "val": grey, "test": grey}, kind="raw-splits")
    with pytest.raises(CorruptFileError, match=r"raw.pt \(split 'train'\): x is float64 .*uint8 images \[N,H,W\]"):
        load_raw_data(tmp_path / "raw.pt")


def test_auto_protocol_resolution() -> None:
    x, y = tiny_grey_digits(n_per_class=2)
    digits = {name: RawSplit(x, y) for name in ("train", "val", "test")}
    with_a = {name: RawSplit(x, y, y % 2) for name in ("train", "val", "test")}
    assert resolve_protocol("auto", digits, "digits", "foreground") == "foreground"  # the source's recorded protocol
    assert resolve_protocol("auto", digits, "cifar10", "corruption") == "corruption"
    assert resolve_protocol("auto", with_a, "npz", "foreground") == "given"  # the data carries its attribute
    assert resolve_protocol("auto", with_a, None) == "given"
    assert resolve_protocol("background", with_a, "adult") == "background"  # a named protocol is kept
    with pytest.raises(BiasProtocolError, match="record no source.*dvc repro -f download"):
        resolve_protocol("auto", digits, None)
    with pytest.raises(BiasProtocolError, match="record the source 'digits' but not its protocol.*dvc repro -f download"):
        resolve_protocol("auto", digits, "digits")  # a raw splits file written before the protocol was recorded


def test_download_records_the_protocol_each_source_registered(tmp_path) -> None:
    """inject_bias imports no source module: the protocol auto resolves to travels in download's output."""
    from debias.data.sources import SOURCE_PROTOCOLS

    assert SOURCE_PROTOCOLS["digits"] == "foreground" and SOURCE_PROTOCOLS["cifar10"] == "corruption"
    x, y = tiny_grey_digits(n_per_class=2)
    save_raw_splits(tmp_path / "splits.pt", {name: RawSplit(x, y) for name in ("train", "val", "test")},
                    source="digits", protocol=SOURCE_PROTOCOLS["digits"])
    raw = load_raw_data(tmp_path / "splits.pt")
    assert resolve_protocol("auto", raw.splits, raw.source, raw.protocol) == "foreground"


def test_given_keeps_feature_vectors_and_colour_protocols_refuse_them(tmp_path, offline) -> None:
    splits = _feature_splits(tmp_path)
    biased = inject_bias(splits, BiasParams(), seed=0, source="compas")
    train = biased["train"]
    assert train.x.shape == splits["train"].x.shape and train.n_classes == 2 and train.n_attrs == 2
    counts = np.zeros((2, 2), dtype=int)
    np.add.at(counts, (splits["train"].y, splits["train"].a), 1)
    assert torch.equal(train.aligned, train.a == torch.from_numpy(counts.argmax(1))[train.y])
    summary = summarise(biased, BiasParams(), "given")
    assert (summary["protocol"], summary["requested_protocol"], summary["modality"]) == ("given", "auto", "tabular")
    assert summary["sample_shape"] == [11]
    with pytest.raises(BiasProtocolError, match="foreground biases image data, but the splits hold tabular data "
                                                r"\(data.source = compas\); allowed: given or auto"):
        inject_bias(splits, BiasParams(protocol="foreground"), seed=0, source="compas")


@pytest.mark.slow
def test_compas_through_the_data_stages_and_erm_with_every_other_default(tmp_path, monkeypatch, capsys) -> None:
    """data.source=compas and nothing else changed (lenet5, augment_shift 2, protocol auto): the stages run."""
    workspace = make_workspace(tmp_path / "ws", {"data": {"source": "compas", "tabular": {"verify_sha256": False}},
                                                     "erm": {"epochs": 1}})
    write_compas(workspace / "data" / "raw" / "compas")
    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: pytest.fail("the stage tried the network"))
    download = run_entrypoint_in_process(workspace, "download", monkeypatch, capsys)
    assert download.returncode == 0, download.stderr
    assert "[download] compas (tabular, sample shape (11,)): n_train=9, n_val=2, n_test=2" in download.stdout
    done = run_entrypoint_in_process(workspace, "inject_bias", monkeypatch, capsys)
    assert done.returncode == 0, done.stderr
    assert "[inject_bias] given (bias.protocol = auto) on compas (tabular)" in done.stdout
    summary = json.loads((workspace / "data/biased/summary.json").read_text())
    assert summary["protocol"] == "given" and summary["modality"] == "tabular"
    assert (workspace / "reports/figures/samples.png").stat().st_size > 0
    with pytest.warns(UserWarning) as warned:
        erm = run_entrypoint_in_process(workspace, "train_erm", monkeypatch, capsys)
    assert erm.returncode == 0, erm.stderr
    messages = " ".join(str(w.message) for w in warned)
    assert "model.name = lenet5 takes images" in messages and "ignored for feature vectors" in messages
    network, payload = load_network(str(workspace / "models/erm.pt"))
    assert payload["model_name"] == "mlp" and payload["input_shape"] == [11]


# --------------------------------------------------------------------------- the mlp encoder


def test_mlp_is_linear_relu_batchnorm_and_trains() -> None:
    model = build_model(ModelParams(name="mlp", mlp=MLPParams(hidden=[16, 8])), 2, (11,))
    kinds = [type(layer).__name__ for layer in model.encoder.features]
    assert kinds == ["Flatten", "Linear", "ReLU", "BatchNorm1d", "Linear", "ReLU", "BatchNorm1d"]
    x = torch.randn(6, 11, generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.normalise(x), x)  # standardised features pass unchanged
    z, logits = model.embed_and_classify(x)
    assert z.shape == (6, 8) and logits.shape == (6, 2)
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 0, 1, 1, 0])).backward()
    first = model.encoder.features[1].weight.grad
    assert first is not None and torch.isfinite(first).all() and first.abs().sum() > 0
    default = build_model("mlp", 2, (11,))
    assert default.encoder.dim == 100 and sum(isinstance(m, torch.nn.Linear) for m in default.encoder.features) == 3
    images = build_model("mlp", 5, 28).eval()  # LfF's MLP on (flattened) images
    assert images(torch.randint(0, 256, (2, 3, 28, 28), dtype=torch.uint8)).shape == (2, 5)


def test_image_encoders_give_way_to_mlp_for_features_and_checkpoints_keep_the_options(tmp_path) -> None:
    with pytest.warns(UserWarning, match=r"model.name = lenet5 takes images; the data holds feature vectors \(11,\)"):
        model = build_model(ModelParams(name="lenet5", mlp=MLPParams(hidden=[12])), 2, (11,))
    assert model.encoder_name == "mlp" and model.encoder.dim == 12
    save_network(str(tmp_path / "m.pt"), model, "lenet5", 2, (11,), method="erm")
    loaded, payload = load_network(str(tmp_path / "m.pt"))
    assert payload["model_name"] == "mlp" and payload["options"] == {"hidden": [12], "batch_norm": True}
    x = torch.randn(4, 11)
    assert torch.equal(loaded(x), model.eval()(x))


# --------------------------------------------------------------------------- augmentation


def test_tabular_view_is_scarf_corruption_from_the_marginals() -> None:
    n, n_features, m = 8, 10, 5
    x = torch.zeros(n, n_features)
    pool = torch.arange(1, m + 1).float()[:, None] * 1000 + torch.arange(n_features).float()[None, :]
    out = tabular_view(x, torch.Generator().manual_seed(1), corruption_rate=0.6, pool=pool)
    changed = out != 0
    assert (changed.sum(1) == 6).all()  # round(0.6 * 10) features of every row
    column = torch.arange(n_features).expand(n, -1)
    assert torch.equal(torch.remainder(out - column, 1000)[changed], torch.zeros(int(changed.sum())))  # same column
    again = tabular_view(x, torch.Generator().manual_seed(1), corruption_rate=0.6, pool=pool)
    other = tabular_view(x, torch.Generator().manual_seed(2), corruption_rate=0.6, pool=pool)
    assert torch.equal(out, again) and not torch.equal(out, other)
    assert torch.equal(tabular_view(pool, torch.Generator(), corruption_rate=0.0), pool)


def test_tabular_view_replaces_one_hot_blocks_together() -> None:
    names = ["age", "sex=F", "sex=M", "race=A", "race=B", "race=C"]
    groups = feature_groups(names)
    assert groups.tolist() == [0, 1, 1, 2, 2, 2]
    generator = torch.Generator().manual_seed(0)
    rows = torch.cat([torch.randn(50, 1, generator=generator),
                      torch.nn.functional.one_hot(torch.randint(0, 2, (50,), generator=generator), 2).float(),
                      torch.nn.functional.one_hot(torch.randint(0, 3, (50,), generator=generator), 3).float()], 1)
    out = tabular_view(rows, generator, corruption_rate=1.0, groups=groups)
    assert (out[:, 1:3].sum(1) == 1).all() and (out[:, 3:].sum(1) == 1).all()  # still valid one-hot rows
    with pytest.raises(ValueError, match="one index per feature column"):
        tabular_view(rows, generator, groups=torch.tensor([0, 2, 2, 2, 2, 2]))
    with pytest.raises(ValueError, match="corruption_rate = 1.5"):
        tabular_view(rows, generator, corruption_rate=1.5)


def test_pixel_augmentations_leave_feature_vectors_alone() -> None:
    x = torch.randn(4, 7)
    with pytest.warns(UserWarning, match="ignored for feature vectors"):
        assert torch.equal(random_shift(x, 2, torch.Generator()), x)
    with pytest.raises(ValueError, match="tabular_view"):
        view(x, 2, 8.0, torch.Generator())


# --------------------------------------------------------------------------- fairness metrics


def test_fairness_metrics_on_a_hand_made_case() -> None:
    # group a=0: y 1 1 1 0 0 0, pred 1 1 0 0 0 1 -> TPR 2/3, FPR 1/3, selection 3/6, accuracy 4/6
    # group a=1: y 1 1 0 0,     pred 1 0 0 0     -> TPR 1/2, FPR 0,   selection 1/4, accuracy 3/4
    y = torch.tensor([1, 1, 1, 0, 0, 0, 1, 1, 0, 0])
    pred = torch.tensor([1, 1, 0, 0, 0, 1, 1, 0, 0, 0])
    a = torch.tensor([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    report = fairness_report(pred, y, a, n_classes=2)
    assert report["equalized_odds_difference"] == pytest.approx(1 / 3)  # max(|2/3 - 1/2|, |1/3 - 0|)
    assert report["equalized_odds_mean"] == pytest.approx(1 / 4)  # (1/6 + 1/3) / 2
    assert report["demographic_parity_difference"] == pytest.approx(1 / 4)  # 1/2 - 1/4
    assert report["accuracy_difference"] == pytest.approx(1 / 12)  # 3/4 - 2/3
    assert report["per_group"]["0"] == pytest.approx({"n": 6, "positives": 3, "negatives": 3, "tpr": 2 / 3, "fpr": 1 / 3,
                                                      "selection_rate": 0.5, "accuracy": 2 / 3})
    assert report["per_group"]["1"]["tpr"] == 0.5 and report["per_group"]["1"]["fpr"] == 0.0
    assert report["reason"] is None and report["notes"] == []
    assert fairness_scalars(report, "test/")["test/equalized_odds_difference"] == pytest.approx(1 / 3)
    # a group without positives: its TPR is undefined, and the report says how fairlearn counts it
    lonely = fairness_report(torch.tensor([1, 0, 1]), torch.tensor([1, 0, 0]), torch.tensor([0, 0, 1]), n_classes=2)
    assert lonely["notes"] == ["a=1 has no positives: fairlearn counts its TPR as 0"]


def test_fairness_metrics_are_none_with_a_reason_for_multiclass_tasks() -> None:
    report = fairness_report(torch.tensor([0, 1, 2]), torch.tensor([0, 1, 2]), torch.tensor([0, 1, 0]), n_classes=5)
    assert report["equalized_odds_difference"] is None and report["per_group"] is None
    assert "binary task" in report["reason"] and "5 classes" in report["reason"]
    assert fairness_scalars(report) == {}


# --------------------------------------------------------------------------- second round (issue 23): silent cases


def publish(monkeypatch, folder: Path, source: str) -> list[Path]:
    """Make the small files in ``folder`` the 'published' ones of ``source`` (their sha256 and rows), as if
    downloaded: what the checks compare a copy against."""
    files = tuple(RemoteFile(f.name, f.url, hashlib.sha256((folder / f.name).read_bytes()).hexdigest(),
                             tabular.count_rows(folder / f.name, f), f.other_lines)
                  for f in tabular.DATASET_FILES[source])
    monkeypatch.setattr(tabular, {"adult": "ADULT_FILES", "compas": "COMPAS_FILES"}[source], files)
    monkeypatch.setitem(tabular.DATASET_FILES, source, files)
    return [folder / f.name for f in files]


def cut_lines(path: Path, keep: int) -> None:
    """Keep the first ``keep`` lines of ``path``: a copy cut at a line boundary."""
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:keep]))


def test_files_cut_at_a_line_boundary_are_refused_with_their_row_counts(tmp_path, offline, monkeypatch) -> None:
    write_adult(tmp_path / "adult")
    write_compas(tmp_path / "compas")
    publish(monkeypatch, tmp_path / "adult", "adult")
    publish(monkeypatch, tmp_path / "compas", "compas")
    assert sum(len(s) for s in load_source(DataParams(source="adult"), tmp_path, seed=3).values()) == 40
    cut_lines(tmp_path / "adult" / "adult.data", 20)  # 36 rows of data published
    with pytest.raises(DataSourceError, match=r"adult.data is not the published adult.data \(sha256 .*\); it holds 20 "
                                              r"rows of data where the published file has 36: it looks truncated"):
        load_source(DataParams(source="adult"), tmp_path, seed=3)
    cut_lines(tmp_path / "compas" / "compas-scores-two-years.csv", 12)  # header + 11 of 20 rows
    with pytest.raises(DataSourceError, match=r"it holds 11 rows of data where the published file has 20: it looks "
                                              r"truncated.*verify_sha256: false"):
        load_source(DataParams(source="compas"), tmp_path, seed=0)
    # verify_sha256: false reads the cut file; its 4 rows leave 2 training rows of one race, which is refused
    with pytest.raises(DataSourceError, match=r"compas' race \(data.tabular.compas_races = .*\) holds only the value "
                                              r"\d in the 2 training images"):
        load_source(DataParams(source="compas", tabular=SMALL), tmp_path, seed=0)


@pytest.mark.skipif(not (SHARED_DATASETS / "adult" / "adult.data").exists(),
                    reason="shared datasets are not beside the repository")
def test_truncated_copies_of_the_real_files_are_refused(tmp_path, offline) -> None:
    for name, file, keep, rows, published in (("adult", "adult.data", 14_000, "14,000", "32,561"),
                                              ("compas", "compas-scores-two-years.csv", 3_001, "3,000", "7,214")):
        (tmp_path / name).mkdir()
        for original in (SHARED_DATASETS / name).iterdir():
            (tmp_path / name / original.name).write_bytes(original.read_bytes())
        cut_lines(tmp_path / name / file, keep)
        with pytest.raises(DataSourceError, match=rf"it holds {rows} rows of data where the published file has "
                                                  rf"{published}: it looks truncated"):
            load_source(DataParams(source=name), tmp_path, seed=0)


def test_a_file_cut_mid_line_names_the_row_and_says_truncated(tmp_path, offline) -> None:
    path = write_compas(tmp_path / "compas")
    text = path.read_bytes()
    path.write_bytes(text[: text.rstrip().rfind(b",")])  # the last line loses its last field
    with pytest.raises(DataSourceError, match=r"data row 20 of 20 ends before column two_year_recid \(the last row: the "
                                              r"file looks truncated mid-line\)"):
        load_source(DataParams(source="compas", tabular=SMALL), tmp_path, seed=0)
    write_adult(tmp_path / "adult")
    adult = tmp_path / "adult" / "adult.data"
    adult.write_bytes(adult.read_bytes().rstrip()[:-12])
    with pytest.raises(DataSourceError, match=r"adult.data: data row 36 of 36 ends before column income \(the last row"):
        load_source(DataParams(source="adult", tabular=SMALL), tmp_path, seed=0)
    write_compas(tmp_path / "compas")
    rows = path.read_text().splitlines()
    fields = rows[3].split(",")
    fields[COMPAS_HEADER.index("priors_count")] = "many"
    rows[3] = ",".join(fields)
    path.write_text("\n".join(rows) + "\n")
    with pytest.raises(DataSourceError, match=r"data row 3: column priors_count holds 'many'; allowed: numbers"):
        load_source(DataParams(source="compas", tabular=SMALL), tmp_path, seed=0)


def test_compas_races_that_match_no_row_are_refused_naming_the_races_present(tmp_path, offline) -> None:
    write_compas(tmp_path / "compas")
    params = DataParams(source="compas", tabular=TabularParams(compas_races=["African American", "Caucasian"],
                                                               verify_sha256=False))
    with pytest.raises(DataSourceError, match=r"data.tabular.compas_races names \['African American'\], which no row of "
                                              r".* holds after ProPublica's filter; the races present: "
                                              r"\['African-American', 'Caucasian', 'Hispanic'\]"):
        load_source(params, tmp_path, seed=0)


def test_fairness_over_one_attribute_value_is_not_computed_never_zero() -> None:
    report = fairness_report(torch.tensor([1, 0, 1, 1]), torch.tensor([1, 0, 0, 1]), torch.tensor([0, 0, 0, 0]), 2)
    assert all(report[key] is None for key in ("equalized_odds_difference", "demographic_parity_difference",
                                               "equalized_odds_mean", "accuracy_difference"))
    assert "only a = [0]: not computed" in report["reason"]
    assert fairness_scalars(report) == {}  # nothing logged as a number
    from debias.evaluation.linear import split_report
    from debias.training.outputs import metrics_entry

    one_group = BiasedSplit(torch.zeros(4, 3), torch.tensor([1, 0, 0, 1]), torch.zeros(4, dtype=torch.long),
                            torch.ones(4, dtype=torch.bool), 2, 1)
    probed = split_report(one_group, torch.tensor([1, 0, 1, 1]))
    assert probed["fairness"]["equalized_odds_difference"] is None and "not computed" in probed["fairness"]["reason"]
    entry = metrics_entry(probed)  # what the metrics JSON holds: the reason, no number
    assert entry["fairness"] == {"reason": report["reason"]}


def test_the_data_path_fingerprint_covers_the_files_read_through_links(tmp_path, monkeypatch) -> None:
    """data.path's fingerprint: the bytes of the files the source reads, a linked one included; others ignored."""
    from debias.data.sources.base import source_digests

    originals, folder = tmp_path / "originals", tmp_path / "mine"
    write_compas(originals)
    folder.mkdir()
    (folder / "compas-scores-two-years.csv").symlink_to(originals / "compas-scores-two-years.csv")
    params = DataParams(source="compas", path=str(folder), tabular=SMALL)
    first = source_digests(params)
    (folder / "notes.txt").write_text("not read by the source")
    assert source_digests(params) == first
    cut_lines(originals / "compas-scores-two-years.csv", 12)  # the linked file changes, the link does not
    assert source_digests(params) != first


def _check(tmp_path: Path, changes: dict) -> tuple[int, str]:
    import contextlib

    params = yaml.safe_load(committed_text("params.yaml"))
    for section, values in changes.items():
        params[section].update(values)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    errors = io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = cli_main(["check-params", str(tmp_path / "params.yaml")])
    return code, errors.getvalue()


def test_equalized_odds_on_a_multiclass_task_is_refused_by_check_params_and_the_probe(tmp_path) -> None:
    from debias.evaluation.probe import probe_encoders
    from debias.schema import ProbeParams

    code, message = _check(tmp_path, {"probe": {"postprocess": "equalized_odds"}})  # digits, 5 classes (foreground)
    assert code == 2 and "probe.postprocess = equalized_odds needs a binary task; data.source = digits" in message
    assert "has 5 classes" in message
    code, message = _check(tmp_path, {"probe": {"postprocess": "equalized_odds"}, "data": {"source": "mnist"},
                                      "bias": {"protocol": "background"}})
    assert code == 2 and "has 10 classes" in message
    write_compas(tmp_path / "compas")
    code, message = _check(tmp_path, {"probe": {"postprocess": "equalized_odds"},
                                      "data": {"source": "compas", "path": str(tmp_path / "compas")}})
    assert code == 2 and "is not the published compas-scores-two-years.csv" in message  # the file is checked
    params = {"probe": {"postprocess": "equalized_odds"},
              "data": {"source": "compas", "path": str(tmp_path / "compas"), "tabular": {"verify_sha256": False}}}
    assert _check(tmp_path, params) == (0, "")
    x = torch.zeros(6, 4)
    split = BiasedSplit(x, torch.tensor([0, 1, 2, 0, 1, 2]), torch.zeros(6, dtype=torch.long),
                        torch.ones(6, dtype=torch.bool), 3, 1)
    with pytest.raises(ValueError, match="probe.postprocess = equalized_odds needs a binary task; this one has 3 classes"):
        probe_encoders({"erm": None}, {"val": split, "test": split}, ProbeParams(postprocess="equalized_odds"), 0,
                       torch.device("cpu"))
