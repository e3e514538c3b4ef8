"""Code deps follow the outputs: a change reruns the stages whose outputs that code computes, and no other.

The rule (src/debias/tools/deps.py): a stage depends on the code that computes its outputs; the harness's side
channels (launcher, fork server, stage runner, tracking, memory advice) and the tools are no stage's dep, any other
harness module a stage reaches is; a module brings its packages' ``__init__.py``; a stage depends on
the params schema's modules of the sections it reads, not on every section; the stages after ``download`` import
no data source, and ERM's module is train_erm's alone. Checked three ways: the walk itself on a small tree,
the derived deps of this repository's dvc.yaml, and, for real, ``dvc status`` in a scratch copy of the repository
after a comment is appended to one file of each kind. That the harness cannot change an output byte is
tests/test_forkserver.py's (the same bytes with the fork server on and off).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from debias.core.fingerprint import stage_code_files, stale_code
from debias.tools.deps import HARNESS, SIDE_CHANNELS, code_deps, is_side_channel, params_sections, stage_code_deps
from tests.conftest import REPO, copy_worktree

UPSTREAM_OF_STAGE2 = {"source", "download", "inject_bias", "train_erm", "infer_groups"}

# file changed (a comment appended) -> the stages whose code deps it is. `report` renders the methods' facts
# (which params apply to which method, their display names), so a method's declaration and its params rerun it
# too; its training code and its loss only train_contrastive.
PROBES: dict[str, set[str]] = {
    # the harness: no stage
    "src/debias/harness/launch.py": set(),
    "src/debias/harness/forkserver/server.py": set(),
    "src/debias/harness/forkserver/launcher.py": set(),
    "src/debias/harness/stage.py": set(),
    "src/debias/harness/tracking/runs.py": set(),
    # the progress reporter is a side channel (research reports to debias.core.progress, whose calls return nothing)
    "src/debias/harness/progress.py": set(),
    "src/debias/harness/memory.py": set(),
    # the tools: no stage imports them
    "src/debias/tools/cli.py": set(),
    "src/debias/tools/compare/data.py": set(),
    "src/debias/tools/presets/__init__.py": set(),
    # a stage-2 method, its loss, its params section: train_contrastive (and report), nothing upstream
    "src/debias/training/methods/supcon/train.py": {"train_contrastive"},
    "src/debias/training/methods/supcon/__init__.py": {"train_contrastive", "report"},
    "src/debias/losses/supervised.py": {"train_contrastive"},
    "src/debias/training/methods/cnc/sampling.py": {"train_contrastive"},
    "src/debias/losses/regulariser.py": {"train_contrastive"},
    "src/debias/params/loss.py": {"train_contrastive", "report"},
    "src/debias/params/stage2.py": {"train_contrastive", "report"},
    # a data source: download (and source, which fingerprints the files a source reads), nothing after
    "src/debias/data/sources/mnist.py": {"source", "download"},
    "src/debias/data/sources/base.py": {"source", "download"},
    # ERM: train_erm alone
    "src/debias/training/erm.py": {"train_erm"},
}


def stages_by_file(dvc_yaml: Path) -> dict[str, set[str]]:
    """Each code file -> the stages of ``dvc_yaml`` that declare it as their code (``meta: code``) or a dep."""
    found: dict[str, set[str]] = {}
    stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
    for name, stage in stages.items():
        for dep in [*stage.get("deps", []), *stage_code_files(stages, name)]:
            found.setdefault(dep, set()).add(name)
    return found


# --------------------------------------------------------------------------- the walk on a small tree


def write_tree(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)


def test_harness_files_are_no_dep_but_what_they_call_is(tmp_path: Path) -> None:
    """The runner (harness) is not listed, the headline code it calls is; the launcher named by ``-m`` is not."""
    write_tree(tmp_path, {
        "src/debias/__init__.py": "",
        "src/debias/harness/launch.py": "def f():\n    from debias.harness import forkserver\n",
        "src/debias/harness/forkserver/__init__.py": "from debias.harness.forkserver import server\n",
        "src/debias/harness/forkserver/server.py": "import os\n",
        "src/debias/harness/stage.py": "def main():\n    from debias.core.headline import write\n    from debias.harness.tracking import run\n",
        "src/debias/core/headline.py": "from debias.core import io\n",
        "src/debias/core/io.py": "",
        "src/debias/harness/tracking/__init__.py": "from debias.harness.tracking.runs import run\n",
        "src/debias/harness/tracking/runs.py": "",
        "src/debias/training/__init__.py": "",
        "src/debias/harness/memory.py": "from debias.core import io\n",
        "src/debias/training/erm.py": "from debias.harness.memory import check\n",
        "pipeline/stage.py": "from debias.harness.stage import main\nfrom debias.training.erm import fit\n",
    })
    deps = code_deps("python -m debias.harness.launch pipeline/stage.py", tmp_path)
    assert deps == ["pipeline/stage.py", "src/debias/__init__.py", "src/debias/core/headline.py", "src/debias/core/io.py",
                    "src/debias/training/__init__.py", "src/debias/training/erm.py"]


PARAMS_TREE = {
    "src/debias/__init__.py": "",
    "src/debias/core/errors.py": "",
    "src/debias/params/__init__.py": ("from debias.params.base import Section\nfrom debias.params.optim import Optim\n"
                                      "from debias.params.loss import Loss, TAU\nfrom debias.params.stage2 import S2\n"
                                      "from debias.params.root import Params, load\n"),
    "src/debias/params/base.py": "from debias.core.errors import E\nclass Section: ...\n",
    "src/debias/params/optim.py": "from debias.params.base import Section\nclass Optim(Section): ...\n",
    "src/debias/params/loss.py": "from debias.params.base import Section\nTAU = 1\nclass Loss(Section): ...\n",
    "src/debias/params/stage2.py": "from debias.params.optim import Optim\nclass S2(Optim): ...\n",
    "src/debias/params/root.py": ("from debias.params.base import Section\nfrom debias.params.loss import Loss\n"
                                  "from debias.params.optim import Optim\nfrom debias.params.stage2 import S2\n"
                                  "class Params(Section):\n    seed: int = 0\n    erm: Optim\n    loss: Loss\n"
                                  "    stage2: S2\n"),
    "pipeline/a.py": "from debias.params import Params\n",
    "pipeline/b.py": "from debias.params import Params, TAU\n",
}
COMMON = ["src/debias/__init__.py", "src/debias/core/errors.py", "src/debias/params/__init__.py",
          "src/debias/params/base.py", "src/debias/params/root.py"]


def test_a_stage_depends_on_the_params_sections_it_reads(tmp_path: Path) -> None:
    """The root composes every section, yet a stage lists only the sections it reads (with what they import) and
    those whose names its code imports; the section of a key comes from the fields of ``Params``."""
    write_tree(tmp_path, PARAMS_TREE)
    assert params_sections(tmp_path) == {"erm": "debias.params.optim", "loss": "debias.params.loss",
                                         "stage2": "debias.params.stage2"}
    assert code_deps("python pipeline/a.py", tmp_path) == sorted(["pipeline/a.py", *COMMON])
    assert code_deps("python pipeline/a.py", tmp_path, ["debias.params.stage2"]) == sorted(
        ["pipeline/a.py", *COMMON, "src/debias/params/optim.py", "src/debias/params/stage2.py"])
    assert code_deps("python pipeline/b.py", tmp_path) == sorted(  # TAU, imported by name, is loss's
        ["pipeline/b.py", *COMMON, "src/debias/params/loss.py"])
    reads_all = {"cmd": "python pipeline/a.py", "params": ["seed"], "deps": ["params.yaml"]}
    assert {Path(p).name for p in stage_code_deps(reads_all, tmp_path)} >= {"loss.py", "optim.py", "stage2.py"}
    assert stage_code_deps({"cmd": "python pipeline/a.py", "params": ["seed", "erm"]}, tmp_path) == sorted(
        ["pipeline/a.py", *COMMON, "src/debias/params/optim.py"])


def test_a_harness_module_that_is_no_side_channel_is_a_dep_and_packages_come_with_their_modules(tmp_path: Path) -> None:
    """A harness module not in SIDE_CHANNELS (here ``helpers``) is a dep of the stage whose code imports it, with the
    harness package's ``__init__`` left out (a side channel); a module found through DISCOVERED brings its parent
    packages' ``__init__.py``, which importing it runs."""
    write_tree(tmp_path, {
        "src/debias/__init__.py": "",
        "src/debias/harness/__init__.py": "",
        "src/debias/harness/helpers.py": "import sys\n",
        "src/debias/evaluation/__init__.py": "",
        "src/debias/evaluation/variants.py": "from debias.harness import helpers\n",
        "src/debias/evaluation/probes/__init__.py": "",
        "src/debias/evaluation/probes/logistic/__init__.py": "",
        "pipeline/probe.py": "from debias.evaluation import variants\n",
    })
    assert code_deps("python pipeline/probe.py", tmp_path) == [
        "pipeline/probe.py", "src/debias/__init__.py", "src/debias/evaluation/__init__.py",
        "src/debias/evaluation/probes/__init__.py", "src/debias/evaluation/probes/logistic/__init__.py",
        "src/debias/evaluation/variants.py", "src/debias/harness/helpers.py"]


def test_every_side_channel_is_a_harness_module_and_no_dep() -> None:
    """Each SIDE_CHANNELS entry exists under a HARNESS package, and dvc.yaml lists none of their files."""
    for name in SIDE_CHANNELS:
        base = REPO / "src" / Path(*name.split("."))
        assert base.with_suffix(".py").is_file() or (base / "__init__.py").is_file(), name
        assert any(name == h or name.startswith(h + ".") for h in HARNESS), name
    declared = set(stages_by_file(REPO / "dvc.yaml"))
    channelled = sorted(dep for dep in declared if dep.startswith("src/") and is_side_channel(
        ".".join(Path(dep).relative_to("src").with_suffix("").parts).removesuffix(".__init__")))
    assert not channelled, channelled


# --------------------------------------------------------------------------- this repository's dvc.yaml


@pytest.mark.parametrize("path", sorted(PROBES))
def test_dvc_yaml_names_each_file_in_the_stages_whose_outputs_it_computes(path: str) -> None:
    declared = stages_by_file(REPO / "dvc.yaml").get(path, set())
    assert (REPO / path).is_file(), path
    assert declared == PROBES[path], f"{path}: deps of {sorted(declared)}, expected {sorted(PROBES[path])}"


# --------------------------------------------------------------------------- code fingerprints


def fingerprinted_tree(root: Path) -> None:
    """A repository of one stage ``s`` whose code is src/a.py, fingerprinted as ``source`` does."""
    from debias.core.fingerprint import code_fingerprints
    from debias.core.io import save_json

    write_tree(root, {"src/a.py": "x = 1\n", "src/b.py": "y = 1\n", "dvc.yaml": yaml.safe_dump({"stages": {
        "s": {"cmd": "c", "deps": ["data/code/s.json", "data/in"], "meta": {"code": ["src/a.py"]}},
        "t": {"cmd": "c", "deps": ["data/in"], "meta": {"code": ["src/b.py"]}}}})})
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    for name, document in code_fingerprints(stages, root).items():
        save_json(root / "data" / "code" / f"{name}.json", document)


def test_source_fingerprints_exactly_the_stages_that_depend_on_their_fingerprint(tmp_path: Path) -> None:
    import hashlib

    from debias.core.fingerprint import code_fingerprints

    fingerprinted_tree(tmp_path)
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    assert code_fingerprints(stages, tmp_path) == {"s": {"files": {"src/a.py": hashlib.md5(b"x = 1\n").hexdigest()}}}
    (tmp_path / "src/b.py").write_text("y = 2\n")  # another stage's code: s's document is the same
    assert code_fingerprints(stages, tmp_path)["s"] == json.loads((tmp_path / "data/code/s.json").read_text())
    (tmp_path / "src/a.py").unlink()
    with pytest.raises(FileNotFoundError, match="src/a.py, listed as code in dvc.yaml"):
        code_fingerprints(stages, tmp_path)


def test_a_stage_under_dvc_whose_code_changed_after_source_ran_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`dvc repro -s s` skips `source`: the stage itself finds its code is not the fingerprinted one, names the
    file and the command that fixes it; run by hand (no DVC), or with its code as fingerprinted, it goes on."""
    from debias.core.errors import StaleInputError
    from debias.harness.stage import check_code_fingerprint

    fingerprinted_tree(tmp_path)
    monkeypatch.setenv("DVC_STAGE", "s")
    check_code_fingerprint("s", tmp_path)
    (tmp_path / "src/a.py").write_text("x = 2\n")
    with pytest.raises(StaleInputError, match=r"s's code changed since the `source` stage fingerprinted it into "
                                              r"data/code/s.json \(src/a.py\).*run `dvc repro s`"):
        check_code_fingerprint("s", tmp_path)
    check_code_fingerprint("t", tmp_path)  # no fingerprint of its own: nothing to hold it to
    monkeypatch.delenv("DVC_STAGE")
    check_code_fingerprint("s", tmp_path)


def test_deps_write_lists_the_code_in_meta_and_depends_on_the_fingerprint(tmp_path: Path) -> None:
    """`debias deps --write` on a stage that lists its code files as deps: they move to ``meta: code`` and the
    stage depends on data/code/<stage>.json instead (data deps kept); an always-changed stage keeps no code dep;
    a second write changes nothing."""
    from debias.tools.deps import stage_differences, write_deps

    write_tree(tmp_path, {"src/debias/__init__.py": "", "src/debias/a.py": "",
                          "pipeline/s.py": "from debias import a\n", "pipeline/source.py": "",
                          "dvc.yaml": "stages:\n  source:\n    cmd: python pipeline/source.py\n    always_changed: true\n"
                                      "    deps:\n      - pipeline/source.py\n"
                                      "  s:\n    cmd: python pipeline/s.py\n    deps:\n      - pipeline/s.py\n"
                                      "      - data/in  # kept\n"})
    assert write_deps(tmp_path / "dvc.yaml") == ["source", "s"]
    stages = yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]
    assert stages["s"]["deps"] == ["data/code/s.json", "data/in"]
    assert stages["s"]["meta"]["code"] == ["pipeline/s.py", "src/debias/__init__.py", "src/debias/a.py"]
    assert "deps" not in stages["source"] and stages["source"]["meta"]["code"] == ["pipeline/source.py"]
    assert write_deps(tmp_path / "dvc.yaml") == [] and stage_differences(tmp_path / "dvc.yaml") == {}
    (tmp_path / "src/debias/b.py").write_text("")
    (tmp_path / "pipeline/s.py").write_text("from debias import a, b\n")
    assert stage_differences(tmp_path / "dvc.yaml") == {"s": (["src/debias/b.py"], [])}


# --------------------------------------------------------------------------- for real: dvc status


def placeholder_outputs(clone: Path) -> None:
    """An empty stand-in for every declared output not yet written (a file, or a folder holding one), so that
    `dvc commit` records a dvc.lock without running the pipeline."""
    for stage in yaml.safe_load((clone / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []) or []:
                path = clone / (next(iter(entry)) if isinstance(entry, dict) else entry)
                if path.exists():
                    continue
                if path.suffix:
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text("placeholder\n")
                else:
                    path.mkdir(parents=True, exist_ok=True)
                    (path / "placeholder").write_text("placeholder\n")


def dvc(clone: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DVC_", "MLFLOW_"))}
    env.update(DEBIAS_TRACKING="off")
    done = subprocess.run(["dvc", *args], cwd=clone, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"dvc {' '.join(args)}:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def code_fingerprints_in(clone: Path) -> dict[str, dict]:
    """The code fingerprints ``source`` wrote in ``clone``: stage -> its data/code/<stage>.json."""
    return {path.stem: json.loads(path.read_text()) for path in (clone / "data" / "code").glob("*.json")}


@pytest.mark.slow
def test_dvc_status_names_only_the_stages_whose_outputs_the_changed_code_computes(tmp_path: Path) -> None:
    """A scratch copy where `source` ran and `dvc commit` recorded a dvc.lock over placeholder outputs; a comment
    appended to one file of each kind and a value of the ``loss`` section changed; `dvc repro source` then
    rewrites exactly the code fingerprints of the stages whose code changed, and one `dvc status --json` names
    those stages (each by its fingerprint) and the stage reading ``loss``, no other."""
    clone = copy_worktree(tmp_path / "repo")
    for command in (["git", "init", "-q"], ["git", "add", "-A"],
                    ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "scratch"]):
        subprocess.run(command, cwd=clone, check=True, capture_output=True)
    dvc(clone, "repro", "source")
    placeholder_outputs(clone)
    dvc(clone, "commit", "-f")
    assert set(json.loads(dvc(clone, "status", "--json"))) <= {"source"}  # `source` is always changed
    before = code_fingerprints_in(clone)

    for path in PROBES:
        with open(clone / path, "a", encoding="utf-8") as handle:
            handle.write("# a comment\n")
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["loss"]["epsilon"] = params["loss"]["epsilon"] / 2 + 0.01
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    dvc(clone, "repro", "source")
    after = code_fingerprints_in(clone)
    status = json.loads(dvc(clone, "status", "--json"))

    named: dict[str, set[str]] = {path: set() for path in PROBES}
    for stage in after:
        for path in stale_code(before[stage], after[stage]):
            named.setdefault(path, set()).add(stage)
    own = stage_code_files(yaml.safe_load((clone / "dvc.yaml").read_text())["stages"], "source")
    for path in PROBES:  # source runs every time: its own code is listed in its meta, not fingerprinted
        if path in own:
            named[path].add("source")
    fingerprints, params_changed, others = set(), set(), set()
    for stage, entries in status.items():
        for entry in entries:
            for dep, change in (entry.get("changed deps", {}) if isinstance(entry, dict) else {}).items():
                if isinstance(change, dict):  # params.yaml's sections the stage reads
                    params_changed.add(stage)
                elif dep == f"data/code/{stage}.json":
                    fingerprints.add(stage)
                else:
                    others.add((stage, dep))
    assert {path: stages for path, stages in named.items() if path in PROBES} == PROBES
    assert set(named) == set(PROBES)
    assert fingerprints == set().union(*PROBES.values()) - {"source"}
    assert not set().union(*(named[p] for p in PROBES if "train_contrastive" in PROBES[p])) & UPSTREAM_OF_STAGE2
    assert params_changed == {"train_contrastive"}  # the stage that reads `loss`
    assert others == {("report", "params.yaml")}  # the report renders every param


# --------------------------------------------------------------------------- the harness changes no value


def test_the_memory_check_leaves_the_model_and_every_random_stream_as_they_were() -> None:
    """The memory check (harness) probes a copy of the real model before training: the model's weights and
    BatchNorm statistics and torch's random state after it are those before, bit for bit, so training computes
    the same with the check on or off (DEBIAS_MEMORY_CHECK)."""
    import torch
    from torch import nn

    from debias.harness.memory import profile

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.body = nn.Sequential(nn.Linear(12, 8), nn.BatchNorm1d(8), nn.Dropout(0.5), nn.Linear(8, 3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.body(x.float().flatten(1) + torch.rand(x.shape[0], 12))  # draws from the global stream

    torch.manual_seed(0)
    model = Net().train()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    rng = torch.get_rng_state()
    prof = profile(model, (3, 4), torch.device("cpu"))
    assert prof.weight_bytes == sum(p.numel() * 4 for p in model.parameters())  # it did probe the model
    assert torch.equal(torch.get_rng_state(), rng)
    after = model.state_dict()
    assert all(torch.equal(after[name], value) for name, value in before.items())
    assert model.training


@pytest.mark.slow
def test_tracking_on_or_off_the_stages_write_the_same_bytes(tmp_path, mlflow_template) -> None:
    """Tracking is harness: with every stage logging to a real MLflow store, or with tracking off, source ->
    train_erm write the same data, models and metrics, byte for byte (only the run records differ)."""
    import hashlib
    import shutil

    from tests.faults.conftest import make_workspace, run_stages_in_one_process

    stages = ("source", "download", "inject_bias", "train_erm")
    outputs = {}
    for mode in ("off", "required"):
        workspace = make_workspace(tmp_path / mode)
        env = {"DEBIAS_TRACKING": mode}
        if mode == "required":
            shutil.copy(mlflow_template, workspace / "mlflow.db")
            env["MLFLOW_TRACKING_URI"] = f"sqlite:///{workspace / 'mlflow.db'}"
        run_stages_in_one_process(workspace, stages, **env)
        outputs[mode] = {str(path.relative_to(workspace)): hashlib.sha256(path.read_bytes()).hexdigest()
                         for folder in ("data", "models", "reports/metrics") for path in (workspace / folder).rglob("*")
                         if path.is_file()}
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'required' / 'mlflow.db'}")
    logged = client.search_runs([e.experiment_id for e in client.search_experiments()])
    assert len(logged) >= len(stages) - 1  # the tracked side really logged its stage runs
    assert len(outputs["off"]) > 10 and outputs["off"] == outputs["required"]


@pytest.mark.parametrize("under_dvc", [False, True])
def test_source_without_the_listed_code_writes_no_fingerprint_and_under_dvc_names_the_file(
        tmp_path: Path, under_dvc: bool) -> None:
    """`source` in a folder whose dvc.yaml lists code that is not there (stage commands beside an installed
    package): run by hand it writes the data fingerprint and no code fingerprint; under DVC (``DVC_STAGE`` set) it
    stops with exit 2 naming the missing file and `debias deps --write`."""
    from tests.conftest import committed_text

    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "source": {"cmd": "c", "always_changed": True},
        "s": {"cmd": "c", "deps": ["data/code/s.json"], "meta": {"code": ["src/missing.py"]}}}}))
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    if under_dvc:
        env["DVC_STAGE"] = "source"
    done = subprocess.run([sys.executable, str(REPO / "pipeline/source.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True)
    assert not (tmp_path / "data/code").exists()
    if under_dvc:
        assert done.returncode == 2, done.stderr
        assert "src/missing.py, listed as code in dvc.yaml, does not exist: run `debias deps --write`" in done.stderr
    else:
        assert done.returncode == 0, done.stderr
        assert (tmp_path / "data/source.json").is_file()
