"""The harness around the research: research code (src/debias outside harness/, tools/ and report/) imports no
harness module, and what it reports through the progress channel never comes back into what it computes."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch

from debias.core import progress, resources
from tests.conftest import REPO

PACKAGE = REPO / "src" / "debias"
OUTSIDE_RESEARCH = ("harness", "tools", "report")  # the floors above the research, allowed to import the harness
HARNESS = "debias.harness"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    """``src/debias/a/b.py`` -> ``debias.a.b``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(package.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, root: Path = PACKAGE) -> set[str]:
    """Every module an ``import`` or ``from ... import`` anywhere in ``path`` names (relative ones resolved; for
    ``from M import x`` both ``M`` and ``M.x``, since ``x`` may be a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    own = module_name(path, root)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return found


def is_research(path: Path) -> bool:
    return path.relative_to(PACKAGE).parts[0] not in OUTSIDE_RESEARCH


def harness_imports(paths: list[Path], root: Path = PACKAGE) -> dict[str, list[str]]:
    """Module -> the harness modules it imports (only modules that import one)."""
    found = {}
    for path in paths:
        names = sorted(m for m in imported_modules(path, root) if m == HARNESS or m.startswith(HARNESS + "."))
        if names:
            found[module_name(path, root)] = names
    return found


def research_files() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if is_research(p))


def test_research_code_imports_no_harness_module() -> None:
    files = research_files()
    assert len(files) > 100 and any("training" in p.parts for p in files)  # the walk sees the research
    offenders = harness_imports(files)
    assert not offenders, ("research code imports the harness (use debias.core.progress, debias.core.resources or "
                           f"debias.core.stage_run instead): {offenders}")


@pytest.mark.parametrize("source", [
    "from debias.harness import progress\n",
    "import debias.harness.memory\n",
    "def f():\n    from debias.harness.tracking import StageRun\n",
    "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from debias.harness.memory import StepPlan\n",
    "from debias import harness\n",
    "from ...harness import stage\n",
])
def test_the_layer_check_finds_every_form_of_harness_import(tmp_path: Path, source: str) -> None:
    root = tmp_path / "src" / "debias"
    module = root / "training" / "methods" / "x.py"
    module.parent.mkdir(parents=True)
    module.write_text(source)
    assert list(harness_imports([module], root)) == ["debias.training.methods.x"]
    module.write_text("from debias.core import progress\nfrom ..harnessing import x\nimport debias.harnessed\n")
    assert harness_imports([module], root) == {}  # names that only start alike are not the harness


class Recorder:
    """A reporter that records every report and tries to hand a value back (returns one, changes the metrics)."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def advance(self, task: str, done: int, total: int, unit: str) -> object:
        self.calls.append(("advance", task, done, total, unit))
        return 0.0

    def step_ended(self, label: str, what: str, seconds: float) -> object:
        self.calls.append(("step", label, what))
        return 0.0

    def epoch_ended(self, label: str, epoch: int, epochs: int, metrics: Mapping[str, float | str], seconds: float,
                    eta: float | None) -> object:
        self.calls.append(("epoch", label, epoch, epochs))
        metrics.clear()  # type: ignore[attr-defined]  # a reporter that meddles changes only its own copy
        return 0.0


def test_the_channel_returns_nothing_and_does_nothing_when_unset() -> None:
    assert progress.advance("task", 1, 2) is None
    assert progress.epoch("label", 0, 1, {"train/loss": 1.0}, 1.0, None) is None
    with progress.step("label", "what") as value:
        assert value is None
    assert resources.check_classifier_fits(None, None, "m", "erm", 1, 1, 1, 1, (3, 8, 8), torch.device("cpu")) is None


def test_a_reporter_gets_the_facts_and_hands_nothing_back() -> None:
    recorder, metrics = Recorder(), {"train/loss": 0.5, "val/avg": 0.75}
    with progress.reporting(recorder):
        assert progress.advance("grid", 1, 3, unit="C") is None  # the reporter's 0.0 never reaches the caller
        assert progress.epoch("train_erm", 0, 2, metrics, 1.0, 1.0) is None
        with progress.step("evaluate", "metrics"):
            pass
    assert metrics == {"train/loss": 0.5, "val/avg": 0.75}  # the reporter cleared its copy, not the caller's dict
    assert recorder.calls == [("advance", "grid", 1, 3, "C"), ("epoch", "train_erm", 0, 2),
                              ("step", "evaluate", "metrics")]
    assert progress.advance("grid", 2, 3) is None and len(recorder.calls) == 3  # uninstalled after the block


def _probe_inputs() -> tuple[dict, dict]:
    from tests.test_training import tiny_split

    splits = {"train": tiny_split(seed=0, n=96), "val": tiny_split(seed=1, n=64), "test": tiny_split(seed=2, n=64)}
    generator = torch.Generator().manual_seed(0)
    features = {name: torch.randn(len(split), 6, generator=generator) + split.y[:, None].float()
                for name, split in splits.items()}
    return splits, features


@pytest.mark.parametrize("variant", ["logistic", "dfr"])
def test_the_probes_compute_the_same_with_a_reporter_or_none(variant: str) -> None:
    """The C grids (and DFR's retrains) loop over plain lists: the report and the chosen classifier are the same
    whether a reporter listens or not, and the reporter hears every point of the grid."""
    from debias.schema import ProbeParams

    splits, features = _probe_inputs()
    if variant == "logistic":
        from debias.evaluation.probes.logistic.fit import logistic_probe as fit
        params = ProbeParams(c_grid=[0.01, 0.1, 1.0], train_split="train")
        grid = "linear probe: C grid"
    else:
        from debias.evaluation.probes.dfr.fit import dfr_probe as fit
        params = ProbeParams.model_validate({"method": "dfr", "dfr": {"c_grid": [0.1, 1.0], "retrains": 2}})
        grid = "DFR: C grid"
    unset = fit(features, splits, params, 0)
    recorder = Recorder()
    with progress.reporting(recorder):
        reported = fit(features, splits, params, 0)
    assert repr(unset[0]) == repr(reported[0]) and torch.equal(unset[2], reported[2])
    heard = [call for call in recorder.calls if call[1] == grid]
    assert [call[2] for call in heard] == list(range(1, len(heard) + 1)) and heard[-1][2] == heard[-1][3] >= 2


def test_the_harness_reporter_and_memory_check_return_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from debias.harness import memory
    from debias.harness import progress as shown

    for on_terminal in (False, True):
        monkeypatch.setattr(shown, "on_terminal", lambda on_terminal=on_terminal: on_terminal)
        reporter = shown.TerminalReporter()
        assert reporter.advance("task", 1, 2, "it") is None
        assert bool(reporter.bars) is on_terminal  # a bar only on a terminal, until the task ends
        assert reporter.advance("task", 2, 2, "it") is None and not reporter.bars
        assert reporter.step_ended("x", "y", 1.0) is None
        assert reporter.epoch_ended("x", 0, 1, {"train/loss": 1.0}, 1.0, None) is None
    from debias.models import build_model

    model = build_model("lenet5", 2, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2**34)
    assert memory.CHECK.classifier(model, optimizer, "lenet5", "erm", 4, 4, 8, 8, (3, 16, 16),
                                 torch.device("cpu")) is None
    with resources.checking(memory.CHECK):
        monkeypatch.setattr(memory, "available_bytes", lambda device: 1024)
        with pytest.raises(memory.ResourceError, match="erm.batch_size = 4 does not fit"):
            resources.check_classifier_fits(model, optimizer, "lenet5", "erm", 4, 4, 8, 8, (3, 16, 16),
                                            torch.device("cpu"))
