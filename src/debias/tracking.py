"""MLflow tracking: store resolution, one run per stage, tags, artifacts and run records.

Store: ``MLFLOW_TRACKING_URI`` when set, else a SQLite file ``mlflow.db`` at the repository
root, where the repository root is ``$DVC_ROOT`` (DVC points it at the main repository even
in ``dvc exp run --temp`` and queued runs), else the nearest folder holding ``.dvc/``, else
the working directory. Artifacts of that default store live in ``<root>/mlruns``, fixed on
the experiment when it is created, so runs from temporary workspaces land beside the rest.
The first use of a store is serialised with a file lock (concurrent migrations fail).

``DEBIAS_TRACKING`` = ``required`` (default: an unreachable store fails the stage fast,
naming the URI) | ``optional`` (warn and run without logging) | ``off``.

Every stage run is tagged with the stage, git commit, DVC experiment name and the hash of
the params it read, and writes a run record JSON (run id, status, wall time) as a stage
output, so the link survives when DVC restores the stage from its run-cache.

One pipeline run (a ``dvc repro``, a ``dvc exp run`` in the workspace, ``--temp`` or from the queue) is one
MLflow *parent* run and its stage runs are nested under it (tag ``mlflow.parentRunId``), so the UI's run
table has one row per experiment. The parent is found by its key (:func:`pipeline_run_key`): the DVC
experiment name and the DVC process that runs the stages (pid and start time of the nearest ``dvc``
ancestor process; each queued experiment runs in its own ``dvc exp exec-run`` process). Two queue workers
therefore never share a key, and a stage can only ever attach to the parent of its own experiment. The
parent holds the full params, the params that differ from the baseline commit (tag and run name), every
headline metric (:mod:`debias.headline`), the warnings, the logged models and the report.

Models are MLflow 3 logged models (:meth:`StageRun.log_model`): a pyfunc "model from code"
(``debias/mlflow_model.py``) that rebuilds the network from the stage's checkpoint with
``torch.load(weights_only=True)``, with a signature and an input example; no pickle anywhere.

Under ``torchrun`` only rank 0 opens the MLflow run and writes the run record; the other
ranks get a no-op :class:`StageRun` (:func:`stage_run`), so one stage is one MLflow run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.request
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from debias.errors import TrackingError
from debias.io import save_json
from debias.params import flatten, params_hash
from debias.paths import repo_root

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

DEFAULT_EXPERIMENT = "debias"
TRACKING_MODES = ("required", "optional", "off")
PIPELINE_TAG = "debias.pipeline_run"  # the parent's key (see pipeline_run_key), on the parent and its stage runs
KIND_TAG = "debias.kind"  # "pipeline" on a parent run
PARENT_TAG = "mlflow.parentRunId"  # MLflow's own nesting tag
# MLflow 3's UI opens an experiment on its GenAI traces view unless this tag says "machine learning"; then it opens
# on "Training runs" (the values: mlflow/server/js, ExperimentKind; MLflow's own demo sets the GenAI one).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"
MODEL_CODE = Path(__file__).with_name("mlflow_model.py")  # the logged models' code (MLflow "model from code")


class StageTerminated(SystemExit):
    """SIGTERM arrived (``kill``, ``dvc queue kill``, a scheduler): the process exits 128 + 15."""


def tracking_uri(root: Path | None = None) -> str:
    """``$MLFLOW_TRACKING_URI`` or ``sqlite:///<root>/mlflow.db`` (absolute)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if uri:
        return uri
    return f"sqlite:///{(root or repo_root()) / 'mlflow.db'}"


def tracking_mode() -> str:
    mode = os.environ.get("DEBIAS_TRACKING", "required").strip().lower()
    if mode not in TRACKING_MODES:
        raise TrackingError(f"DEBIAS_TRACKING = '{mode}'; allowed: {', '.join(TRACKING_MODES)}")
    return mode


def git_commit(root: Path) -> str | None:
    """The commit the run belongs to: DVC's experiment baseline, else ``git rev-parse HEAD``."""
    if os.environ.get("DVC_EXP_BASELINE_REV"):
        return os.environ["DVC_EXP_BASELINE_REV"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None


def check_reachable(uri: str, timeout_s: float = 5.0) -> None:
    """Fail fast, naming the URI, when an HTTP tracking server does not answer."""
    if not uri.startswith(("http://", "https://")):
        return
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as response:
            response.read()
    except Exception as exc:
        raise TrackingError(
            f"MLflow tracking server {uri} is unreachable ({type(exc).__name__}: {exc}); start it, fix "
            "MLFLOW_TRACKING_URI, or set DEBIAS_TRACKING=optional to run without logging"
        ) from None


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _process(pid: int) -> tuple[list[str], int, str] | None:
    """``(argv, parent pid, start time)`` of a process: /proc on Linux, else ``ps``; None when it is gone."""
    proc = Path("/proc") / str(pid)
    if proc.is_dir():
        try:
            argv = [a for a in (proc / "cmdline").read_bytes().decode(errors="replace").split("\0") if a]
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            return argv, int(fields[1]), fields[19]  # fields after the name: state, ppid, ..., starttime (22nd)
        except (OSError, IndexError, ValueError):
            return None
    try:
        out = subprocess.run(["ps", "-o", "ppid=", "-o", "lstart=", "-o", "args=", "-p", str(pid)],
                             capture_output=True, text=True, timeout=5).stdout.split()
    except (OSError, subprocess.TimeoutExpired):
        return None
    if len(out) < 7:
        return None
    return out[6:], int(out[0]), "-".join(out[1:6])


def is_dvc_command(argv: list[str]) -> bool:
    """Whether ``argv`` runs DVC: ``dvc ...``, ``python /path/bin/dvc ...`` or ``python -m dvc ...``."""
    head = argv[:3]
    if any(Path(arg).name == "dvc" for arg in head[:2]):
        return True
    return any(a == "-m" and b == "dvc" for a, b in zip(head, head[1:]))


def dvc_invocation(max_depth: int = 32) -> str | None:
    """``'<pid>-<start time>'`` of the nearest ancestor ``dvc`` process (the ``dvc repro``, ``dvc exp run`` or
    queued ``dvc exp exec-run`` running this stage), None outside DVC."""
    pid = os.getppid()
    for _ in range(max_depth):
        if pid <= 1:
            return None
        info = _process(pid)
        if info is None:
            return None
        argv, parent, started = info
        if is_dvc_command(argv):
            return f"{pid}-{started}"
        pid = parent
    return None


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
    key = f"{experiment or 'workspace'}@{host}:{invocation or 'no-dvc'}"
    return re.sub(r"[^A-Za-z0-9._:@+-]", "_", key)[:250]


def read_yaml_file(path: Path) -> dict[str, Any] | None:
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None
    return loaded if isinstance(loaded, dict) else None


def committed_params(root: Path, commit: str | None) -> dict[str, Any] | None:
    """params.yaml as committed at ``commit`` (the experiment's baseline), None when git cannot say."""
    if not commit:
        return None
    import yaml

    try:
        done = subprocess.run(["git", "show", f"{commit}:params.yaml"], cwd=root, capture_output=True, text=True,
                              timeout=10)
        loaded = yaml.safe_load(done.stdout) if done.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, yaml.YAMLError):
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


def ensure_experiment(uri: str, name: str, root: Path) -> str:
    """Create (once, under a lock) the store and the experiment; return the experiment id. The experiment is
    tagged as a machine-learning one (:data:`EXPERIMENT_KIND_TAG`) so the UI opens on its training runs; an older
    experiment without the tag gets it (a kind chosen in the UI is kept)."""
    from mlflow.tracking import MlflowClient

    def get_or_create() -> str:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            if EXPERIMENT_KIND_TAG not in experiment.tags:
                client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, EXPERIMENT_KIND)
            return experiment.experiment_id
        location = (root / "mlruns").as_uri() if uri.startswith("sqlite:") else None
        try:
            return client.create_experiment(name, artifact_location=location,
                                            tags={EXPERIMENT_KIND_TAG: EXPERIMENT_KIND})
        except Exception:  # a server has no file lock: another stage (a parallel sweep task) created it meanwhile
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
            return experiment.experiment_id

    if uri.startswith("sqlite:"):
        with _file_lock(root / "mlflow.db.lock"):
            return get_or_create()
    return get_or_create()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def _store_lock(uri: str, root: Path):
    return _file_lock(root / "mlflow.db.lock") if uri.startswith("sqlite:") else contextlib.nullcontext()


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
        name = experiment or "workspace"
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
    try:
        from debias.params import as_dict, load_params

        return as_dict(load_params(path))
    except Exception:
        return read_yaml_file(path)


@contextlib.contextmanager
def _tracking_uri_set(uri: str) -> Iterator[None]:
    """MLflow's fluent APIs (which ``Model.log`` uses) pointed at ``uri`` for the duration, then restored."""
    try:
        from mlflow.tracking._tracking_service.utils import _use_tracking_uri
    except ImportError:  # a later MLflow: set and restore the environment variable instead
        previous = os.environ.get("MLFLOW_TRACKING_URI")
        os.environ["MLFLOW_TRACKING_URI"] = uri
        try:
            yield
        finally:
            if previous is None:
                os.environ.pop("MLFLOW_TRACKING_URI", None)
            else:
                os.environ["MLFLOW_TRACKING_URI"] = previous
        return
    with _use_tracking_uri(uri):
        yield


@contextlib.contextmanager
def _quiet_mlflow() -> Iterator[None]:
    """MLflow's INFO lines and artifact progress bars off while a model is logged."""
    import logging

    logger = logging.getLogger("mlflow")
    level = logger.level
    previous = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    logger.setLevel(logging.WARNING)
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    try:
        yield
    finally:
        logger.setLevel(level)
        if previous is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = previous


class StageRun:
    """An MLflow run for one stage: params, metrics, artifacts, model; a no-op when tracking is off.

    A store that breaks while the stage runs (its SQLite file deleted, replaced or corrupted, a
    server gone) is noticed at the next call: ``required`` raises :class:`TrackingError` naming the
    store, ``optional`` warns once and the stage goes on without logging.
    """

    def __init__(self, client: Any, run_id: str | None, uri: str | None = None, mode: str = "required",
                 parent_id: str | None = None, stage: str | None = None) -> None:
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.mode = mode
        self.parent_id = parent_id  # the pipeline run's parent (None outside DVC)
        self.stage = stage
        self.lost: str | None = None  # why logging stopped, when it did
        self.notes: dict[str, Any] = {}  # facts for the run record (see note)
        database = sqlite_path(uri) if uri else None
        self._database = database
        self._inode = database.stat().st_ino if database is not None and database.exists() else None

    @property
    def active(self) -> bool:
        return self.run_id is not None

    def _store_problem(self) -> str | None:
        """Why the store cannot be trusted any more (its SQLite file deleted or replaced), else None."""
        if self._database is None or self._inode is None:
            return None
        try:
            inode = self._database.stat().st_ino
        except FileNotFoundError:
            return f"its file {self._database} was deleted"
        return None if inode == self._inode else f"its file {self._database} was replaced"

    def _give_up(self, what: str, cause: str) -> None:
        message = (f"MLflow tracking store {self.uri} broke while {what}: {cause}; the stage's files on disk are "
                   "intact but this MLflow run is lost")
        self.run_id, self.parent_id, self.lost = None, None, message
        if self.mode == "required":
            raise TrackingError(message + "; restore or remove the store and rerun, or set DEBIAS_TRACKING=optional "
                                "to run without logging")
        warnings.warn(message + " (DEBIAS_TRACKING=optional: going on without logging)", stacklevel=3)

    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` on the store, turning a broken store into :meth:`_give_up`."""
        if not self.active:
            return None
        problem = self._store_problem()
        if problem is not None:
            self._give_up(what, problem)
            return None
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            self._give_up(what, f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}")
            return None

    def log_params(self, values: dict[str, Any]) -> None:
        if not self.active:
            return
        from mlflow.entities import Param

        flat = {k: str(v)[:6000] for k, v in flatten(values).items()}
        items = [Param(k, v) for k, v in sorted(flat.items())]
        for start in range(0, len(items), 100):
            self._call("logging params", self.client.log_batch, self.run_id, params=items[start : start + 100])

    def log_metrics(self, values: dict[str, float | None], step: int | None = None) -> None:
        if not self.active:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(k.replace("/", "."), float(v), stamp, step or 0) for k, v in values.items() if v is not None]
        for start in range(0, len(items), 500):
            self._call("logging metrics", self.client.log_batch, self.run_id, metrics=items[start : start + 500])

    def log_artifact(self, path: str | Path, folder: str | None = None) -> None:
        if self.active and Path(path).exists():
            self._call(f"logging {path}", self.client.log_artifact, self.run_id, str(path), folder)

    def log_model(self, model: Any, name: str | None = None, checkpoint: str | Path | None = None,
                  input_example: Any = None) -> str | None:
        """Log a network as an MLflow 3 logged model of this run (and of the pipeline's parent run): the
        pyfunc model from code :data:`MODEL_CODE`, its weights the stage's ``checkpoint`` (written by
        :func:`debias.models.save_network`, loaded back with ``weights_only=True``), with a signature and
        ``input_example`` (a few rows of the training split, as stored). Named after the checkpoint (``erm``,
        ``stage2``). Returns the model id (None when not logged)."""
        if not self.active:
            return None
        if checkpoint is None or not Path(checkpoint).exists() or input_example is None:
            warnings.warn(f"model not logged to MLflow: {'no checkpoint' if checkpoint is None else 'no input example'}"
                          " was given (StageRun.log_model needs the checkpoint the stage wrote and an input example)")
            return None
        model_id = self._call("logging the model", self._log_model, model, name or Path(checkpoint).stem,
                              Path(checkpoint), input_example)
        if model_id:
            self.notes["model_id"] = model_id
        return model_id

    def _log_model(self, model: Any, name: str, checkpoint: Path, input_example: Any) -> str:
        import mlflow
        import numpy as np
        import torch
        from mlflow.entities import LoggedModelOutput
        from mlflow.models import Model, infer_signature

        example = np.ascontiguousarray(torch.as_tensor(input_example)[:2].cpu().numpy())
        was_training = model.training
        model.eval()
        with torch.no_grad():
            output = model(torch.from_numpy(example)).float().cpu().numpy()
        model.train(was_training)
        run = self.client.get_run(self.run_id)
        tags = {key: value for key, value in run.data.tags.items() if key.startswith("debias.")}
        tags["debias.checkpoint"] = str(checkpoint)
        logged = self.client.create_logged_model(run.info.experiment_id, name=name, source_run_id=self.run_id,
                                                 params={k: str(v)[:6000] for k, v in run.data.params.items()},
                                                 tags=tags, model_type="classifier")
        with _tracking_uri_set(self.uri), _quiet_mlflow():
            Model.log(artifact_path=None, name=name, flavor=mlflow.pyfunc, run_id=self.run_id,
                      model_id=logged.model_id, python_model=str(MODEL_CODE), artifacts={"checkpoint": str(checkpoint)},
                      signature=infer_signature(example, output), input_example=example,
                      pip_requirements=model_requirements(model))
        if self.parent_id:
            self.client.log_outputs(self.parent_id, models=[LoggedModelOutput(logged.model_id, step=0)])
        return logged.model_id

    # ------------------------------------------------------------------ the pipeline's parent run

    def log_parent(self, metrics: dict[str, float] | None = None, tags: dict[str, str] | None = None) -> None:
        """Metrics and tags on the pipeline's parent run (nothing without one)."""
        if not self.active or not self.parent_id:
            return
        from mlflow.entities import Metric

        stamp = int(time.time() * 1000)
        items = [Metric(k, float(v), stamp, 0) for k, v in (metrics or {}).items() if v is not None]
        if items:
            self._call("logging the parent's metrics", self.client.log_batch, self.parent_id, metrics=items)
        for key, value in (tags or {}).items():
            if self.parent_id:
                self._call("tagging the parent run", self.client.set_tag, self.parent_id, key, value)

    def log_parent_artifact(self, path: str | Path, folder: str | None = None) -> None:
        if self.active and self.parent_id and Path(path).exists():
            self._call(f"logging {path} on the parent run", self.client.log_artifact, self.parent_id, str(path), folder)

    def note(self, key: str, value: Any) -> None:
        """A fact about this run (e.g. it resumed an interrupted one): an MLflow tag ``debias.<key>`` and a
        field of the stage's run record."""
        self.notes[key] = value
        self.set_tags({f"debias.{key}": str(value)})

    def log_warnings(self, warnings: list[str]) -> None:
        """A stage's warnings (``code: message`` lines, :mod:`debias.health`): the tag ``debias.warnings`` (one per
        line) and the metric ``warnings`` (their count, 0 included)."""
        self.log_metrics({"warnings": float(len(warnings))})
        if warnings:
            self.set_tags({"debias.warnings": "\n".join(warnings)[:5000]})

    def set_tags(self, tags: dict[str, str]) -> None:
        if not self.active:
            return
        for key, value in tags.items():
            self._call("tagging the run", self.client.set_tag, self.run_id, key, value)

    def end(self, status: str) -> None:
        """Log the workspace's params.yaml and dvc.lock and end the run with ``status``."""
        if not self.active:
            return
        # Under `dvc exp run` the git tags name the baseline commit; these files name the experiment.
        for name in ("params.yaml", "dvc.lock"):
            self.log_artifact(Path.cwd() / name, "provenance")
        if self.active:
            self._call("ending the run", self.client.set_terminated, self.run_id, status)
        if self.active and self.parent_id:  # the parent shows how the pipeline's last stage ended
            self._call("ending the parent run", self.client.set_terminated, self.parent_id, status)


# Imported when the logged model is loaded (debias/mlflow_model.py), besides the modules of the model's classes.
MODEL_LOADER_MODULES = ("torch", "numpy")


def model_requirements(model: Any) -> list[str] | None:
    """Pinned pip requirements of a logged ``model``: the distributions of its own classes' modules (debias,
    torch, torchvision for the ResNets) and those :data:`MODEL_CODE` imports to load it (MLflow adds itself).

    MLflow would otherwise infer them by loading the saved model in a subprocess that imports torch and
    mlflow again (~5 s in every training stage). None (MLflow infers) when a distribution cannot be resolved.
    """
    try:
        from importlib.metadata import packages_distributions

        from mlflow.utils.requirements_utils import _get_pinned_requirement

        modules = {type(m).__module__.split(".")[0] for m in model.modules()} | set(MODEL_LOADER_MODULES)
        distributions = packages_distributions()
        names = sorted({dist for module in modules for dist in distributions[module]})
        return [_get_pinned_requirement(dist) for dist in names]
    except Exception:
        return None


@contextlib.contextmanager
def stage_run(stage: str, params: dict[str, Any], record_path: str | Path | None = None,
              experiment: str | None = None) -> Iterator[StageRun]:
    """Open an MLflow run for ``stage`` tagged for provenance; write a run record on success.

    A SIGTERM ends the run as KILLED; an exception as FAILED (and re-raises). On a rank other
    than 0 of a ``torchrun`` launch it yields a no-op run and touches neither MLflow nor the record.
    """
    from debias.distributed import is_main  # here: importing it imports torch, which tracking alone does not need

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
                "mlflow.runName": f"{stage}-{os.environ.get('DVC_EXP_NAME') or 'workspace'}",
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
