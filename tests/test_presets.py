"""Paper presets (src/debias/tools/presets) and ``debias preset``: every preset composes into valid params over the
committed params.yaml and yields the papers' values; apply keeps every byte but the changed values, refuses before
writing, and names the presets on a bad name."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest
import yaml

from debias.core.errors import ParamsError
from debias.core.trees import flatten
from debias.params import BACKGROUND_COLOURS
from debias.schema import Params, validate
from debias.tools import presets
from debias.tools.presets import catalog
from debias.tools.cli import main
from tests.conftest import committed_text

BFFHQ_ROOT = {"data": {"imagefolder": {"root": "data/external/bffhq"}}}


def _base() -> dict:
    return yaml.safe_load(committed_text("params.yaml"))


def _composed(name: str) -> Params:
    preset = presets.load(name)
    sets = BFFHQ_ROOT if preset.requires else None
    return validate(presets.compose(_base(), preset, sets))


# --------------------------------------------------------------------------- every preset


@pytest.mark.parametrize("name", presets.names())
def test_every_preset_validates_over_the_committed_params_and_names_its_sources(name) -> None:
    preset = presets.load(name)
    assert preset.version >= 1 and preset.title and preset.paper and preset.objective
    assert all(block["source"].strip() for block in preset.blocks)
    assert set(flatten(preset.params())) == set(preset.sources())
    params = _composed(name)
    # every value the preset sets is what the validated params hold
    dumped = flatten(params.model_dump(mode="json"))
    for key, value in flatten(preset.params()).items():
        assert dumped[key] == value or (isinstance(value, (int, float)) and dumped[key] == pytest.approx(value)), key


def test_the_presets_are_the_papers_tables() -> None:
    names = set(presets.names())
    table6 = {f"fairkl-bmnist-{rho}-{loss}" for rho in ("0.999", "0.997", "0.995", "0.99")
              for loss in ("eps-supinfonce", "eps-supcon")}
    table7 = {f"fairkl-ccifar10-{ratio}pct" for ratio in ("0.5", "1", "2", "5")}
    assert table6 | table7 | {"fairkl-bffhq", "cnc-cmnist", "cnc-waterbirds", "cnc-celeba", "wcl-adult",
                              "wcl-compas"} <= names
    assert not any(name.startswith("_") for name in names)


# FairKL App. B.2.1 Table 6: (alpha, lambda, eps) per rho and loss.
TABLE6 = {("0.999", "eps-supcon"): (0.03, 0.75, 0.25), ("0.997", "eps-supcon"): (0.03, 0.5, 0.0),
          ("0.995", "eps-supcon"): (0.03, 0.5, 0.5), ("0.99", "eps-supcon"): (0.03, 0.5, 0.0),
          ("0.999", "eps-supinfonce"): (0.03, 0.75, 0.5), ("0.997", "eps-supinfonce"): (0.03, 0.75, 0.5),
          ("0.995", "eps-supinfonce"): (0.03, 0.75, 0.5), ("0.99", "eps-supinfonce"): (0.03, 0.5, 0.5)}


@pytest.mark.parametrize("rho,loss", sorted(TABLE6))
def test_biased_mnist_presets_carry_table_6_and_app_b21(rho, loss) -> None:
    values = flatten(presets.load(f"fairkl-bmnist-{rho}-{loss}").params())
    alpha, lam, eps = TABLE6[(rho, loss)]
    own = "loss.eps_supcon.fairkl_weight", "loss.eps_supcon.epsilon"  # eps-SupCon's own lambda and eps
    lam_key, eps_key = own if loss == "eps-supcon" else ("loss.fairkl.weight", "loss.epsilon")
    assert (values["loss.alpha"], values[lam_key], values[eps_key]) == (alpha, lam, eps)
    other = ("loss.fairkl.weight", "loss.epsilon") if loss == "eps-supcon" else own
    assert not set(other) & set(values)  # the other loss's eps and lambda are left as they are
    assert values["bias.background.rho"] == float(rho) and values["bias.protocol"] == "background"
    assert values["stage2.method"] == loss.replace("-", "_")
    assert values["loss.fairkl.variant"] == "released" and values["loss.temperature"] == 0.1
    assert (values["stage2.optimizer"], values["stage2.lr"], values["stage2.weight_decay"]) == ("adam", 0.001, 1e-5)
    assert (values["stage2.batch_size"], values["stage2.epochs"], values["stage2.lr_milestones"],
            values["stage2.lr_gamma"]) == (256, 80, [26, 53], 0.1)
    assert values["model.name"] == "simpleconv" and values["data.source"] == "mnist"
    assert values["groups.method"] == "true" and values["stage2.augment_shift"] == 0
    # the released biased_mnist.py overwrites class 9's colour in background mode; the schema keeps Bahng et al.'s
    assert values["bias.background.colours"][9] == [50, 255, 128]
    assert values["bias.background.colours"][:9] == [list(c) for c in BACKGROUND_COLOURS[:9]]
    assert list(BACKGROUND_COLOURS[9]) == [128, 128, 128]


def test_biased_mnist_0997_eps_supcon_is_eps_0_lambda_05() -> None:
    values = flatten(presets.load("fairkl-bmnist-0.997-eps-supcon").params())
    assert (values["loss.eps_supcon.epsilon"], values["loss.eps_supcon.fairkl_weight"]) == (0.0, 0.5)
    params = _composed("fairkl-bmnist-0.997-eps-supcon")
    assert (params.loss.eps_supcon.epsilon, params.loss.eps_supcon.fairkl_weight, params.loss.alpha) == (0.0, 0.5, 0.03)
    assert params.stage2.method == "eps_supcon" and params.bias.background.rho == 0.997


@pytest.mark.parametrize("ratio,rho,eps", [("0.5", 0.995, 0.1), ("1", 0.99, 0.25), ("2", 0.98, 0.5), ("5", 0.95, 0.25)])
def test_corrupted_cifar10_presets_carry_table_7_and_app_b22(ratio, rho, eps) -> None:
    values = flatten(presets.load(f"fairkl-ccifar10-{ratio}pct").params())
    assert (values["loss.alpha"], values["loss.fairkl.weight"], values["loss.epsilon"]) == (0.1, 1.0, eps)
    assert values["bias.corruption.rho"] == rho and values["data.source"] == "cifar10"
    assert (values["model.name"], values["stage2.optimizer"], values["stage2.lr"], values["stage2.weight_decay"],
            values["stage2.epochs"], values["stage2.batch_size"]) == ("resnet18", "adam", 0.001, 1e-4, 200, 256)
    assert any("cosine" in d for d in presets.load(f"fairkl-ccifar10-{ratio}pct").deviations)


def test_bffhq_preset_needs_its_folder_and_carries_app_b23() -> None:
    preset = presets.load("fairkl-bffhq")
    with pytest.raises(presets.PresetError, match="data.imagefolder.root"):
        presets.compose(_base(), preset)
    values = flatten(preset.params())
    assert (values["loss.alpha"], values["loss.epsilon"], values["loss.fairkl.weight"]) == (0.1, 0.25, 1.5)
    assert (values["stage2.lr"], values["stage2.epochs"], values["stage2.batch_size"], values["stage2.weight_decay"],
            values["model.name"]) == (0.0001, 100, 256, 1e-4, "resnet18")
    assert values["data.source"] == "imagefolder" and any("imagefolder" in d for d in preset.deviations)


@pytest.mark.parametrize("name,m,tau,lr,wd,epochs,erm", [
    ("cnc-cmnist", 32, 0.05, 1e-3, 1e-4, 3, ("lenet5", 1e-3, 5e-4, 32, 5)),
    ("cnc-waterbirds", 17, 0.1, 1e-4, 1e-3, 5, ("resnet50", 1e-3, 1.0, 128, 300)),
    ("cnc-celeba", 64, 0.05, 1e-5, 0.1, 15, ("resnet50", 1e-4, 0.1, 128, 50)),
])
def test_cnc_presets_carry_app_d(name, m, tau, lr, wd, epochs, erm) -> None:
    params = _composed(name)
    cnc = params.stage2.cnc
    assert (cnc.num_positives, cnc.num_negatives, cnc.temperature, cnc.contrastive_weight, cnc.accumulation,
            cnc.anchor_fraction) == (m, m, tau, 0.75, 32, 1.0)
    assert (params.stage2.method, params.stage2.optimizer, params.stage2.lr, params.stage2.momentum,
            params.stage2.weight_decay, params.stage2.epochs) == ("cnc", "sgd", lr, 0.9, wd, epochs)
    assert (params.model.name, params.erm.lr, params.erm.weight_decay, params.erm.batch_size, params.erm.epochs) == erm
    assert params.groups.method == "cluster" and params.stage2.selection == "best_worst_group"
    assert params.model.pretrained == (params.model.name == "resnet50")


def test_cnc_cmnist_uses_app_d1_data() -> None:
    params = _composed("cnc-cmnist")
    assert (params.data.source, params.data.mnist_val_size, params.bias.foreground.p_corr) == ("mnist", 12000, 0.995)


@pytest.mark.parametrize("name,source", [("wcl-adult", "adult"), ("wcl-compas", "compas")])
def test_wcl_presets_carry_sec_6(name, source) -> None:
    params = _composed(name)
    assert params.data.source == source and params.stage2.method == "wcl"
    assert (params.stage2.wcl.temperature, params.stage2.batch_size) == (0.5, 128)
    assert (params.data.tabular.val_fraction, params.data.tabular.test_fraction) == (0.15, 0.15)
    assert params.model.name == "mlp" and params.model.mlp.batch_norm


# --------------------------------------------------------------------------- apply


def _workspace(tmp_path: Path) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(committed_text("params.yaml"))
    return path


@pytest.mark.slow
def test_apply_keeps_every_byte_but_the_changed_values(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    before = path.read_text()
    assert main(["preset", "apply", "cnc-waterbirds", "--params", str(path)]) == 0
    after = path.read_text()
    assert before.count("\n") == after.count("\n") and after != before
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    expected = flatten(presets.load("cnc-waterbirds").params())
    old = flatten(yaml.safe_load(before))
    assert len(changed) == sum(1 for key, value in expected.items() if old.get(key) != value)
    for a, b in changed:  # same key and comment, another value
        key_a, _, rest_a = a.partition(":")
        key_b, _, rest_b = b.partition(":")
        assert key_a == key_b
        assert rest_a.partition("#")[2] == rest_b.partition("#")[2]
    # the same comments, all of them
    assert [l for l in before.splitlines() if l.lstrip().startswith("#")] == \
           [l for l in after.splitlines() if l.lstrip().startswith("#")]
    params = validate(yaml.safe_load(after))
    assert (params.data.source, params.stage2.cnc.num_positives, params.erm.weight_decay) == ("waterbirds", 17, 1.0)
    assert f"preset cnc-waterbirds version {presets.load('cnc-waterbirds').version} applied" in capsys.readouterr().out
    # applying it again changes nothing
    assert main(["preset", "apply", "cnc-waterbirds", "--params", str(path)]) == 0
    assert path.read_text() == after


def test_apply_appends_a_key_params_yaml_lacks_to_its_section() -> None:
    text = "seed: 0  # a comment\nbias:\n  protocol: auto   # which\n  foreground:\n    p_corr: 0.9\nloss:\n  alpha: 1.0\n"
    out = presets.rewrite(text, {"bias": {"max_uncolourable": 0.02, "foreground": {"p_corr": 0.995}}, "seed": 3})
    assert out == ("seed: 3  # a comment\nbias:\n  protocol: auto   # which\n  foreground:\n    p_corr: 0.995\n"
                   "  max_uncolourable: 0.02\nloss:\n  alpha: 1.0\n")
    flow = "stage2:\n  lr_milestones: []      # none\n  cnc: {temperature: 0.05, init: scratch}\n"
    out = presets.rewrite(flow, {"stage2": {"lr_milestones": [26, 53], "cnc": {"init": "erm"}}})
    assert out == "stage2:\n  lr_milestones: [26, 53]  # none\n  cnc: {temperature: 0.05, init: erm}\n"


def test_replacements_share_one_parse_and_land_in_place_from_the_end_backwards(monkeypatch) -> None:
    """Two values on one flow line, a block list that grows, a DVC null and a scalar below it: all placed by one
    parse (applied last line first); an insertion parses again."""
    from debias.tools.presets import params_file

    text = ("a: {x: 1, y: 22}  # flow\nlist:\n- 1\n- 2\nempty:   # DVC's null\nlast: 5\n")
    parses = []
    load = params_file._load_yaml
    monkeypatch.setattr(params_file, "_load_yaml", lambda *args, **kw: parses.append(kw.get("typ")) or load(*args, **kw))
    out = presets.rewrite(text, {"a": {"x": 100, "y": 2}, "list": [7, 8, 9], "empty": 0.5, "last": 6})
    assert out == "a: {x: 100, y: 2}  # flow\nlist:\n- 7\n- 8\n- 9\nempty: 0.5  # DVC's null\nlast: 6\n"
    assert parses == ["rt"]
    parses.clear()
    out = presets.rewrite(text, {"a": {"x": 3}, "new": {"k": 1}, "last": 7})
    assert out == "a: {x: 3, y: 22}  # flow\nlist:\n- 1\n- 2\nempty:   # DVC's null\nlast: 7\nnew:\n  k: 1\n"
    assert parses == ["rt", "rt", "rt"]  # a's replacement; the insertion; last's replacement after it


@pytest.mark.slow
def test_dry_run_and_print_set_write_nothing(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    before = path.read_bytes()
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(path), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "stage2.cnc.accumulation: 1 -> 32" in out and "dry run: nothing written" in out
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(path), "--print-set"]) == 0
    args = shlex.split(capsys.readouterr().out)
    assert path.read_bytes() == before
    assert args[0::2] == ["-S"] * (len(args) // 2)
    parsed = {a.partition("=")[0]: yaml.safe_load(a.partition("=")[2]) for a in args[1::2]}
    assert parsed == flatten(presets.load("cnc-cmnist").params())
    assert parsed["stage2.cnc.num_positives"] == 32 and parsed["bias.foreground.class_digits"][0] == [0, 1]


def test_a_bad_name_lists_the_presets(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    assert main(["preset", "apply", "cnc-cmnst", "--params", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'cnc-cmnst'" in err and "did you mean 'cnc-cmnist'" in err
    assert all(name in err for name in presets.names())
    for bad in ("_fairkl-bmnist", "../params", ""):
        with pytest.raises(presets.PresetError, match="unknown preset"):
            presets.load(bad)


def test_a_pinned_version_must_match(tmp_path) -> None:
    version = presets.load("cnc-cmnist").version
    assert presets.load(f"cnc-cmnist@{version}").version == version
    with pytest.raises(presets.PresetError, match=f"version {version}, not {version + 5}"):
        presets.load(f"cnc-cmnist@{version + 5}")


@pytest.mark.parametrize("name", ["cnc-cmnist", "cnc-waterbirds", "cnc-celeba"])
def test_cnc_presets_train_stage_two_as_the_released_code(name) -> None:
    """The released train_supervised_contrast.py (the README's commands, --replicate 42): encoder in eval mode, the
    classifier's gradient zeroed once per epoch; the schema defaults are the paper's (train mode, per-step)."""
    preset = presets.load(name)
    cnc = preset.params()["stage2"]["cnc"]
    assert (cnc["encoder_mode"], cnc["head_gradient"]) == ("eval", "epoch_sum")
    assert "train_supervised_contrast.py" in preset.sources()["stage2.cnc.head_gradient"]
    schema = validate({}).stage2.cnc
    assert (schema.encoder_mode, schema.head_gradient) == ("train", "step")


def test_a_failed_validation_writes_nothing(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    before = path.read_bytes()
    stamp = os.stat(path).st_mtime_ns
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(path), "--set", "stage2.cnc.temperature=0"]) == 2
    err = capsys.readouterr().err
    assert "stage2.cnc.temperature" in err and "nothing written" in err
    assert main(["preset", "apply", "fairkl-bffhq", "--params", str(path)]) == 2  # its folder not given
    assert "--set data.imagefolder.root=" in capsys.readouterr().err
    assert path.read_bytes() == before and os.stat(path).st_mtime_ns == stamp
    assert [p.name for p in tmp_path.iterdir()] == ["params.yaml"]  # no temporary file left


def test_show_and_list(capsys) -> None:
    assert main(["preset", "show", "fairkl-bmnist-0.997-eps-supcon"]) == 0
    out = capsys.readouterr().out
    assert "loss.eps_supcon.epsilon = 0.0" in out and "Table 6" in out and "released objective" in out
    assert main(["preset", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == presets.names()


def test_a_malformed_preset_file_is_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(catalog, "PRESET_DIR", tmp_path)
    (tmp_path / "x.yaml").write_text("name: x\nversion: 1\ntitle: t\npaper: p\nobjective: o\n"
                                     "blocks:\n  - params: {seed: 1}\n")
    with pytest.raises(presets.PresetError, match="source"):
        presets.load("x")
    (tmp_path / "y.yaml").write_text("name: y\nversion: 1\ntitle: t\npaper: p\nobjective: o\nextends: y\n"
                                     "blocks:\n  - {source: s, params: {seed: 1}}\n")
    with pytest.raises(presets.PresetError, match="extends itself"):
        presets.load("y")


@pytest.mark.slow
def test_a_key_params_yaml_lacks_lands_after_its_sections_last_value_even_a_wrapped_list() -> None:
    text = committed_text("params.yaml")
    out = presets.rewrite(text, {"bias": {"background": {"probe_key": 1}}})
    lines = out.splitlines()
    at = lines.index("    probe_key: 1")
    # after the colours' last item (a block list of lists, as DVC writes it), inside the section
    assert lines[at - 3:at] == ["    - - 128", "      - 128", "      - 128"]  # the last colour, [128, 128, 128]
    assert yaml.safe_load(out)["bias"]["background"]["probe_key"] == 1
    assert out.replace("    probe_key: 1\n", "", 1) == text
    applied = presets.plan_apply(text, presets.load("cnc-cmnist"), {"bias": {"max_uncolourable": 0.02}})
    assert validate(yaml.safe_load(applied.text)).bias.max_uncolourable == 0.02
    assert applied.changes["bias.max_uncolourable"][1] == 0.02


@pytest.mark.parametrize("name", ["fairkl-ccifar10-0.5pct", "fairkl-ccifar10-1pct", "fairkl-ccifar10-2pct",
                                  "fairkl-ccifar10-5pct", "fairkl-bffhq"])
def test_fairkl_resnet_presets_keep_the_released_imagenet_stem_and_cifar10_statistics(name) -> None:
    """The released main_infonce.py swaps in the 3x3 first convolution for cifar10 / cifar100 only: Corrupted CIFAR-10
    and bFFHQ keep torchvision's 7x7 stride-2 stem and max-pool, normalised with CIFAR-10's mean and std."""
    from torch import nn

    from debias.models import build_model

    params = _composed(name)
    assert (params.model.stem, params.model.normalization) == ("imagenet", "cifar10")
    model = build_model(params.model, 2, 32)  # 32 px, where stem auto would pick the CIFAR stem
    assert model.encoder.net.conv1.kernel_size == (7, 7) and isinstance(model.encoder.net.maxpool, nn.MaxPool2d)
    assert model.encoder.input_mean == (0.4914, 0.4822, 0.4465) and model.encoder.input_std == (0.2023, 0.1994, 0.2010)


def test_presets_without_a_resnet_leave_stem_and_statistics_auto() -> None:
    for name in ("fairkl-bmnist-0.997-eps-supinfonce", "cnc-cmnist", "wcl-adult"):
        params = _composed(name)
        assert (params.model.stem, params.model.normalization) == ("auto", "auto"), name


# --------------------------------------------------------------------------- apply: files that are not plain


def _one_line_error(capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "applied" not in captured.out
    return err


@pytest.mark.slow
def test_apply_writes_through_a_symlinked_params_yaml_to_its_target(tmp_path, capsys) -> None:
    team = tmp_path / "team"
    team.mkdir()
    target = _workspace(team)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    link = workspace / "params.yaml"
    link.symlink_to(Path("..") / "team" / "params.yaml")
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(link)]) == 0
    assert link.is_symlink() and os.readlink(link) == str(Path("..") / "team" / "params.yaml")
    assert validate(yaml.safe_load(target.read_text())).stage2.cnc.num_positives == 32  # the team's file changed
    assert sorted(p.name for p in workspace.iterdir()) == ["params.yaml"]  # no temporary file left beside the link
    assert sorted(p.name for p in team.iterdir()) == ["params.yaml"]


def test_an_alias_the_change_would_break_is_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    lines = path.read_text().split("\n")
    erm = lines.index("erm:")
    first = next(i for i in range(erm, len(lines)) if lines[i].startswith("  lr: "))
    second = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("  lr: "))
    lines[first] = lines[first].replace("lr: ", "lr: &lr ", 1)
    lines[second] = "  lr: *lr"
    path.write_text("\n".join(lines))
    before = path.read_bytes()
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(path)]) == 2  # it sets erm.lr, the anchor
    err = _one_line_error(capsys)
    assert f"&lr (line {first + 1}), *lr (line {second + 1})" in err and "nothing written" in err
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


def test_a_repeated_key_is_one_line_and_writes_nothing(tmp_path, capsys) -> None:
    path = _workspace(tmp_path)
    path.write_text(path.read_text() + "\nseed: 3\n")
    before = path.read_bytes()
    assert main(["preset", "apply", "cnc-cmnist", "--params", str(path)]) == 2
    err = _one_line_error(capsys)
    assert "DuplicateKeyError" in err and 'duplicate key "seed"' in err and "nothing written" in err
    assert path.read_bytes() == before


@pytest.mark.slow
def test_a_read_only_or_immutable_params_yaml_is_one_line_and_left_as_it_was(tmp_path, capsys) -> None:
    import subprocess

    path = _workspace(tmp_path)
    before = path.read_bytes()
    path.chmod(0o444)
    try:
        assert main(["preset", "apply", "cnc-cmnist", "--params", str(path)]) == 2
        assert "is read-only (mode 444)" in _one_line_error(capsys)
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == before
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("chattr +i is not available here (not root, or a file system without it)")
    try:
        assert main(["preset", "apply", "cnc-cmnist", "--params", str(path)]) == 2
        assert "chattr -i" in _one_line_error(capsys)
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["params.yaml"]


@pytest.mark.slow
def test_errors_name_the_file_given_with_params_not_params_yaml(tmp_path, capsys) -> None:
    """--params other.yaml: a repeated key, a section in flow style, a list instead of a mapping, values that do not
    validate and anchors the change would break are each reported against other.yaml."""
    path = tmp_path / "other.yaml"
    base = committed_text("params.yaml")
    lines = base.split("\n")
    erm = lines.index("erm:")
    first = next(i for i in range(erm, len(lines)) if lines[i].startswith("  lr: "))
    second = next(i for i in range(first + 1, len(lines)) if lines[i].startswith("  lr: "))
    aliased = [*lines]
    aliased[first] = aliased[first].replace("lr: ", "lr: &lr ", 1)
    aliased[second] = "  lr: *lr"
    start = lines.index("report:")
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith(" "))
    flow = "\n".join([*lines[:start], "report: {title: debias report}", *lines[end:]])
    cases = {"repeated key": (base + "\nseed: 3\n", []),
             "flow section": (flow, ["--set", "report.dpi=120"]),
             "a list": ("- 1\n- 2\n", []),
             "invalid values": (base, ["--set", "stage2.cnc.temperature=0"]),
             "aliases": ("\n".join(aliased), [])}
    for case, (text, extra) in cases.items():
        path.write_text(text)
        assert main(["preset", "apply", "cnc-cmnist", "--params", str(path), *extra]) == 2, case
        err = capsys.readouterr().err
        assert str(path) in err and "params.yaml" not in err, (case, err)
