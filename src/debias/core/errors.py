"""Every error a user can act on, in one light module (no torch import), so the stage harness can name them.

Each is raised with one message that names the parameter, file or setting at fault and what to do;
:func:`debias.harness.stage.main` prints it on one line and exits with code 2 (``DEBIAS_DEBUG=1``: traceback).
"""

from __future__ import annotations


class DebiasError(Exception):
    """Base of the errors a user can act on."""


class ParamsError(DebiasError, ValueError):
    """A parameter is missing, unknown, of the wrong type or out of range."""


class DeclarationError(DebiasError, RuntimeError):
    """A method, group-inference method or probe variant module cannot be imported (import or syntax error) or
    declares itself wrongly (a name registered twice, a params section owned twice, a default without its source,
    no memory plan); the message names the module and what is wrong."""


class DataSourceError(DebiasError, RuntimeError):
    """A data source cannot provide its data; the message says which parameter or file to change."""


class BiasProtocolError(DebiasError, ValueError):
    """The data cannot be biased with the chosen protocol and parameters."""


class CorruptFileError(DebiasError, RuntimeError):
    """A file is truncated, foreign or missing the keys its reader needs."""


class TrackingError(DebiasError, RuntimeError):
    """The tracking store cannot be reached or used."""


class ResourceError(DebiasError, RuntimeError):
    """A run would not fit in the memory (or on the disk) of its machine; the message names what to lower."""


class DeviceError(DebiasError, RuntimeError):
    """``DEBIAS_DEVICE`` names a device this machine does not have."""


class TrainingDiverged(DebiasError, RuntimeError):
    """A loss or a weight became non-finite (or meaningless); the message names epoch, step and the params to lower."""


class StaleInputError(DebiasError, RuntimeError):
    """An input was written for other data or settings than the stage now reads."""


# The one wording of every number that needs the true bias attribute when the data has none (metrics, report,
# compare, MLflow tags): shown in place of the number, never a 0, a NaN or a dropped column.
NEEDS_BIAS_LABELS = "needs bias labels"


class NeedsBiasLabels(DebiasError, ValueError):
    """A stage, method or number needs the true bias attribute, and the data has none (no attribute column)."""


def uncommitted_params_hint(path: str = "params.yaml") -> str:
    """When ``path`` differs from git's committed copy, a sentence saying the values stay there and how to undo them
    (``dvc exp run -S`` writes its values into params.yaml and leaves them after a failed run); else ''."""
    import os
    import subprocess

    root = os.environ.get("DVC_ROOT")
    if root and os.path.realpath(root) != os.path.realpath(os.getcwd()):  # a queued or --temp experiment's workspace
        return ("\nThis experiment ran in DVC's temporary workspace (a queued or --temp run): the repository's "
                f"{path} is untouched; `dvc queue logs <name>` shows the run, and fixing the value and queueing it "
                "again reruns it")
    try:
        done = subprocess.run(["git", "diff", "--quiet", "HEAD", "--", str(path)], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    if done.returncode != 1:  # 0: as committed; 128 and others: not a git repository, no HEAD
        return ""
    return (f"\n{path} differs from the committed one and keeps these values after this failed run (`dvc exp run -S` "
            f"writes them there): `git checkout {path}` restores the committed values, `git diff {path}` shows them")
