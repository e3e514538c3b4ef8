"""Start a stage's entrypoint: ``python -m debias.harness.launch [--single] SCRIPT [ARGS]`` (every command of dvc.yaml).

A training entrypoint runs with ``DEBIAS_NPROC`` processes; ``--single`` (the other stages) always runs one.
One process runs in a process forked by the warm fork server (:mod:`debias.harness.forkserver`: torch, MLflow and the
rest imported once for all stages) where it can, else by ``exec``.

``DEBIAS_NPROC`` (a machine setting, default 1) is the number of training processes on this
machine, one per GPU on CUDA (``CUDA_VISIBLE_DEVICES`` picks them), any number on the CPU:

* 1: the stage runs in a process forked by the fork server, this process standing in for it (signals passed
  on, its exit code), or else this process becomes ``python SCRIPT ARGS`` (``exec``: same pid, signals and exit
  code); torch is not imported here;
* N > 1: this process runs torchrun itself (``torch.distributed.run``, the code behind the
  ``torchrun`` command) as ``torchrun --standalone --nproc_per_node=N SCRIPT ARGS``: a single-node
  rendezvous on a free port, N workers with ``WORLD_SIZE``/``RANK``/``LOCAL_RANK`` set, which
  :mod:`debias.core.distributed` reads. It runs in-process rather than ``exec``-ing the ``torchrun``
  command so that a worker's own exit code comes back (2 for a stage's expected errors, with its
  one message above) instead of torchrun's blanket 1. A SIGTERM (``dvc queue kill``) reaches
  torchrun, which passes it on to the workers.

Before anything, the command claims the workspace for the DVC run it belongs to and is refused, naming the running
one, when another DVC run holds it (:mod:`debias.harness.workspace`).

dvc.yaml runs the training stages through it (``python -m debias.harness.launch pipeline/train_erm.py``);
since it reads no param, changing ``DEBIAS_NPROC`` never makes DVC rerun a stage.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

NPROC_VARIABLE = "DEBIAS_NPROC"
USAGE = "usage: python -m debias.harness.launch [--single] SCRIPT [ARGS ...]   (DEBIAS_NPROC processes, default 1; --single: 1)"


def nproc_from_env(environ: dict[str, str] | None = None) -> int:
    """``DEBIAS_NPROC`` as a whole number >= 1 (default 1); ``ValueError`` naming the setting otherwise."""
    value = (os.environ if environ is None else environ).get(NPROC_VARIABLE, "").strip()
    if not value:
        return 1
    if not (value.isascii() and value.isdigit()) or int(value) < 1:  # '²'.isdigit() is True; int('²') fails
        raise ValueError(f"{NPROC_VARIABLE} = '{value}'; allowed: a whole number >= 1 (processes on this machine)")
    return int(value)


def torchrun_arguments(script: str, args: Sequence[str], nproc: int) -> list[str]:
    """The command line of ``torchrun`` (without the program name) that starts ``nproc`` workers of ``script``."""
    return ["--standalone", f"--nproc_per_node={nproc}", script, *args]


def single_process_command(script: str, args: Sequence[str]) -> list[str]:
    """``python [OPTIONS] SCRIPT ARGS`` with this interpreter and the options it was started with (``-X dev``, ...,
    as a forked stage has them)."""
    from debias.harness.forkserver import interpreter_options

    return [sys.executable, *interpreter_options(list(getattr(sys, "orig_argv", []))), script, *args]


def exit_code_of_failure(exitcode: int) -> int:
    """A worker's exit code as a shell would report it: a death by signal N becomes 128 + N; never 0."""
    if exitcode < 0:
        return 128 + (-exitcode)
    return exitcode or 1


def run_torchrun(script: str, args: Sequence[str], nproc: int) -> int:
    """Run ``torchrun --standalone --nproc_per_node=nproc script args`` here; return the exit code to end with."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import parse_args, run

    try:
        run(parse_args(torchrun_arguments(script, args, nproc)))
    except ChildFailedError as exc:
        failed_rank, failure = exc.get_first_failure()
        print(f"[debias.harness.launch] {script}: rank {failed_rank} of {nproc} failed first (exit code {failure.exitcode}); "
              "the other ranks were stopped", file=sys.stderr)
        return exit_code_of_failure(failure.exitcode)
    except SignalException as exc:  # SIGTERM / SIGINT here: torchrun has already passed it on to the workers
        print(f"[debias.harness.launch] {script}: stopped by {exc.sigval.name}; the workers were stopped", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


def tree_src(cwd: Path, package: Path) -> Path | None:
    """The ``src`` of the tree a stage runs in (``cwd``: DVC runs every command at the repository's root) when this
    ``debias`` (``package``) was imported from elsewhere, else None. A queued or ``--temp`` experiment runs in its own
    copy of the committed tree (``.dvc/tmp/exps/...``) while an editable install points at the workspace, whose code
    may have changed since: its stages must run the code its dvc.lock records."""
    src = cwd / "src"
    if not (src / "debias" / "__init__.py").is_file() or (src / "debias").resolve() == package.resolve():
        return None
    return src.resolve()


def run_tree_code(argv: Sequence[str]) -> None:
    """``exec`` this command again with the tree's ``src`` first on ``PYTHONPATH`` (:func:`tree_src`), the same
    interpreter, options and arguments (same pid, signals and exit code); nothing where this is the tree's code.
    Exits 2 naming the folder where the tree's code cannot be imported even so (``python -E`` / ``-I``)."""
    src = tree_src(Path.cwd(), Path(__file__).resolve().parents[1])
    if src is None:
        return
    paths = os.environ.get("PYTHONPATH", "")
    if paths.split(os.pathsep)[0] == str(src):
        print(f"[debias.harness.launch] error: debias was imported from {Path(__file__).resolve().parents[1]}, not "
              f"from this tree's {src}, with {src} first on PYTHONPATH (an interpreter that ignores PYTHONPATH, "
              "python -E or -I?); run the stage with this tree's code on the path", file=sys.stderr)
        sys.exit(2)
    from debias.harness.forkserver import interpreter_options
    from debias.harness.forkserver.protocol import is_tree_src

    # the tree's src in place of any other debias tree's (the stages of every tree then share one fork server)
    others = [entry for entry in paths.split(os.pathsep) if entry and not is_tree_src(entry)]
    os.environ["PYTHONPATH"] = os.pathsep.join([str(src), *others])
    command = [sys.executable, *interpreter_options(list(getattr(sys, "orig_argv", []))), "-m", "debias.harness.launch", *argv]
    os.execv(command[0], command)


def main(argv: Sequence[str] | None = None) -> None:
    """Start ``SCRIPT ARGS`` as one process (exec) or as ``DEBIAS_NPROC`` torchrun workers, with the code of the
    tree it runs in (:func:`run_tree_code`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    run_tree_code(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        sys.exit(0 if argv else 2)
    single = argv[0] == "--single"
    if single:
        argv = argv[1:]
        if not argv:
            print(USAGE, file=sys.stderr)
            sys.exit(2)
    script, args = argv[0], argv[1:]
    from debias.harness.workspace import claim

    refused = claim()  # before the stage: one DVC run at a time in this workspace
    if refused is not None:
        print(f"[{Path(script).stem}] error: {refused}", file=sys.stderr)
        sys.exit(2)
    try:
        nproc = 1 if single else nproc_from_env()
    except ValueError as exc:
        print(f"[debias.harness.launch] error: {exc}", file=sys.stderr)
        sys.exit(2)
    if nproc == 1:
        from debias.harness import forkserver

        try:
            code = forkserver.run_stage(script, args)
        except ValueError as exc:
            print(f"[debias.harness.launch] error: {exc}", file=sys.stderr)
            sys.exit(2)
        if code is not None:
            sys.exit(code)
        command = single_process_command(script, args)
        os.execv(command[0], command)
    sys.exit(run_torchrun(script, args, nproc))


if __name__ == "__main__":
    main()
