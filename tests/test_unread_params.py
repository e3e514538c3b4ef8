"""unread-param said as a stage starts: a declared param changed since the stage's previous run (dvc.lock's record)
that the run does not read is printed before the stage's body, kept in its run record, and counted by the report."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from debias.core.headline import UNREAD_KEY, recorded_unread, run_warnings
from debias.harness.stage import STAGE_PARAMS
from debias.harness.unread import changed_since_last_run, recorded, unread_since_last_run
from debias.params import as_dict
from debias.schema import validate
from tests.conftest import committed_text


def committed_cnc() -> dict:
    raw = copy.deepcopy(yaml.safe_load(committed_text("params.yaml")))
    raw["stage2"]["method"] = "cnc"
    raw["stage2"]["optimizer"] = "adam"
    return raw


def write_lock(folder, stage: str, raw: dict) -> None:
    """A dvc.lock whose record of ``stage`` holds ``raw``'s values of the params the stage declares."""
    params = validate(raw)
    recorded_values = as_dict(params, STAGE_PARAMS[stage])
    (folder / "dvc.lock").write_text(yaml.safe_dump({"schema": "2.0", "stages": {stage: {
        "cmd": "python pipeline/x.py", "params": {"params.yaml": recorded_values}}}}))


def test_changed_params_the_run_does_not_read_are_warned_against_the_stages_last_run(tmp_path) -> None:
    raw = committed_cnc()
    write_lock(tmp_path, "train_contrastive", raw)
    lock = tmp_path / "dvc.lock"
    assert recorded("train_contrastive", lock)["stage2.method"] == "cnc"
    changed = copy.deepcopy(raw)
    changed["loss"]["temperature"] = 0.2      # CNC reads its own temperature: unread
    changed["loss"]["epsilon"] = 0.25         # CNC's margin: read
    changed["stage2"]["momentum"] = 0.5       # Adam has no momentum: unread
    changed["stage2"]["batch_size"] = 64      # CNC's batches are M and N: unread
    changed["stage2"]["cnc"]["temperature"] = 0.1  # read
    params = validate(changed)
    keys = STAGE_PARAMS["train_contrastive"]
    assert set(changed_since_last_run("train_contrastive", params, keys, lock)) == {
        "loss.temperature", "loss.epsilon", "stage2.momentum", "stage2.batch_size", "stage2.cnc.temperature"}
    found = unread_since_last_run("train_contrastive", params, keys, lock)
    assert {m.split(" =")[0] for m in found} == {"unread-param: loss.temperature", "unread-param: stage2.momentum",
                                                 "unread-param: stage2.batch_size"}
    assert any("not read under stage2.optimizer adam" in m for m in found)
    # the same params as the last run, no record of the stage, no dvc.lock: nothing changed, nothing said
    assert unread_since_last_run("train_contrastive", validate(raw), keys, lock) == []
    assert unread_since_last_run("linear_probe", params, STAGE_PARAMS["linear_probe"], lock) == []
    assert unread_since_last_run("train_contrastive", params, keys, tmp_path / "missing.lock") == []


@pytest.mark.slow
def test_the_stage_prints_them_before_its_body_and_keeps_them_in_its_run_record(tmp_path, monkeypatch, capsys) -> None:
    from debias.harness.stage import main

    raw = committed_cnc()
    write_lock(tmp_path, "train_contrastive", raw)
    raw["loss"]["temperature"] = 0.2
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    (tmp_path / "dvc.yaml").write_text(committed_text("dvc.yaml"))
    monkeypatch.chdir(tmp_path)
    seen = []

    def body(params, run) -> None:
        seen.append(capsys.readouterr().err)  # what was printed before the body started

    main("train_contrastive", body)
    (before,) = seen
    assert "[train_contrastive] WARNING unread-param: loss.temperature = 0.2: not read under stage2.method cnc" in before
    record = json.loads((tmp_path / "reports/runs/train_contrastive.json").read_text())
    assert record[UNREAD_KEY] == [before.split("WARNING ", 1)[1].strip()]
    assert recorded_unread(tmp_path) == {"train_contrastive": record[UNREAD_KEY]}


def test_the_report_counts_the_run_records_unread_params_with_the_stages_warnings(tmp_path) -> None:
    from debias.report.build import params_warnings
    from debias.report.document import render_markdown
    from debias.report.sections.stage_warnings import warnings_section

    runs = tmp_path / "reports/runs"
    runs.mkdir(parents=True)
    message = "unread-param: loss.temperature = 0.2: not read under stage2.method cnc: changing it changes nothing"
    (runs / "train_contrastive.json").write_text(json.dumps({"stage": "train_contrastive", UNREAD_KEY: [message]}))
    metrics = tmp_path / "reports/metrics"
    metrics.mkdir(parents=True)
    (metrics / "stage2_train.json").write_text(json.dumps({"warnings": ["weak-groups: the inferred minority ..."]}))
    assert run_warnings(tmp_path) == {"train_contrastive": [message, "weak-groups: the inferred minority ..."]}
    assert params_warnings(tmp_path) == [message]
    text = render_markdown("t", [warnings_section(tmp_path)], tmp_path, tmp_path)
    assert "2 warnings from 1 stage" in text and "loss.temperature = 0.2" in text


def test_a_param_of_a_loss_term_weighted_zero_is_warned_at_the_stage_start(tmp_path) -> None:
    """Under ``stage2.cnc.contrastive_weight: 0`` the contrastive term's margin and temperature change nothing: a run
    that changes them since the last one is told so before it trains (as for stage2.batch_size under CNC)."""
    raw = committed_cnc()
    raw["stage2"]["cnc"]["contrastive_weight"] = 0
    write_lock(tmp_path, "train_contrastive", raw)
    changed = copy.deepcopy(raw)
    changed["loss"]["epsilon"] = 0.25
    changed["stage2"]["cnc"]["temperature"] = 0.2
    changed["stage2"]["cnc"]["num_positives"] = 8  # read: the cross-entropy term trains on the batches drawn
    found = unread_since_last_run("train_contrastive", validate(changed), STAGE_PARAMS["train_contrastive"],
                                  tmp_path / "dvc.lock")
    assert sorted(m.split(":")[1].strip() for m in found) == ["loss.epsilon = 0.25", "stage2.cnc.temperature = 0.2"]
    assert all("not read under stage2.cnc.contrastive_weight 0.0" in m for m in found), found
    changed["stage2"]["cnc"]["contrastive_weight"] = 0.75  # the term weighs again: its params are read
    assert unread_since_last_run("train_contrastive", validate(changed), STAGE_PARAMS["train_contrastive"],
                                 tmp_path / "dvc.lock") == []
