"""What a stage logs to its MLflow run (:class:`StageRun`): params, metrics, artifacts, tags, warnings, the
pipeline parent's metrics, and the network as an MLflow 3 logged model (pyfunc from code, no pickle)."""

from __future__ import annotations

import re
import time
import warnings
from pathlib import Path
from typing import Any

from debias.core.errors import NEEDS_BIAS_LABELS, TrackingError
from debias.harness.tracking.store import _quiet_mlflow, _tracking_uri_set, sqlite_path
from debias.params import flatten

MODEL_CODE = Path(__file__).parent / "mlflow_model.py"  # the logged models' code (MLflow "model from code")


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

    def log_metrics(self, values: dict[str, float | str | None], step: int | None = None) -> None:
        """Log numbers (None skipped); a value that is :data:`~debias.core.errors.NEEDS_BIAS_LABELS` (data without bias
        labels) is logged as no number but named in the tag ``debias.needs_bias_labels`` (``key, key: needs bias
        labels``), so the run says which of its keys cannot be computed instead of lacking them silently."""
        if not self.active:
            return
        from mlflow.entities import Metric

        needs = sorted(k.replace("/", ".") for k, v in values.items() if v == NEEDS_BIAS_LABELS)
        if needs:
            self.needs_bias_labels = sorted(set(getattr(self, "needs_bias_labels", [])) | set(needs))
            self.set_tags({"debias.needs_bias_labels": f"{', '.join(self.needs_bias_labels)}: {NEEDS_BIAS_LABELS}"[:5000]})
        stamp = int(time.time() * 1000)
        items = [Metric(k.replace("/", "."), float(v), stamp, step or 0) for k, v in values.items()
                 if v is not None and v != NEEDS_BIAS_LABELS]
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
        ``input_example`` (a few rows of the training split, as stored). Named after what it is: the checkpoint
        (``erm``, ``stage2``), the method (stage 2's ``stage2.method``, else the encoder's ``model.name``) and the
        pipeline run (``erm-lenet5-workspace``, ``stage2-cnc-temp-temperature0.05-seed1``). Returns the model id
        (None when not logged)."""
        if not self.active:
            return None
        if checkpoint is None or not Path(checkpoint).exists() or input_example is None:
            warnings.warn(f"model not logged to MLflow: {'no checkpoint' if checkpoint is None else 'no input example'}"
                          " was given (StageRun.log_model needs the checkpoint the stage wrote and an input example)")
            return None
        model_id = self._call("logging the model", self._log_model, model, name or self._model_name(Path(checkpoint)),
                              Path(checkpoint), input_example)
        if model_id:
            self.notes["model_id"] = model_id
        return model_id

    def _model_name(self, checkpoint: Path) -> str:
        """``<checkpoint>-<method>-<pipeline run>`` (:meth:`log_model`), the characters MLflow refuses in a model's
        name (``/ : . % " '``, and anything else outside letters, digits, ``-`` and ``_``) made ``_``."""
        from debias.harness.tracking.store import run_label

        params = self.client.get_run(self.run_id).data.params
        method = params.get("stage2.method") if checkpoint.stem == "stage2" else params.get("model.name")
        name = "-".join(filter(None, (checkpoint.stem, method, run_label())))
        return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:200]

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
        items = [Metric(k, float(v), stamp, 0) for k, v in (metrics or {}).items()
                 if v is not None and v != NEEDS_BIAS_LABELS]
        needs = sorted(k for k, v in (metrics or {}).items() if v == NEEDS_BIAS_LABELS)
        if needs:  # data without bias labels: the parent names the keys it has no number for
            tags = {**(tags or {}), "debias.needs_bias_labels": f"{', '.join(needs)}: {NEEDS_BIAS_LABELS}"[:5000]}
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
        """A stage's warnings (``code: message`` lines, :mod:`debias.core.health`): the tag ``debias.warnings`` (one per
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


# Imported when the logged model is loaded (debias/harness/tracking/mlflow_model.py), besides the modules of the model's classes.
MODEL_LOADER_MODULES = ("torch", "numpy")


def model_requirements(model: Any) -> list[str] | None:
    """Pinned pip requirements of a logged ``model``: the distributions of its own classes' modules (debias,
    torch, torchvision for the ResNets) and those :data:`MODEL_CODE` imports to load it (MLflow adds itself).

    MLflow would otherwise infer them by loading the saved model in a subprocess that imports torch and
    mlflow again (~5 s in every training stage). The distributions come from MLflow's own map of modules to
    distributions, which ``Model.log`` builds anyway to check the requirements (one scan of every installed
    distribution instead of two; a stage forked by the fork server may find it built). None (MLflow infers) when a distribution cannot be resolved.
    """
    try:
        from mlflow.utils import requirements_utils

        modules = {type(m).__module__.split(".")[0] for m in model.modules()} | set(MODEL_LOADER_MODULES)
        requirements_utils._init_modules_to_packages_map()
        distributions = requirements_utils._MODULES_TO_PACKAGES
        names = sorted({dist for module in modules for dist in distributions[module]})
        return [requirements_utils._get_pinned_requirement(dist) for dist in names]
    except Exception:
        return None
