"""``debias sweep``: a grid of DVC experiments (params x values x seeds) run on the DVC queue or a SLURM job array.

Every grid point is one ordinary DVC experiment (``dvc exp run -n NAME -S key=value ... [targets]``), so
``dvc exp show`` and ``debias compare`` read a sweep like any other experiments. Two launchers:

- ``local``: DVC's own queue (``dvc exp run --queue``, DVC's command run in the sweep's process, then ``dvc queue
  start -j N``) on this machine.
- ``slurm``: a job array through submitit; each array task clones the repository at the sweep's commit into
  ``sweeps/<name>/clones/<experiment>``, pulls DVC's run-cache from the DVC remote (``dvc pull --run-cache``),
  runs ``dvc exp run``, pushes the run-cache (``dvc push --run-cache``) and the experiment (``dvc exp push
  origin``: its git ref to this repository, its outputs to the remote), and removes its clone.

Shared upstream stages run once: with ``--upstream STAGE`` each distinct value of the params that STAGE and its
ancestors read (``params:`` in dvc.yaml) is first computed by one ``dvc repro STAGE`` in a clone (phase 1; SLURM:
a first array that the experiments' array depends on with ``afterok``), whose run-cache the experiments then
restore instead of recomputing (local: the clone uses this repository's cache; SLURM: through the DVC remote).
Its MLflow runs go to the experiment ``<mlflow experiment>-upstream``.

The whole grid is validated against the params schema (and the targets against dvc.yaml) before anything is
queued or submitted. The plan and the SLURM job ids are kept in ``sweeps/<name>/sweep.json``: ``--status`` shows
each experiment queued / running / done / failed with its log, ``--resume`` reruns what is neither done nor
queued nor running (an experiment is done when its DVC experiment exists at the sweep's baseline commit);
``--resume --seeds`` adds seeds to a finished sweep and ``--until-decided`` adds them in batches until a corrected
verdict (:mod:`.extend`). While anything runs, a line at least every 15 s names each running run's stage, epoch
and ETA (:mod:`.watch`); afterwards each experiment's stages that DVC restored from its run-cache get their MLflow
runs (:mod:`.records`).
"""

from debias.tools.sweep.command import add_parser
from debias.tools.sweep.grid import Job, SweepError
from debias.tools.sweep.local import run_local

__all__ = ["Job", "SweepError", "add_parser", "run_local"]
