"""What a stage really read, wrote and imported, held against what dvc.yaml says it depends on and writes.

A traced stage process (tests/trace_hook/sitecustomize.py, through ``sys.addaudithook``) appends one JSON line per
file opened (with its mode), renamed, removed, listed or made, and per ``debias`` module imported, to a log. What
it left on disk is the difference of two :func:`snapshot` calls of the repository around the stage. :func:`check_stage`
turns both into the stage's violations, each a sentence naming the file or module:

- every file read inside the repository is a dep of the stage, lies under one, is one of its own outs, or is a
  declared environment file (:data:`ENVIRONMENT`); outside it, every file read lies under the interpreter (left out
  by the hook), ``/proc``, ``/dev``, ``/sys``, a temporary folder, the data source's external files (stages
  depending on their fingerprint ``data/source.json`` only) or an :data:`ENVIRONMENT` entry;
- every file the stage created, changed or deleted in the repository is one of its outs or lies under one, or is
  declared as no out with the reason (:data:`NOT_OUTS`); outside it, it wrote only into temporary folders or
  :data:`ENVIRONMENT` entries marked writable;
- every ``debias`` module imported is a dep of the stage or a side channel (:data:`debias.tools.deps.SIDE_CHANNELS`):
  a harness module that is neither counts as handing values into the outputs.
Code files (``src/``, ``pipeline/``) are judged by the imports, not by their reads; the import machinery's listing of
the folders on ``sys.path`` is no read.
"""

from __future__ import annotations

import fnmatch
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from debias.tools.deps import is_side_channel, module_file

# Files (repository-relative; a trailing / is a folder and everything under it; fnmatch patterns) a stage may create,
# change or delete that are not outs, each with the reason DVC need not know them.
NOT_OUTS: dict[str, str] = {
    "models/.resume/": "a training stage's resume state: written during training, deleted when the stage succeeds; "
                       "a failed stage leaves it for its next run of the same stage to resume from (read back then "
                       "only)",
    "*/__pycache__/*": "the interpreter's bytecode cache of the code deps",
    "mlflow.db": "the MLflow store (harness tracking): git- and DVC-ignored, shared by every run",
    "mlruns/": "MLflow's artifact store (harness tracking): git- and DVC-ignored, shared by every run",
}

# Files read outside the stage's deps (repository-relative, or absolute / ~-relative outside it) that shape no output
# value, each with the reason; those whose reason starts with "writable:" may also be written.
ENVIRONMENT: dict[str, str] = {
    "params.yaml": "read whole and validated by every stage; the values a stage passes on are those of its params: "
                   "keys (debias.harness.stage.STAGE_PARAMS), which DVC tracks",
    "dvc.yaml": "the stage runner reads the stage's declared outs to check they are writable and to log them; DVC "
                "reruns a stage whose entry changes",
    ".dvc/": "DVC's own configuration, read to find the repository root",
    "/etc/": "the system's configuration (time zone, users, host names, shared-library cache, SSL certificates)",
    "/usr/share/": "system data: fonts, time-zone and locale tables",
    "/usr/lib/": "system libraries and their data",
    "/usr/local/share/": "system data: fonts",
    "~/.cache/debias/numba/": "writable: numba's cache of compiled UMAP code (the same code, compiled once)",
    "~/.cache/debias/vega/": "writable: the Vega-Lite bundle the installed vl-convert produces, cached under its "
                             "version's name (the plots page embeds it)",
    "*.egg-info/*": "installed distributions' metadata: the registries look up plugin entry points in it (a "
                    "plugin's code lies outside the repository, docs/guarantees.md)",
    "*.dist-info/*": "installed distributions' metadata: the registries look up plugin entry points in it (a "
                     "plugin's code lies outside the repository, docs/guarantees.md)",
    "~/.cache/matplotlib/": "writable: matplotlib's font list cache",
    "~/.config/matplotlib/": "writable: matplotlib's settings folder (made empty when missing)",
    "~/.matplotlib/": "writable: matplotlib's settings and cache folder on some systems",
    "~/.cache/fontconfig/": "writable: fontconfig's font cache",
}

MACHINE_FOLDERS = ("/proc/", "/dev/", "/sys/")
CODE_FOLDERS = ("src/", "pipeline/")


@dataclass
class Trace:
    """What one stage's processes did, as the hook logged it: absolute paths and module names."""

    reads: set[str] = field(default_factory=set)
    writes: set[str] = field(default_factory=set)  # created, written, renamed or removed
    by: dict[str, str] = field(default_factory=dict)  # path -> the innermost debias module that first touched it
    listed: set[str] = field(default_factory=set)
    imports: dict[str, list[str]] = field(default_factory=dict)  # module -> the debias modules on the stack then
    scripts: set[str] = field(default_factory=set)  # files run as __main__


def is_write(mode: str | None, flags: int | None) -> bool:
    """Whether an ``open`` audit event writes: a mode with w, a, x or +, or (``os.open``) flags asking to write."""
    if mode is not None:
        return any(c in mode for c in "wax+")
    return bool((flags or 0) & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))


def is_read(mode: str | None, flags: int | None) -> bool:
    """Whether an ``open`` audit event reads: a mode with r or +, or flags that are not write-only."""
    if mode is not None:
        return "r" in mode or "+" in mode
    flags = flags or 0
    if flags & os.O_TRUNC or (flags & os.O_CREAT and flags & os.O_EXCL):  # emptied, or made new: nothing to read
        return False
    return (flags & os.O_ACCMODE) != os.O_WRONLY


def read_trace(path: Path) -> Trace:
    """The :class:`Trace` of a hook's log (every process of the stage; a missing log is an empty trace)."""
    trace = Trace()
    if not path.exists():
        return trace
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        event, paths = record["event"], record.get("paths") or []
        for path in paths:
            if path:
                trace.by.setdefault(path, record.get("by") or "?")
        if event == "import":
            trace.imports.setdefault(record["module"], record.get("stack") or [])
        elif event == "cpython.run_file":
            trace.scripts.update(paths)
        elif event == "open":
            if os.path.isdir(paths[0]):
                trace.listed.add(paths[0])
                continue
            if is_read(record.get("mode"), record.get("flags")):
                trace.reads.add(paths[0])
            if is_write(record.get("mode"), record.get("flags")):
                trace.writes.add(paths[0])
        elif event in ("os.listdir", "os.scandir"):
            trace.listed.add(paths[0])
        elif event in ("os.rename", "tempfile.mkstemp", "tempfile.mkdtemp", "os.mkdir", "os.remove", "os.rmdir",
                       "shutil.rmtree", "sqlite3.connect"):
            trace.writes.update(p for p in paths if p)
    return trace


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every file under ``root`` but ``.git/``: repository-relative path -> (size, modification time in ns)."""
    found: dict[str, tuple[int, int]] = {}
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if not (folder == str(root) and d == ".git")]
        for name in files:
            path = os.path.join(folder, name)
            try:
                stat = os.stat(path)
            except OSError:
                continue
            found[os.path.relpath(path, root)] = (stat.st_size, stat.st_mtime_ns)
    return found


def changed_files(before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]) -> set[str]:
    """Files created, changed or deleted between two :func:`snapshot` calls."""
    return {path for path in set(before) | set(after) if before.get(path) != after.get(path)}


def declared(stage: dict[str, Any]) -> tuple[list[str], list[str]]:
    """A dvc.yaml stage's deps and outs (outs, metrics and plots), as repository-relative paths."""
    outs = [next(iter(entry)) if isinstance(entry, dict) else entry
            for kind in ("outs", "metrics", "plots") for entry in stage.get(kind) or []]
    return [str(d) for d in stage.get("deps") or []], [str(o) for o in outs]


def under(path: str, entries: list[str] | tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``entries`` or lies under one (an entry is a file, a folder, or a pattern)."""
    for entry in entries:
        folder = entry.rstrip("/")
        if path == folder or path.startswith(folder + "/") or fnmatch.fnmatch(path, entry):
            return True
    return False


def _environment(root: Path) -> tuple[list[str], list[str]]:
    """:data:`ENVIRONMENT`'s entries as paths (absolute outside ``root``, relative inside): all, and the writable."""
    entries, writable = [], []
    for entry, reason in ENVIRONMENT.items():
        path = os.path.expanduser(entry) + ("/" if entry.endswith("/") and entry.startswith("~") else "")
        entries.append(path)
        if reason.startswith("writable:"):
            writable.append(path)
    return entries, writable


def temporary_folders() -> tuple[str, ...]:
    """The temporary folders a process may use: ``tempfile``'s, ``$TMPDIR`` and ``/tmp``, ``/var/tmp``, ``/dev/shm``."""
    folders = {tempfile.gettempdir(), os.environ.get("TMPDIR", ""), "/tmp", "/var/tmp", "/dev/shm"}
    return tuple(sorted(os.path.join(os.path.realpath(f), "") for f in folders if f))


def _inside(path: str, root: Path) -> str | None:
    """``path`` relative to ``root`` when it lies inside it, else None."""
    real = os.path.realpath(path)
    base = os.path.realpath(root)
    return os.path.relpath(real, base) if real == base or real.startswith(base + os.sep) else None


# Loading params assembles the whole schema from every registry (debias.schema imports each method's, group
# method's and probe's declarations through debias.core.declarations): what is imported on that path builds the
# schema of sections a stage may not read, and the stage's own code deps are derived from its imports
# (debias.tools.deps), which name the declarations it does use.
SCHEMA_ASSEMBLY = {"debias.schema", "debias.core.declarations"}


def unread_sections(stage: dict[str, Any], root: Path) -> set[str]:
    """The params section modules a stage does not read (:func:`debias.tools.deps.stage_sections`): loading params
    imports every section, and what a section's module imports to build its schema (a registry's declarations)
    passes no value into this stage's outputs."""
    from debias.tools.deps import params_sections, stage_sections

    return set(params_sections(root).values()) - set(stage_sections(stage, root))


def check_stage(name: str, stage: dict[str, Any], trace: Trace, changed: set[str], root: Path,
                external: list[str] = ()) -> list[str]:
    """The violations of stage ``name`` (its dvc.yaml entry ``stage``) by what it did: ``trace`` (its processes'
    events), ``changed`` (files it created, changed or deleted under ``root``, :func:`changed_files`) and
    ``external`` (absolute paths of the data source's external files); an empty list when the graph holds."""
    deps, outs = declared(stage)
    environment, writable = _environment(root)
    inside_environment = [e for e in environment if not os.path.isabs(e)]
    outside_environment = [e for e in environment if os.path.isabs(e) or e.startswith("*")]
    temporary = temporary_folders()
    fingerprinted = "data/source.json" in deps or name == "source"
    problems: list[str] = []

    def allowed_outside(path: str, entries: list[str]) -> bool:
        real = os.path.realpath(path)
        return (real.startswith(MACHINE_FOLDERS) or real.startswith(temporary) or under(real, entries)
                or under(path, entries) or (fingerprinted and under(real, list(external))))

    def who(path: str) -> str:
        return f" (in {trace.by[path]})" if trace.by.get(path) else ""

    for path in sorted(trace.reads - trace.writes):  # a file the stage made itself (a temporary) is no input
        rel = _inside(path, root)
        if rel is None:
            if not allowed_outside(path, outside_environment):
                problems.append(f"{name} reads {path}{who(path)}, outside the repository: neither a temporary "
                                "folder nor a declared environment file (ENVIRONMENT)")
            continue
        if rel.startswith(CODE_FOLDERS) and rel.endswith((".py", ".pyc")):
            continue  # code: judged by the imports below
        if not (under(rel, deps) or under(rel, outs) or under(rel, inside_environment) or under(rel, list(NOT_OUTS))):
            problems.append(f"{name} reads {rel}{who(path)}, which is not among its deps in dvc.yaml")
    for path in sorted(trace.listed):
        rel = _inside(path, root)
        if rel is None or rel == "." or rel.startswith(CODE_FOLDERS) or rel in ("src", "pipeline"):
            continue  # outside: listing finds nothing the reads above do not name; code: the import machinery
        if not (under(rel, deps) or under(rel, outs) or under(rel, inside_environment) or under(rel, list(NOT_OUTS))
                or any(d.startswith(rel.rstrip("/") + "/") for d in (*deps, *outs))):
            problems.append(f"{name} lists the folder {rel}{who(path)}, which is not among its deps in dvc.yaml")
    for rel in sorted(changed):
        if not (under(rel, outs) or under(rel, list(NOT_OUTS))):
            problems.append(f"{name} writes {rel}, which is not among its outs in dvc.yaml nor declared as no out "
                            "(NOT_OUTS)")
    for path in sorted(trace.writes):
        if _inside(path, root) is None and not allowed_outside(path, writable):
            problems.append(f"{name} writes {path}{who(path)}, outside the repository: neither a temporary folder "
                            "nor a writable environment entry (ENVIRONMENT)")
    for script in sorted(trace.scripts):
        rel = _inside(script, root)
        if rel is not None and rel not in deps:
            problems.append(f"{name} runs {rel}, which is not among its deps in dvc.yaml")
    unread = unread_sections(stage, root)
    for module, stack in sorted(trace.imports.items()):
        found = module_file(module, root)
        if found is None:
            continue  # a name tried on import (``from a import b`` asks for ``a.b``) that is no module
        rel = str(found.relative_to(root))
        if rel in deps or is_side_channel(module) or (unread & {module, *stack}) or (SCHEMA_ASSEMBLY & {*stack}):
            continue  # a dep, a side channel, or imported to build the schema of params the stage does not read
        problems.append(f"{name} imports {module} ({rel}{', for ' + stack[0] if stack else ''}), which is neither "
                        "among its deps in dvc.yaml nor a side channel (debias.tools.deps.SIDE_CHANNELS)")
    return problems
