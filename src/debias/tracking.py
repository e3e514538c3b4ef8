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

Under ``torchrun`` only rank 0 opens the MLflow run and writes the run record; the other
ranks get a no-op :class:`StageRun` (:func:`stage_run`), so one stage is one MLflow run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import tempfile
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


def ensure_experiment(uri: str, name: str, root: Path) -> str:
    """Create (once, under a lock) the store and the experiment; return the experiment id."""
    from mlflow.tracking import MlflowClient

    def get_or_create() -> str:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            return experiment.experiment_id
        location = (root / "mlruns").as_uri() if uri.startswith("sqlite:") else None
        return client.create_experiment(name, artifact_location=location)

    if uri.startswith("sqlite:"):
        with _file_lock(root / "mlflow.db.lock"):
            return get_or_create()
    return get_or_create()


def sqlite_path(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None."""
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


class StageRun:
    """An MLflow run for one stage: params, metrics, artifacts, model; a no-op when tracking is off.

    A store that breaks while the stage runs (its SQLite file deleted, replaced or corrupted, a
    server gone) is noticed at the next call: ``required`` raises :class:`TrackingError` naming the
    store, ``optional`` warns once and the stage goes on without logging.
    """

    def __init__(self, client: Any, run_id: str | None, uri: str | None = None, mode: str = "required") -> None:
        self.client = client
        self.run_id = run_id
        self.uri = uri
        self.mode = mode
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
        self.run_id, self.lost = None, message
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

    def log_model(self, model: Any, name: str = "model") -> None:
        """Log a torch module as an MLflow pytorch model (pickle serialisation: no export needed)."""
        if not self.active:
            return
        import mlflow.pytorch

        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / name
            mlflow.pytorch.save_model(model, str(target), serialization_format="pickle",
                                      pip_requirements=model_requirements(model))
            self._call("logging the model", self.client.log_artifacts, self.run_id, str(target), name)

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
        if not self.active:  # tracking off: self.client is None
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


# Imported by loading a pickled torch model with mlflow.pytorch, besides the modules of the model's classes.
MODEL_LOADER_MODULES = ("torch", "cloudpickle", "numpy", "pandas")


def model_requirements(model: Any) -> list[str] | None:
    """Pinned pip requirements of a pickled torch ``model``: the list MLflow's inference finds.

    That inference loads the saved model in a subprocess that imports torch and mlflow again to
    watch which modules load (~5 s in every training stage); the answer is the distributions of the
    model's own classes' modules (debias, torch, torchvision for resnet18) and those MLflow's loader
    imports. None (MLflow infers) when a distribution cannot be resolved.
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
    client, run_id = None, None
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
            client, run_id = None, None
    run = StageRun(client, run_id, uri, mode)
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
            "tracking_lost": run.lost,
            **run.notes,
            "wall_time_s": round(time.time() - started, 3),
        })


def read_run_record(path: str | Path) -> dict[str, Any] | None:
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else None
