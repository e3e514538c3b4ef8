"""MLflow runs for what DVC restored: every experiment of a sweep gets its pipeline run, and each stage DVC restored
from its run-cache (no code of the stage ran, so it logged nothing) gets a stage run saying which run computed it.

A stage's run record ``reports/runs/<stage>.json`` is one of its DVC outputs, so a stage restored from the run-cache
restores the record of the run that computed those outputs: its MLflow run id, parent run and logged model. A
stage ran in the experiment when its record names the experiment's finished pipeline run as parent; any other was
restored. For each restored stage the sweep creates, under the experiment's pipeline run (created when no stage
ran at all: the experiment's params, its params difference from the sweep's commit, its headline metrics),
a stage run tagged ``debias.restored_from`` (the original run's id), with the original run's params, last metrics
and ``outputs/`` files (which ``debias compare --source mlflow`` reads), and the original logged model linked to
both runs; the pipeline run gets the experiment's headline metrics it lacks and the restored stages' warnings. Running it again adds nothing: restored stages already recorded are skipped.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from debias.tools.sweep.workspace import cache_dir

RESTORED_TAG = "debias.restored_from"  # on a stage run made for a restored stage: the run that computed its outputs
RESTORED_PARENT_TAG = "debias.restored"  # on a pipeline run the sweep made: why it exists
STAGE_TAG = "debias.stage"
EXPERIMENT_TAG = "debias.dvc_experiment"
RECORDS = "reports/runs"


def experiment_ref(commit: str, name: str) -> str:
    """The git ref of DVC experiment ``name`` of baseline ``commit``."""
    return f"refs/exps/{commit[:2]}/{commit[2:]}/{name}"


def git_file(root: Path, ref: str, path: str) -> str | None:
    """``path`` as committed at ``ref`` (None where it is not)."""
    import subprocess

    done = subprocess.run(["git", "show", f"{ref}:{path}"], cwd=root, capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def record_hashes(lock: dict[str, Any]) -> dict[str, str]:
    """Stage -> md5 of its run record ``reports/runs/<stage>.json`` in a dvc.lock (stages without one left out)."""
    found = {}
    for stage, entry in (lock.get("stages") or {}).items():
        for out in entry.get("outs") or []:
            if out.get("path") == f"{RECORDS}/{stage}.json" and out.get("md5"):
                found[stage] = out["md5"]
    return found


def cached_text(md5: str, stores: list[Path]) -> str | None:
    """The file of hash ``md5`` in the first of ``stores`` (DVC caches or local remotes: ``files/md5/ab/cdef...``)
    that holds it."""
    for store in stores:
        path = store / "files" / "md5" / md5[:2] / md5[2:]
        if path.is_file():
            return path.read_text(encoding="utf-8")
    return None


def restored_stages(records: dict[str, dict[str, Any]], parent_id: str | None) -> dict[str, dict[str, Any]]:
    """The stages of ``records`` (stage -> run record) that did not run under pipeline run ``parent_id``: DVC
    restored them from its run-cache (or a previous attempt's run computed them)."""
    return {stage: record for stage, record in records.items()
            if parent_id is None or record.get("parent_run_id") != parent_id}


def headline_values(root: Path, ref: str) -> dict[str, Any]:
    """The experiment's headline values (``reports/metrics/<stage>.json``, git-tracked), numbers or text; a file that is
    not the one the experiment's dvc.lock records is left out, said on stderr (:func:`headline.mismatches`)."""
    import sys

    from debias.core.headline import STAGES, headline_path, mismatch_message, mismatches, parse_lock

    lock = parse_lock(git_file(root, ref, "dvc.lock") or "")
    found: dict[str, Any] = {}
    for stage in STAGES:
        name = headline_path(stage).as_posix()
        text = git_file(root, ref, name)
        why = mismatches(lock, lambda _: None if text is None else text.encode(), [name]).get(name)
        if why:
            print(f"[sweep] WARNING {ref.rsplit('/', 1)[-1]}: {mismatch_message(name, why)}", file=sys.stderr)
            continue
        try:
            values = json.loads(text) if text else {}
        except ValueError:
            continue
        found.update(values if isinstance(values, dict) else {})
    return found


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def headline_metrics(root: Path, ref: str) -> dict[str, float]:
    """The experiment's headline metrics that are numbers."""
    return {k: float(v) for k, v in headline_values(root, ref).items() if is_number(v)}


def _params_at(root: Path, ref: str) -> dict[str, Any]:
    """params.yaml at ``ref``, parsed as DVC parses it (YAML 1.2); {} where it has none."""
    from debias.params import parse_yaml

    return parse_yaml((git_file(root, ref, "params.yaml") or "").encode("utf-8"), Path(f"{ref}:params.yaml")) or {}


def experiment_params(root: Path, ref: str) -> dict[str, Any]:
    """The experiment's params.yaml, flat, the schema's defaults filled in where it validates."""
    from debias.core.trees import flatten
    from debias.params import as_dict
    from debias.schema import validate

    written = _params_at(root, ref)
    try:
        return flatten(as_dict(validate(written)))
    except Exception:  # another version's params: what the file says
        return flatten(written)


def _client_and_experiment(root: Path, state: dict[str, Any]) -> tuple[Any, str] | None:
    from mlflow.tracking import MlflowClient

    from debias.harness.tracking import DEFAULT_EXPERIMENT, ensure_experiment, tracking_uri

    options = state["options"]
    uri = options.get("tracking_uri") or tracking_uri(root)
    name = options.get("mlflow_experiment") or os.environ.get("MLFLOW_EXPERIMENT_NAME") or DEFAULT_EXPERIMENT
    return MlflowClient(tracking_uri=uri), ensure_experiment(uri, name, root)


def find_parent(client: Any, experiment_id: str, name: str, records: dict[str, dict[str, Any]]) -> Any | None:
    """The experiment's finished pipeline run: one a stage record names as parent first, else the newest; runs of
    stopped attempts (``debias.sweep_stopped``) never."""
    from debias.harness.tracking import KIND_TAG
    from debias.tools.sweep.status import STOPPED_TAG

    runs = client.search_runs([experiment_id], max_results=100, order_by=["attributes.start_time DESC"],
                              filter_string=f"tags.`{KIND_TAG}` = 'pipeline' and tags.`{EXPERIMENT_TAG}` = '{name}'")
    finished = [r for r in runs if r.info.status == "FINISHED" and STOPPED_TAG not in r.data.tags]
    named = {record.get("parent_run_id") for record in records.values()}
    return next((r for r in finished if r.info.run_id in named), finished[0] if finished else None)


def create_parent(client: Any, experiment_id: str, root: Path, state: dict[str, Any], name: str, ref: str,
                  restored: dict[str, dict[str, Any]]) -> str:
    """A pipeline run for experiment ``name`` of which DVC restored every stage: its params and difference from the
    sweep's commit (its metrics and warnings: :func:`complete_parent`)."""
    from mlflow.entities import Param

    from debias.harness.tracking import KIND_TAG, PIPELINE_TAG
    from debias.harness.tracking.runs import committed_params, describe_difference, params_difference

    written = _params_at(root, ref)
    difference = params_difference(written, committed_params(root, state["commit"]))
    summary = describe_difference(difference, 120)
    tags = {KIND_TAG: "pipeline", PIPELINE_TAG: f"{name}@restored", EXPERIMENT_TAG: name,
            "debias.git_commit": state["commit"], "mlflow.runName": f"{name} ({summary})" if summary else name,
            "debias.params_diff": describe_difference(difference, 5000) or "none (the baseline's params)",
            RESTORED_PARENT_TAG: (f"DVC restored every stage of {name} from its run-cache ({', '.join(restored)}): "
                                  "made by debias sweep; each stage run names the run that computed it")}
    run_id = client.create_run(experiment_id, tags=tags).info.run_id
    params = [Param(k, str(v)[:6000]) for k, v in sorted(experiment_params(root, ref).items())]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start:start + 100])
    return run_id


def complete_parent(client: Any, parent: Any, root: Path, ref: str, restored: dict[str, dict[str, Any]]) -> None:
    """Give the experiment's pipeline run what its restored stages would have logged on it: the experiment's headline
    metrics it lacks, and the warnings tags (``debias.warnings.<stage>``, the summary where it has none) of the
    pipeline runs that computed them."""
    from mlflow.entities import Metric

    stamp = int(time.time() * 1000)
    metrics = [Metric(k, v, stamp, 0) for k, v in sorted(headline_metrics(root, ref).items())
               if k not in parent.data.metrics]
    if metrics:
        client.log_batch(parent.info.run_id, metrics=metrics)
    tags = dict(parent.data.tags)
    for stage, record in restored.items():
        try:
            original = client.get_run(record["parent_run_id"]) if record.get("parent_run_id") else None
        except Exception:  # the original parent is in no store this one reaches
            original = None
        if original is None:
            continue
        found = {f"debias.warnings.{stage}": original.data.tags.get(f"debias.warnings.{stage}"),
                 "debias.warnings": original.data.tags.get("debias.warnings")}
        for key, value in found.items():
            if value is not None and key not in tags:
                client.set_tag(parent.info.run_id, key, value)
                tags[key] = value


def create_restored_stage(client: Any, experiment_id: str, parent: Any, name: str, stage: str,
                          record: dict[str, Any]) -> str:
    """A finished stage run under ``parent`` for ``stage``, restored by DVC: tagged with the run that computed it,
    with that run's params, last metrics and ``outputs/`` files, and its logged model linked here and on the parent."""
    from mlflow.entities import LoggedModelOutput, Metric, Param

    from debias.harness.tracking import PARENT_TAG, PIPELINE_TAG

    source = record.get("run_id")
    original = None
    if source:
        try:
            original = client.get_run(source)
        except Exception:  # deleted, or in another store
            original = None
    where = (f"run {source} (MLflow experiment {original.info.experiment_id}, {original.info.run_name})" if original
             else f"run {source}, not in this store" if source else "a run that logged no MLflow run")
    tags = {STAGE_TAG: stage, EXPERIMENT_TAG: name, PARENT_TAG: parent.info.run_id,
            PIPELINE_TAG: parent.data.tags.get(PIPELINE_TAG, ""), RESTORED_TAG: source or "none",
            "mlflow.runName": f"{stage}-{name} (restored)",
            "mlflow.note.content": f"DVC restored {stage} of {name} from its run-cache: no code ran. Its outputs were "
                                   f"computed by {where}."}
    if original is not None:
        tags.update({k: v for k, v in original.data.tags.items()
                     if k.startswith("debias.") and k not in tags and k != PIPELINE_TAG})
    run_id = client.create_run(experiment_id, tags=tags).info.run_id
    if original is not None:
        params = [Param(k, v) for k, v in sorted(original.data.params.items())]
        stamp = int(time.time() * 1000)
        metrics = [Metric(k, v, stamp, 0) for k, v in sorted(original.data.metrics.items())]
        for start in range(0, max(len(params), len(metrics)), 100):
            client.log_batch(run_id, params=params[start:start + 100], metrics=metrics[start:start + 100])
        _copy_outputs(client, source, run_id)
    model = record.get("model_id")
    if model:
        try:
            for target in (run_id, parent.info.run_id):
                client.log_outputs(target, models=[LoggedModelOutput(model, step=0)])
        except Exception:  # a model in another store: the tag still names its run
            pass
    client.set_terminated(run_id, "FINISHED")
    return run_id


def _copy_outputs(client: Any, source: str, target: str) -> None:
    """The ``outputs/`` artifacts of run ``source`` logged again under run ``target``."""
    import mlflow.artifacts

    if not client.list_artifacts(source, "outputs"):
        return
    with tempfile.TemporaryDirectory() as tmp:
        local = mlflow.artifacts.download_artifacts(run_id=source, artifact_path="outputs", dst_path=tmp,
                                                    tracking_uri=client._tracking_client.tracking_uri)
        client.log_artifacts(target, local, "outputs")


def recorded_restorations(client: Any, experiment_id: str, parent_id: str) -> set[str]:
    """The stages already recorded as restored under ``parent_id``."""
    from debias.harness.tracking import PARENT_TAG

    children = client.search_runs([experiment_id], max_results=1000,
                                  filter_string=f"tags.`{PARENT_TAG}` = '{parent_id}'")
    return {r.data.tags.get(STAGE_TAG) for r in children if RESTORED_TAG in r.data.tags}


def record_restored(root: Path, state: dict[str, Any], names: list[str]) -> list[str]:
    """For each finished experiment of ``names``: its pipeline run (made when every stage was restored) and a stage
    run per restored stage (:func:`create_restored_stage`). Returns a line per experiment it recorded something
    for, and per problem (an unreadable record, an unusable store): said, never fatal to the sweep."""
    from debias.harness.tracking import tracking_mode

    if tracking_mode() == "off" or not names:
        return []
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"  # a command line tool: no bar per small file
    stores = [Path(cache_dir(root))]
    if state["options"].get("dvc_remote"):
        stores.append(Path(state["options"]["dvc_remote"]))
    try:
        client, experiment_id = _client_and_experiment(root, state)
    except Exception as exc:
        return [f"WARNING the restored experiments were not recorded in MLflow: {type(exc).__name__}: {exc}"[:600]]
    lines = []
    for name in names:
        ref = experiment_ref(state["commit"], name)
        lock = yaml.safe_load(git_file(root, ref, "dvc.lock") or "") or {}
        records, unread = {}, []
        for stage, md5 in record_hashes(lock).items():
            text = cached_text(md5, stores)
            if text is None:
                unread.append(stage)
                continue
            records[stage] = json.loads(text)
        if unread:
            lines.append(f"WARNING {name}: the run records of {', '.join(unread)} are in no DVC cache here: their "
                         "MLflow provenance is not recorded (`dvc exp pull` the experiment, then resume)")
        try:
            parent = find_parent(client, experiment_id, name, records)
            restored = restored_stages(records, parent.info.run_id if parent else None)
            made = ""
            if parent is None:
                if not restored:
                    continue
                parent = client.get_run(create_parent(client, experiment_id, root, state, name, ref, restored))
                made = "its MLflow run (every stage restored) and "
            else:
                done = recorded_restorations(client, experiment_id, parent.info.run_id)
                restored = {stage: record for stage, record in restored.items() if stage not in done}
            for stage, record in restored.items():
                create_restored_stage(client, experiment_id, parent, name, stage, record)
            if restored:
                complete_parent(client, parent, root, ref, restored)
            if made:
                client.set_terminated(parent.info.run_id, "FINISHED")
        except Exception as exc:
            lines.append(f"WARNING {name}: its restored stages were not recorded in MLflow: {type(exc).__name__}: "
                         f"{str(exc)[:300]}")
            continue
        if restored:
            lines.append(f"{name}: {made}{len(restored)} restored stage run(s) recorded in MLflow "
                         f"({', '.join(restored)}), each tagged {RESTORED_TAG} with the run that computed it")
    return lines
