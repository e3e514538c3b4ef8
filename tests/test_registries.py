"""One home per group-inference method and per probe variant, as per stage-2 method (tests/test_method_registry.py):
a method registered from a module outside the package (no file of the repository edited) validates, applies, has
its sources and runs; no name is spread over the code (docs/extending.md)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from debias.groups.registry import GroupMethodSpec, discover as discover_group_methods, register_group_method
from debias.schema import validate
from tests.conftest import REPO
from tests.test_method_registry import _modules_quoting

GROUP_METHODS = discover_group_methods()  # every declaration imported


def doc_block(marker: str) -> str:
    """The python block after ``<!-- marker -->`` in docs/extending.md (the page's example is what the test runs)."""
    text = (REPO / "docs" / "extending.md").read_text(encoding="utf-8")
    return text.split(f"<!-- {marker} -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]


GROUP_RUN = '''
import json
import torch
from debias.data.store import BiasedSplit
from debias.groups import METHODS, groups_report, infer_groups
from debias.schema import validate
from debias.schema.applicability import RunContext, applies
from debias.schema.sources import SOURCES

y = torch.tensor([0, 1, 2, 0, 1, 2, 0])
train = BiasedSplit(torch.zeros(7, 3, 1, 1, dtype=torch.uint8), y, y.clone(), torch.ones(7, dtype=torch.bool), 3, 3)
params = validate({"groups": {"method": "parity", "parity": {"modulus": 3}}})
result = infer_groups(params.groups.method, train, torch.zeros(7, 2), torch.zeros(7, 3), params.groups, 0)
report = groups_report(params.groups.method, result, train)
pred = validate({})
print(json.dumps({
    "registered": sorted(METHODS), "label": result.inferred_label.tolist(), "group": result.inferred_group.tolist(),
    "y": result.y.tolist(), "method": report["method"], "minority": report["n_inferred_minority"],
    "default_modulus": pred.groups.parity.modulus, "source": SOURCES.get("groups.parity.modulus"),
    "applies": [applies("groups.parity.modulus", RunContext(params)),
                applies("groups.parity.modulus", RunContext(pred)), applies("groups.cluster.n_init", RunContext(params))],
}))
'''


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
    env.update(PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO / "src"), str(REPO)]), DEBIAS_TRACKING="off",
               DEBIAS_THREADS="1", **extra)
    return env


def _run(tmp_path: Path, module: str, text: str, run: str) -> dict:
    (tmp_path / f"{module}.py").write_text(text)
    (tmp_path / "run.py").write_text(run)
    done = subprocess.run([sys.executable, "run.py"], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path, DEBIAS_METHODS=module), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_group_method_from_a_temporary_module_infers_groups(tmp_path) -> None:
    facts = _run(tmp_path, "parity_groups", doc_block("parity_groups.py"), GROUP_RUN)
    assert facts["registered"] == ["cluster", "parity", "pred", "soft", "true"]
    assert facts["label"] == [0, 1, 2, 0, 1, 2, 0]  # index mod 3, the module's own rule
    assert facts["group"] == [0, 4, 8, 0, 4, 8, 0] and facts["y"] == [0, 1, 2, 0, 1, 2, 0]
    assert facts["method"] == "parity" and facts["minority"] == 0
    assert facts["default_modulus"] == 2  # groups.parity is a section of the schema, with its default
    assert facts["source"] == "ours: a rule to show the shape (default 2)"
    assert facts["applies"] == [True, False, False]  # its own section, not under pred; cluster's not under it


def test_a_group_method_outside_the_registry_is_refused_naming_the_registered_ones(tmp_path) -> None:
    code = "from debias.schema import validate; validate({'groups': {'method': 'parity'}})"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120)
    assert done.returncode != 0
    assert "groups.method = 'parity' is not allowed; allowed: 'pred', 'cluster', 'soft' or 'true'" in done.stderr


def test_a_group_declaration_must_name_the_source_of_every_default() -> None:
    from debias.groups.methods.cluster import ClusterParams

    with pytest.raises(ValueError, match=r"no source for groups\.cluster2\.algorithm \(and 5 more\)"):
        register_group_method("cluster2", "x:y", section="cluster2", params=ClusterParams, sources={})
    with pytest.raises(ValueError, match=r"groups\.cluster is already cluster's"):
        register_group_method("cluster2", "x:y", section="cluster", params=ClusterParams, sources={})
    with pytest.raises(ValueError, match="registered twice"):
        register_group_method("pred", "x:y")
    assert "cluster2" not in GROUP_METHODS


def test_every_shipped_group_method_is_declared_in_its_own_module() -> None:
    package = REPO / "src" / "debias" / "groups" / "methods"
    assert {path.stem for path in package.glob("*.py")} - {"__init__"} == set(GROUP_METHODS)
    for name, spec in GROUP_METHODS.items():
        assert isinstance(spec, GroupMethodSpec) and spec.display
        assert validate({"groups": {"method": name}}).groups.method == name
    assert [name for name, spec in GROUP_METHODS.items() if spec.needs_attribute] == ["true"]


def test_a_group_methods_name_is_quoted_in_at_most_two_modules() -> None:
    # true is also the word environment variables and YAML spell a boolean with (MLFLOW_DISABLE_TELEMETRY=true)
    modules = _modules_quoting(set(GROUP_METHODS) - {"true"})
    spread = {name: sorted(where) for name, where in modules.items() if len(where) > 2}
    assert not spread, spread
    assert modules["pred"] >= {"src/debias/groups/methods/pred.py"}  # the walk finds its declaration


def _compares_a_name_with(path: Path, names: set[str], attribute: str) -> list[int]:
    """Lines of ``path`` comparing one of ``names`` with something called ``attribute`` (``x.method == "pred"``)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            literals = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in names]
            named = [n for n in ast.walk(node) if attribute in getattr(n, "id", getattr(n, "attr", ""))]
            if literals and named:
                lines.append(node.lineno)
    return lines


def test_no_chain_of_group_method_names_outside_their_modules() -> None:
    methods = REPO / "src" / "debias" / "groups" / "methods"
    offenders = [f"{path.relative_to(REPO)}:{line}" for path in [*(REPO / "src").rglob("*.py"),
                                                                *(REPO / "pipeline").glob("*.py")]
                 if path.parent != methods for line in _compares_a_name_with(path, set(GROUP_METHODS), "method")]
    assert not offenders, offenders


PROBE_MODULE = '''
import torch
from pydantic import Field

from debias.evaluation.variants import register_probe
from debias.params import Section


class NearestParams(Section):
    shrink: float = Field(0.0, ge=0, le=1)


class NearestMean:
    """Class of the nearest class mean (means shrunk towards their average by ``shrink``)."""

    def __init__(self, means):
        self.means = means

    def predict(self, x):
        return torch.cdist(x.double(), self.means).argmin(1)


def nearest_fit(features, splits, params, seed):
    train = splits["val"]
    means = torch.stack([features["val"][train.y == c].double().mean(0) for c in range(train.n_classes)])
    means = (1 - params.nearest.shrink) * means + params.nearest.shrink * means.mean(0)
    model = NearestMean(means)
    test = model.predict(features["test"])
    report = {"test_accuracy": float((test == splits["test"].y).double().mean()), "test_predictions": test.tolist()}
    return report, model, torch.arange(len(train))


register_probe("nearest", lambda params: ("val", "test"), fit=nearest_fit, display="nearest class mean",
               section="nearest", params=NearestParams, sources={"shrink": "ours: a test's rule (default 0)"},
               reads=("probe.standardize",))
'''

PROBE_RUN = '''
import json
import torch
from debias.data.store import BiasedSplit
from debias.evaluation.probe import probe_report, probe_splits
from debias.evaluation.variants import PROBES
from debias.schema import validate
from debias.schema.applicability import RunContext, applies
from debias.schema.sources import SOURCES

def split(y):
    x = torch.zeros(len(y), 3, 1, 1, dtype=torch.uint8)
    return BiasedSplit(x, y, y.clone(), torch.ones(len(y), dtype=torch.bool), 2, 2)

val, test = split(torch.tensor([0, 0, 1, 1])), split(torch.tensor([0, 1, 1]))
features = {"val": torch.tensor([[0.0, 0.0], [0.0, 2.0], [10.0, 0.0], [10.0, 2.0]]),
            "test": torch.tensor([[1.0, 1.0], [9.0, 1.0], [4.0, 1.0]])}
params = validate({"probe": {"method": "nearest", "nearest": {"shrink": 0.5}}})
report = probe_report(features, {"val": val, "test": test}, params.probe, 0)
logistic = validate({})
print(json.dumps({
    "registered": sorted(PROBES), "report": report, "splits": list(probe_splits(params.probe)),
    "default_shrink": logistic.probe.nearest.shrink, "source": SOURCES.get("probe.nearest.shrink"),
    "applies": [applies(key, RunContext(p)) for p in (params, logistic)
                for key in ("probe.nearest.shrink", "probe.standardize", "probe.train_split", "probe.dfr.c_grid")],
}))
'''


@pytest.mark.slow
def test_a_probe_variant_from_a_temporary_module_probes(tmp_path) -> None:
    facts = _run(tmp_path, "nearest_probe", PROBE_MODULE, PROBE_RUN)
    assert facts["registered"] == ["dfr", "logistic", "nearest"]
    # shrink 0.5: class means (0, 1) and (10, 1) move to (2.5, 1) and (7.5, 1); 4 is nearer the first
    assert facts["report"] == {"test_accuracy": 2 / 3, "test_predictions": [0, 1, 0]}
    assert facts["splits"] == ["val", "test"]
    assert facts["default_shrink"] == 0.0 and facts["source"] == "ours: a test's rule (default 0)"
    assert facts["applies"] == [True, True, False, False,  # its section and what it reads; not train_split, DFR's
                                False, True, True, False]  # under logistic: not its section


def test_a_probe_variant_outside_the_registry_is_refused(tmp_path) -> None:
    code = "from debias.schema import validate; validate({'probe': {'method': 'nearest'}})"
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                          env=_env(tmp_path), timeout=120)
    assert done.returncode != 0
    assert "probe.method = 'nearest' is not allowed; allowed: 'logistic' or 'dfr'" in done.stderr


def test_a_probe_declaration_must_name_the_source_of_every_default() -> None:
    from debias.evaluation.probes.dfr import DFRParams
    from debias.evaluation.variants import PROBES, register_probe

    with pytest.raises(ValueError, match=r"no source for probe\.dfr2\.c_grid \(and 2 more\)"):
        register_probe("dfr2", lambda p: ("val",), fit="x:y", section="dfr2", params=DFRParams, sources={})
    with pytest.raises(ValueError, match=r"probe\.dfr is already dfr's"):
        register_probe("dfr2", lambda p: ("val",), fit="x:y", section="dfr", params=DFRParams, sources={})
    assert "dfr2" not in PROBES


def test_every_shipped_probe_variant_is_declared_in_its_own_package() -> None:
    from debias.evaluation.variants import POSTPROCESSINGS, PROBES, import_declarations

    import_declarations()
    package = REPO / "src" / "debias" / "evaluation" / "probes"
    assert {path.parent.name for path in package.glob("*/__init__.py")} == set(PROBES) | set(POSTPROCESSINGS)
    for name, variant in [*PROBES.items(), *POSTPROCESSINGS.items()]:
        target = variant.fit if name in PROBES else variant.report
        assert variant.display and target.startswith(f"debias.evaluation.probes.{name}.fit:")
        assert (package / name / "fit.py").is_file()
    assert validate({"probe": {"method": "dfr"}}).probe.dfr.retrains == 20


def test_a_probe_variants_name_is_quoted_in_at_most_two_modules() -> None:
    from debias.evaluation.variants import PROBES

    modules = _modules_quoting(set(PROBES))
    spread = {name: sorted(where) for name, where in modules.items() if len(where) > 2}
    assert not spread, spread
    assert modules["dfr"] >= {"src/debias/evaluation/probes/dfr/__init__.py"}


@pytest.mark.slow
def test_no_chain_of_probe_variant_names_outside_their_packages() -> None:
    from debias.evaluation.variants import POSTPROCESSINGS, PROBES

    probes = REPO / "src" / "debias" / "evaluation" / "probes"
    offenders = [f"{path.relative_to(REPO)}:{line}" for path in [*(REPO / "src").rglob("*.py"),
                                                                *(REPO / "pipeline").glob("*.py")]
                 if probes not in path.parents
                 for attribute in ("method", "postprocess")
                 for line in _compares_a_name_with(path, set(PROBES) | set(POSTPROCESSINGS), attribute)]
    assert not offenders, offenders
