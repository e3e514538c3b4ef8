"""The DVC graph, proven by running it: each stage's command from dvc.yaml, in a scratch copy of the repository at
tiny sizes, under an audit hook (tests/trace_hook/sitecustomize.py, on PYTHONPATH for these processes only) that
logs every file opened with its mode, renamed, removed or listed and every ``debias`` module imported. Per stage
(:func:`debias.tools.trace.check_stage`): every file read is a dep or a declared environment file, every file
written is an out or declared as none (NOT_OUTS), every project module imported is a dep or a side channel.

All behind ``slow``: the default pipeline, every stage once, and beside it a whole pipeline on an image folder
without bias labels; then every stage-2 method, group-inference method and probe variant, each rerunning its own
stage on the default pipeline's upstream outputs. Each stage is one single-threaded process, so the fixtures run
two at a time (the machine's two cores).
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from debias.tools.trace import changed_files, check_stage, read_trace, snapshot
from tests.conftest import REPO, copy_worktree, unlabelled_image_folder
from tests.faults.conftest import deep_update

HOOK = REPO / "tests" / "trace_hook"
STAGES = ["source", "download", "inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe",
          "evaluate", "report"]
# Tiny sizes: one or two epochs on 120 images per split; the default methods (cluster groups, CNC).
TINY: dict = {
    "data": {"max_per_split": 120},
    "erm": {"epochs": 2},
    "stage2": {"epochs": 1},
    "probe": {"c_grid": [1.0], "max_iter": 50, "dfr": {"c_grid": [1.0], "retrains": 2}},
    "evaluate": {"splits": ["test"], "mi_max_iter": 20, "umap": {"max_points": 60}},
}


class TracedClone:
    """A scratch copy of the repository whose stages run as DVC runs them (dvc.yaml's command), traced."""

    def __init__(self, root: Path, changes: dict | None = None) -> None:
        self.root = copy_worktree(root)
        self.base = deep_update(yaml.safe_load((self.root / "params.yaml").read_text()), TINY)
        self.set_params(changes or {})
        for command in (["git", "init", "-q"], ["git", "add", "-A"],
                        ["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "trace"]):
            subprocess.run(command, cwd=self.root, check=True, capture_output=True)
        self.stages = yaml.safe_load((self.root / "dvc.yaml").read_text())["stages"]
        self.runs = 0

    def set_params(self, changes: dict) -> None:
        """params.yaml: the tiny base with ``changes`` merged in."""
        params = deep_update(copy.deepcopy(self.base), changes)
        (self.root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    def external(self) -> list[str]:
        """The data source's external files (absolute), as the source stage fingerprints them."""
        from debias.data.sources.base import external_files
        from debias.schema import load_params

        return [str(p) for p in external_files(load_params(self.root / "params.yaml").data).values()]

    def run(self, name: str) -> list[str]:
        """Run stage ``name``'s dvc.yaml command under the hook; its violations (:func:`check_stage`)."""
        self.runs += 1
        log = self.root.parent / f"trace-{self.root.name}-{self.runs}-{name}.jsonl"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_TRACKING", "DVC_", "DEBIAS_"))}
        env.update(DEBIAS_TRACKING="off", DEBIAS_THREADS="1", DEBIAS_FORKSERVER="0", DEBIAS_TRACE_LOG=str(log),
                   DVC_STAGE=name, DVC_ROOT=str(self.root), PYTHONPATH=os.pathsep.join([str(HOOK), str(self.root / "src")]),
                   PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
        before = snapshot(self.root)
        done = subprocess.run(self.stages[name]["cmd"].split("#", 1)[0], shell=True, cwd=self.root, env=env,
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{name} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        trace = read_trace(log)
        assert trace.imports or name == "source", f"{name}: the hook logged no import (is {HOOK} on PYTHONPATH?)"
        return check_stage(name, self.stages[name], trace, changed_files(before, snapshot(self.root)), self.root,
                           self.external())


def _trace_all(clone: TracedClone) -> dict[str, list[str]]:
    """Every stage of ``clone`` run in order, traced; the violations by stage."""
    return {name: clone.run(name) for name in STAGES}


def _trace_image_folder(root: Path) -> list[str]:
    """A pipeline on an image folder (external files: read by source and download alone, through the fingerprint)
    without its attribute column: the no-bias-labels path of every stage, label-free selection rules."""
    clone = TracedClone(root / "repo", unlabelled_image_folder(root / "shapes", n_train=32))
    return [problem for problems in _trace_all(clone).values() for problem in problems]


def _selected(request: pytest.FixtureRequest, names: set[str] | dict) -> list[pytest.Item]:
    """This module's selected tests among ``names`` (by function name), in the session's order."""
    return [item for item in request.session.items
            if getattr(item, "module", None) is request.module and getattr(item, "originalname", "") in names]


IMAGE_FOLDER_TEST = "test_a_pipeline_on_an_image_folder_without_bias_labels_reads_its_deps_and_writes_its_outs"


@pytest.fixture(scope="module")
def pipelines(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    """The default pipeline and, when its test is selected, the image-folder one, traced side by side: each stage is
    one single-threaded process, so the two pipelines take the machine's two cores."""
    pool = ThreadPoolExecutor(max_workers=2)
    default = TracedClone(tmp_path_factory.mktemp("trace") / "repo")
    futures = {"default": pool.submit(lambda: (default, _trace_all(default)))}
    if _selected(request, {IMAGE_FOLDER_TEST}):
        futures["image_folder"] = pool.submit(_trace_image_folder, tmp_path_factory.mktemp("trace-folder"))
    yield futures
    pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def default_pipeline(pipelines) -> tuple[TracedClone, dict[str, list[str]]]:
    return pipelines["default"].result()


@pytest.mark.slow
def test_every_stage_of_the_default_pipeline_reads_its_deps_and_writes_its_outs(default_pipeline) -> None:
    _, found = default_pipeline
    problems = [problem for name in STAGES for problem in found[name]]
    assert not problems, "\n".join(problems)


# --------------------------------------------------------------------------- every variant (slow)


def _stage2_methods() -> list[str]:
    from debias.training.methods.registry import discover

    return sorted(discover())


def _group_methods() -> list[str]:
    from debias.groups.registry import discover

    return sorted(discover())


def _probe_methods() -> list[str]:
    from debias.evaluation.variants import PROBES, import_declarations

    import_declarations()  # the registry fills as its declarations are imported
    return sorted(PROBES)


# each variant test: the stage it reruns and the params section whose ``method`` it sets
VARIANT_TESTS = {
    "test_every_stage2_method_reads_its_deps_and_writes_its_outs": ("train_contrastive", "stage2"),
    "test_every_group_method_reads_its_deps_and_writes_its_outs": ("infer_groups", "groups"),
    "test_every_probe_variant_reads_its_deps_and_writes_its_outs": ("linear_probe", "probe"),
}


@pytest.fixture(scope="module")
def variant_problems(request: pytest.FixtureRequest, default_pipeline) -> dict[tuple[str, str], list[str]]:
    """Each selected variant's stage rerun (one epoch) on the default pipeline's upstream outputs, traced; its
    violations by (stage, method). Two at a time, on the clone and a copy of it (one core each), each copy taking
    every other variant in the tests' order."""
    clone, _ = default_pipeline
    jobs = [(*VARIANT_TESTS[item.originalname], item.callspec.params["method"])
            for item in _selected(request, VARIANT_TESTS)]
    copy_root = clone.root.parent / f"{clone.root.name}-copy"
    shutil.copytree(clone.root, copy_root, symlinks=True)
    twin = copy.copy(clone)
    twin.root, twin.runs = copy_root, 0

    def work(worker: TracedClone, share: list[tuple[str, str, str]]) -> dict[tuple[str, str], list[str]]:
        found = {}
        for stage, section, method in share:
            worker.set_params({section: {"method": method}})
            found[(stage, method)] = worker.run(stage)
        return found

    with ThreadPoolExecutor(max_workers=2) as pool:
        halves = [pool.submit(work, worker, jobs[i::2]) for i, worker in enumerate((clone, twin))]
        return {key: problems for half in halves for key, problems in half.result().items()}


@pytest.mark.slow
@pytest.mark.parametrize("method", _stage2_methods())
def test_every_stage2_method_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    """train_contrastive with each registered method, on the default pipeline's upstream outputs (one epoch)."""
    problems = variant_problems[("train_contrastive", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("method", _group_methods())
def test_every_group_method_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    problems = variant_problems[("infer_groups", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("method", _probe_methods())
def test_every_probe_variant_reads_its_deps_and_writes_its_outs(variant_problems, method: str) -> None:
    problems = variant_problems[("linear_probe", method)]
    assert not problems, "\n".join(problems)


@pytest.mark.slow
def test_a_pipeline_on_an_image_folder_without_bias_labels_reads_its_deps_and_writes_its_outs(pipelines) -> None:
    problems = pipelines["image_folder"].result()
    assert not problems, "\n".join(problems)
