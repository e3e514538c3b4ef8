"""A warm interpreter for the stage processes: torch, MLflow, pandas, SciPy and scikit-learn imported once, a fork per stage.

Every stage is its own ``python pipeline/<stage>.py`` process, and importing its libraries took 3-4.5 of the
5-12 s each stage process lasted on the default data (``python -X importtime``, docs/gpu.md). With the fork
server, ``python -m debias.harness.launch pipeline/<stage>.py`` (dvc.yaml's command for every stage) asks a server
process that holds those imports to fork a process that runs the stage, and stands in for it:

* the forked process is the process the launcher would start (:mod:`debias.harness.forkserver.stage`): it takes the
  launcher's standard streams (passed over a Unix socket), environment (plus ``DEBIAS_LAUNCHER_PID``, the launcher's
  pid, where the search for the DVC process running the stage starts), working directory, umask, resource limits,
  CPU affinity, ignored and blocked signals, a session of its own (its watcher's: its own CPU share where the
  kernel shares CPU time by session), and sets ``sys.argv``, ``sys.path[0]``, ``sys.orig_argv``, its
  process title and its global random state as ``python SCRIPT ARGS`` would have them; it drops every ``debias``
  module the server held, so the project's code is read from disk by each stage (a change takes effect at the next
  stage, as without the server); MLflow's map of modules to installed distributions, which the server builds once
  when idle, is kept only where the stage's path would give the same map (:func:`stage.keep_distribution_map`);
* the launcher passes on the signals a plain stage would have received (:data:`launcher.FORWARDED_SIGNALS`, those
  it inherited ignored excepted), and ends with the stage's exit code or dies of its signal; if the launcher is
  killed, the stage's process group is killed too, and if the server's watcher of the stage dies, so does the stage.

One server per interpreter and import-time state: the socket's name hashes the Python executable, version and
flags, the environment variables an import may read (:data:`IMPORT_TIME`: the interpreter's, the loader's, the
thread pools', locale, cache and temporary folders, the preloaded libraries'), the modification times of ``sys.path``'s folders (an install or
upgrade starts a new server), the control group and mount namespace (a SLURM job's stages never run in another
job's server), the niceness, the CPU affinity (the thread pools are sized from it), the hard resource limits,
the text of the interpreter hooks (``sitecustomize``, ``usercustomize``) and this module's own text. The server imports torch with ``OMP_WAIT_POLICY=PASSIVE``
unless the environment sets it (the value UMAP's stages need, since OpenMP reads it once, when torch loads it).

Where anything is not as expected (not Linux, ``DEBIAS_FORKSERVER=0``, a CUDA device visible unless
``DEBIAS_FORKSERVER=1``, a finite address-space or data limit, a socket folder that is not ours, no server
yet) the launcher runs the stage itself, as before: the
first stage of a pipeline starts the server in the background and runs in its own process. The server leaves
after ``DEBIAS_FORKSERVER_IDLE`` seconds without a stage (default :data:`IDLE_SECONDS`); its log is
``<socket>.log``.
"""

from debias.harness.forkserver.launcher import process_state, run_stage
from debias.harness.forkserver.protocol import (IDLE_SECONDS, IDLE_VARIABLE, LAUNCHER_VARIABLE, SWITCH_VARIABLE, identity,
                                        idle_seconds, interpreter_options, read_at_import, receive_message,
                                        send_message)

__all__ = ["IDLE_SECONDS", "IDLE_VARIABLE", "LAUNCHER_VARIABLE", "SWITCH_VARIABLE", "identity", "idle_seconds",
           "interpreter_options", "process_state", "read_at_import", "receive_message", "run_stage", "send_message"]
