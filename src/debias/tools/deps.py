"""Each stage's code dependencies, derived from what its entrypoint imports, so dvc.yaml cannot drift.

The rule: a stage depends on the code that computes its outputs and on nothing else.

A stage's command (``python pipeline/<stage>.py`` or ``python -m debias.harness.launch pipeline/<stage>.py``)
runs files that import modules of the ``debias`` package, which import others, at module level or
inside functions. :func:`code_deps` walks those imports statically (``ast``: every ``import`` and
``from ... import`` anywhere in a file, so lazy imports count) from the command's files and returns
every file of the repository it reaches: the entrypoint, ``src/debias/**.py`` (each package's
``__init__.py`` included, since importing a submodule runs it). Data dependencies (``data/``,
``models/``, ``reports/``) are not code and stay as dvc.yaml states them. Two refinements:

- **The harness** (:data:`HARNESS`: the launcher, the fork server, the stage runner, tracking, progress lines,
  memory advice, and the tools no stage runs) starts, watches, records or advises on a stage. Of its modules,
  those named in :data:`SIDE_CHANNELS` hand research code no value derived from their inputs: their files are
  never a stage's deps. Any other harness module a stage reaches is a dep like research code (a side channel is
  a claim each entry makes with its reason; tests/test_trace.py fails on a stage that imports a harness module
  that is neither). The walk still follows a side channel's own imports, since what it calls may compute output
  values (the stage runner writes the headline metrics through :mod:`debias.core.headline` and sizes the thread
  pools through :mod:`debias.core.runtime`). tests/test_forkserver.py holds the harness to this: the same output
  bytes with the fork server on and off.
- **Packages**: importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py``, so every file reached brings
  its parent packages' ``__init__.py`` (those of a module found by :data:`DISCOVERED` included).
- **The params schema** (:mod:`debias.params`, one module per section, completed and loaded by :mod:`debias.schema`):
  a stage depends on the modules of the sections it reads (its ``params:`` in dvc.yaml, the modules of the section classes the code imports by name,
  every section for a stage that depends on params.yaml whole) plus the shared ones (:data:`PARAMS_COMMON`),
  not on every section: a change to ``loss``'s schema reruns the stages that read ``loss``.

dvc.yaml keeps each stage's list under its ``meta: code``; the stage's one code dep is ``data/code/<stage>.json``,
the md5 of each listed file, which the ``source`` stage writes (:func:`debias.core.fingerprint.code_fingerprints`),
so dvc.lock holds one code entry per stage. ``debias deps`` prints the difference between dvc.yaml and the derived
lists; ``debias deps --write`` rewrites every stage's ``meta: code`` and its fingerprint dep (comments and everything
else kept).
"""

from __future__ import annotations

import ast
import io
import re
import shlex
from collections.abc import Iterable
from pathlib import Path

PACKAGE = "debias"
SOURCE_ROOT = Path("src")
CODE_PREFIXES = ("src/", "pipeline/")  # a dvc.yaml dep under these is code, derived here
# Modules that import others by name at run time, which no import statement shows: reaching the key (relative to
# src/debias) reaches every file its glob names. The stage-2 method registry imports every method's declaration
# when the params schema is built, as the group-inference registry does its methods' modules and the probe
# registry its variants' declarations; base.setup_method imports the training module the running method names,
# the probe the fit module of the running variant. (A package whose ``__init__`` maps names to submodules in a
# ``_LAZY`` dict, imported on first use, is followed by :func:`lazy_exports`.)
DISCOVERED = {"training/methods/registry.py": "training/methods/*/__init__.py",
              "training/methods/base.py": "training/methods/*/train.py",
              "groups/registry.py": "groups/methods/*.py",
              "evaluation/variants.py": "evaluation/probes/*/__init__.py",
              "evaluation/probe.py": "evaluation/probes/*/fit.py"}

# The harness packages: what starts, runs, watches, records or advises on a stage, each with what it holds. Whether
# a module of them is a stage's dep is :data:`SIDE_CHANNELS`'s decision, not this table's.
HARNESS: dict[str, str] = {
    "debias.harness": "the launcher, the fork server, the stage runner, tracking, progress lines and the memory "
                      "check; the side channels among them are no stage's deps (SIDE_CHANNELS), the others are",
    "debias.tools": "the `debias` command, sweeps, services, presets, compare and this module: no stage imports them "
                    "(DVC sees the params a preset writes, not the preset code)",
}

# The harness modules that are side channels: they start, run, record or advise on a stage and hand research code
# no value derived from their inputs (an exception ends the stage, never changes what it computes). Their files are
# no stage's deps; a harness module not listed here is a dep of every stage that reaches it.
SIDE_CHANNELS: dict[str, str] = {
    "debias.harness": "the package: its __init__ holds only a docstring",
    "debias.harness.launch": "starts the stage's process (exec, the fork server or torchrun)",
    "debias.harness.forkserver": "forks the stage's process from a warm interpreter; the same output bytes with it on "
                                 "and off (tests/test_forkserver.py)",
    "debias.harness.stage": "loads the params through debias.params (a dep), turns errors into one line, opens the "
                            "run; what it calls that computes outputs (headline metrics, thread pools) stays a dep "
                            "through its imports",
    "debias.harness.tracking": "records the run in MLflow and reports/runs/; the same output bytes with tracking on "
                               "and off (tests/test_deps.py)",
    "debias.harness.memory": "refuses a run that would not fit in memory before it starts; leaves the model and every "
                             "random stream as they were (tests/test_deps.py); research calls it through "
                             "debias.core.resources, whose calls return nothing (tests/test_layers.py)",
    "debias.harness.progress": "the terminal reporter research code reports to through debias.core.progress; its calls "
                               "return nothing and research loops iterate over their own ranges (tests/test_layers.py)",
    "debias.harness.unread": "names the declared params changed since the stage's last run (dvc.lock) that the run "
                             "does not read; prints and records them, returns research code nothing",
    "debias.harness.workspace": "refuses a stage command of a second DVC run in the workspace before the stage "
                                "starts (the launcher's claim); the standard library only, it hands the stage nothing",
}

# Harness modules that call nothing computing an output either: the walk stops at them (the memory check reads
# the methods' memory plans, and the unread-param check the applicability rules, which must not make every stage
# depend on every method's declaration; the unread-param note a run record keeps is about the change that started
# that run, which a later edit to the rules does not make wrong).
HARNESS_LEAVES = ("debias.harness.memory", "debias.harness.unread")

PARAMS = "debias.params"
SCHEMA = "debias.schema"  # the whole schema built from the sections and the registries: a face, as the package
# The schema's modules every stage that loads params depends on: the package (re-exports), the Section base and
# the root (the Params model with its checks across sections, and the loading every stage runs).
PARAMS_COMMON = ("debias.params.base", "debias.params.root")


def is_harness(module: str) -> bool:
    """Whether ``module`` is, or lies under, a :data:`HARNESS` entry."""
    return any(module == name or module.startswith(name + ".") for name in HARNESS)


def is_side_channel(module: str) -> bool:
    """Whether ``module`` is a :data:`SIDE_CHANNELS` entry or lies under one (an entry naming a :data:`HARNESS`
    package covers its ``__init__`` alone), or lies under ``debias.tools`` (no stage imports the tools)."""
    return module == "debias.tools" or module.startswith("debias.tools.") or any(
        module == name or (module.startswith(name + ".") and name not in HARNESS) for name in SIDE_CHANNELS)


def is_params_section(module: str) -> bool:
    """A section module of the params schema (``debias.params.loss``), not the package or its shared modules."""
    return module.startswith(PARAMS + ".") and module not in PARAMS_COMMON


def module_file(module: str, root: Path) -> Path | None:
    """The file of a ``debias`` module (``debias/x.py`` or ``debias/x/__init__.py``) under ``root/src``, else None."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    base = root / SOURCE_ROOT / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def script_module_file(module: str, importer: Path, root: Path) -> Path | None:
    """A module a script outside the package imports from its own folder (a helper beside the entrypoints in
    ``pipeline/``: the folder a script runs from is first on ``sys.path``), as a file in the repository; else None."""
    if importer.is_relative_to(root / SOURCE_ROOT) or not importer.is_relative_to(root):
        return None
    base = importer.parent / Path(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path: Path) -> set[str]:
    """Every module named by an import statement in ``path`` (``from a import b`` also tries ``a.b``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    package = path.parent
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import: resolve against the file's package
                parts = list(package.parts)
                anchor = parts[: len(parts) - (node.level - 1)]
                if "src" not in anchor:
                    continue
                prefix = ".".join(anchor[anchor.index("src") + 1:])
                base = f"{prefix}.{node.module}" if node.module else prefix
            else:
                base = node.module or ""
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def _with_parents(module: str) -> list[str]:
    """``debias.a.b`` -> ``debias``, ``debias.a``, ``debias.a.b``: importing a submodule runs its packages."""
    parts = module.split(".")
    return [".".join(parts[: i + 1]) for i in range(len(parts))]


def module_name(path: Path, root: Path) -> str:
    """``root/src/debias/a/b.py`` -> ``debias.a.b``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(root / SOURCE_ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def params_exports(root: Path) -> dict[str, str]:
    """The names :mod:`debias.params` re-exports, each mapped to the section module defining it (static)."""
    init = module_file(PARAMS, root)
    if init is None or init.name != "__init__.py":
        return {}
    exports: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PARAMS + "."):
            exports.update({alias.asname or alias.name: node.module for alias in node.names})
    return exports


def params_sections(root: Path) -> dict[str, str]:
    """Each top-level params key mapped to the module of its section class (``loss`` -> ``debias.params.loss``),
    read statically from the fields of ``Params`` in ``debias.params.root``; keys of plain values (``seed``)
    belong to the root."""
    path = module_file(PARAMS_COMMON[1], root)
    if path is None:
        return {}
    tree = ast.parse(path.read_text(encoding="utf-8"))
    origin = {alias.asname or alias.name: node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
              and node.module for alias in node.names}  # ast.walk: TYPE_CHECKING imports name sections too
    sections: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Params":
            for field in node.body:
                if (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)
                        and isinstance(field.annotation, ast.Name) and field.annotation.id in origin):
                    sections[field.target.id] = origin[field.annotation.id]
    return sections


def lazy_exports(package: str, root: Path) -> dict[str, str]:
    """The names a package imports from its submodules on first use: its ``__init__``'s module-level ``_LAZY``
    dict literal (``{"infer_groups": "inference", ...}``, possibly extended by ``_LAZY.update``/comprehensions over
    literal names), each mapped to the submodule's full name; empty for a module or a package without one."""
    init = module_file(package, root)
    if init is None or init.name != "__init__.py":
        return {}
    found: dict[str, str] = {}
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        value = None
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            value = node.value
        elif (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
              and getattr(node.value.func, "attr", None) == "update"
              and getattr(node.value.func.value, "id", None) == "_LAZY" and node.value.args):
            value = node.value.args[0]
        if isinstance(value, ast.Dict):
            found.update({k.value: v.value for k, v in zip(value.keys, value.values)
                          if isinstance(k, ast.Constant) and isinstance(v, ast.Constant)})
        elif isinstance(value, ast.DictComp) and isinstance(value.value, ast.Constant):
            names = value.generators[0].iter
            if isinstance(names, (ast.Tuple, ast.List)):
                found.update({n.value: value.value.value for n in names.elts if isinstance(n, ast.Constant)})
    return {name: f"{package}.{sub}" for name, sub in found.items()}


def reachable_files(entries: list[Path], root: Path, sections: Iterable[str] = ()) -> set[Path]:
    """Every repository file reached from ``entries`` through ``debias`` imports (the entries included) with their
    packages' ``__init__.py``, without the side channels' files (:func:`is_side_channel`); of the params schema, the package, :data:`PARAMS_COMMON` and the section modules
    named in ``sections`` or by the names the code imports from :mod:`debias.params` (with what they import)."""
    exports = params_exports(root)
    seen: set[Path] = set()
    todo = [p for p in entries if p.is_file()]
    todo += [f for name in sections if (f := module_file(name, root)) is not None]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        if path.name == "__init__.py" and path.parent in (root / SOURCE_ROOT / Path(*PARAMS.split(".")),
                                                          root / SOURCE_ROOT / Path(*SCHEMA.split("."))):
            todo += [f for name in PARAMS_COMMON if (f := module_file(name, root)) is not None]
            continue  # the package re-exports, the schema assembles: which sections count is decided by name
        own = module_name(path, root) if path.is_relative_to(root / SOURCE_ROOT) else ""
        if own in HARNESS_LEAVES:
            continue
        for module in _imported_modules(path):
            if module.startswith(PARAMS + ".") and module_file(module, root) is None:  # from debias.params import X
                module = exports.get(module.rsplit(".", 1)[1], PARAMS)
            elif module_file(module, root) is None and "." in module:  # from a package a name it imports lazily
                package, name = module.rsplit(".", 1)
                module = lazy_exports(package, root).get(name, module)
            # a harness module is walked for what it calls, not for its packages (debias.training for its memory advice)
            for name in [module] if is_harness(module) else _with_parents(module):
                if is_params_section(name) and own == PARAMS_COMMON[1]:
                    continue  # the root composes every section; a stage depends on those it reads
                found = module_file(name, root) or script_module_file(name, path, root)
                if found is not None and found not in seen:
                    todo.append(found)
        package = root / SOURCE_ROOT / PACKAGE
        if package in path.parents and path.relative_to(package).as_posix() in DISCOVERED:
            todo.extend(sorted(package.glob(DISCOVERED[path.relative_to(package).as_posix()])))
        if path.is_relative_to(root / SOURCE_ROOT):
            todo += [f for name in _with_parents(own)[:-1] if (f := module_file(name, root)) is not None]
    return {path for path in seen if not _side_channel_file(path, root)}


def _side_channel_file(path: Path, root: Path) -> bool:
    return path.is_relative_to(root / SOURCE_ROOT) and is_side_channel(module_name(path, root))


def command_entries(cmd: str, root: Path) -> list[Path]:
    """The files a stage command runs: ``python FILE`` and ``python -m MODULE FILE`` (a launcher and its script)."""
    words = shlex.split(cmd.split("#", 1)[0])
    entries: list[Path] = []
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words):
            found = module_file(words[i + 1], root)
            if found is not None:
                entries.append(found)
        elif word.endswith(".py"):
            entries.append(root / word)
    return entries


def stage_sections(stage: dict, root: Path) -> list[str]:
    """The params section modules a dvc.yaml stage reads: those of its ``params:`` keys, every section when it
    depends on params.yaml whole (the report renders every param)."""
    sections = params_sections(root)
    keys = list(sections) if "params.yaml" in (stage.get("deps") or []) else [
        str(key).split(".")[0] for key in stage.get("params") or [] if isinstance(key, str)]
    return sorted({sections[key] for key in keys if key in sections})


def code_deps(cmd: str, root: Path, sections: Iterable[str] = ()) -> list[str]:
    """The code files (repository-relative, sorted) a stage command depends on, with the params ``sections``
    (modules, :func:`stage_sections`) it reads."""
    files = reachable_files(command_entries(cmd, root), root, sections)
    return sorted(str(p.relative_to(root)) for p in files)


def stage_code_deps(stage: dict, root: Path) -> list[str]:
    """:func:`code_deps` of a dvc.yaml stage (its ``cmd``, ``params`` and ``deps``)."""
    return code_deps(stage["cmd"], root, stage_sections(stage, root))


def is_code(dep: str) -> bool:
    return dep.startswith(CODE_PREFIXES)


def stage_differences(dvc_yaml: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per stage: (code files its ``meta: code`` lacks, code files it lists that the imports do not reach)."""
    import yaml

    from debias.core.fingerprint import stage_code_files

    root = dvc_yaml.parent
    stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    out: dict[str, tuple[list[str], list[str]]] = {}
    for name, stage in stages.items():
        declared = set(stage_code_files(stages, name)) | {d for d in stage.get("deps", []) or [] if is_code(d)}
        derived = set(stage_code_deps(stage, root))
        missing, extra = sorted(derived - declared), sorted(declared - derived)
        if missing or extra:
            out[name] = (missing, extra)
    return out


def write_deps(dvc_yaml: Path) -> list[str]:
    """Rewrite each stage's ``meta: code`` in dvc.yaml as derived, and its deps to name its code fingerprint
    (``data/code/<stage>.json``, which ``source`` writes) instead of the files (data deps and comments kept); the
    stages changed. ``source`` itself runs every time: its code is listed, not fingerprinted."""
    from ruamel.yaml import YAML
    from ruamel.yaml.comments import CommentedMap

    from debias.core.fingerprint import CODE_META
    from debias.core.paths import code_fingerprint_path

    root = dvc_yaml.parent
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)  # the file's own style
    document = yaml.load(dvc_yaml.read_text(encoding="utf-8"))
    changed = []
    for name, stage in document["stages"].items():
        derived = stage_code_deps(stage, root)
        meta = stage.get("meta")
        deps = stage.get("deps")
        data = [d for d in (deps or []) if not is_code(d) and d != str(code_fingerprint_path(name))]
        wanted = data if stage.get("always_changed") else [str(code_fingerprint_path(name)), *data]
        if meta is not None and list(meta.get(CODE_META) or []) == derived and list(deps or []) == wanted:
            continue
        changed.append(name)
        if meta is None:
            meta = CommentedMap()
            stage.insert(len(stage), "meta", meta)
        meta[CODE_META] = derived
        if deps is None and wanted:
            stage.insert(1, "deps", wanted)
        elif deps is not None and wanted:
            deps.clear()
            deps.extend(wanted)
        elif deps is not None:
            del stage["deps"]
    text = io.StringIO()
    yaml.dump(document, text)
    dvc_yaml.write_text(_blank_line_between_stages(text.getvalue()), encoding="utf-8")
    return changed


def _blank_line_between_stages(text: str) -> str:
    """One blank line before each stage (ruamel keeps a stage's trailing blank line ahead of an appended ``meta``)."""
    lines = [line for line in text.splitlines() if line.strip()]
    out: list[str] = []
    for line in lines:
        if re.match(r"^  [A-Za-z_][\w-]*:", line) and out and not out[-1].startswith("stages:"):
            out.append("")
        out.append(line)
    return "\n".join(out) + "\n"
