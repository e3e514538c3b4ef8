"""What the launcher and the fork server share: settings, the server's identity (its socket), the messages."""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import struct
import sys
import tempfile
from pathlib import Path

SWITCH_VARIABLE = "DEBIAS_FORKSERVER"  # "0" runs every stage in a process of its own
IDLE_VARIABLE = "DEBIAS_FORKSERVER_IDLE"
# Set in a forked stage process: the launcher's pid, whose ancestors (DVC) are the stage's (debias.harness.tracking.runs).
LAUNCHER_VARIABLE = "DEBIAS_LAUNCHER_PID"
# Ours: long enough to span a pipeline's stages and the edit between two `dvc exp run`s, short enough that the
# server's ~1.1 GB (resident after a tiny pipeline: docs/pipeline.md) is not held for long after it.
IDLE_SECONDS = 300.0
# The environment variables an import may read (the interpreter, the dynamic loader, native thread pools, locale,
# cache and temporary folders, and the preloaded libraries); the forked process gets the launcher's whole
# environment, so only these can make a server's imports differ from the stage's own (a prefix ends with "_").
IMPORT_TIME = ("PYTHON", "LD_", "OMP_", "KMP_", "GOMP_", "MKL_", "OPENBLAS_", "GOTO", "BLIS_", "VECLIB_", "NUMEXPR_",
               "NUMBA_", "TORCH", "PYTORCH_", "CUDA_", "CUBLAS_", "CUDNN_", "NVIDIA_", "TRITON_", "LANG", "LC_", "TZ",
               "HOME", "XDG_", "TMPDIR", "TEMP", "TMP", "MLFLOW_", "SKLEARN_", "SCIPY_", "PANDAS_", "PYDANTIC_",
               "SQLALCHEMY_", "JOBLIB_", "LOKY_", "TQDM_", "MPL", "MATPLOTLIB", "ARROW_", "OTEL_")
# ... less MLflow's tracking settings, read when a run starts.
RUNTIME_ONLY = ("MLFLOW_TRACKING_", "MLFLOW_EXPERIMENT_", "MLFLOW_RUN_ID")
MAX_MESSAGE = 1 << 24  # bytes of one request (the environment dominates)
# Ours: how long a launcher waits for the server to fork its stage (a fork takes milliseconds; an idle import of
# umap from numba's cache, during which the server answers nobody, ~1.5 s) before it runs the stage itself.
ANSWER_SECONDS = 60.0
# Limits a fork cannot honour (it starts with the server's mappings): finite, the stage runs as its own process.
EXEC_ONLY_LIMITS = ("RLIMIT_AS", "RLIMIT_DATA")


# ----------------------------------------------------------------------------------------------- identity

def read_at_import(name: str) -> bool:
    """True for an environment variable that may shape what an import does (:data:`IMPORT_TIME`)."""
    return name.startswith(IMPORT_TIME) and not name.startswith(RUNTIME_ONLY)


def interpreter_options(orig_argv: list[str]) -> list[str]:
    """The interpreter options of ``python [OPTIONS] -m debias.harness.launch ...`` (the words before ``-m``; none for a
    command line without ``-m``)."""
    words = orig_argv[1:]
    return words[: words.index("-m")] if "-m" in words else []


def _text(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""


TREE_SRC = "<debias src>"  # a debias source folder in an identity: any tree's, since each stage re-imports debias


def is_tree_src(entry: str) -> bool:
    """Whether a path entry is the ``src`` of a debias tree (``debias`` and build records only): the stages of
    different trees (the workspace, a queued experiment's copy) share a server, each importing its own tree's code."""
    try:
        names = os.listdir(entry or ".")
    except OSError:
        return False
    return "debias" in names and all(n in ("debias", "__pycache__") or n.endswith(".egg-info") for n in names)


def tree_neutral(pythonpath: str) -> str:
    """``PYTHONPATH`` with each debias source folder (:func:`is_tree_src`) as :data:`TREE_SRC`."""
    return os.pathsep.join(TREE_SRC if is_tree_src(e) else e for e in pythonpath.split(os.pathsep))


def stage_path(server_path: list[str], server_pythonpath: str, stage_pythonpath: str) -> list[str]:
    """The server's ``sys.path`` with each folder of its ``PYTHONPATH`` replaced by the stage's folder in the same
    place (they differ only in debias source folders, :func:`identity`): a stage imports its own tree's debias."""
    def entries(value: str) -> list[str]:
        return [os.path.abspath(e) for e in value.split(os.pathsep) if e]

    mapping = dict(zip(entries(server_pythonpath), entries(stage_pythonpath)))
    return [mapping.get(entry, entry) for entry in server_path]


def identity(environ: dict[str, str], options: list[str]) -> str:
    """A hash of everything an import may have read: the key of the server that may run this process's stages."""
    paths = []
    for entry in sys.path[1:]:  # [0] is the folder of `python -m` (each stage sets its own); the folders packages
        # are installed into: an install changes their listing
        installed = os.path.basename(entry) in ("site-packages", "dist-packages")
        try:
            paths.append((TREE_SRC if is_tree_src(entry) else entry, os.stat(entry).st_mtime_ns if installed else None))
        except OSError:
            paths.append((entry, None))
    try:
        namespace = os.readlink("/proc/self/ns/mnt")
    except OSError:
        namespace = ""
    state = {
        "executable": sys.executable, "version": sys.version, "options": options, "flags": repr(sys.flags),
        "environment": sorted((k, tree_neutral(v) if k == "PYTHONPATH" else v) for k, v in environ.items()
                              if read_at_import(k)),
        "paths": paths, "cgroup": _text("/proc/self/cgroup"), "namespace": namespace, "nice": os.nice(0),
        "uid": os.getuid(), "code": [_text(str(path)) for path in sorted(Path(__file__).parent.glob("*.py"))],
        # the interpreter hooks site ran at start-up (the server ran them once; an edited one needs a new server)
        "hooks": [_text(file) for name in ("sitecustomize", "usercustomize")
                  if isinstance(file := getattr(sys.modules.get(name), "__file__", None), str)],
        # the thread pools (torch, OpenMP, OpenBLAS, numba) are sized from the CPUs a process may run on when it
        # loads them: a pinned launcher (taskset, SLURM) gets a server that loaded them under the same mask
        "affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        # hard limits (a fork can lower, never raise them) and the stack's (glibc sizes threads' stacks from it
        # at start-up)
        "limits": {name: pair if name == "RLIMIT_STACK" else pair[1] for name, pair in resource_limits().items()},
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


def resource_limits() -> dict[str, tuple[int, int]]:
    """This process's resource limits: ``{"RLIMIT_AS": (soft, hard), ...}`` (those this platform has)."""
    import resource

    limits = {}
    for name in sorted(dir(resource)):
        if name.startswith("RLIMIT_"):
            try:
                limits[name] = tuple(resource.getrlimit(getattr(resource, name)))
            except (OSError, ValueError):
                continue
    return limits


def unforkable(limits: dict[str, tuple[int, int] | list[int]]) -> str | None:
    """Why a fork of the server cannot run under ``limits`` exactly as a new process would, or None.

    A fork starts with the server's address space (several GB of mappings: torch, MLflow, ...), so a finite
    address-space or data-segment limit would count what a new process never maps: such a stage runs as its own
    process (:data:`EXEC_ONLY_LIMITS`)."""
    import resource

    for name in EXEC_ONLY_LIMITS:
        if name in limits and any(value != resource.RLIM_INFINITY for value in limits[name]):
            return f"{name} is finite"
    return None


def cuda_visible(environ: dict[str, str]) -> bool:
    """True where torch could see a CUDA (or ROCm) device, read without loading a driver: ``CUDA_VISIBLE_DEVICES``
    naming a device, or, where it is unset, an NVIDIA device file (``/dev/nvidia0``, ...) or ROCm's ``/dev/kfd``."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        first = value.split(",")[0].strip()
        return bool(first) and not first.startswith("-")  # "" and "-1" hide every device
    return bool(glob.glob("/dev/nvidia[0-9]*")) or os.path.exists("/dev/kfd")


def enabled(environ: dict[str, str]) -> bool:
    """Whether the launcher uses the fork server: on Linux, ``DEBIAS_FORKSERVER=1`` on, ``0`` off; unset (or
    empty), on unless a CUDA device is visible (:func:`cuda_visible`; no forked stage has trained on one yet)."""
    if sys.platform != "linux":
        return False
    switch = environ.get(SWITCH_VARIABLE, "").strip()
    if switch == "0":
        return False
    return bool(switch) or not cuda_visible(environ)


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
