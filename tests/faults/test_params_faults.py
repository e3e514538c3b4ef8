"""Bad params.yaml: one schema, one message (key, value, what is allowed, closest key), before any data is read.

Through the schema directly, through ``debias check-params``, through a real stage entrypoint
(exit code 2, our message on stderr, outputs untouched) and through ``dvc exp run -S`` (DVC's
own rejection of an unknown key; our message for a valid key with a bad value).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from debias.params import ParamsError
from debias.schema import validate
from tests.faults.conftest import (
    PYTHON,
    assert_clean_failure,
    dvc,
    run_stage,
    shipped_params,
    snapshot,
    stage_env,
    write_params,
)

# (override, fragments the message must hold: the key, the value, what is allowed [, the closest key])
BAD = {
    "typo-epsilon": ({"loss": {"epsilion": 0.3}},
                     ["unknown parameter 'loss.epsilion'", "0.3", "did you mean 'loss.epsilon'"]),
    "typo-section": ({"stage2": {"cnc": {"num_positive": 8}}},
                     ["unknown parameter 'stage2.cnc.num_positive'", "did you mean 'stage2.cnc.num_positives'"]),
    "typo-top-level": ({"sead": 1}, ["unknown parameter 'sead'", "did you mean 'seed'"]),
    "wrong-type-lr": ({"erm": {"lr": "fast"}}, ["erm.lr = 'fast'", "a string where a number is expected"]),
    "wrong-type-epochs": ({"erm": {"epochs": 2.5}}, ["erm.epochs = 2.5", "integer"]),
    "wrong-type-section": ({"loss": 0.1}, ["loss = 0.1"]),
    "wrong-type-bool": ({"stage2": {"cnc": {"two_sided": "sometimes"}}}, ["stage2.cnc.two_sided = 'sometimes'", "a string where true or false is expected"]),
    "rho-above-1": ({"bias": {"background": {"rho": 1.0}}}, ["bias.background.rho = 1.0", "allowed: 0 < value < 1"]),
    "rho-zero": ({"bias": {"background": {"rho": 0.0}}}, ["bias.background.rho = 0.0", "allowed: 0 < value < 1"]),
    "eval-rho-negative": ({"bias": {"background": {"eval_rho": -0.1}}}, ["bias.background.eval_rho = -0.1", "allowed: 0 < value < 1"]),
    "p-corr-one": ({"bias": {"foreground": {"p_corr": 1}}}, ["bias.foreground.p_corr = 1", "allowed: 0 < value < 1"]),
    "p-corr-negative": ({"bias": {"foreground": {"p_corr": -0.5}}}, ["bias.foreground.p_corr = -0.5", "allowed: 0 < value < 1"]),
    "epsilon-negative": ({"loss": {"epsilon": -0.1}}, ["loss.epsilon = -0.1", "allowed: 0 <= value <= 100"]),
    "temperature-zero": ({"loss": {"temperature": 0}}, ["loss.temperature = 0", "allowed: 0.0001 <= value <= 10"]),
    "temperature-negative": ({"loss": {"temperature": -1.0}}, ["loss.temperature = -1.0", "allowed: 0.0001 <= value <= 10"]),
    "erm-lr-negative": ({"erm": {"lr": -0.01}}, ["erm.lr = -0.01", "allowed: 0 < value <= 10"]),
    "stage2-lr-zero": ({"stage2": {"lr": 0}}, ["stage2.lr = 0", "allowed: 0 < value <= 10"]),
    "batch-zero": ({"erm": {"batch_size": 0}}, ["erm.batch_size = 0", "allowed: 1 <= value <= 65536"]),
    "M-zero": ({"stage2": {"cnc": {"num_positives": 0}}}, ["stage2.cnc.num_positives = 0", "allowed: 1 <= value <= 4096"]),
    "N-negative": ({"stage2": {"cnc": {"num_negatives": -3}}}, ["stage2.cnc.num_negatives = -3", "allowed: 1 <= value <= 4096"]),
    "fairkl-negative": ({"loss": {"fairkl": {"weight": -1}}}, ["loss.fairkl.weight = -1", "allowed: 0 <= value <= 1000"]),
    "unknown-method": ({"stage2": {"method": "cnx"}}, ["stage2.method = 'cnx' is not allowed", "allowed:", "'cnc'"]),
    "unknown-source": ({"data": {"source": "imagenet"}}, ["data.source = 'imagenet' is not allowed", "'digits'"]),
    "unknown-protocol": ({"bias": {"protocol": "stripes"}}, ["bias.protocol = 'stripes' is not allowed", "'foreground'"]),
    "unknown-model": ({"model": {"name": "vgg16"}}, ["model.name = 'vgg16' is not allowed", "'lenet5'"]),
    "unknown-groups": ({"groups": {"method": "oracle"}}, ["groups.method = 'oracle' is not allowed", "'pred'"]),
    "unknown-fairkl-variant": ({"loss": {"fairkl": {"variant": "js"}}}, ["loss.fairkl.variant = 'js' is not allowed"]),
    "protocol-cannot-colour": ({"bias": {"foreground": {"class_digits": [[0], [1], [2], [3]],
                                                         "colours": [[255, 0, 0], [0, 255, 0], [0, 0, 255]]}}},
                               ["bias.foreground.colours has 3 colours for 4 classes", "allowed: at least one colour per class"]),
    "one-class": ({"bias": {"foreground": {"class_digits": [[0, 1, 2]]}}}, ["class_digits needs at least 2 classes"]),
    "digit-twice": ({"bias": {"foreground": {"class_digits": [[0, 1], [1, 2]]}}}, ["uses a label twice"]),
    "negative-digit": ({"bias": {"foreground": {"class_digits": [[-1, 0], [1, 2]]}}},
                       ["bias.foreground.class_digits.0.0 = -1", "greater than or equal to 0"]),
    "colour-out-of-range": ({"bias": {"background": {"colours": [[300, 0, 0]]}}},
                            ["bias.background.colours.0.0 = 300", "less than or equal to 255"]),
    "colour-negative": ({"bias": {"foreground": {"colours": [[0, 0, 0]] * 4 + [[0, -1, 0]]}}},
                        ["bias.foreground.colours.4.1 = -1", "greater than or equal to 0"]),
    "fractions-too-large": ({"data": {"val_fraction": 0.5, "test_fraction": 0.45}},
                            ["data.val_fraction + test_fraction = 0.95", "allowed: a sum below 0.9"]),
    "npz-without-path": ({"data": {"source": "npz", "path": None}}, ["data.path is required when source is 'npz'"]),
    "seed-fraction": ({"seed": 1.5}, ["seed = 1.5", "whole number"]),
    "seed-negative": ({"seed": -1}, ["seed = -1", "allowed: 0 <= value"]),
    "image-size-tiny": ({"data": {"image_size": 4}}, ["data.image_size = 4", "allowed: 8 <= value <= 512"]),
}


@pytest.mark.parametrize("override, fragments", list(BAD.values()), ids=list(BAD))
def test_schema_names_key_value_and_what_is_allowed(override: dict, fragments: list[str]) -> None:
    """Each bad value, merged into the shipped params, fails validation with one message holding every fragment."""
    params = shipped_params()
    for section, value in override.items():
        if isinstance(value, dict) and isinstance(params.get(section), dict):
            from tests.faults.conftest import deep_update

            deep_update(params[section], value)
        else:
            params[section] = value
    with pytest.raises(ParamsError) as info:
        validate(params)
    message = str(info.value)
    assert message.startswith("invalid params.yaml:")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert "Traceback" not in message and "pydantic" not in message.lower()  # our words, not the library's
    assert message.count("\n  - ") == 1  # exactly this problem, reported once


def test_several_problems_are_listed_in_one_message() -> None:
    with pytest.raises(ParamsError) as info:
        validate({"loss": {"epsilion": 1, "temperature": 0}, "erm": {"lr": -1}})
    message = str(info.value)
    for fragment in ("loss.epsilion", "loss.temperature = 0", "erm.lr = -1"):
        assert fragment in message


def test_shipped_params_pass() -> None:
    validate(shipped_params())


# --------------------------------------------------------------------------- debias check-params


@pytest.mark.slow
def test_check_params_command_rejects_a_typo_and_accepts_the_fix(tmp_path: Path) -> None:
    params = shipped_params()
    params["loss"]["epsilion"] = params["loss"].pop("epsilon")
    bad = tmp_path / "params.yaml"
    bad.write_text(yaml.safe_dump(params, sort_keys=False))
    done = subprocess.run(["debias", "check-params", str(bad)], capture_output=True, text=True, check=False, env=stage_env(),
                          timeout=60)
    assert done.returncode == 2, done
    assert "unknown parameter 'loss.epsilion'" in done.stderr and "did you mean 'loss.epsilon'" in done.stderr
    assert "Traceback" not in done.stderr
    params["loss"]["epsilon"] = params["loss"].pop("epsilion")
    bad.write_text(yaml.safe_dump(params, sort_keys=False))
    done = subprocess.run(["debias", "check-params", str(bad)], capture_output=True, text=True, check=False, env=stage_env(),
                          timeout=60)
    assert done.returncode == 0 and "valid" in done.stdout, done


@pytest.mark.slow
def test_check_params_command_on_a_missing_and_a_malformed_file(tmp_path: Path) -> None:
    done = subprocess.run([PYTHON, "-m", "debias.tools.cli", "check-params", str(tmp_path / "nope.yaml")],
                          capture_output=True, text=True, check=False, env=stage_env(), timeout=60)
    assert done.returncode == 2 and "not found" in done.stderr and "Traceback" not in done.stderr
    (tmp_path / "broken.yaml").write_text("loss: {temperature: [\n")
    done = subprocess.run([PYTHON, "-m", "debias.tools.cli", "check-params", str(tmp_path / "broken.yaml")],
                          capture_output=True, text=True, check=False, env=stage_env(), timeout=60)
    assert done.returncode == 2 and "not valid YAML" in done.stderr and "Traceback" not in done.stderr


# --------------------------------------------------------------------------- through a real stage


def test_stage_fails_before_reading_data_and_touches_no_output(prepared_workspace: Path) -> None:
    """A bad value and a typo: train_erm exits 2 with our message; no output changes.

    The training split is also made unreadable: the params message (not a corrupt-file one)
    proves params are validated before any data is read.
    """
    ws = prepared_workspace
    before = snapshot(ws)
    (ws / "data/biased/train.pt").write_bytes(b"not a torch file")
    before["data/biased/train.pt"] = snapshot(ws)["data/biased/train.pt"]
    write_params(ws, {"erm": {"lr": -1.0}, "loss": {"epsilion": 0.3}})
    done = run_stage(ws, "train_erm")
    assert_clean_failure(done, "invalid params.yaml", "erm.lr = -1.0", "allowed: 0 < value <= 10",
                         "unknown parameter 'loss.epsilion'", "did you mean 'loss.epsilon'", stage="train_erm")
    assert "cannot be read" not in done.stderr  # the data was never opened
    assert snapshot(ws) == before  # bytes and mtimes of every previous output unchanged
    assert not (ws / "models/.resume").exists() or not any((ws / "models/.resume").iterdir())


def test_every_stage_validates_the_whole_file(prepared_workspace: Path) -> None:
    """A stage that does not read ``loss`` still refuses a params.yaml with a bad ``loss`` value."""
    ws = prepared_workspace
    before = snapshot(ws)
    write_params(ws, {"loss": {"temperature": 0}})
    done = run_stage(ws, "download")
    assert_clean_failure(done, "loss.temperature = 0", "allowed: 0.0001 <= value <= 10", stage="download")
    assert snapshot(ws) == before


# --------------------------------------------------------------------------- through dvc exp run -S


def _committed_outputs(clone: Path) -> dict[str, tuple[str, int]]:
    return snapshot(clone, ("data", "reports"))


def test_dvc_rejects_an_unknown_key_itself(downloaded_clone: Path) -> None:
    clone = downloaded_clone
    params_before = (clone / "params.yaml").read_bytes()
    outputs_before = _committed_outputs(clone)
    done = dvc(clone, "exp", "run", "-S", "loss.epsilion=0.3", check=False)
    assert done.returncode != 0
    assert "epsilion" in done.stderr and "Could not override" in done.stderr, done.stderr
    assert (clone / "params.yaml").read_bytes() == params_before
    assert _committed_outputs(clone) == outputs_before


def test_dvc_added_unknown_key_is_caught_by_our_schema(downloaded_clone: Path) -> None:
    """``-S +key=value`` gets past DVC's check; the first stage that runs refuses it, naming the closest key."""
    clone = downloaded_clone
    outputs_before = _committed_outputs(clone)
    done = dvc(clone, "exp", "run", "-S", "+loss.epsilion=0.3", check=False)
    assert done.returncode != 0
    assert "exited with 2" in done.stderr
    assert "unknown parameter 'loss.epsilion'" in done.stderr and "did you mean 'loss.epsilon'" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert _committed_outputs(clone) == outputs_before


def test_dvc_valid_key_with_a_bad_value_fails_with_our_message(downloaded_clone: Path) -> None:
    """``dvc exp run -S loss.temperature=0``: the first stage (source, which validates the whole file before
    fingerprinting) exits 2 with our message; nothing already written is touched (bytes and mtimes)."""
    clone = downloaded_clone
    outputs_before = _committed_outputs(clone)
    done = dvc(clone, "exp", "run", "-S", "loss.temperature=0", check=False)
    assert done.returncode != 0
    assert "Running stage 'source'" in done.stdout, done.stdout
    assert "failed to run: python -m debias.harness.launch --single pipeline/source.py, exited with 2" in done.stderr, done.stderr
    assert "[source] error: invalid params.yaml" in done.stderr
    assert "loss.temperature = 0" in done.stderr and "allowed: 0.0001 <= value <= 10" in done.stderr
    # DVC leaves the -S value in params.yaml: the message says so and how to undo it
    assert "params.yaml differs from the committed one" in done.stderr and "`git checkout params.yaml`" in done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert _committed_outputs(clone) == outputs_before  # and no file of a later stage was written
