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
headline metric (:mod:`debias.core.headline`), the warnings, the logged models and the report.

Models are MLflow 3 logged models (:meth:`StageRun.log_model`): a pyfunc "model from code"
(``debias/harness/tracking/mlflow_model.py``) that rebuilds the network from the stage's checkpoint with
``torch.load(weights_only=True)``, with a signature and an input example; no pickle anywhere.

Under ``torchrun`` only rank 0 opens the MLflow run and writes the run record; the other
ranks get a no-op :class:`StageRun` (:func:`stage_run`), so one stage is one MLflow run.
"""

from debias.harness.tracking.artifacts import MODEL_CODE, StageRun, model_requirements
from debias.harness.tracking.runs import KIND_TAG, PARENT_TAG, PIPELINE_TAG, StageTerminated, read_run_record, stage_run
from debias.harness.tracking.store import (DEFAULT_EXPERIMENT, EXPERIMENT_KIND, EXPERIMENT_KIND_TAG, check_reachable,
                                   ensure_experiment, git_commit, tracking_mode, tracking_uri)

__all__ = ["DEFAULT_EXPERIMENT", "EXPERIMENT_KIND", "EXPERIMENT_KIND_TAG", "KIND_TAG", "MODEL_CODE", "PARENT_TAG",
           "PIPELINE_TAG", "StageRun", "StageTerminated", "check_reachable", "ensure_experiment", "git_commit",
           "model_requirements", "read_run_record", "stage_run", "tracking_mode", "tracking_uri"]
