"""Atomic, checked file I/O: every stage output is written to a temporary file and renamed.

A crash or kill mid-write leaves the previous file intact, and DVC never records a
half-written output. Loading checks the file is ours and complete, and says which file
is broken and what to do instead of failing deep inside torch or json.
"""

from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from debias.core.errors import CorruptFileError

FORMAT_KEY = "__debias_format__"
_UMASK = os.umask(0)
os.umask(_UMASK)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


def _sweep_dead_temps(path: Path) -> None:
    """Remove ``.<name>.<pid>.<random>.tmp`` files of ``path`` left by writers that no longer run.

    A SIGKILL cannot be caught, so a killed writer leaves its half-written temporary file beside
    the output; in a ``persist: true`` DVC output folder (``data/raw``) DVC would hash and record
    it with the rest. The next write of the same output removes it; live writers' files are kept.
    """
    stem = f".{path.name}."
    for candidate in path.parent.glob(f"{glob.escape(stem)}*.tmp"):
        owner = candidate.name[len(stem):].split(".", 1)[0]
        if owner.isdigit() and int(owner) != os.getpid() and not _pid_alive(int(owner)):
            candidate.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success fsync and rename it onto ``path``.

    The temporary file is ``.<name>.<pid>.<random>.tmp``; those of killed writers are swept first.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_dead_temps(path)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; outputs get the usual permissions
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):  # tensors, numpy arrays and scalars (a 0-d one becomes a number)
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _finite_or_null(value: Any) -> Any:
    """NaN/inf are not JSON: write them as null so the file stays parseable (and says so)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value


def save_json(path: str | Path, obj: Any) -> None:
    """Write ``obj`` as indented JSON, atomically."""
    text = json.dumps(_finite_or_null(json.loads(json.dumps(obj, default=_json_default))), indent=2, sort_keys=False)
    with atomic_path(path) as tmp:
        tmp.write_text(text + "\n")


def load_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the stage that writes it first (dvc repro)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise CorruptFileError(f"{path} is not valid JSON ({exc}); delete it and rerun its stage") from None


def save_torch(path: str | Path, obj: dict[str, Any], kind: str) -> None:
    """``torch.save`` a dict tagged with ``kind`` (e.g. 'split', 'checkpoint'), atomically."""
    import torch

    payload = dict(obj)
    payload[FORMAT_KEY] = kind
    with atomic_path(path) as tmp, open(tmp, "wb") as handle:
        # To a file object, not the path: torch names the archive inside the zip after the file it is
        # given, and the random temporary name would make every write of the same data differ in bytes
        # (a new DVC hash, and every downstream stage rerun, for identical outputs).
        try:
            torch.save(payload, handle)
        except RuntimeError as exc:  # torch's zip writer turns a failed write (disk full, ...) into this
            raise _os_error_behind(exc, path) or exc from None


def _os_error_behind(exc: BaseException, path: str | Path) -> OSError | None:
    """The OSError a library error was raised while handling (its ``__context__`` chain), naming ``path``."""
    cause = exc.__cause__ or exc.__context__
    while cause is not None:
        if isinstance(cause, OSError):
            return OSError(cause.errno, cause.strerror, str(path))
        cause = cause.__cause__ or cause.__context__
    return None


def load_torch(path: str | Path, kind: str, required: tuple[str, ...] = ()) -> dict[str, Any]:
    """Load a file written by :func:`save_torch`; a truncated or foreign file is a CorruptFileError."""
    import torch

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run the stage that writes it first (dvc repro)")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, pickle garbage, wrong format ...
        raise CorruptFileError(
            f"{path} cannot be read as a debias {kind} file ({type(exc).__name__}: {str(exc)[:200]}); "
            "it is truncated or foreign: delete it and rerun the stage that writes it"
        ) from None
    if not isinstance(payload, dict) or payload.get(FORMAT_KEY) != kind:
        found = payload.get(FORMAT_KEY) if isinstance(payload, dict) else type(payload).__name__
        raise CorruptFileError(f"{path} is not a debias {kind} file (found {found!r}); rerun the stage that writes it")
    missing = [key for key in required if key not in payload]
    if missing:
        raise CorruptFileError(f"{path} lacks {missing}; it was written by another version: rerun its stage")
    payload.pop(FORMAT_KEY)
    return payload
