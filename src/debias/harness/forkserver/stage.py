"""The forked stage process: become ``python SCRIPT ARGS`` as started by the launcher, then run the script.

What a new process would have and a fork of the server would not, set here: the launcher's signal dispositions
and mask, streams, environment, folder, umask, limits and CPU affinity, a process title and name, fresh global
random state and fresh project modules; and a death signal, so that the stage never outlives its watcher.
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
from pathlib import Path

from debias.harness.forkserver.protocol import LAUNCHER_VARIABLE, stage_path

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
PR_SET_NAME = 15
# What a new Python process does with a signal it inherits at its default: SIGINT raises KeyboardInterrupt,
# SIGPIPE and SIGXFSZ are ignored (errors instead); every other one keeps the default.
PYTHON_STARTUP = {signal.SIGINT: signal.default_int_handler, signal.SIGPIPE: signal.SIG_IGN,
                  signal.SIGXFSZ: signal.SIG_IGN}


def _libc():
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def die_with_parent(parent: int) -> None:
    """SIGKILL this process when ``parent`` (its watcher) ends, whatever ends it; ends at once if it already has."""
    if _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError("prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the watcher ended before the death signal was armed
        os._exit(1)


def set_signals(ignored: list[int], blocked: list[int]) -> None:
    """The dispositions a new Python process started by the launcher would have: what the launcher inherited as
    ignored stays ignored (``nohup``, ``cmd &`` in a script); the rest as Python sets them (:data:`PYTHON_STARTUP`,
    else the default); the launcher's blocked signals blocked."""
    skip = {signal.SIGKILL, signal.SIGSTOP}
    for signum in sorted(signal.valid_signals() - skip):
        handler = signal.SIG_IGN if signum in ignored else PYTHON_STARTUP.get(signum, signal.SIG_DFL)
        try:
            signal.signal(signum, handler)
        except (OSError, ValueError):  # one the C library reserves
            continue
    signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def set_process_title(argv: list[str]) -> None:
    """Show ``argv`` (the launcher's ``python SCRIPT ARGS``) as this process's command line (``ps``, ``top``,
    ``/proc/PID/cmdline``) and its executable's name as the process name, where ``ps`` would otherwise show the
    server's ``python -m debias.harness.forkserver SOCKET``.

    The text is written over the process's argument area (and, if longer, the environment area after it, which no
    longer backs ``environ`` once :func:`adopt` has replaced the environment), as setproctitle does: ``/proc``
    then reads the arguments as one line. Call after :func:`adopt`."""
    import ctypes

    stat = Path("/proc/self/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()  # field 3 onwards (the name may hold spaces)
    arg_start, arg_end, env_start, env_end = (int(fields[number - 3]) for number in (48, 49, 50, 51))
    end = env_end if env_start == arg_end else arg_end
    if not 0 < arg_start < arg_end <= end:
        return
    title = " ".join(argv).encode(errors="replace")[: end - arg_start - 1]
    area = bytearray(max(arg_end - arg_start, len(title) + 1))
    area[: len(title)] = title
    if len(title) + 1 < arg_end - arg_start:
        area[arg_end - arg_start - 1] = ord(" ")  # a last byte that is not NUL: /proc reads up to the title's NUL
    ctypes.memmove(arg_start, bytes(area), len(area))
    name = os.path.basename(argv[0]).encode()[:15] if argv else b""
    if name:
        _libc().prctl(PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


# MLflow's map of modules to installed distributions, which logging a model reads (a scan of every installed
# distribution's files, in every training stage), as the server built it: its sys.path and whether MLflow saw a
# Databricks runtime, set by the server once the map is built; empty before.
DISTRIBUTION_MAP: dict = {}
DISTRIBUTION_SUFFIXES = (".dist-info", ".egg-info", ".egg")  # what importlib.metadata finds distributions by


def holds_distributions(entry: str) -> bool:
    """Whether a ``sys.path`` entry may hold distribution metadata: a file (an egg, a zip) or a folder with a
    ``*.dist-info``, ``*.egg-info`` or ``*.egg`` entry; not a folder that does not exist."""
    if os.path.isfile(entry):
        return True
    try:
        return any(name.endswith(DISTRIBUTION_SUFFIXES) for name in os.listdir(entry or "."))
    except OSError:
        return False


def keep_distribution_map() -> bool:
    """Keep the distribution map the server built (:data:`DISTRIBUTION_MAP`) where this process would build the same:
    no folder on one path but not the other holds distribution metadata, and MLflow's Databricks test answers the
    same; else drop it (MLflow builds it again on first use). Whether it was kept."""
    utils = sys.modules.get("mlflow.utils.requirements_utils")
    if not DISTRIBUTION_MAP or utils is None or getattr(utils, "_MODULES_TO_PACKAGES", None) is None:
        return False
    from mlflow.utils.databricks_utils import is_in_databricks_runtime

    differ = set(sys.path) ^ set(DISTRIBUTION_MAP["path"])
    if any(holds_distributions(entry) for entry in differ) or is_in_databricks_runtime() != DISTRIBUTION_MAP["databricks"]:
        utils._MODULES_TO_PACKAGES = None
        utils._PACKAGES_TO_MODULES = None
        return False
    return True


def fresh_random_state() -> None:
    """Global random state as a new process has it, its own: NumPy's legacy global generator and torch's default
    CPU generator seeded from the operating system's randomness, as each seeds itself when loaded (Python's
    ``random`` reseeds itself after a fork). The server's, shared by every fork, is never what a stage starts with."""
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.seed()


def adopt(state: dict, fds: list[int]) -> None:
    """Become the launcher's stage process: streams, environment, folder, limits, affinity, argv, fresh project
    modules. ``OSError`` where the launcher's state cannot be taken exactly (the launcher then runs the stage)."""
    import importlib
    import io
    import resource

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    server_pythonpath = os.environ.get("PYTHONPATH", "")
    os.environ.clear()
    os.environ.update(state["environ"])
    os.environ[LAUNCHER_VARIABLE] = str(int(state["pid"]))
    os.chdir(state["cwd"])
    os.umask(int(state["umask"]))
    for name, (soft, hard) in state["limits"].items():
        resource.setrlimit(getattr(resource, name), (soft, hard))  # raises where it cannot: nothing ran yet
    os.sched_setaffinity(0, state["affinity"])
    os.setpgid(0, 0)  # the stage's process group: killed whole if the launcher goes
    unbuffered = sys.stdout.write_through  # -u / PYTHONUNBUFFERED: the server was started with the same
    encoding, errors = sys.stdout.encoding, sys.stdout.errors
    sys.stdin = io.TextIOWrapper(io.open(0, "rb", closefd=False), encoding=encoding, errors=errors)
    sys.stdout = io.TextIOWrapper(io.open(1, "wb", buffering=0 if unbuffered else -1, closefd=False),
                                  encoding=encoding, errors=errors, line_buffering=os.isatty(1), write_through=unbuffered)
    sys.stderr = io.TextIOWrapper(io.open(2, "wb", buffering=0 if unbuffered else -1, closefd=False),
                                  encoding=encoding, errors="backslashreplace", line_buffering=True, write_through=unbuffered)
    sys.__stdin__, sys.__stdout__, sys.__stderr__ = sys.stdin, sys.stdout, sys.stderr
    script = state["script"]
    sys.argv = [script, *state["args"]]
    sys.orig_argv = list(state["orig_argv"])
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    sys.path[1:] = stage_path(sys.path[1:], server_pythonpath, os.environ.get("PYTHONPATH", ""))
    for name in [name for name in sys.modules if name == "debias" or name.startswith("debias.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    _matplotlib_rc_of_folder()
    keep_distribution_map()
    tempfile.tempdir = None  # the server's TMPDIR, cached by its first gettempdir(): the launcher's instead


def _matplotlib_rc_of_folder() -> None:
    """A ``matplotlibrc`` in the working folder, which matplotlib reads first when imported there (the server
    imported it in ``/``): its settings over the defaults, as matplotlib would have them."""
    matplotlib = sys.modules.get("matplotlib")
    if matplotlib is not None and os.path.isfile("matplotlibrc"):
        matplotlib.rcParams.update(matplotlib.rc_params_from_file("matplotlibrc", use_default_template=True))


def _exit_code(code: object) -> int:
    """``SystemExit.code`` as the interpreter turns it into an exit status."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def run_stage_process(state: dict, fds: list[int], adopted: int, watcher: int) -> None:
    """The forked stage process: take over the launcher's process state (then write a byte to ``adopted``), run the
    script as ``__main__``, end as the interpreter would. Never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    try:
        die_with_parent(watcher)
        set_signals(list(state["ignored"]), list(state["blocked"]))
        adopt(state, fds)
        set_process_title(list(state["orig_argv"]))
        fresh_random_state()
        os.write(adopted, b"1")
        os.close(adopted)
    except BaseException:  # nothing of the stage ran: the watcher tells the launcher, which runs it itself
        traceback.print_exc()
        os._exit(1)
    code, interrupted = 1, False
    try:
        runpy.run_path(state["script"], run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        try:
            sys.excepthook(*sys.exc_info())
        except BaseException:
            traceback.print_exc()
        code = 1
    try:
        threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads, then atexit
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        if interrupted:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        os._exit(code)
