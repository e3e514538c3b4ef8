"""Each stage's code dependencies, derived from what its entrypoint imports, so dvc.yaml cannot drift.

A stage's command (``python pipeline/<stage>.py`` or ``python -m debias.launch pipeline/<stage>.py``)
runs files that import modules of the ``debias`` package, which import others, at module level or
inside functions. :func:`code_deps` walks those imports statically (``ast``: every ``import`` and
``from ... import`` anywhere in a file, so lazy imports count) from the command's files and returns
every file of the repository it reaches: the entrypoint, ``src/debias/**.py`` (each package's
``__init__.py`` included, since importing a submodule runs it). Data dependencies (``data/``,
``models/``, ``reports/``) are not code and stay as dvc.yaml states them.

``debias deps`` prints the difference between dvc.yaml and the derived lists; ``debias deps --write``
rewrites the code entries of every stage's ``deps`` (comments and everything else kept).
"""

from __future__ import annotations

import ast
import shlex
from pathlib import Path

PACKAGE = "debias"
SOURCE_ROOT = Path("src")
CODE_PREFIXES = ("src/", "pipeline/")  # a dvc.yaml dep under these is code, derived here
# Modules that import others by name at run time, which no import statement shows: reaching the key (relative to
# src/debias) reaches every file its glob names. The stage-2 method registry imports every method's declaration
# when the params schema is built; base.setup_method imports the training module the running method names.
DISCOVERED = {"training/methods/registry.py": "training/methods/*/__init__.py",
              "training/methods/base.py": "training/methods/*/train.py"}


def module_file(module: str, root: Path) -> Path | None:
    """The file of a ``debias`` module (``debias/x.py`` or ``debias/x/__init__.py``) under ``root/src``, else None."""
    if module != PACKAGE and not module.startswith(PACKAGE + "."):
        return None
    base = root / SOURCE_ROOT / Path(*module.split("."))
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


def reachable_files(entries: list[Path], root: Path) -> set[Path]:
    """Every repository file reached from ``entries`` through ``debias`` imports (the entries included)."""
    seen: set[Path] = set()
    todo = [p for p in entries if p.is_file()]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for module in _imported_modules(path):
            for name in _with_parents(module):
                found = module_file(name, root)
                if found is not None and found not in seen:
                    todo.append(found)
        package = root / SOURCE_ROOT / PACKAGE
        if package in path.parents and path.relative_to(package).as_posix() in DISCOVERED:
            todo.extend(sorted(package.glob(DISCOVERED[path.relative_to(package).as_posix()])))
    return seen


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


def code_deps(cmd: str, root: Path) -> list[str]:
    """The code files (repository-relative, sorted) a stage command depends on."""
    files = reachable_files(command_entries(cmd, root), root)
    return sorted(str(p.relative_to(root)) for p in files)


def is_code(dep: str) -> bool:
    return dep.startswith(CODE_PREFIXES)


def stage_differences(dvc_yaml: Path) -> dict[str, tuple[list[str], list[str]]]:
    """Per stage: (code deps dvc.yaml lacks, code deps dvc.yaml has that the imports do not reach)."""
    import yaml

    root = dvc_yaml.parent
    stages = yaml.safe_load(dvc_yaml.read_text(encoding="utf-8"))["stages"]
    out: dict[str, tuple[list[str], list[str]]] = {}
    for name, stage in stages.items():
        declared = {d for d in stage.get("deps", []) or [] if is_code(d)}
        derived = set(code_deps(stage["cmd"], root))
        missing, extra = sorted(derived - declared), sorted(declared - derived)
        if missing or extra:
            out[name] = (missing, extra)
    return out


def write_deps(dvc_yaml: Path) -> list[str]:
    """Rewrite each stage's code deps in dvc.yaml as derived (data deps and comments kept); the stages changed."""
    from ruamel.yaml import YAML

    root = dvc_yaml.parent
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)  # the file's own style
    document = yaml.load(dvc_yaml.read_text(encoding="utf-8"))
    changed = []
    for name, stage in document["stages"].items():
        deps = stage.get("deps")
        derived = code_deps(stage["cmd"], root)
        data = [d for d in (deps or []) if not is_code(d)]
        if deps is None or [d for d in deps if is_code(d)] != derived:
            changed.append(name)
            new = derived + data
            if deps is None:
                stage.insert(1, "deps", new)
            else:
                deps.clear()
                deps.extend(new)
    with open(dvc_yaml, "w", encoding="utf-8") as handle:
        yaml.dump(document, handle)
    return changed
