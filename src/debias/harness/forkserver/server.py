"""The server's side: preload, listen, fork a watcher per request and from it the stage process."""

from __future__ import annotations

import os
import signal
import socket
import struct
import sys
import time
from pathlib import Path

from debias.harness.forkserver.protocol import idle_seconds, receive_message, resource_limits, send_message, unforkable
from debias.harness.forkserver.stage import DISTRIBUTION_MAP, run_stage_process

# The libraries the stages import (measured with `python -X importtime pipeline/<stage>.py`, the default data, and in
# the forked stages themselves, `python -X importtime -m debias.harness.launch ...`, which showed each one importing
# the params' YAML reader, the SQLite dialect, the tables, pyarrow's datasets and MLflow's metrics SDK on its own):
# imported by the server before it takes a stage. umap (numba) is imported after the server is up, when idle
# and numba's cache is warm (debias.groups.embedding.warm_cache, started by the server on a cold cache).
PRELOAD = ("torch", "torch._dynamo", "torch._functorch.aot_autograd", "torchvision", "numpy", "pandas", "scipy.stats",
           "scipy.optimize", "sklearn.linear_model", "sklearn.cluster", "sklearn.metrics", "sklearn.model_selection",
           "sklearn.pipeline", "yaml", "ruamel.yaml", "pydantic", "pyarrow.parquet", "pyarrow.dataset", "mlflow",
           "mlflow.tracking", "mlflow.store.tracking.sqlalchemy_store",
           "mlflow.store.tracking.sqlalchemy_workspace_store", "sqlalchemy.dialects.sqlite", "mlflow.pyfunc",
           "opentelemetry.sdk.metrics", "matplotlib.pyplot", "tabulate", "tqdm")


# ----------------------------------------------------------------------------------------------- server side

def _start_warming(options: list[str]) -> int | None:
    """Start :func:`debias.groups.embedding.warm_cache` in a process of its own where numba's cache lacks UMAP's code;
    its pid."""
    import subprocess

    if _embedding().warm_marker().exists():
        return None
    # niced: it takes the cores the stages leave idle (they run one at a time), not theirs
    warmer = subprocess.Popen([sys.executable, *options, "-c",
                               "import os; os.nice(10); from debias.groups.embedding import warm_cache; warm_cache()"],
                              stdin=subprocess.DEVNULL)
    print(f"numba's cache lacks UMAP's code: warming it (pid {warmer.pid})", flush=True)
    return warmer.pid


def _embedding():
    """:mod:`debias.groups.embedding`, imported by name: the server's warm-up changes no stage's result, so it is not one
    of the stages' code dependencies (:mod:`debias.tools.deps` follows import statements)."""
    import importlib

    return importlib.import_module("debias.groups.embedding")


def _import_umap() -> None:
    """``import umap`` as the stages do (numba's cache folder and caching switched on)."""
    _embedding().import_umap(waiting=False)


def _remember_schema_head() -> None:
    """MLflow's newest database schema revision, which its SQL store checks a database against each time it opens
    one (alembic reads MLflow's ~70 migration scripts for it, in every stage that logs), read once here and
    remembered (``functools.cache``) for every stage forked after: their MLflow is this one, its scripts these (an
    install makes another server, :func:`debias.harness.forkserver.protocol.identity`), so the answer is theirs."""
    import functools

    from mlflow.store.db import utils

    utils._get_latest_schema_revision = functools.cache(utils._get_latest_schema_revision)
    utils._get_latest_schema_revision()


def _map_distributions() -> None:
    """MLflow's map of modules to installed distributions, built once here for every stage that logs a model
    (:func:`debias.harness.forkserver.stage.keep_distribution_map` says where a stage keeps it)."""
    from mlflow.utils import requirements_utils
    from mlflow.utils.databricks_utils import is_in_databricks_runtime

    requirements_utils._init_modules_to_packages_map()
    DISTRIBUTION_MAP.update(path=list(sys.path), databricks=is_in_databricks_runtime())


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


# What the server's thread pools and mappings were made under (set by :func:`serve` before it listens).
SERVER_STATE: dict = {}


def why_not_forked(state: dict, server: dict) -> str | None:
    """Why a fork of this server would not be the process the launcher would start, or None: a limit that a fork
    cannot honour (:func:`debias.harness.forkserver.protocol.unforkable`), a hard limit or stack size other than the
    server's (a fork cannot raise one; glibc sized the server's thread stacks from its own), or another CPU
    affinity (the server's thread pools were sized from its own). The socket's name covers all but the first."""
    reason = unforkable(state["limits"])
    if reason is not None:
        return reason
    if sorted(state["affinity"]) != server.get("affinity"):
        return "the launcher may run on other CPUs than the server's thread pools were sized for"
    for name, (soft, hard) in server.get("limits", {}).items():
        theirs = state["limits"].get(name)
        if theirs is None or theirs[1] != hard or (name == "RLIMIT_STACK" and theirs[0] != soft):
            return f"the launcher's {name} is not the server's"
    return None


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
        reason = why_not_forked(state, SERVER_STATE)
        if reason is not None:  # the launcher runs the stage as a process of its own, saying nothing
            send_message(conn, {"plain": reason})
            return
        # A session of its own for the watcher and its stage: the kernel's autogroup shares CPU time by session, and
        # in the server's every forked stage of every launcher split one share (seen: 4 queued stages at ~20 % of a
        # core each beside another server's stage at ~75 %, on 2 cores), where a plain stage has its launcher's.
        # The stage's process group stays in the watcher's session, so it is not orphaned: Ctrl-Z still stops it.
        os.setsid()
        readable, adopted = os.pipe()
        watcher = os.getpid()
        pid = os.fork()
        if pid == 0:
            conn.close()
            os.close(readable)
            run_stage_process(state, fds, adopted, watcher)
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


def remove_stale(folder: Path, keep: Path) -> list[Path]:
    """Remove the socket, lock and log of every other identity in ``folder`` that no server holds (an identity
    used once, or whose server left); those of a server that gave up (``.failed``, which its log explains) stay.
    The files removed. A server that opens a lock while it is removed sees another inode and leaves."""
    import fcntl

    removed = []
    for lock_path in folder.glob("*.sock.lock"):
        sock = lock_path.with_suffix("")
        if sock == keep or Path(f"{sock}.failed").exists():
            continue
        try:
            fd = os.open(lock_path, os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a server holds it while it lives
        except OSError:
            os.close(fd)
            continue
        try:
            for stale in (sock, Path(f"{sock}.log"), lock_path):  # the lock last, still held
                try:
                    stale.unlink()
                    removed.append(stale)
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)
    return removed


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
        if os.fstat(lock).st_ino != os.stat(f"{path}.lock").st_ino:  # removed as stale while we opened it
            raise OSError("the lock file was replaced")
    except OSError:
        print("another server holds the lock", flush=True)
        return 0
    remove_stale(path.parent, keep=path)
    try:
        os.ftruncate(1, 0)  # the log (stdout and stderr) is this server's alone from here
    except OSError:  # not a file (started by hand)
        pass
    idle = idle_seconds(dict(os.environ))
    SERVER_STATE.update(affinity=sorted(os.sched_getaffinity(0)), limits=resource_limits())
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
    pending_idle = [_remember_schema_head, _import_umap, _map_distributions]
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
