"""benchmarks/ as a package: no module edits ``sys.path`` (there or in scripts/), none is over 500 lines, src/ never
imports it, and its imports run one way: studies import shared modules and the library, shared modules import no
study, a study no other study, and no import cycle anywhere; every entry point's ``--help`` runs."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import benchmarks
from tests.conftest import REPO

MAX_LINES = 500
# an edit of the import path: sys.path.insert / append / extend / remove / pop, sys.path[...] = ..., sys.path = / +=,
# site.addsitedir; a mention in prose (``sys.path``) is none
SYS_PATH_EDIT = re.compile(r"\bsys\.path\s*(?:\.\s*(?:insert|append|extend|remove|pop)\s*\(|\[[^\]]*\]\s*=|\+?=(?!=))"
                           r"|\bsite\.addsitedir\s*\(")


def modules(root: Path) -> dict[str, Path]:
    """Every module of the ``benchmarks`` package under ``root``, by dotted name (a package by its __init__)."""
    found = {}
    for path in sorted((root / "benchmarks").rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imported(path: Path, name: str, known: set[str]) -> set[str]:
    """The ``benchmarks`` and ``debias`` modules the file of module ``name`` imports, anywhere in it (``from pkg
    import sub``: ``pkg.sub`` where that is a module of ``known``; relative imports resolved)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names}
    return {m for m in found if m.split(".")[0] in ("benchmarks", "debias")}


def study_of(name: str) -> str:
    """``benchmarks.default_search.page`` -> ``default_search``; the package itself -> ''."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else ""


def layering_problems(graph: dict[str, set[str]], shared: tuple[str, ...]) -> list[str]:
    """``a -> b: why`` for every import from a shared module to a study, from a study to another study, or into
    benchmarks from anything outside it (the library)."""
    problems = []
    for name, targets in graph.items():
        for target in sorted(t for t in targets if t.startswith("benchmarks.")):
            mine, theirs = study_of(name), study_of(target)
            if not name.startswith("benchmarks"):
                problems.append(f"{name} -> {target}: the library imports a benchmark")
            elif theirs in shared or theirs == mine:
                continue
            elif mine in shared:
                problems.append(f"{name} -> {target}: a shared module imports a study")
            else:
                problems.append(f"{name} -> {target}: a study imports another study")
    return problems


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle among the graph's own modules as ``[a, ..., a]``, or None (a package counts as imported
    with each of its submodules)."""
    edges = {name: {t for t in targets if t in graph} | {p for p in parents(name) if p in graph and p != name}
             for name, targets in graph.items()}
    state: dict[str, int] = {}

    def visit(node: str, trail: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return trail[trail.index(nxt):] + [nxt] if nxt in trail else [node, nxt]
            if not state.get(nxt) and (found := visit(nxt, trail + [nxt])):
                return found
        state[node] = 2
        return None

    for start in sorted(edges):
        if not state.get(start) and (found := visit(start, [start])):
            return found
    return None


def parents(name: str) -> list[str]:
    """The packages importing ``name`` runs first: ``a.b.c`` -> ``a``, ``a.b``."""
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def benchmark_graph() -> dict[str, set[str]]:
    found = modules(REPO)
    return {name: imported(path, name, set(found)) for name, path in found.items()}


def test_no_file_under_benchmarks_or_scripts_edits_sys_path() -> None:
    for bad in ("sys.path.insert(0, str(HERE))", "sys.path.append(p)", "sys.path[:0] = [p]", "sys.path += [p]",
                "sys.path = [p]", "site.addsitedir(p)"):
        assert SYS_PATH_EDIT.search(bad), bad
    for fine in ("with the debias on ``sys.path``", "if sys.path == old:", "print(sys.path[0])"):
        assert not SYS_PATH_EDIT.search(fine), fine
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()}"
             for path in sorted([*(REPO / "benchmarks").rglob("*.py"), *(REPO / "scripts").rglob("*.py")])
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             if SYS_PATH_EDIT.search(line)]
    assert not found, "\n".join(found)


def test_no_module_under_benchmarks_is_over_500_lines() -> None:
    long = {str(path.relative_to(REPO)): count for path in modules(REPO).values()
            if (count := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_the_import_walk_resolves_packages_submodules_and_relative_imports(tmp_path: Path) -> None:
    page = tmp_path / "benchmarks" / "study" / "page.py"
    page.parent.mkdir(parents=True)
    page.write_text("from . import protocol\nfrom .protocol import FIELDS\nfrom benchmarks import cells\n"
                    "import json\n\n\ndef f():\n    from debias.metrics.paired import paired\n")
    known = {"benchmarks", "benchmarks.cells", "benchmarks.study", "benchmarks.study.protocol"}
    assert imported(page, "benchmarks.study.page", known) == {
        "benchmarks.study.protocol", "benchmarks.cells", "debias.metrics.paired"}


def test_the_layering_check_names_each_wrong_way_import_and_a_cycle() -> None:
    graph = {"benchmarks.cells": {"benchmarks.speed"}, "benchmarks.speed": {"benchmarks.quality", "benchmarks.cells"},
             "benchmarks.quality": set(), "benchmarks.study.page": {"benchmarks.study.protocol"},
             "benchmarks.study.protocol": {"benchmarks.cells"}, "debias.metrics": {"benchmarks.cells"}}
    assert layering_problems(graph, ("cells",)) == [
        "benchmarks.cells -> benchmarks.speed: a shared module imports a study",
        "benchmarks.speed -> benchmarks.quality: a study imports another study",
        "debias.metrics -> benchmarks.cells: the library imports a benchmark"]
    assert cycle(graph) == ["benchmarks.cells", "benchmarks.speed", "benchmarks.cells"]
    assert cycle({"benchmarks.a": set(), "benchmarks.a.b": {"benchmarks.a.c"}, "benchmarks.a.c": set()}) is None


def test_studies_import_shared_modules_and_shared_modules_no_study() -> None:
    graph = benchmark_graph()
    assert set(benchmarks.SHARED) <= {study_of(name) for name in graph}, "a name in benchmarks.SHARED is no module"
    assert layering_problems(graph, benchmarks.SHARED) == []


def test_no_import_cycle_among_the_benchmarks() -> None:
    assert cycle(benchmark_graph()) is None


def test_src_never_imports_benchmarks() -> None:
    found = [f"{path.relative_to(REPO)}: {target}" for path in sorted((REPO / "src").rglob("*.py"))
             for target in imported(path, "debias.x", set()) if target.startswith("benchmarks")]
    assert not found, found


def entry_points(root: Path) -> list[str]:
    """The modules ``python -m`` runs: a module with a ``__main__`` block, a package with a ``__main__.py``."""
    found = []
    for name, path in modules(root).items():
        text = path.read_text(encoding="utf-8")
        if (path.name != "__init__.py" and 'if __name__ == "__main__":' in text) or (
                path.name == "__init__.py" and (path.parent / "__main__.py").is_file() and name != "benchmarks"):
            found.append(name)
    return sorted(found)


@pytest.mark.slow
def test_every_benchmark_entry_point_prints_its_help_as_python_m_runs_it() -> None:
    """One interpreter runs each ``python -m benchmarks.<name> --help`` (runpy, as ``-m`` does): each exits 0 with
    a usage line; a module that fails to import or parse fails here."""
    import subprocess
    import sys

    names = entry_points(REPO)
    assert {"benchmarks.default_search", "benchmarks.quality", "benchmarks.speed"} <= set(names)
    script = ("import contextlib, io, runpy, sys\n"
              "for name in sys.argv[1:]:\n"
              "    sys.argv = [name, '--help']\n"
              "    out = io.StringIO()\n"
              "    try:\n"
              "        with contextlib.redirect_stdout(out):\n"
              "            runpy.run_module(name, run_name='__main__', alter_sys=True)\n"
              "    except SystemExit as stop:\n"
              "        code = stop.code\n"
              "    else:\n"
              "        code = 'no exit'\n"
              "    print(name, code, 'usage:' in out.getvalue(), flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script, *names], cwd=REPO, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines() == [f"{name} 0 True" for name in names], done.stdout + done.stderr[-2000:]
