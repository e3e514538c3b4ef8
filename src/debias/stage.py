"""The harness every pipeline entrypoint runs in: params, threads, MLflow run, clean errors.

An entrypoint names its stage and the params it reads (exactly those dvc.yaml declares for
it) and passes a body ``(params, run) -> None``. Expected failures (bad params, bad data,
broken files, unreachable tracking) end the process with one clear message and exit code 2
instead of a traceback; nothing already written is touched, since outputs are atomic.
Under ``torchrun`` every rank runs the body; only rank 0 opens the MLflow run and writes the run
record (:func:`debias.tracking.stage_run`), and the other ranks name themselves in error messages.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

from debias import distributed
from debias.data.bias import BiasProtocolError
from debias.data.sources import DataSourceError
from debias.io import CorruptFileError
from debias.params import Params, ParamsError, as_dict, load_params
from debias.paths import RUNS
from debias.runtime import configure_threads
from debias.tracking import StageRun, TrackingError, stage_run
from debias.training.memory import ResourceError, is_out_of_memory, out_of_memory_advice

EXPECTED_ERRORS = (ParamsError, DataSourceError, BiasProtocolError, CorruptFileError, TrackingError, ResourceError,
                   FileNotFoundError, ValueError)

# The params each stage reads; dvc.yaml declares exactly these (tests/test_dvc_yaml.py checks).
STAGE_PARAMS: dict[str, list[str]] = {
    "download": ["seed", "data"],
    "inject_bias": ["seed", "bias"],
    "train_erm": ["seed", "model", "erm"],
    "infer_groups": ["seed", "groups"],
    "train_contrastive": ["seed", "model", "stage2", "loss"],
    "linear_probe": ["seed", "probe"],
    "evaluate": ["seed", "evaluate"],
    "report": ["report"],  # plus params.yaml as a file dependency: the report shows every changed param
}


def main(stage: str, body: Callable[[Params, StageRun], None]) -> None:
    """Validate params, open the stage's MLflow run and run ``body``; exit 2 on an expected error."""
    params = None
    who = ", ".join(filter(None, [stage, "" if distributed.is_main() else distributed.describe()]))
    try:
        params = load_params()
        configure_threads()
        with stage_run(stage, as_dict(params, STAGE_PARAMS[stage]), record_path=RUNS / f"{stage}.json") as run:
            body(params, run)
    except EXPECTED_ERRORS as exc:
        if os.environ.get("DEBIAS_DEBUG"):
            raise
        print(f"[{who}] error: {exc}\n(set DEBIAS_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
    except (MemoryError, RuntimeError) as exc:  # a real out-of-memory error: say what to lower
        if os.environ.get("DEBIAS_DEBUG") or not is_out_of_memory(exc):
            raise
        first_line = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        print(f"[{who}] error: out of memory ({type(exc).__name__}: {first_line}); to reduce it, "
              f"{out_of_memory_advice(stage, params)}\n(set DEBIAS_DEBUG=1 for the traceback)", file=sys.stderr)
        sys.exit(2)
