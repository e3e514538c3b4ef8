"""Determinism: the same params and seed give bit-identical outputs on CPU across two whole-pipeline runs.

``dvc repro`` of every stage in two separate temporary clones (tiny configuration; both started in
the background when the session begins, see conftest.py): every metrics JSON, every checkpoint's
state dict, the embeddings and group files must be identical, and so must DVC's hashes of them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import yaml

from debias.core.io import load_torch
from tests.faults.conftest import dvc

pytestmark = pytest.mark.slow

# Outputs whose bytes legitimately differ between runs: run records (MLflow run id, wall time)
# and what embeds them (the report shows run ids; figure files may carry a creation stamp).
NOT_COMPARED_PREFIXES = ("reports/runs/", "reports/report.", "reports/figures/")


@pytest.fixture(scope="module")
def two_runs(determinism_runs) -> tuple[Path, Path, list[str]]:
    """The two ``dvc repro`` runs started in the background when the session began (conftest)."""
    results = determinism_runs.results()
    for done in results:
        assert done.returncode == 0, f"{done.args}:\n{done.stdout}\n{done.stderr}"
    stages = [line.split("'")[1] for line in results[0].stdout.splitlines() if line.startswith("Running stage '")]
    return determinism_runs.clones[0], determinism_runs.clones[1], stages


def test_the_whole_pipeline_ran(two_runs) -> None:
    _, _, stages = two_runs
    dag = list(yaml.safe_load(Path(two_runs[0] / "dvc.yaml").read_text())["stages"])
    assert sorted(stages) == sorted(dag)


def _metrics(clone: Path, name: str) -> dict:
    return json.loads((clone / name).read_text())


def test_every_metrics_json_is_identical(two_runs) -> None:
    first, second, _ = two_runs
    names = sorted(p.relative_to(first).as_posix() for p in (first / "reports/metrics").glob("*.json"))
    assert {"reports/metrics/erm.json", "reports/metrics/stage2_train.json", "reports/metrics/probe.json",
            "reports/metrics/representation.json", "reports/metrics/groups.json"} <= set(names)
    assert names == sorted(p.relative_to(second).as_posix() for p in (second / "reports/metrics").glob("*.json"))
    for name in names + ["data/biased/summary.json"]:
        assert _metrics(first, name) == _metrics(second, name), name
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def test_model_weights_are_bit_identical(two_runs) -> None:
    first, second, _ = two_runs
    for name in ("models/erm.pt", "models/stage2.pt"):
        a = load_torch(first / name, "checkpoint", ("state_dict",))["state_dict"]
        b = load_torch(second / name, "checkpoint", ("state_dict",))["state_dict"]
        assert a.keys() == b.keys(), name
        for key in a:
            assert torch.equal(a[key], b[key]), f"{name}: {key}"


def test_embeddings_groups_and_curves_are_identical(two_runs) -> None:
    first, second, _ = two_runs
    for folder in ("data/erm", "data/stage2"):
        for path in sorted((first / folder).glob("embeddings_*.pt")):
            a = load_torch(path, "embeddings")
            b = load_torch(second / folder / path.name, "embeddings")
            assert torch.equal(a["z"], b["z"]) and torch.equal(a["logits"], b["logits"]), path
    for name in ("data/groups/train.parquet", "reports/plots/erm_curves.csv", "reports/plots/stage2_curves.csv"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name


def _out_hashes(clone: Path) -> dict[str, str]:
    lock = yaml.safe_load((clone / "dvc.lock").read_text())
    return {out["path"]: out["md5"] for stage in lock["stages"].values() for out in stage.get("outs", [])}


def test_dvc_records_the_same_hash_for_every_output(two_runs) -> None:
    """Byte-identical files: DVC's run-cache and ``dvc.lock`` agree across the two runs."""
    first, second, _ = two_runs
    a, b = _out_hashes(first), _out_hashes(second)
    assert a.keys() == b.keys()
    compared = {path for path in a if not path.startswith(NOT_COMPARED_PREFIXES)}
    assert {"data/raw", "data/biased/train.pt", "models/erm.pt", "models/stage2.pt", "data/erm"} <= compared
    differ = sorted(path for path in compared if a[path] != b[path])
    assert differ == [], f"outputs whose bytes differ between two identical runs: {differ}"


def test_a_second_repro_reruns_nothing(two_runs) -> None:
    first, _, _ = two_runs
    done = dvc(first, "repro")
    # only the source stage runs (always: it fingerprints external data files) and changes nothing
    running = [line for line in done.stdout.splitlines() if line.startswith("Running stage")]
    assert running == ["Running stage 'source':"], done.stdout
    status = subprocess.run(["dvc", "status"], cwd=first, capture_output=True, text=True, check=False)
    assert status.stdout.split() == ["source:", "always", "changed"], status.stdout
