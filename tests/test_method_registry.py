"""One home per stage-2 method: a method registered from a module outside the package (no file of the repository
edited) validates, applies, plans its memory, trains and writes stage 2's outputs; no method's name is spread over
the code (docs/extending.md)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from debias.params import ParamsError
from debias.schema import validate
from debias.training.methods.registry import METHODS, MethodSpec, discover, register_method
from tests.conftest import REPO, committed_text



def doc_block(marker: str, language: str = "python") -> str:
    """The ``language`` block after ``<!-- marker -->`` in docs/extending.md (the page's example is what runs)."""
    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    return text.split(f"<!-- {marker} -->", 1)[1].split(f"```{language}\n", 1)[1].split("```", 1)[0]


def write_walk_through(folder: Path) -> None:
    """docs/extending.md's focal-loss method as it says to lay it out: the package ``focal`` (its declaration and
    its training code) under ``folder``, and ``folder/params.yaml``, the committed one with the page's
    ``stage2.focal`` block added, run as ``-S stage2.method=focal`` with a tiny stage 2."""
    (folder / "focal").mkdir()
    (folder / "focal" / "__init__.py").write_text(doc_block("focal/__init__.py"))
    (folder / "focal" / "train.py").write_text(doc_block("focal/train.py"))
    text = committed_text("params.yaml")
    block = doc_block("params.yaml: stage2", "yaml")
    assert "\nstage2:\n" in text and block.startswith("  focal:\n")
    params = yaml.safe_load(text.replace("\nstage2:\n", "\nstage2:\n" + block, 1))
    params["stage2"].update(method="focal", optimizer="adam", lr=3e-3, batch_size=32, epochs=2)
    params["stage2"]["focal"]["gamma"] = 1.5
    (folder / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


RUN = '''
import json, sys
import torch
from debias.harness.memory import out_of_memory_advice
from debias.harness.stage import installed
from debias.harness.tracking import StageRun
from debias.schema import load_params, validate
from debias.schema.applicability import RunContext, applies
from debias.schema.sources import SOURCES
from debias.training.methods import METHODS, train_stage2
from debias.training.outputs import StageOutputs
from tests.test_training import tiny_split
import focal

from pathlib import Path
out = Path(sys.argv[1])
params = load_params("params.yaml")
train, val = tiny_split(96), tiny_split(48, seed=1)
outputs = StageOutputs(model=out / "stage2.pt", embeddings_dir=out / "stage2", metrics=out / "stage2_train.json",
                       curves=out / "curves.csv", resume=out / "resume.pt")
with installed():  # the memory check and progress reporter, as the stage harness runs a stage's body
    train_stage2(params, {"train": train, "val": val, "test": val}, train.a.clone(), train.a != train.y, None,
                 StageRun(None, None), outputs)
cnc = validate({"stage2": {"method": "cnc"}})
print(json.dumps({
    "registered": sorted(METHODS), "plans": focal.PLANS, "gamma": params.stage2.focal.gamma,
    "default_gamma": cnc.stage2.focal.gamma, "source": SOURCES.get("stage2.focal.gamma"),
    "applies": [applies("stage2.focal.gamma", RunContext(params)), applies("stage2.focal.gamma", RunContext(cnc)),
                applies("stage2.cnc.temperature", RunContext(params)), applies("loss.temperature", RunContext(params)),
                applies("stage2.head.max_iter", RunContext(params))],
    "advice": out_of_memory_advice("train_contrastive", params),
}))
'''


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src"), str(REPO)]), DEBIAS_TRACKING="off",
               DEBIAS_THREADS="1", **extra)
    return env


@pytest.mark.slow
def test_a_method_from_a_temporary_package_and_its_params_section_trains_a_tiny_stage_2(tmp_path) -> None:
    """docs/extending.md's walk-through, block by block: a package outside the repository (no file of it edited) and
    one params.yaml section make a method that validates, applies, plans its memory, trains and writes stage 2's
    outputs."""
    write_walk_through(tmp_path)
    (tmp_path / "run.py").write_text(RUN)
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "run.py", str(out)], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path, DEBIAS_METHODS="focal"), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    facts = json.loads(done.stdout.strip().splitlines()[-1])
    assert "focal" in facts["registered"] and "cnc" in facts["registered"]
    assert facts["gamma"] == 1.5 and facts["default_gamma"] == 2.0  # stage2.focal is a section of the schema
    assert facts["source"] == "paper: Lin et al. 2017, Sec. 5.1: gamma = 2"
    assert facts["plans"] == [32]  # its own memory plan was asked, once, before training
    assert facts["applies"] == [True, False, False, True, False]  # own section, not CNC's, reads loss.*, CE head
    assert facts["advice"].startswith("lower stage2.batch_size (now 32), stage2.focal.gamma (now 1.5), "
                                      "stage2.eval_batch_size")
    info = json.loads((out / "stage2_train_info.json").read_text())
    assert info == {"method": "focal", "focal_gamma": 1.5}
    metrics = json.loads((out / "stage2_train.json").read_text())
    assert metrics["method"] == "focal"
    assert (out / "stage2.pt").stat().st_size > 0


@pytest.mark.slow
def test_the_walk_through_without_its_params_section_is_refused_naming_it(tmp_path) -> None:
    write_walk_through(tmp_path)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    del params["stage2"]["focal"]
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    done = subprocess.run([sys.executable, "-m", "debias.tools.cli", "check-params", "params.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(tmp_path, DEBIAS_METHODS="focal"), timeout=300)
    assert done.returncode == 2 and "params.yaml has no stage2.focal: the params section of a registered stage-2 " \
                                    "method, which would run on the schema's defaults unseen" in done.stderr, done.stderr


@pytest.mark.slow
def test_a_method_outside_the_registry_is_refused_naming_the_registered_ones(tmp_path) -> None:
    code = "from debias.schema import validate; validate({'stage2': {'method': 'focal', 'focal': {'gamma': 1.0}}})"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120)  # no DEBIAS_METHODS: focal is not registered
    assert done.returncode != 0
    assert "stage2.method = 'focal' is not allowed; allowed: 'cnc', " in done.stderr
    assert "unknown parameter 'stage2.focal'" in done.stderr
    done = subprocess.run([sys.executable, "-c", "from debias.schema import validate; validate({})"], cwd=tmp_path,
                          capture_output=True, text=True, env=_env(tmp_path, DEBIAS_METHODS="no_such_module"),
                          timeout=120)
    assert done.returncode != 0 and "DEBIAS_METHODS names 'no_such_module', which cannot be imported" in done.stderr


def test_a_declaration_must_name_the_source_of_every_default() -> None:
    from debias.training.methods.lff import LfFParams

    discover()  # cnc registered, as in any process that validated params
    with pytest.raises(ValueError, match=r"no source for stage2\.lff2\.ema_alpha"):
        register_method("lff2", "x:y", section="lff2", params=LfFParams, sources={"q": "paper: LfF"}, memory_plan=None)
    with pytest.raises(ValueError, match=r"stage2\.lff is already lff's"):
        register_method("lff2", "x:y", section="lff", params=LfFParams, sources={"q": "", "ema_alpha": ""},
                        memory_plan=None)
    with pytest.raises(ValueError, match="registered twice"):
        register_method("cnc", "x:y", memory_plan=None)
    with pytest.raises(ValueError, match=r"stage-2 method 'lff2' declares no memory_plan; allowed: a function"):
        register_method("lff2", "x:y")  # a forgotten plan is refused, not estimated as ERM's
    assert "lff2" not in METHODS


def test_every_shipped_method_is_declared_in_its_own_package() -> None:
    package = REPO / "src" / "debias" / "training" / "methods"
    for name, spec in discover().items():
        assert isinstance(spec, MethodSpec) and spec.display
        module = spec.setup.partition(":")[0] if isinstance(spec.setup, str) else spec.setup.__module__
        assert module.startswith("debias.training.methods.") and module.endswith(".train"), (name, module)
        assert (package / module.split(".")[-2] / "__init__.py").is_file()
        if spec.section is not None:
            assert validate({"stage2": {"method": name}}).stage2.method == name


def _modules_quoting(names: set[str]) -> dict[str, set[str]]:
    """For each name, the modules of src/ where it is a whole string literal (``"cnc"``; not ``"stage2.cnc."``)."""
    found: dict[str, set[str]] = {name: set() for name in names}
    for path in (REPO / "src").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in found:
                found[node.value].add(str(path.relative_to(REPO)))
    return found


def test_a_methods_name_is_quoted_in_at_most_two_modules() -> None:
    # erm is also stage 1's name (train_erm, erm.*, models/erm.pt): every consumer of stage 1 names it
    modules = _modules_quoting(set(discover()) - {"erm"})
    spread = {name: sorted(where) for name, where in modules.items() if len(where) > 2}
    assert not spread, spread
    assert modules["cnc"] >= {"src/debias/training/methods/cnc/__init__.py"}  # the walk finds its declaration


@pytest.mark.slow
def test_no_chain_of_method_names_outside_the_method_packages() -> None:
    """No ``stage2.method == '<name>'`` / ``method in (...)`` comparison outside the method packages (erm is also
    stage 1's model, whose checkpoints the probe tells apart by that name)."""
    names = set(discover())
    methods = REPO / "src" / "debias" / "training" / "methods"
    offenders = []
    for path in [*(REPO / "src").rglob("*.py"), *(REPO / "pipeline").glob("*.py")]:
        if methods in path.parents and path.parent != methods:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Compare):
                literals = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names - {"erm"}]
                on_method = [n for n in ast.walk(node) if "method" in getattr(n, "id", getattr(n, "attr", ""))]
                if literals and on_method:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert not offenders, offenders


def test_the_walk_through_names_the_registration_a_researcher_uses() -> None:
    docs = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    assert "DEBIAS_METHODS=focal " in docs and "debias deps --write" in docs
    assert 'register_method("focal", f"{__name__}.train:setup"' in doc_block("focal/__init__.py")
