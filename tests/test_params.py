"""The params schema: the shipped file is valid, and bad input fails with a clear message."""

from __future__ import annotations

import pytest
import yaml

from debias.params import ParamsError, params_hash, read_yaml
from debias.schema import Params, load_params, validate
from debias.tools.cli import main as cli_main
from tests.conftest import committed_text


def test_shipped_params_yaml_is_valid_and_complete(tmp_path) -> None:
    shipped = tmp_path / "params.yaml"
    shipped.write_text(committed_text("params.yaml"))  # never the workspace's: a dvc exp run may have changed it
    params = load_params(shipped)
    raw = yaml.safe_load(shipped.read_text())
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
        ({"loss": {"temperature": 0}}, "allowed: 0.0001 <= value <= 10"),
        ({"loss": {"temperature": 1e-30}}, "loss.temperature = 1e-30"),
        ({"erm": {"lr": True}}, "erm.lr = True: a boolean where a number is expected"),
        ({"erm": {"epochs": True}}, "erm.epochs = True: a boolean where a whole number is expected"),
        ({"erm": {"epochs": 2.5}}, "erm.epochs = 2.5"),
        ({"probe": {"c_grid": [0.1, float("nan")]}}, "probe.c_grid.1 = nan"),
        ({"probe": {"c_grid": [0.1, float("inf")]}}, "probe.c_grid.1 = inf"),
        ({"probe": {"c_grid": [0.1, 0.1]}}, "values repeat"),
        ({"erm": {"epochs": 5, "lr_milestones": [3, 7]}}, "erm.lr_milestones [7] never take effect with epochs = 5"),
        ({"stage2": {"lr_milestones": [2, 1]}}, "stage2.lr_milestones = [2, 1]; allowed: strictly increasing"),
        ({"data": {"path": "x.npz"}}, "data.path = 'x.npz' is read only by source npz"),
        ({"bias": {"background": {"colours": [[255, 0, 0], [250, 2, 3]] + [[0, 0, 9 * i + 40] for i in range(8)]}}},
         "bias.background.colours[0] = [255, 0, 0] and colours[1] = [250, 2, 3] cannot be told apart"),
        ({"bias": {"background": {"colours": [[255, 255, 250]] + [[0, 0, 20 * i + 40] for i in range(9)]}}},
         "cannot be told apart from the white strokes"),
        ({"bias": {"foreground": {"colours": [[255, 0, 0], [208, 255, 0], [0, 255, 92], [0, 116, 255], [3, 3, 3]]}}},
         "bias.foreground.colours[4] = [3, 3, 3] cannot be told apart from the black background"),
        ({"bias": {"foreground": {"class_digits": [[0, 1], []]}}}, "holds an empty class"),
        ({"data": {"image_size": 12}}, "model.name = lenet5 needs data.image_size >= 16"),
        ({"data": {"source": "adult"}, "bias": {"protocol": "foreground"}},
         "bias.protocol = foreground biases images; data.source = adult holds feature vectors"),
        ({"erm": {"lr": -1}}, "erm.lr = -1"),
        ({"erm": {"lr": "fast"}}, "erm.lr = 'fast'"),
        ({"stage2": {"cnc": {"num_positives": 0}}}, "stage2.cnc.num_positives = 0"),
        ({"stage2": {"cnc": {"contrastive_weight": 1}}},
         "stage2.cnc.contrastive_weight = 1: the classifier head's cross-entropy weight 1 - lambda is then 0"),
        ({"stage2": {"method": "cnx"}}, "stage2.method = 'cnx' is not allowed; allowed: 'cnc'"),
        ({"data": {"source": "imagenet"}}, "data.source = 'imagenet' is not allowed"),
        ({"bias": {"protocol": "stripes"}}, "bias.protocol = 'stripes'"),
        ({"model": {"name": "vgg"}}, "model.name = 'vgg'"),
        ({"data": {"source": "npz"}}, "data.path is required when source is 'npz'"),
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
    bad.write_text("erm:\n  lr: 0.1\nerm:\n  lr: 0.2\n")  # DVC refuses duplicate keys; so do we
    with pytest.raises(ParamsError, match="DuplicateKeyError.*duplicate key"):
        load_params(bad)
    bad.write_bytes("report:\n  title: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ParamsError, match=r"not UTF-8 text \(byte 0xe9 at line 2\)"):
        load_params(bad)


def test_yaml_is_read_as_dvc_reads_it(tmp_path) -> None:
    """YAML 1.2, as DVC's parser: 1e-3 is a number (PyYAML would read a string), yes is a string."""
    path = tmp_path / "params.yaml"
    path.write_text("erm:\n  lr: 1e-3\nreport:\n  title: yes\n")
    params = validate(read_yaml(path))  # load_params reads it so, then refuses the sections it leaves out
    assert params.erm.lr == 0.001 and params.report.title == "yes"


@pytest.mark.parametrize("text", ["erm:\n  lr: 1e-3\nreport:\n  title: yes\n",
                                  "%YAML 1.1\n---\nreport:\n  title: yes\nerm:\n  lr: 0o17\n",
                                  "a: [1.0, .inf, ~, 0x1F, 1_000, on, 2001-12-14]\n<<: {b: 1}\n"])
def test_yaml_gives_the_values_dvc_s_own_parser_gives(tmp_path, text: str) -> None:
    """What DVC compares and records (its parse of params.yaml) is what the stage reads, a ``%YAML`` directive
    included."""
    from dvc.utils.serialize import parse_yaml as dvc_parse_yaml

    path = tmp_path / "params.yaml"
    path.write_text(text)
    assert read_yaml(path) == dvc_parse_yaml(text, str(path))


def test_the_report_reads_the_committed_params_as_the_stages_do() -> None:
    """A committed ``lr: 1e-2`` is the number 0.01 for the report's "changed by this run" table, as for DVC and the
    stages (a YAML 1.1 reader made it the string '1e-2' and the report stage failed validating it)."""
    from debias.report.params_table import committed_params

    text = committed_text("params.yaml")
    assert "  lr: 0.01\n" in text
    assert committed_params(text.replace("  lr: 0.01\n", "  lr: 1e-2\n", 1)).erm.lr == 0.01


def test_an_alias_bomb_gives_a_short_message(tmp_path) -> None:
    """A few lines of YAML aliases expand to 10^9 list items: the message must stay short and quick."""
    levels = ["a0: &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    path = tmp_path / "params.yaml"
    path.write_text("\n".join(levels) + "\nprobe:\n  c_grid: *a8\n")
    with pytest.raises(ParamsError) as info:
        load_params(path)
    assert len(str(info.value)) < 5000, len(str(info.value))
    assert "unknown parameter 'a0'" in str(info.value) and "probe.c_grid.0" in str(info.value)


def test_params_hash_is_stable_and_sensitive() -> None:
    a = {"erm": {"lr": 0.01, "epochs": 3}}
    assert params_hash(a) == params_hash({"erm": {"epochs": 3, "lr": 0.01}})
    assert params_hash(a) != params_hash({"erm": {"lr": 0.02, "epochs": 3}})


def test_check_params_cli(tmp_path, capsys) -> None:
    shipped = tmp_path / "shipped.yaml"
    shipped.write_text(committed_text("params.yaml"))
    assert cli_main(["check-params", str(shipped)]) == 0
    bad = tmp_path / "params.yaml"
    bad.write_text("loss:\n  epsilion: 0.1\n")
    assert cli_main(["check-params", str(bad)]) == 2
    assert "did you mean 'loss.epsilon'" in capsys.readouterr().err


def test_yaml_true_selects_the_oracle_group_method() -> None:
    """`dvc exp run -S groups.method=true` writes a YAML boolean; it must mean the 'true' method."""
    assert validate(yaml.safe_load("groups: {method: true}")).groups.method == "true"


@pytest.mark.slow
def test_check_params_with_overrides_validates_each_value_and_leaves_the_file_untouched(tmp_path, capsys) -> None:
    import os
    import subprocess
    import sys

    from tests.conftest import REPO

    shipped = tmp_path / "params.yaml"
    shipped.write_text(committed_text("params.yaml"))
    before = shipped.read_bytes()
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    done = subprocess.run([sys.executable, "-m", "debias.tools.cli", "check-params", "-S", "loss.epsilon=-1"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "loss.epsilon = -1" in done.stderr and "allowed: 0 <= value" in done.stderr
    assert shipped.read_bytes() == before
    assert cli_main(["check-params", str(shipped), "-S", "loss.epsilon=0.25", "-S", "stage2.epochs=4"]) == 0
    assert "with -S loss.epsilon=0.25 -S stage2.epochs=4: valid" in capsys.readouterr().out
    # a sweep (dvc exp run --queue -S 'key=a,b'): every value checked, the bad one named
    assert cli_main(["check-params", str(shipped), "-S", "loss.epsilon=0,0.25,-1"]) == 2
    out, err = capsys.readouterr()
    assert out.count(": valid") == 2 and "2 of 3 combinations valid" in out and "loss.epsilon = -1" in err
    # a key params.yaml does not hold: DVC refuses it without '+', the schema with it; both name the key
    assert cli_main(["check-params", str(shipped), "-S", "loss.epsilo=1"]) == 2
    assert "did you mean 'loss.epsilon'?" in capsys.readouterr().err
    assert cli_main(["check-params", str(shipped), "-S", "+loss.epsilo=1"]) == 2
    assert "unknown parameter 'loss.epsilo'" in capsys.readouterr().err
    # malformed overrides and other files: a clear refusal, no traceback
    assert cli_main(["check-params", str(shipped), "-S", "loss.epsilon=["]) == 2
    assert "not a valid override" in capsys.readouterr().err
    assert cli_main(["check-params", str(shipped), "-S", "other.yaml:a=1"]) == 2
    assert "reads only params.yaml" in capsys.readouterr().err
    assert shipped.read_bytes() == before
    # another file name: the overrides (with or without its prefix) apply to it
    other = tmp_path / "mine.yaml"
    other.write_bytes(before)
    assert cli_main(["check-params", str(other), "-S", "seed=3", "-S", "mine.yaml:loss.epsilon=0.5"]) == 0
    assert other.read_bytes() == before


def test_a_typo_in_an_override_starts_with_the_unknown_key_and_the_suggestion(tmp_path, capsys) -> None:
    """`-S loss.epsiln=0.3`: the line starts with the unknown key and the closest known one, then the overrides;
    OmegaConf's internals (`Key ... is not in struct`, `full_key`, `object_type`) never reach the user. A missing
    section is named with the override's whole key."""
    shipped = tmp_path / "params.yaml"
    shipped.write_text(committed_text("params.yaml"))
    assert cli_main(["check-params", str(shipped), "-S", "loss.epsiln=0.3", "-S", "seed=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("unknown parameter 'loss.epsiln'; did you mean 'loss.epsilon'? (-S loss.epsiln=0.3 -S seed=1;")
    assert "not in struct" not in err and "full_key" not in err and "object_type" not in err
    assert cli_main(["check-params", str(shipped), "-S", "lss.epsilon=0.3"]) == 2
    assert capsys.readouterr().err.startswith("unknown parameter 'lss.epsilon'; did you mean 'loss.epsilon'? (")
    assert cli_main(["check-params", str(shipped), "-S", "zzzz=1"]) == 2
    assert capsys.readouterr().err.startswith("unknown parameter 'zzzz' (-S zzzz=1; +key=value adds a key")


def test_a_sweep_of_more_combinations_than_the_cap_is_refused_at_once_naming_the_key(tmp_path, capsys) -> None:
    """`check-params -S 'seed=range(0,1000000)'` is counted, not expanded: refused in seconds with the key and its
    count; the product of the axes is what counts, and a sweep at the cap is checked."""
    import time

    from debias.tools.overrides import override_sets
    from debias.tools.sweep.grid import MAX_POINTS

    shipped = tmp_path / "params.yaml"
    shipped.write_text(committed_text("params.yaml"))
    started = time.monotonic()
    assert cli_main(["check-params", str(shipped), "-S", "seed=range(0,1000000)"]) == 2
    assert time.monotonic() - started < 30
    out, err = capsys.readouterr()
    assert out == "" and err.strip() == (
        f"-S seed=range(0,1000000): 1000000 combinations (seed: 1000000 values), more than {MAX_POINTS} (each is "
        "one experiment); nothing was checked: give fewer values (a range meant as a list?)")
    with pytest.raises(ParamsError, match=r"1000 combinations \(seed: 50 values, loss.epsilon: 20 values\)"):
        override_sets(["seed=range(0,50)", "loss.epsilon=range(0,20)", "stage2.epochs=3"], limit=999)
    assert len(override_sets(["seed=range(0,50)", "loss.epsilon=range(0,20)"], limit=1000)) == 1000
    values = ",".join(str(n) for n in range(12))  # a list is counted up to the cap
    with pytest.raises(ParamsError, match=r": more than 10 combinations \(seed: more than 10 values\)"):
        override_sets([f"seed={values}"], limit=10)


def _with(**dotted) -> dict:
    """The committed params.yaml with dotted keys set."""
    from debias.tools.sweep.grid import nested

    return nested(yaml.safe_load(committed_text("params.yaml")), dotted)


@pytest.mark.parametrize("key", ["erm.batch_size", "stage2.batch_size"])
def test_a_batch_of_one_is_refused_where_the_encoder_has_batchnorm(key) -> None:
    """BatchNorm in training mode cannot take a batch of one (torch fails at the first step, naming no param):
    the schema refuses it, naming the key, the encoder and what is allowed, and only where the encoder has
    BatchNorm."""
    method = {"stage2.method": "eps_supinfonce"}
    with pytest.raises(ParamsError) as refused:
        validate(_with(**{key: 1, "model.name": "simpleconv", **method}))
    assert (f"{key} = 1: the encoder (model.name = simpleconv) has BatchNorm, which needs at least 2 samples per "
            f"training batch; allowed: {key} >= 2, or an encoder without BatchNorm (lenet5, or mlp with "
            "model.mlp.batch_norm false)") in str(refused.value)
    with pytest.raises(ParamsError, match=f"{key} = 1: the encoder \\(model.name = mlp with model.mlp.batch_norm true"):
        validate(_with(**{key: 1, "model.name": "mlp", **method}))
    with pytest.raises(ParamsError, match=f"{key} = 1: the encoder \\(the mlp data.source = adult uses, with "
                                          "model.mlp.batch_norm true\\)"):
        validate(_with(**{key: 1, "data.source": "adult", "bias.protocol": "auto", "model.name": "lenet5", **method}))
    validate(_with(**{key: 1, "model.name": "lenet5", **method}))
    validate(_with(**{key: 1, "model.name": "mlp", "model.mlp.batch_norm": False, **method}))
    validate(_with(**{key: 2, "model.name": "resnet18", **method}))


def test_the_encoders_said_to_have_batchnorm_are_the_ones_built_with_it() -> None:
    from typing import get_args

    from torch import nn

    from debias.models import build_model
    from debias.params.model import ModelParams, has_batchnorm

    cases = [(name, True, (3, 32, 32)) for name in get_args(ModelParams.model_fields["name"].annotation)]
    cases += [("mlp", False, (3, 32, 32)), ("lenet5", True, (12,)), ("lenet5", False, (12,))]  # (12,): feature vectors
    for name, batch_norm, shape in cases:
        model = ModelParams(name=name, mlp={"batch_norm": batch_norm})
        built = build_model(model, 2, shape)
        found = any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in built.modules())
        assert has_batchnorm(model, len(shape) == 1) == found, (name, batch_norm, shape)
