"""The server's side: preload, listen, fork a watcher per request and from it the stage process."""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

from debias.forkserver.protocol import LAUNCHER_VARIABLE, idle_seconds, receive_message, send_message

# The libraries the stages import (measured with `python -X importtime pipeline/<stage>.py`, the default data):
# imported by the server before it takes a stage. umap (numba) is imported after the server is up, when idle
# and numba's cache is warm (debias.embedding.warm_cache, started by the server on a cold cache).
PRELOAD = ("torch", "torch._dynamo", "torch._functorch.aot_autograd", "torchvision", "numpy", "pandas", "scipy.stats",
           "scipy.optimize", "sklearn.linear_model", "sklearn.cluster", "sklearn.metrics", "sklearn.model_selection",
           "yaml", "pydantic", "pyarrow.parquet", "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.pyfunc", "matplotlib.pyplot", "tqdm")


# ----------------------------------------------------------------------------------------------- server side

def _start_warming(options: list[str]) -> int | None:
    """Start :func:`debias.embedding.warm_cache` in a process of its own where numba's cache lacks UMAP's code;
    its pid."""
    import subprocess

    if _embedding().warm_marker().exists():
        return None
    # niced: it takes the cores the stages leave idle (they run one at a time), not theirs
    warmer = subprocess.Popen([sys.executable, *options, "-c",
                               "import os; os.nice(10); from debias.embedding import warm_cache; warm_cache()"],
                              stdin=subprocess.DEVNULL)
    print(f"numba's cache lacks UMAP's code: warming it (pid {warmer.pid})", flush=True)
    return warmer.pid


def _embedding():
    """:mod:`debias.embedding`, imported by name: the server's warm-up changes no stage's result, so it is not one
    of the stages' code dependencies (:mod:`debias.deps` follows import statements)."""
    import importlib

    return importlib.import_module("debias.embedding")


def _import_umap() -> None:
    """``import umap`` as the stages do (numba's cache folder and caching switched on)."""
    _embedding().import_umap(waiting=False)


def _preload(names: tuple[str, ...]) -> list[str]:
    """Import ``names`` (those installed); the names imported."""
    import importlib

    done = []
    for name in names:
        try:
            importlib.import_module(name)
            done.append(name)
        except Exception as exc:  # an optional library missing or broken: the stages import it themselves
            print(f"preload {name}: {type(exc).__name__}: {exc}", flush=True)
    return done


def _reset_signals() -> None:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)


def _adopt(state: dict, fds: list[int]) -> None:
    """Become the launcher's stage process: streams, environment, folder, limits, argv, fresh project modules."""
    import importlib
    import io
    import resource

    for target, fd in enumerate(fds[:3]):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(state["environ"])
    os.environ[LAUNCHER_VARIABLE] = str(int(state["pid"]))
    os.chdir(state["cwd"])
    os.umask(int(state["umask"]))
    for name, (soft, hard) in state["limits"].items():
        try:
            resource.setrlimit(getattr(resource, name), (soft, hard))
        except (OSError, ValueError, AttributeError):
            pass  # a limit above the server's hard limit: the server's stays
    try:
        os.sched_setaffinity(0, state["affinity"])
    except OSError:
        pass
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
    for name in [name for name in sys.modules if name == "debias" or name.startswith("debias.")]:
        del sys.modules[name]
    importlib.invalidate_caches()
    _matplotlib_rc_of_folder()
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


def _run_stage_process(state: dict, fds: list[int], adopted: int) -> None:
    """The forked stage process: take over the launcher's process state (then write a byte to ``adopted``), run the
    script as ``__main__``, end as the interpreter would. Never returns."""
    import atexit
    import runpy
    import threading
    import traceback

    try:
        _reset_signals()
        _adopt(state, fds)
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


def _wait(pid: int, conn: socket.socket) -> int:
    """The stage's wait status; kills its process group if the launcher goes first."""
    import select

    pidfd = os.pidfd_open(pid)
    try:
        while True:
            ready, _, _ = select.select([pidfd, conn], [], [])
            if pidfd in ready:
                return os.waitpid(pid, 0)[1]
            if not conn.recv(1, socket.MSG_PEEK):  # EOF: the launcher was killed
                try:
                    os.killpg(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                return os.waitpid(pid, 0)[1]
    finally:
        os.close(pidfd)


def _serve_one(conn: socket.socket, log: str) -> None:
    """A request's watcher (forked by the server): fork the stage process, report its pid and its end (or, if it
    could not take over the launcher's state, that nothing ran). Never returns."""
    code = 0
    try:
        for signum in (signal.SIGCHLD, signal.SIGTERM):  # the stage inherits the defaults, not the server's
            signal.signal(signum, signal.SIG_DFL)
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", creds)[1] != os.getuid():
            return
        state, fds = receive_message(conn, max_fds=3)
        if len(fds) != 3:
            send_message(conn, {"error": f"{len(fds)} standard streams came with the request (3 expected)"})
            return
        readable, adopted = os.pipe()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(readable)
            _run_stage_process(state, fds, adopted)
        os.close(adopted)
        for fd in fds:
            os.close(fd)
        send_message(conn, {"pid": pid})
        status = _wait(pid, conn)
        if os.read(readable, 1) or os.WIFSIGNALED(status):  # ran, or was stopped (a signal passed on) before it ran
            send_message(conn, {"status": status})
        else:
            send_message(conn, {"error": f"the forked process could not take over the launcher's state (log: {log})"})
    except BaseException as exc:  # the launcher runs the stage itself when nothing started
        print(f"request: {type(exc).__name__}: {exc}", flush=True)
        code = 1
    finally:
        os._exit(code)


def _give_up(path: Path, reason: str) -> int:
    """Leave ``<socket>.failed`` with ``reason`` (launchers of this identity then stop starting servers) and 1."""
    print(f"{reason}; exiting (launchers of this environment run their stages themselves)", flush=True)
    Path(f"{path}.failed").write_text(reason + "\n")
    return 1


def serve(path: Path, options: list[str]) -> int:
    """Preload, listen on ``path`` and fork a watcher per request until idle for ``DEBIAS_FORKSERVER_IDLE`` s."""
    import fcntl
    import gc
    import select
    import threading

    lock = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print("another server holds the lock", flush=True)
        return 0
    try:
        os.ftruncate(1, 0)  # the log (stdout and stderr) is this server's alone from here
    except OSError:  # not a file (started by hand)
        pass
    idle = idle_seconds(dict(os.environ))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # leave through the finally below (the socket removed)
    os.chdir("/")  # nothing imported may read the launcher's folder
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    started = time.perf_counter()
    warmer = _start_warming(options)
    done = _preload(PRELOAD)
    print(f"preloaded {len(done)} modules in {time.perf_counter() - started:.2f} s", flush=True)
    gc.freeze()  # the preloaded objects leave the collector's generations: a fork's collections never copy their pages
    if threading.active_count() != 1:  # native pools (OpenBLAS, OpenMP) re-create themselves after a fork
        return _give_up(path, f"{threading.enumerate()} after the imports: forking is unsafe")
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        server.bind(str(path))
        server.listen(64)
    except OSError as exc:
        return _give_up(path, f"cannot listen on {path}: {exc}")
    watchers: set[int] = set()
    idle_since = time.monotonic()
    pending_idle = [_import_umap]
    try:
        while True:
            ready, _, _ = select.select([server], [], [], 0.0 if pending_idle and warmer is None else 1.0)
            if ready:
                conn, _ = server.accept()
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    server.close()
                    _serve_one(conn, f"{path}.log")
                conn.close()
                watchers.add(pid)
            elif pending_idle and warmer is None:
                try:
                    pending_idle.pop(0)()
                except Exception as exc:  # the stages import it themselves
                    print(f"idle import: {type(exc).__name__}: {exc}", flush=True)
                gc.freeze()
                if threading.active_count() != 1:
                    return _give_up(path, f"{threading.enumerate()} after an idle import: forking is unsafe")
            while watchers or warmer is not None:
                try:
                    pid, _ = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    watchers.clear()
                    warmer = None
                    break
                if pid == 0:
                    break
                watchers.discard(pid)
                warmer = None if pid == warmer else warmer
            if watchers or ready:
                idle_since = time.monotonic()
            elif time.monotonic() - idle_since > idle:
                print(f"idle for {idle:g} s: exiting", flush=True)
                return 0
    finally:
        server.close()
        try:
            if os.path.exists(path):
                os.unlink(path)
        except OSError:
            pass
