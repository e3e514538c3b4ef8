"""The params schema: the shipped file is valid, and bad input fails with a clear message."""

from __future__ import annotations

import pytest
import yaml

from debias.cli import main as cli_main
from debias.params import Params, ParamsError, load_params, params_hash, validate
from tests.conftest import REPO


def test_shipped_params_yaml_is_valid_and_complete() -> None:
    params = load_params(REPO / "params.yaml")
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    # every top-level section of the schema is stated in params.yaml (no hidden defaults)
    assert set(raw) == set(Params.model_fields), set(Params.model_fields) ^ set(raw)
    assert params.data.source == "digits"


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        ({"loss": {"epsilion": 0.3}}, "unknown parameter 'loss.epsilion'"),
        ({"loss": {"epsilion": 0.3}}, "did you mean 'loss.epsilon'"),
        ({"bias": {"foreground": {"p_corr": 1.0}}}, "bias.foreground.p_corr = 1.0"),
        ({"bias": {"foreground": {"p_corr": 1.0}}}, "allowed: 0 < value < 1"),
        ({"bias": {"background": {"rho": 0}}}, "bias.background.rho = 0"),
        ({"loss": {"epsilon": -0.1}}, "loss.epsilon = -0.1"),
        ({"loss": {"temperature": 0}}, "allowed: 0 < value <= 10"),
        ({"erm": {"lr": -1}}, "erm.lr = -1"),
        ({"erm": {"lr": "fast"}}, "erm.lr = 'fast'"),
        ({"stage2": {"cnc": {"num_positives": 0}}}, "stage2.cnc.num_positives = 0"),
        ({"stage2": {"method": "cnx"}}, "stage2.method = 'cnx' is not allowed; allowed: 'cnc'"),
        ({"data": {"source": "imagenet"}}, "data.source = 'imagenet' is not allowed"),
        ({"bias": {"protocol": "stripes"}}, "bias.protocol = 'stripes'"),
        ({"model": {"name": "vgg"}}, "model.name = 'vgg'"),
        ({"data": {"source": "npz"}}, "data.path is required when data.source is 'npz'"),
        ({"bias": {"foreground": {"class_digits": [[0], [1], [2]], "colours": [[1, 2, 3], [4, 5, 6]]}}},
         "has 2 colours for 3 classes"),
        ({"seed": 1.5}, "seed"),
    ],
)
def test_bad_params_are_named_with_what_is_allowed(override: dict, expected: str) -> None:
    with pytest.raises(ParamsError) as info:
        validate(override)
    assert expected in str(info.value)


def test_every_problem_is_listed_at_once() -> None:
    with pytest.raises(ParamsError) as info:
        validate({"loss": {"epsilon": -1, "temperature": -1}})
    assert "loss.epsilon" in str(info.value) and "loss.temperature" in str(info.value)


def test_missing_and_malformed_files(tmp_path) -> None:
    with pytest.raises(ParamsError, match="not found"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("data: [unclosed\n")
    with pytest.raises(ParamsError, match="not valid YAML"):
        load_params(bad)
    bad.write_text("- a list\n")
    with pytest.raises(ParamsError, match="must hold a mapping"):
        load_params(bad)


def test_params_hash_is_stable_and_sensitive() -> None:
    a = {"erm": {"lr": 0.01, "epochs": 3}}
    assert params_hash(a) == params_hash({"erm": {"epochs": 3, "lr": 0.01}})
    assert params_hash(a) != params_hash({"erm": {"lr": 0.02, "epochs": 3}})


def test_check_params_cli(tmp_path, capsys) -> None:
    assert cli_main(["check-params", str(REPO / "params.yaml")]) == 0
    bad = tmp_path / "params.yaml"
    bad.write_text("loss:\n  epsilion: 0.1\n")
    assert cli_main(["check-params", str(bad)]) == 2
    assert "did you mean 'loss.epsilon'" in capsys.readouterr().err


def test_yaml_true_selects_the_oracle_group_method() -> None:
    """`dvc exp run -S groups.method=true` writes a YAML boolean; it must mean the 'true' method."""
    assert validate(yaml.safe_load("groups: {method: true}")).groups.method == "true"
