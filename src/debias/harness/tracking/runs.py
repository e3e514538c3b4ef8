"""One MLflow run per stage (:func:`stage_run`) nested under its pipeline run's parent, found by its key (the DVC
experiment and process), with the provenance tags and the run record."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from debias.core.errors import ParamsError, TrackingError
from debias.core.io import save_json
from debias.core.paths import repo_root
from debias.harness.forkserver import LAUNCHER_VARIABLE
from debias.harness.tracking.artifacts import StageRun
from debias.harness.workspace import dvc_ancestor
from debias.params import flatten, params_hash, parse_yaml, read_yaml
from debias.harness.tracking.store import (DEFAULT_EXPERIMENT, _store_lock, check_reachable, ensure_experiment, git_commit,
                                           run_label, tracking_mode, tracking_uri)

PIPELINE_TAG = "debias.pipeline_run"  # the parent's key (see pipeline_run_key), on the parent and its stage runs
KIND_TAG = "debias.kind"  # "pipeline" on a parent run
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag


class StageTerminated(SystemExit):
    """SIGTERM arrived (``kill``, ``dvc queue kill``, a scheduler): the process exits 128 + 15."""


def dvc_invocation() -> str | None:
    """``'<pid>-<start time>'`` of the nearest ancestor ``dvc`` process (the ``dvc repro``, ``dvc exp run`` or
    queued ``dvc exp exec-run`` running this stage: :func:`debias.harness.workspace.dvc_ancestor`), None outside
    DVC. A stage forked by the fork server starts from its launcher (``DEBIAS_LAUNCHER_PID``), whose ancestors are
    the stage's."""
    launcher = os.environ.get(LAUNCHER_VARIABLE, "")
    found = dvc_ancestor(int(launcher) if launcher.isascii() and launcher.isdigit() else os.getppid())
    return None if found is None else f"{found[0]}-{found[2]}"


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()[:8]
    except OSError:
        return ""


def pipeline_run_key() -> str | None:
    """What identifies the pipeline run this stage belongs to: the DVC experiment name (``$DVC_EXP_NAME``; a
    workspace ``dvc repro`` has none) and the DVC process running the stages, on this host (boot). None
    outside DVC (a stage started by hand): its run then has no parent."""
    experiment = os.environ.get("DVC_EXP_NAME")
    invocation = dvc_invocation()
    if experiment is None and invocation is None:
        return None
    host = ".".join(filter(None, (socket.gethostname(), _boot_id())))
    key = f"{experiment or run_label()}@{host}:{invocation or 'no-dvc'}"
    return re.sub(r"[^A-Za-z0-9._:@+-]", "_", key)[:250]


def read_yaml_file(path: Path) -> dict[str, Any] | None:
    """``path`` parsed as DVC and the stages parse params.yaml (YAML 1.2: ``1e-3`` is a number; the stage's own read
    of the same text is reused), None when it is missing, not YAML or not a mapping."""
    try:
        loaded = read_yaml(path)
    except (OSError, ParamsError):
        return None
    return loaded if isinstance(loaded, dict) else None


def committed_params(root: Path, commit: str | None) -> dict[str, Any] | None:
    """params.yaml as committed at ``commit`` (the experiment's baseline), parsed as :func:`read_yaml_file` parses
    the workspace's; None when git cannot say."""
    if not commit:
        return None
    try:
        done = subprocess.run(["git", "show", f"{commit}:params.yaml"], cwd=root, capture_output=True, timeout=10)
        loaded = parse_yaml(done.stdout, Path(f"{commit}:params.yaml")) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ParamsError):
        return None
    return loaded if isinstance(loaded, dict) else None


def params_difference(params: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """Flat ``{key: value}`` of the params whose value differs from ``baseline`` (keys it lacks included)."""
    if baseline is None:
        return {}
    ours, theirs = flatten(params), flatten(baseline)
    return {key: value for key, value in ours.items() if theirs.get(key, object()) != value}


def describe_difference(difference: dict[str, Any], width: int = 200) -> str:
    """``'loss.epsilon=0.1, seed=1'`` cut to ``width`` characters."""
    text = ", ".join(f"{key}={value}" for key, value in sorted(difference.items()))
    return text if len(text) <= width else text[: width - 1] + "…"


def pipeline_parent(client: Any, experiment_id: str, key: str, uri: str, root: Path, commit: str | None) -> str:
    """The id of the parent run of pipeline run ``key``: found by its tag, else created (under the store's
    lock) with the full params, the difference from the baseline commit's params.yaml and provenance tags.
    A parent found is marked RUNNING again (each stage ends it with its own status)."""

    def find() -> Any | None:
        found = client.search_runs([experiment_id], max_results=1, filter_string=(
            f"tags.`{PIPELINE_TAG}` = '{key}' and tags.`{KIND_TAG}` = 'pipeline'"))
        return found[0] if found else None

    with _store_lock(uri, root):
        parent = find()
        if parent is not None:
            if parent.info.status != "RUNNING":
                client.update_run(parent.info.run_id, status="RUNNING")
            return parent.info.run_id
        experiment = os.environ.get("DVC_EXP_NAME")
        params = _workspace_params()
        written = read_yaml_file(Path.cwd() / "params.yaml")  # as written: defaults the file omits are no difference
        difference = params_difference(written, committed_params(root, commit)) if written else {}
        summary = describe_difference(difference, 120)
        name = run_label()
        tags = {KIND_TAG: "pipeline", PIPELINE_TAG: key,
                "mlflow.runName": f"{name} ({summary})" if summary else name,
                "debias.params_diff": describe_difference(difference, 5000) or "none (the baseline's params)"}
        if experiment:
            tags["debias.dvc_experiment"] = experiment
        if commit:
            tags["debias.git_commit"] = commit
        run_id = client.create_run(experiment_id, tags=tags).info.run_id
    if params:
        from mlflow.entities import Param

        items = [Param(k, str(v)[:6000]) for k, v in sorted(flatten(params).items())]
        for start in range(0, len(items), 100):
            client.log_batch(run_id, params=items[start : start + 100])
    return run_id


def _workspace_params() -> dict[str, Any] | None:
    """Every param of this workspace (params.yaml with the schema's defaults filled in), None without one."""
    path = Path.cwd() / "params.yaml"
    if not path.exists():
        return None
    from debias.params import as_dict
    from debias.schema import validate

    written = read_yaml_file(path)
    try:  # the schema's defaults filled in; completeness is the stage's own check, not the tracker's
        return as_dict(validate(written or {}))
    except ParamsError:  # an invalid file fails its stage with the error; the parent keeps what it says
        return written


@contextlib.contextmanager
def stage_run(stage: str, params: dict[str, Any], record_path: str | Path | None = None,
              experiment: str | None = None) -> Iterator[StageRun]:
    """Open an MLflow run for ``stage`` tagged for provenance; write a run record on success.

    A SIGTERM ends the run as KILLED; an exception as FAILED (and re-raises). On a rank other
    than 0 of a ``torchrun`` launch it yields a no-op run and touches neither MLflow nor the record.
    """
    from debias.core.distributed import is_main  # here: importing it imports torch, which tracking alone does not need

    if not is_main():
        yield StageRun(None, None)
        return
    root = repo_root()
    mode = tracking_mode()
    uri = tracking_uri(root)
    started = time.time()
    client, run_id, parent_id = None, None, None
    if mode != "off":
        try:
            check_reachable(uri)
            from mlflow.tracking import MlflowClient

            experiment_id = ensure_experiment(uri, experiment or os.environ.get("MLFLOW_EXPERIMENT_NAME", DEFAULT_EXPERIMENT), root)
            client = MlflowClient(tracking_uri=uri)
            tags = {
                "debias.stage": stage,
                "debias.params_hash": params_hash(params),
                "mlflow.runName": f"{stage}-{run_label()}",
            }
            commit = git_commit(root)
            if commit:
                tags["debias.git_commit"] = commit
            if os.environ.get("DVC_EXP_NAME"):
                tags["debias.dvc_experiment"] = os.environ["DVC_EXP_NAME"]
            key = pipeline_run_key()
            if key is not None:
                parent_id = pipeline_parent(client, experiment_id, key, uri, root, commit)
                tags.update({PARENT_TAG: parent_id, PIPELINE_TAG: key})
            run_id = client.create_run(experiment_id, tags=tags).info.run_id
        except Exception as exc:
            if mode == "required":
                if isinstance(exc, TrackingError):
                    raise
                raise TrackingError(
                    f"MLflow tracking store {uri} cannot be used ({type(exc).__name__}: {exc}); fix it, or set "
                    "DEBIAS_TRACKING=optional to run without logging"
                ) from exc
            warnings.warn(f"tracking disabled: {uri} unusable ({exc}); results of stage '{stage}' are NOT logged to MLflow")
            client, run_id, parent_id = None, None, None
    run = StageRun(client, run_id, uri, mode, parent_id=parent_id if run_id else None, stage=stage)
    run.log_params(params)

    previous = signal.getsignal(signal.SIGTERM)

    def on_term(signum: int, frame: Any) -> None:
        raise StageTerminated(128 + signum)  # unwinds the stage; the run is ended KILLED below

    handling_term = run.active
    if handling_term:
        signal.signal(signal.SIGTERM, on_term)
    status = "FINISHED"
    try:
        yield run
    except (StageTerminated, KeyboardInterrupt):  # SIGTERM or Ctrl-C: stopped, not failed
        status = "KILLED"
        raise
    except BaseException:
        status = "FAILED"
        raise
    finally:
        if handling_term:
            signal.signal(signal.SIGTERM, previous)
        if status == "FINISHED":
            run.end(status)
        else:  # already unwinding: a broken store must not hide the error that stopped the stage
            with contextlib.suppress(Exception):
                run.end(status)
    if status == "FINISHED" and record_path is not None:
        save_json(record_path, {
            "stage": stage,
            "run_id": run.run_id,
            "tracking_uri": uri if run.active else None,
            "params_hash": params_hash(params),
            "dvc_experiment": os.environ.get("DVC_EXP_NAME"),
            "parent_run_id": run.parent_id,
            "tracking_lost": run.lost,
            **run.notes,
            "wall_time_s": round(time.time() - started, 3),
        })


def read_run_record(path: str | Path) -> dict[str, Any] | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else None
