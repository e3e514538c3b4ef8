"""benchmarks/tabular.py: its plan passes the params schema, rows come from the right files, grids pick by
validation accuracy (offline: no experiment runs)."""

from __future__ import annotations


import pytest
import yaml

from benchmarks import dvc_queue, pages, quality, tabular
from debias.core import headline, health
from debias.core.trees import merge
from debias.schema import validate
from tests.conftest import REPO, SHARED_DATASETS


CONFIG = yaml.safe_load((REPO / "benchmarks" / "tabular.yaml").read_text())


def test_every_planned_experiment_passes_the_params_schema(tmp_path) -> None:
    for source, names in tabular.FILES.items():
        (tmp_path / source).mkdir()
        for name in names:
            (tmp_path / source / name).write_text("")
    config = tabular.with_data_paths(CONFIG, tmp_path)
    base = merge(yaml.safe_load((REPO / "params.yaml").read_text()), config["base"])
    jobs = dvc_queue.plan(config, list(config["settings"]), [0, 1], list(config["methods"]))
    assert len(jobs) == 2 * 2 * (1 + len(CONFIG["methods"]))
    for job in jobs:
        params = validate(merge(base, job["overrides"]))
        assert params.data.source in ("adult", "compas") and params.data.path == str(tmp_path / params.data.source)
        assert params.model.name == "mlp" and params.probe.postprocess == "equalized_odds"
        if job["method"] != dvc_queue.UPSTREAM:
            assert job["targets"] == ["linear_probe"]
    assert set(CONFIG["labels"]) == {"erm", *CONFIG["methods"], *CONFIG["derived"], *CONFIG["grids"]}
    with pytest.raises(FileNotFoundError, match="lacks"):
        tabular.with_data_paths(CONFIG, tmp_path / "nowhere")


def test_rows_read_erm_methods_derived_and_grids() -> None:
    config = {**CONFIG, "derived": {"eq_odds": {"experiment": "lff_q07", "encoder": "erm"}},
              "grids": {"lff": ["lff_q01", "lff_q07"]}}
    fair = lambda eod: {"equalized_odds_difference": eod, "demographic_parity_difference": 0.1}  # noqa: E731
    jobs = [{"name": "up", "setting": "compas", "seed": 0, "method": dvc_queue.UPSTREAM},
            {"name": "a", "setting": "compas", "seed": 0, "method": "lff_q01"},
            {"name": "b", "setting": "compas", "seed": 0, "method": "lff_q07"}]
    detailed = {  # the stages' detailed files; dvc exp show reports their headline keys (debias.core.headline)
        "up": {"train_erm": {"test": {"avg": 0.65, "worst_group": 0.3, "fairness": fair(0.3)}}},
        "a": {"train_contrastive": {"test": {"avg": 0.62, "worst_group": 0.2, "fairness": fair(0.2)},
                                    "val": {"avg": 0.66}}},
        "b": {"train_contrastive": {"test": {"avg": 0.40, "worst_group": 0.1, "fairness": fair(0.1)}, "val": {"avg": 0.31}},
              "linear_probe": {"erm": {"trained": True, "probe": {"equalized_odds": {"test": {
                  "avg": 0.61, "worst_group": 0.4, "fairness": fair(0.05)}}}}}},
    }
    shown = {name: {"metrics": {k: v for stage, d in files.items() for k, v in headline.headline(stage, d).items()}}
             for name, files in detailed.items()}
    warnings = {"b": {"train_contrastive": ["chance-level", "degenerate-selection"], "linear_probe": ["weak-groups"]}}
    rows = {r["method"]: r for r in tabular.rows_of(jobs, shown, {"a": {"train_contrastive": 12.0}}, config, warnings)}
    assert set(rows) == {"erm", "lff_q01", "lff_q07", "eq_odds", "lff"}
    # each row carries the warnings of the stage behind its numbers: stage 2 for a method, the probe for Eq. Odds
    assert rows["lff_q07"]["warnings"] == "chance-level;degenerate-selection"
    assert rows["eq_odds"]["warnings"] == "weak-groups" and rows["erm"]["warnings"] == rows["lff"]["warnings"] == ""
    assert rows["erm"]["test_avg"] == 0.65 and rows["erm"]["test_equalized_odds_difference"] == 0.3
    assert rows["eq_odds"]["test_equalized_odds_difference"] == 0.05 and rows["eq_odds"]["experiment"] == "b"
    assert rows["lff"]["chosen"] == "lff_q01" and rows["lff"]["test_avg"] == 0.62  # best validation accuracy
    text = tabular.markdown(list(rows.values()), config, ["compas"], ["lff_q01", "lff_q07"])
    assert "| compas | Baseline (ERM) | 65.0 | 0.300 | 0.100 | 30.0 | – | 1 | 65.2 / 0.289 |" in text
    assert "chosen: LfF, q = 0.1 ×1" in text
    assert "| compas | LfF, q = 0.7 ⚠ chance-level in 1 of 1 seeds ⚠ degenerate-selection in 1 of 1 seeds | 40.0 |" in text
    assert "| compas | LfF, q = 0.1 | 62.0 |" in text
    # the legend explains exactly the codes the table carries, from debias.core.health.CODES
    assert f"*chance-level*: {health.CODES['chance-level']}." in text and "*weak-groups*" in text
    assert "*collapsed-representation*" not in text
    mixed = [rows["lff_q07"], {**rows["lff_q07"], "seed": 1, "warnings": ""}]
    assert pages.warning_flag(mixed) == " ⚠ chance-level in 1 of 2 seeds ⚠ degenerate-selection in 1 of 2 seeds"


@pytest.mark.skipif(not (SHARED_DATASETS / "compas").is_dir(), reason="shared datasets not present")
def test_shared_datasets_hold_the_files_the_benchmark_reads() -> None:
    config = tabular.with_data_paths(CONFIG, SHARED_DATASETS)
    assert config["settings"]["compas"]["data"]["path"].endswith("compas")


def test_quality_rows_read_a_probe_result_for_methods_that_name_one() -> None:
    config = yaml.safe_load((REPO / "benchmarks" / "quality.yaml").read_text())
    (job,) = [j for j in dvc_queue.plan(config, ["cmnist_096"], [0], ["dfr"]) if j["method"] == "dfr"]
    assert job["targets"] == ["linear_probe"] and job["result"] == {"file": "probe", "encoder": "erm"}
    assert job["overrides"]["probe"] == {"method": "dfr"} and "result" not in job["overrides"]
    shown = {job["name"]: {"metrics": {"probe_erm_avg": 0.9, "probe_erm_unbiased": 0.88, "probe_erm_worst": 0.7,
                                       "s2_avg": 0.1}}}  # the headline keys dvc exp show reports
    (row,) = quality.rows_of([job], shown, {job["name"]: {"linear_probe": 4.0}})
    assert row["method"] == "dfr" and row["test_avg"] == 0.9 and row["test_worst_group"] == 0.7
    assert row["train_seconds"] == 4.0
