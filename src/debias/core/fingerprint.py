"""Content fingerprints: what a result depends on, hashed, so a stale input is never mistaken for the current one.

- :func:`tensor_digest` hashes tensors by dtype, shape and bytes (training data, labels, weights);
- :func:`code_version` hashes the source of every ``debias`` module the process has imported;
- :func:`file_digest` hashes a file's bytes, :func:`tree_digest` a folder's files (names, sizes, mtimes),
  :func:`files_digest` named files wherever they are (resolved paths, sizes, mtimes);
- :func:`digest` combines JSON-able values into one short hex string;
- :func:`code_fingerprint` is a stage's code as DVC sees it: the md5 of each file dvc.yaml's ``meta: code`` lists
  for the stage (:func:`stage_code_files`), written by ``source`` to ``data/code/<stage>.json``, the stage's one
  code dep (:func:`stale_code` says which files changed since).
A training stage's resume state is keyed by ``{"params", "data", "code"}`` digests (:mod:`debias.training.loop`),
and the ``source`` stage fingerprints external data files so DVC reruns ``download`` when they change.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import debias

DIGEST_SIZE = 16  # bytes of BLAKE2b: 32 hex digits
CHUNK = 1 << 20  # bytes read at a time


def digest(value: Any) -> str:
    """BLAKE2b of ``value`` as sorted, compact JSON: 32 hex digits."""
    blob = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.blake2b(blob, digest_size=DIGEST_SIZE).hexdigest()


def tensor_digest(tensors: Mapping[str, Any]) -> str:
    """BLAKE2b over each named tensor's dtype, shape and bytes (CPU, contiguous), in name order; None allowed."""
    import torch

    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for name in sorted(tensors):
        tensor = tensors[name]
        hasher.update(name.encode())
        if tensor is None:
            hasher.update(b"none")
            continue
        if isinstance(tensor, Mapping):  # a state dict
            hasher.update(tensor_digest(tensor).encode())
            continue
        t = torch.as_tensor(tensor).detach().cpu().contiguous()
        hasher.update(f"{t.dtype}{tuple(t.shape)}".encode())
        if t.dtype == torch.bool:
            t = t.to(torch.uint8)
        hasher.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return hasher.hexdigest()


def _package_files(modules: Iterable[Any], root: Path) -> list[Path]:
    files = set()
    for module in modules:
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(root):
            files.add(Path(path).resolve())
    return sorted(files)


def code_version() -> str:
    """BLAKE2b over the relative path and source of every imported ``debias`` module (and a ``pipeline/``
    entrypoint run as ``__main__``): changes whenever the code this process runs changes."""
    root = Path(debias.__file__).resolve().parent
    modules = [m for name, m in list(sys.modules.items()) if name == "debias" or name.startswith("debias.")]
    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
    for path in _package_files(modules, root):
        hasher.update(str(path.relative_to(root)).encode())
        hasher.update(path.read_bytes())
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    if main and Path(main).resolve().parent.name == "pipeline":
        hasher.update(Path(main).name.encode())
        hasher.update(Path(main).read_bytes())
    return hasher.hexdigest()


def file_digest(path: Path) -> str:
    """BLAKE2b of a file's bytes, read in chunks."""
    hasher = hashlib.blake2b(digest_size=DIGEST_SIZE)
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(CHUNK), b""):
            hasher.update(block)
    return hasher.hexdigest()


def tree_digest(folder: Path) -> str:
    """BLAKE2b over the relative name, size and modification time of every file under ``folder`` (as DVC's
    own change detection does for large folders; reading every image of a dataset at each run would not scale)."""
    entries = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        entries.append([str(path.relative_to(folder)), stat.st_size, stat.st_mtime_ns])
    return digest(entries)


def files_digest(paths: Iterable[Path]) -> str:
    """BLAKE2b over each named file's name, resolved path (links and ``..`` followed), size and modification time,
    in the order given; a missing file counts as ``missing`` (as :func:`tree_digest`, without reading the files)."""
    entries: list[list[Any]] = []
    for path in paths:
        try:
            stat = path.stat()
            entries.append([str(path), os.path.realpath(path), stat.st_size, stat.st_mtime_ns])
        except OSError:
            entries.append([str(path), "missing"])
    return digest(entries)


CODE_META = "code"  # dvc.yaml: a stage's ``meta: {code: [...]}``, the code files it runs (``debias deps --write``)


def stage_code_files(stages: Mapping[str, Any], stage: str) -> list[str]:
    """The code files dvc.yaml's ``stages`` (parsed) lists under ``stage``'s ``meta: code``; [] when none."""
    meta = (stages.get(stage) or {}).get("meta") or {}
    return [str(path) for path in meta.get(CODE_META) or []]


def code_fingerprint(files: Iterable[str], root: Path) -> dict[str, Any]:
    """``{"files": {path: md5 of its bytes}}`` for the repository-relative ``files`` (sorted; DVC's md5), so the
    document changes exactly when one of them does; a missing file is an error naming it."""
    digests = {}
    for name in sorted(set(files)):
        path = root / name
        if not path.is_file():
            raise FileNotFoundError(f"{name}, listed as code in dvc.yaml, does not exist: run `debias deps --write`")
        digests[name] = hashlib.md5(path.read_bytes()).hexdigest()
    return {"files": digests}


def code_fingerprints(stages: Mapping[str, Any], root: Path) -> dict[str, dict[str, Any]]:
    """Each of dvc.yaml's ``stages`` (parsed) whose deps name its code fingerprint -> :func:`code_fingerprint` of the
    code files its ``meta: code`` lists (``root``: the repository)."""
    from debias.core.paths import code_fingerprint_path

    return {name: code_fingerprint(stage_code_files(stages, name), root) for name, stage in stages.items()
            if str(code_fingerprint_path(name)) in [str(dep) for dep in (stage or {}).get("deps") or []]}


def stale_code(recorded: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """The files whose md5 differs between two :func:`code_fingerprint` documents (added and removed ones too)."""
    before, after = dict(recorded.get("files") or {}), dict(current.get("files") or {})
    return sorted(name for name in set(before) | set(after) if before.get(name) != after.get(name))
