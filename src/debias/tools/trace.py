"""What a stage really read, wrote, probed, ran and imported, held against what dvc.yaml says it depends on and writes.

Files are traced at the OS level: the stage's command runs under ``strace -f``, so every open, stat, rename,
removal, folder made and program run of every process of the stage counts, whatever library makes it (pyarrow's C++
readers, a ctypes ``fopen``, ``torch.from_file``, a ``cat`` or ``python -I`` subprocess); Python's audit hook
(tests/trace_hook/sitecustomize.py) adds what the OS does not see: which ``debias`` module imported which, so code
deps are judged by the imports, and which module opened a file (named in the messages). Both logs become a
:class:`Trace` (:mod:`debias.tools.trace_log`). What the stage left on disk is the difference of
two :func:`snapshot` calls of the repository around it. :func:`check_stage` turns all of it into the stage's
violations, each a sentence naming the file or module:

- every file read inside the repository that existed before the stage is a dep of the stage, lies under one, is its
  own resume state (:data:`debias.core.paths.RESUME_FILES`) or a declared environment file (:data:`ENVIRONMENT`);
  the real path decides (a symlink in the repository to a file elsewhere is judged by where it points); outside the
  repository, every file read lies under the interpreter, ``/proc``, ``/dev``, ``/sys``, a declared environment entry,
  the data source's external files (stages depending on their fingerprint ``data/source.json`` only), or a temporary
  folder, and there only when the stage itself made the file;
- no file or folder inside the repository that another stage writes is probed (``stat``, ``exists``, ``access``,
  ``getxattr``, a ``chdir`` into it) or tried (an ``open``, ``chdir`` or ``chmod`` that fails: a missing file is an
  answer too) unless it is among the stage's deps or outs: on a fresh clone the file is missing, in a workspace where
  the other stage ran it is there, and what the stage does depends on which (DVC knows of neither); nor is any other
  file or folder the repository held before the stage (code aside: judged by the imports) that is not a dep, an out,
  a folder holding one, a declared environment file or a declared probe (:data:`PROBED`): whether it is there steers
  the stage just as much (a name that was not there, and is no stage's out, answers the same on every clone: the
  dynamic loader and the import system probe many);
- no other stage's out is renamed, removed, linked over, opened to write or has its mode, owner or times changed,
  even if put back (renamed away and back, it is what it was, and a snapshot sees nothing); no file that is not an
  out or declared as no out has its mode, owner or times changed (``chmod``, ``chown``, ``utime``: a snapshot of
  sizes and modification times need not show it);
- no folder is listed (its entries read: ``getdents``) whose entries DVC does not pin for the stage. DVC pins a
  dep's presence (it runs the stage only when every dep exists) and the stage's own outs' (it deletes them before
  the stage runs); another stage's out is there or not by whether that stage ran or was pulled. So a listing is a
  read of every other stage's out under the folder (:func:`revealed`), each of which must be a dep unless the folder
  lies in a dep; a folder holding none is listed only when one of the stage's deps or outs lies under it. The
  atomic writer lists the folder of each file it writes and acts on its own temporaries alone (:data:`LISTERS`): as
  many listings of a folder as the audit hook saw it make are excused;
- every file the stage created, changed or deleted in the repository is one of its outs or lies under one, or is
  declared as no out with the reason (:data:`NOT_OUTS`); outside it, it wrote only into temporary folders or
  :data:`ENVIRONMENT` entries marked writable; a link made (``link``, ``symlink``) reads what it links to: a hard
  link or a symlink from a non-dep into an out makes the out that file without opening it;
- every program it ran from the repository is a dep; a read under ``.git/`` is made by a git command declared for
  the stage (:data:`GIT_COMMANDS`, :data:`STAGE_COMMANDS`: git's objects hold every committed file of every commit);
- every ``debias`` module imported is a dep of the stage or a side channel (:data:`debias.tools.deps.SIDE_CHANNELS`):
  a harness module that is neither counts as handing values into the outputs.
Code files (``src/``, ``pipeline/``, their ``__pycache__``) are judged by the imports: a code file read is a dep, the
file of a module the hook saw imported, or a side channel's; any other (run by ``runpy.run_path`` or a spec loader's
``exec_module``, whose module the import recorder never sees, or read as data) is a read DVC does not track.
"""

from __future__ import annotations

import fnmatch
import os
import tempfile
from pathlib import Path
from typing import Any

import yaml

from debias.core.paths import CODE_FINGERPRINTS, FINGERPRINT_STAGE, RESUME, RESUME_FILES
from debias.tools.deps import HARNESS_LEAVES, is_side_channel, module_file
from debias.tools.trace_log import Trace

# Files (repository-relative; a trailing / is a folder and everything under it; fnmatch patterns) a stage may create,
# change or delete that are not outs, each with the reason DVC need not know them.
NOT_OUTS: dict[str, str] = {
    f"{RESUME.as_posix()}/": "a training stage's resume state: written during training, deleted when the stage "
                             "succeeds; a failed stage leaves it for its next run of the same stage to resume from "
                             "(read back by that stage only: RESUME_FILES)",
    "*/__pycache__/*": "the interpreter's bytecode cache of the code deps",
    f"{CODE_FINGERPRINTS.as_posix()}/": (
        "each stage's code fingerprint, a dep of that stage: written by `source`, which runs first on every repro, "
        "from the code files dvc.yaml lists; no out, so that DVC's read lock on a running stage's deps never refuses "
        "another run's `source` (the workspace claim refuses it, with its message)"),
    "mlflow.db": "the MLflow store (harness tracking, written only; never read back into an output): git- and "
                 "DVC-ignored, shared by every run",
    "mlflow.db-journal": "SQLite's journal of the MLflow store",
    "mlruns/": "MLflow's artifact store (harness tracking, written only): git- and DVC-ignored, shared by every run",
}

# Files read outside the stage's deps (repository-relative, or absolute / ~-relative outside it) that shape no output
# value, each with the reason; those whose reason starts with "writable:" may also be written.
ENVIRONMENT: dict[str, str] = {
    "params.yaml": "read whole and validated by every stage; the values a stage passes on are those of its params: "
                   "keys (debias.harness.stage.STAGE_PARAMS), which DVC tracks",
    "dvc.yaml": "the stage runner reads the stage's declared outs to check they are writable and to log them; DVC "
                "reruns a stage whose entry changes",
    "dvc.lock": "the stage runner reads the params DVC recorded for the stage's last run, to name the changed ones "
                "this run does not read (unread-param, debias.harness.unread); no computed value depends on it",
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

# What one stage alone may read besides ENVIRONMENT, each with the reason.
STAGE_ENVIRONMENT: dict[str, dict[str, str]] = {
    "report": {
        "~/.gitconfig": "git's own settings, read by that `git show`",
        "~/.config/git/": "git's own settings, read by that `git show`",
    },
}

# The git commands (argument lists joined by spaces; fnmatch patterns) that may read ``.git/``, each with the reason:
# git's objects hold every committed file of every commit, so a read there is judged by the command that made it (the
# OS trace names each process's program), never by the path (a ``git show <commit>:<file>``, or the stage's own open
# of ``.git/objects/``, reads files DVC does not track). GIT_COMMANDS: every stage's; STAGE_COMMANDS: one stage's.
GIT_COMMANDS: dict[str, str] = {
    "git rev-parse HEAD": "the run's commit, recorded as provenance (debias.core.environment.git_commit): it names "
                          "the code, it computes no value",
    "git for-each-ref --format=%(refname)%00%(objectname)%00%(symref) refs/exps/exec/": "DVC's executor refs, kept "
                                                                                        "to put them back "
                                                                                        "(debias.harness.workspace)",
    "git update-ref refs/exps/exec/*": "puts DVC's executor refs back (debias.harness.workspace)",
    "git symbolic-ref refs/exps/exec/*": "puts DVC's executor refs back (debias.harness.workspace)",
    "git diff --quiet HEAD -- params.yaml": "a failed stage's message says whether params.yaml is as committed "
                                            "(debias.core.errors.uncommitted_params_hint)",
    "git show HEAD:reports/metrics/*.json": "a failed stage puts back the committed headline dvc.lock records "
                                            "(debias.core.headline); its run is over",
    "git show *:params.yaml": "harness tracking (written only): the params a run changed against its commit's",
}
STAGE_COMMANDS: dict[str, dict[str, str]] = {
    "report": {
        "git show HEAD:params.yaml": "debias.report.params_table.committed_text: the params section shows this run's "
                                     "params against the committed ones, so a report says which commit it means",
        "git rev-parse --short=12 HEAD": "names the commit that params section compared with",
    },
}
GIT_FOLDER = ".git/"

# Nothing under .dvc/ is an environment file: DVC reads its configuration and cache in its own process, and a stage
# process needs none of it (debias.core.paths.repo_root takes $DVC_ROOT, else probes for the folder ``.dvc``: a stat,
# no read). A read of .dvc/config, .dvc/cache/ or .dvc/tmp/ by a stage is a read DVC does not track.

# The modules whose folder listings read nothing into an output, each with the reason: check_stage excuses as many
# listings of a folder as the audit hook saw these modules make (the OS trace counts every listing, by any code).
LISTERS: dict[str, str] = {
    "debias.core.io": "the atomic writer lists the folder of each file it writes to remove its own temporaries left "
                      "by killed writers (``.<name>.<pid>.<random>.tmp``, _sweep_dead_temps): it acts on no other name",
}

# Paths in the repository a stage may probe without their being deps, each with the reason.
PROBED: dict[str, str] = {
    ".dvc": "debias.core.paths.repo_root finds the repository by this folder's presence (a stat, no read): every "
            "stage runs at a repository root",
}

MACHINE_FOLDERS = ("/proc/", "/dev/", "/sys/")
CODE_FOLDERS = ("src/", "pipeline/")


def code_module(rel: str) -> str | None:
    """The module a code file of the repository holds (``src/debias/a/__pycache__/b.cpython-311.pyc`` ->
    ``debias.a.b``, ``src/debias/a/__init__.py`` -> ``debias.a``); None outside ``src/``."""
    parts = rel.split("/")
    if parts[0] != "src" or len(parts) < 2:
        return None
    if len(parts) > 2 and parts[-2] == "__pycache__":
        parts = [*parts[:-2], parts[-1].split(".", 1)[0]]
    else:
        parts[-1] = parts[-1].rsplit(".", 1)[0]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts[1:])


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
    """A dvc.yaml stage's deps (its code files, ``meta: code``, included) and outs (outs, metrics and plots), as
    repository-relative paths."""
    from debias.core.fingerprint import stage_code_files

    outs = [next(iter(entry)) if isinstance(entry, dict) else entry
            for kind in ("outs", "metrics", "plots") for entry in stage.get(kind) or []]
    return ([str(d) for d in stage.get("deps") or []] + stage_code_files({"": stage}, ""),
            [str(o) for o in outs])


def fingerprinted_code(name: str, root: Path) -> list[str]:
    """The code files of each stage of ``root``'s dvc.yaml that depends on its code fingerprint
    (``data/code/<stage>.json``) when ``name`` is the stage that writes them (``source``): it reads them, as data,
    to hash them; [] for any other stage."""
    from debias.core.fingerprint import stage_code_files
    from debias.core.paths import code_fingerprint_path

    if name != FINGERPRINT_STAGE:
        return []
    stages = yaml.safe_load((root / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    return sorted({path for stage, entry in stages.items()
                   if str(code_fingerprint_path(stage)) in [str(d) for d in (entry or {}).get("deps") or []]
                   for path in stage_code_files(stages, stage)})


def under(path: str, entries: list[str] | tuple[str, ...]) -> bool:
    """Whether ``path`` is one of ``entries`` or lies under one (an entry is a file, a folder, or a pattern)."""
    for entry in entries:
        folder = entry.rstrip("/")
        if path == folder or path.startswith(folder + "/") or fnmatch.fnmatch(path, entry):
            return True
    return False


def revealed(folder: str, outs: list[str]) -> list[str]:
    """The ``outs`` a listing of ``folder`` shows the presence of (repository-relative): those under it at any depth
    (a sub-folder's entry is there because what it holds is) and the one it lies in."""
    return [out for out in outs if under(out, [folder]) or under(folder, [out])]


def _environment(root: Path, stage: str = "") -> tuple[list[str], list[str]]:
    """:data:`ENVIRONMENT`'s entries and ``stage``'s :data:`STAGE_ENVIRONMENT` as paths (absolute outside ``root``,
    relative inside): all, and the writable."""
    entries, writable = [], []
    for entry, reason in {**ENVIRONMENT, **STAGE_ENVIRONMENT.get(stage, {})}.items():
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
                external: list[str] = (), existed: set[str] | None = None,
                others_outs: list[str] = ()) -> list[str]:
    """The violations of stage ``name`` (its dvc.yaml entry ``stage``) by what it did: ``trace`` (its processes'
    events), ``changed`` (files it created, changed or deleted under ``root``, :func:`changed_files`), ``external``
    (absolute paths of the data source's external files), ``existed`` (the repository's files before the stage,
    :func:`snapshot`'s keys: a file read that was not there is one the stage made) and ``others_outs`` (every other
    stage's outs: probing them, failing to open them or listing a folder that holds them is reading them); an empty
    list when the graph holds."""
    deps, outs = declared(stage)
    deps += fingerprinted_code(name, root)
    environment, writable = _environment(root, name)
    inside_environment = [e for e in environment if not os.path.isabs(e)]
    outside_environment = [e for e in environment if os.path.isabs(e) or e.startswith("*")]
    own_resume = [RESUME_FILES[name].as_posix()] if name in RESUME_FILES else []
    temporary = temporary_folders()
    fingerprinted = "data/source.json" in deps or name == FINGERPRINT_STAGE
    skip = _interpreter_folders()
    imported = {module for module in trace.imports if module_file(module, root) is not None}
    git_commands = [*GIT_COMMANDS, *STAGE_COMMANDS.get(name, {})]

    def declared_git(command: str) -> bool:
        return any(fnmatch.fnmatchcase(command, pattern) for pattern in git_commands)
    problems: list[str] = []

    def allowed_outside(path: str, entries: list[str], own_temporary: bool) -> bool:
        real = os.path.realpath(path)
        return (real.startswith(MACHINE_FOLDERS) or real.startswith(skip) or under(real, entries)
                or under(path, entries) or (fingerprinted and under(real, list(external)))
                or (own_temporary and real.startswith(temporary)))

    def who(path: str) -> str:
        return f" (in {trace.by[path]})" if trace.by.get(path) else ""

    def code(rel: str) -> bool:
        return rel.startswith(CODE_FOLDERS) and (rel.endswith((".py", ".pyc")) or "/__pycache__" in rel)

    for path in sorted(trace.reads):
        real = os.path.realpath(path)
        rel = _inside(real, root)
        if rel is None:
            made_here = path in trace.made or real in trace.made
            if not allowed_outside(real, outside_environment, made_here):
                where = ("a file in a temporary folder the stage did not make" if real.startswith(temporary)
                         else "neither a temporary file of its own nor a declared environment file (ENVIRONMENT)")
                problems.append(f"{name} reads {real}{who(real)}, outside the repository: {where}")
            continue
        if under(rel, [GIT_FOLDER]):
            commands = trace.readers.get(path, set()) | trace.readers.get(real, set())
            others = sorted(c for c in commands if not declared_git(c))
            if commands and not others:
                continue  # read by a git command declared for the stage (GIT_COMMANDS, STAGE_COMMANDS)
            shown = ", ".join(f"`{' '.join(c.split())[:80]}`" if c else "the stage's own process"
                              for c in others) or "a process"
            problems.append(f"{name} reads {rel}{who(real)} by {shown}: git's store holds every committed file of "
                            "every commit; only the git commands declared for the stage (GIT_COMMANDS, "
                            "STAGE_COMMANDS) may read it")
            continue
        if existed is not None and rel not in existed:
            continue  # a file the stage made itself is no input (the snapshot leaves out .git/: above)
        if code(rel):
            module = code_module(rel)
            if under(rel, deps) or (module is not None and (module in imported or is_side_channel(module))):
                continue  # judged by the imports below
            problems.append(f"{name} reads {rel}{who(real)}, code no import of the stage loaded (run by runpy or a "
                            "spec loader's exec_module, or read as data), which is not among its deps in dvc.yaml")
            continue
        if not (under(rel, deps) or under(rel, outs) or under(rel, inside_environment) or under(rel, own_resume)):
            problems.append(f"{name} reads {rel}{who(real)}, which is not among its deps in dvc.yaml")
    for path, count in sorted(trace.listed.items()):
        rel = _inside(path, root)
        if rel is None or rel == "." or rel.startswith(CODE_FOLDERS) or rel in ("src", "pipeline"):
            continue  # outside: listing finds nothing the reads above do not name; the root (``python -m`` puts it
            # on sys.path) and code: the import machinery
        if (under(rel, deps) or under(rel, outs) or under(rel, inside_environment) or under(rel, list(NOT_OUTS))
                or under(rel, [GIT_FOLDER])):
            continue  # a dep folder or one inside it, inside an out, a declared environment or no-out folder, or
            # git's store (it holds no stage's outs; what is read there is judged by the command that reads it)
        hidden = [out for out in revealed(rel, list(others_outs)) if not under(out, deps)]
        excused = sum(n for module, n in trace.listed_by.get(path, {}).items() if module in LISTERS)
        if hidden and count > excused:
            shown = ", ".join(hidden[:3]) + (f" and {len(hidden) - 3} more" if len(hidden) > 3 else "")
            problems.append(f"{name} lists the folder {rel}{who(path)}, which holds other stages' outs that are not "
                            f"among its deps in dvc.yaml ({shown}): what it finds depends on whether they exist")
        elif not hidden and not any(d.startswith(rel.rstrip("/") + "/") for d in (*deps, *outs)):
            problems.append(f"{name} lists the folder {rel}{who(path)}, which is not among its deps in dvc.yaml")
    attempts = [(path, "probes", "(exists / stat)") for path in trace.probed]
    attempts += [(path, "tries to open", "(a failed open, chdir or chmod: a missing file is an answer)")
                 for path in trace.tried]
    declared_paths = [*deps, *outs, *inside_environment, *own_resume, *NOT_OUTS, *PROBED]
    present = _with_folders(existed or ())
    for path, verb, how in sorted(attempts):
        rel = _inside(path, root)
        if rel is None or rel == "." or code(rel):
            continue
        if under(rel, list(others_outs)) and not (under(rel, deps) or under(rel, outs) or under(rel, own_resume)):
            problems.append(f"{name} {verb} {rel}{who(path)} {how}, an out of another stage that is not among its "
                            "deps in dvc.yaml")
        elif (rel in present and not rel.startswith(CODE_FOLDERS) and rel not in ("src", "pipeline")
              and not (under(rel, declared_paths) or under(rel, [GIT_FOLDER]) or path in trace.made
                       or path in trace.writes or any(under(entry, [rel]) for entry in declared_paths))):
            problems.append(f"{name} {verb} {rel}{who(path)} {how}, which is not among its deps in dvc.yaml: "
                            "whether it is there steers the stage, and DVC does not track it")
    for path in sorted(trace.writes):
        rel = _inside(path, root)
        if rel is not None and under(rel, list(others_outs)) and not under(rel, outs):
            problems.append(f"{name} moves, removes, links over or changes {rel}{who(path)}, an out of another "
                            "stage (put back or not, what that stage left is not what DVC recorded)")
    for path in sorted(trace.changed_metadata):
        rel = _inside(path, root)
        if rel is not None and not (under(rel, outs) or under(rel, list(NOT_OUTS)) or under(rel, list(others_outs))
                                    or path in trace.made):
            problems.append(f"{name} changes the mode, owner or times of {rel}{who(path)}, which is not among its "
                            "outs in dvc.yaml nor declared as no out (NOT_OUTS)")
    for rel in sorted(changed):
        if not (under(rel, outs) or under(rel, list(NOT_OUTS))):
            problems.append(f"{name} writes {rel}, which is not among its outs in dvc.yaml nor declared as no out "
                            "(NOT_OUTS)")
    for path in sorted(trace.writes):
        if _inside(path, root) is None and not allowed_outside(path, writable, True):
            problems.append(f"{name} writes {path}{who(path)}, outside the repository: neither a temporary folder "
                            "nor a writable environment entry (ENVIRONMENT)")
    for script in sorted(trace.scripts):
        rel = _inside(script, root)
        if rel is not None and rel not in deps and not code(rel):
            problems.append(f"{name} runs {rel}, which is not among its deps in dvc.yaml")
    unread = unread_sections(stage, root)
    for module, stack in sorted(trace.imports.items()):
        found = module_file(module, root)
        if found is None:
            continue  # a name tried on import (``from a import b`` asks for ``a.b``) that is no module
        rel = str(found.relative_to(root))
        if (rel in deps or is_side_channel(module) or (unread & {module, *stack}) or (SCHEMA_ASSEMBLY & {*stack})
                or set(HARNESS_LEAVES) & {*stack}):
            continue  # a dep, a side channel, imported to build the schema of params the stage does not read, or by
            # a harness leaf (whose imports compute no output: debias.tools.deps.HARNESS_LEAVES)
        problems.append(f"{name} imports {module} ({rel}{', for ' + stack[0] if stack else ''}), which is neither "
                        "among its deps in dvc.yaml nor a side channel (debias.tools.deps.SIDE_CHANNELS)")
    return problems


def _with_folders(files: set[str] | tuple[()]) -> set[str]:
    """Repository-relative ``files`` and every folder holding one: what was in the repository before the stage (a
    probe of a name that was not there answers the same on every clone, unless it is another stage's out)."""
    found: set[str] = set()
    for name in files:
        while name and name not in found:
            found.add(name)
            name = os.path.dirname(name)
    return found


def _interpreter_folders() -> tuple[str, ...]:
    """The interpreter's and its installed packages' folders (never a stage's deps)."""
    import sys
    import sysconfig

    folders = {sys.prefix, sys.base_prefix, sys.exec_prefix, *sysconfig.get_paths().values()}
    return tuple(sorted({os.path.join(os.path.realpath(f), "") for f in folders if f}))
