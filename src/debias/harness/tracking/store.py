"""Where the MLflow store is (``$MLFLOW_TRACKING_URI`` or ``<root>/mlflow.db``), the tracking mode, and the
store's first use (experiment created under a file lock) and MLflow's fluent settings around a model upload."""

from __future__ import annotations

import contextlib
import fcntl
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from debias.core.environment import git_commit  # noqa: F401  (re-exported: tracking tags runs with it)
from debias.core.errors import TrackingError
from debias.core.paths import repo_root

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

DEFAULT_EXPERIMENT = "debias"
TRACKING_MODES = ("required", "optional", "off")
# MLflow 3's UI opens an experiment on its GenAI traces view unless this tag says "machine learning"; then it opens
# on "Training runs" (the values: mlflow/server/js, ExperimentKind; MLflow's own demo sets the GenAI one).
EXPERIMENT_KIND_TAG, EXPERIMENT_KIND = "mlflow.experimentKind", "custom_model_development"


RUN_NAME_VARIABLE = "DEBIAS_RUN_NAME"  # names a pipeline run that is no DVC experiment (a sweep's shared upstream)


def run_label() -> str:
    """What this pipeline run is, for its MLflow names: the DVC experiment (``$DVC_EXP_NAME``), else the name the
    launcher gave it (``$DEBIAS_RUN_NAME``: ``debias sweep`` names its shared upstream runs), else ``workspace``."""
    return os.environ.get("DVC_EXP_NAME") or os.environ.get(RUN_NAME_VARIABLE) or "workspace"


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
