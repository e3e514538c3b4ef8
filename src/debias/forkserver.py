"""A warm interpreter for the stage processes: torch, MLflow, pandas, SciPy and scikit-learn imported once, a fork per stage.

Every stage is its own ``python pipeline/<stage>.py`` process, and importing its libraries took 3-4.5 of the
5-12 s each stage process lasted on the default data (``python -X importtime``, docs/gpu.md). With the fork
server, ``python -m debias.launch pipeline/<stage>.py`` (dvc.yaml's command for every stage) asks a server
process that holds those imports to fork a process that runs the stage, and stands in for it:

* the forked process takes the launcher's standard streams (passed over a Unix socket), environment (plus
  ``DEBIAS_LAUNCHER_PID``, the launcher's pid, where the search for the DVC process running the stage starts), working
  directory, umask, resource limits and CPU affinity, and sets ``sys.argv``, ``sys.path[0]`` and
  ``sys.orig_argv`` as ``python SCRIPT ARGS`` would; it drops every ``debias`` module the server held, so the
  project's code is read from disk by each stage (a change takes effect at the next stage, as without the server);
* the launcher passes SIGINT, SIGTERM, SIGHUP and SIGQUIT on, and ends with the stage's exit code or dies of its
  signal; if the launcher is killed, the stage's process group is killed too.

One server per interpreter and import-time state: the socket's name hashes the Python executable, version and
flags, the environment variables an import may read (:data:`IMPORT_TIME`: the interpreter's, the loader's, the
thread pools', locale, cache and temporary folders, the preloaded libraries'), the modification times of ``sys.path``'s folders (an install or
upgrade starts a new server), the control group and mount namespace (a SLURM job's stages never run in another
job's server), the niceness and this module's own text. The server imports torch with ``OMP_WAIT_POLICY=PASSIVE``
unless the environment sets it (the value UMAP's stages need, since OpenMP reads it once, when torch loads it).

Where anything is not as expected (not Linux, ``DEBIAS_FORKSERVER=0``, a socket folder that is not ours, no
server yet, interpreter options the server cannot mirror) the launcher runs the stage itself, as before: the
first stage of a pipeline starts the server in the background and runs in its own process. The server leaves
after ``DEBIAS_FORKSERVER_IDLE`` seconds without a stage (default :data:`IDLE_SECONDS`); its log is
``<socket>.log``.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import tempfile
import time
from pathlib import Path

SWITCH_VARIABLE = "DEBIAS_FORKSERVER"  # "0" runs every stage in a process of its own
IDLE_VARIABLE = "DEBIAS_FORKSERVER_IDLE"
# Set in a forked stage process: the launcher's pid, whose ancestors (DVC) are the stage's (debias.tracking.runs).
LAUNCHER_VARIABLE = "DEBIAS_LAUNCHER_PID"
# Ours: long enough to span a pipeline's stages and the edit between two `dvc exp run`s, short enough that the
# server's ~0.9 GB (resident, umap imported: measured on the default pipeline) is not held for long after the last stage.
IDLE_SECONDS = 300.0
# The libraries the stages import (measured with `python -X importtime pipeline/<stage>.py`, the default data):
# imported by the server before it takes a stage. umap (numba) is imported after the server is up, when idle
# and numba's cache is warm (debias.embedding.warm_cache, started by the server on a cold cache).
PRELOAD = ("torch", "torch._dynamo", "torch._functorch.aot_autograd", "torchvision", "numpy", "pandas", "scipy.stats",
           "scipy.optimize", "sklearn.linear_model", "sklearn.cluster", "sklearn.metrics", "sklearn.model_selection",
           "yaml", "pydantic", "pyarrow.parquet", "mlflow", "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.pyfunc", "matplotlib.pyplot", "tqdm")
# The environment variables an import may read (the interpreter, the dynamic loader, native thread pools, locale,
# cache and temporary folders, and the preloaded libraries); the forked process gets the launcher's whole
# environment, so only these can make a server's imports differ from the stage's own (a prefix ends with "_").
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "VECLIB_", "NUMEXPR_",
               "NUMBA_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TRITON_", "LANG", "LC_", "TZ",
               "HOME", "XDG_", "TMPDIR", "TEMP", "TMP", "MLFLOW_", "SKLEARN_", "SCIPY_", "PANDAS_", "PYDANTIC_",
               "SQLALCHEMY_", "JOBLIB_", "LOKY_", "TQDM_", "MPL", "MATPLOTLIB")
# ... less MLflow's tracking settings, read when a run starts.
RUNTIME_ONLY = ("MLFLOW_TRACKING_", "MLFLOW_EXPERIMENT_", "MLFLOW_RUN_ID")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
MAX_MESSAGE = 1 << 24  # bytes of one request (the environment dominates)
# Ours: how long a launcher waits for the server to fork its stage (a fork takes milliseconds; an idle import of
# umap from numba's cache, during which the server answers nobody, ~1.5 s) before it runs the stage itself.
ANSWER_SECONDS = 60.0


# ----------------------------------------------------------------------------------------------- identity

def read_at_import(name: str) -> bool:
    """True for an environment variable that may shape what an import does (:data:`IMPORT_TIME`)."""
    return name.startswith(IMPORT_TIME) and not name.startswith(RUNTIME_ONLY)


def interpreter_options(orig_argv: list[str]) -> list[str]:
    """The interpreter options of ``python [OPTIONS] -m debias.launch ...`` (the words before ``-m``)."""
    words = orig_argv[1:]
    return words[: words.index("-m")] if "-m" in words else words


def _text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


def identity(environ: dict[str, str], options: list[str]) -> str:
    """A hash of everything an import may have read: the key of the server that may run this process's stages."""
    paths = []
    for entry in sys.path:  # the folders packages are installed into: an install changes their listing
        installed = os.path.basename(entry) in ("site-packages", "dist-packages")
        try:
            paths.append((entry, os.stat(entry).st_mtime_ns if installed else None))
        except OSError:
            paths.append((entry, None))
    try:
        namespace = os.readlink("/proc/self/ns/mnt")
    except OSError:
        namespace = ""
    state = {
        "executable": sys.executable, "version": sys.version, "options": options, "flags": repr(sys.flags),
        "environment": sorted((k, v) for k, v in environ.items() if read_at_import(k)),
        "paths": paths, "cgroup": _text("/proc/self/cgroup"), "namespace": namespace, "nice": os.nice(0),
        "uid": os.getuid(), "module": _text(__file__),
    }
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=str).encode()).hexdigest()[:24]


def socket_folder() -> Path | None:
    """``$XDG_RUNTIME_DIR/debias`` or ``<tmp>/debias-<uid>``, made private; None if it exists and is not ours alone."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    folder = Path(base) / "debias" if base and Path(base).is_dir() else Path(tempfile.gettempdir()) / f"debias-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        info = folder.lstat()
    except OSError:
        return None
    if not folder.is_dir() or folder.is_symlink() or info.st_uid != os.getuid() or info.st_mode & 0o077:
        return None
    return folder


def socket_path(environ: dict[str, str], options: list[str]) -> Path | None:
    """The server's socket for this process's identity; None where the fork server cannot be used."""
    folder = socket_folder()
    if folder is None:
        return None
    path = folder / f"{identity(environ, options)}.sock"
    return path if len(os.fsencode(path)) < 100 else None  # sun_path holds 108 bytes


def enabled(environ: dict[str, str]) -> bool:
    """The fork server is used on Linux unless ``DEBIAS_FORKSERVER=0``."""
    return sys.platform == "linux" and environ.get(SWITCH_VARIABLE, "1").strip() != "0"


def idle_seconds(environ: dict[str, str]) -> float:
    """``DEBIAS_FORKSERVER_IDLE`` as seconds > 0 (default :data:`IDLE_SECONDS`); ``ValueError`` naming it otherwise."""
    value = environ.get(IDLE_VARIABLE, "").strip()
    if not value:
        return IDLE_SECONDS
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(f"{IDLE_VARIABLE} = '{value[:40]}'; allowed: seconds > 0 (the fork server's idle lifetime)")
    return seconds


# ----------------------------------------------------------------------------------------------- messages

def send_message(sock: socket.socket, message: dict, fds: list[int] | None = None) -> None:
    """A length-prefixed JSON message, with ``fds`` passed alongside (SCM_RIGHTS)."""
    data = json.dumps(message).encode()
    frame = struct.pack("!I", len(data)) + data
    if fds:
        socket.send_fds(sock, [frame[:4]], fds)
        sock.sendall(frame[4:])
    else:
        sock.sendall(frame)


def _receive_exactly(sock: socket.socket, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = sock.recv(left)
        if not chunk:
            raise EOFError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def receive_message(sock: socket.socket, max_fds: int = 0) -> tuple[dict, list[int]]:
    """One message of :func:`send_message` and the file descriptors that came with it."""
    if max_fds:
        head, fds, _, _ = socket.recv_fds(sock, 4, max_fds)
        if not head:
            raise EOFError("the other side closed the connection")
        head += _receive_exactly(sock, 4 - len(head))
    else:
        head, fds = _receive_exactly(sock, 4), []
    (size,) = struct.unpack("!I", head)
    if size > MAX_MESSAGE:
        raise ValueError(f"a message of {size} bytes (at most {MAX_MESSAGE})")
    return json.loads(_receive_exactly(sock, size)), list(fds)


# ----------------------------------------------------------------------------------------------- launcher side

def process_state(script: str, args: list[str]) -> dict:
    """What the forked process takes over from the launcher."""
    import resource

    limits = {}
    for name in dir(resource):
        if name.startswith("RLIMIT_"):
            try:
                limits[name] = resource.getrlimit(getattr(resource, name))
            except (OSError, ValueError):
                continue
    umask = os.umask(0)
    os.umask(umask)
    return {"script": script, "args": args, "pid": os.getpid(), "cwd": os.getcwd(), "environ": dict(os.environ), "umask": umask,
            "limits": limits, "affinity": sorted(os.sched_getaffinity(0)),
            "orig_argv": [sys.executable, *interpreter_options(list(getattr(sys, "orig_argv", []))), script, *args]}


def start_server(path: Path, options: list[str]) -> None:
    """Start the server for ``path`` in the background (detached: its own session, no inherited streams)."""
    pid = os.fork()
    if pid:  # the launcher goes on with the stage at once; the first child exits right away
        os.waitpid(pid, 0)
        return
    try:
        os.setsid()
        if os.fork():
            os._exit(0)
        log = os.open(f"{path}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)  # emptied by the lock's holder
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.execv(sys.executable, [sys.executable, *options, "-m", "debias.forkserver", str(path), *options])
    finally:
        os._exit(1)


def _server_starting(path: Path) -> bool:
    """True while a server for ``path`` holds its lock (starting up or serving)."""
    import fcntl

    try:
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True  # cannot tell: do not start another
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return True
    finally:
        os.close(fd)  # closing drops a lock taken here
    return False


def run_stage(script: str, args: list[str]) -> int | None:
    """Run ``python SCRIPT ARGS`` in a process forked by the server; its exit code (128 + N for signal N, after
    this process has passed the signal on), or None where the caller should run the stage itself. ``ValueError``
    naming the setting for a bad ``DEBIAS_FORKSERVER_IDLE``."""
    environ = dict(os.environ)
    if not enabled(environ):
        return None
    idle_seconds(environ)
    options = interpreter_options(list(getattr(sys, "orig_argv", [])))
    path = socket_path(environ, options)
    if path is None:
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:
        sock.close()
        if not _server_starting(path):
            start_server(path, options)
        return None
    with sock:
        try:
            state = process_state(script, args)
        except OSError:  # e.g. the working folder is gone: the stage itself says so
            return None
        return _stand_in(sock, state)


def _stand_in(sock: socket.socket, state: dict) -> int | None:
    pending: list[int] = []
    stage_pid: list[int] = []

    def forward(signum: int, _frame: object) -> None:
        if stage_pid:
            try:
                os.kill(stage_pid[0], signum)
            except ProcessLookupError:
                pass
        else:
            pending.append(signum)

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        try:
            sock.settimeout(ANSWER_SECONDS)
            send_message(sock, state, [0, 1, 2])
            started, _ = receive_message(sock)
            sock.settimeout(None)
        except (OSError, EOFError, ValueError):  # (a timeout too) closing the socket kills a stage forked late
            return None  # nothing ran: the caller runs the stage itself
        if "error" in started:
            print(f"[debias.forkserver] {started['error']}; running the stage in its own process", file=sys.stderr)
            return None
        stage_pid.append(int(started["pid"]))
        for signum in pending:
            forward(signum, None)
        try:
            ended, _ = receive_message(sock)
        except (OSError, EOFError, ValueError) as exc:
            print(f"[debias.forkserver] lost the fork server while it ran {state['script']} ({exc}): the stage's "
                  f"outcome is unknown; rerun it with {SWITCH_VARIABLE}=0 to run it in its own process", file=sys.stderr)
            return 1
        if "error" in ended:  # nothing of the stage ran
            print(f"[debias.forkserver] {ended['error']}; running the stage in its own process", file=sys.stderr)
            return None
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    status = int(ended["status"])
    if os.WIFSIGNALED(status):
        signum = os.WTERMSIG(status)
        sys.stdout.flush()
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # die of the same signal, as the stage did
        return 128 + signum
    return os.WEXITSTATUS(status)


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
        print(f"{threading.enumerate()} after the imports: forking is unsafe; exiting", flush=True)
        return 1
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(64)
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
                    print(f"{threading.enumerate()} after an idle import: forking is unsafe; exiting", flush=True)
                    return 1
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


if __name__ == "__main__":
    sys.exit(serve(Path(sys.argv[1]), sys.argv[2:]))
