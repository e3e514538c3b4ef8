"""The package's layering: no import cycle anywhere in src/debias (the packages an import runs counted), no import
from a lower floor to a higher one, ERM's module imported by no stage-2 method, no evaluation module and no stage
that is not ERM's, and no module over the size limit (the params schema included: one module per section)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "src"
PACKAGE = SOURCE / "debias"
ERM = "debias.training.erm"
MAX_LINES = 600  # issue 28: a module longer than this is split along its seams


def module_name(path: Path) -> str:
    """``src/debias/a/b.py`` -> ``debias.a.b``; a package's ``__init__.py`` -> the package."""
    parts = list(path.relative_to(SOURCE).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def resolve(name: str) -> str | None:
    """The longest prefix of the dotted ``name`` that is a module of src/debias (None outside the package)."""
    parts = name.split(".")
    while parts:
        if ".".join(parts) in MODULES:
            return ".".join(parts)
        parts.pop()
    return None


def imports_of(path: Path, name: str | None = None) -> set[str]:
    """The src/debias modules the file of module ``name`` (default: ``path``'s under src/) imports, at module level
    or inside functions (``from pkg import sub``: the submodule ``pkg.sub`` where it is one, else ``pkg``). A
    package's ``__init__`` that Python runs before a submodule is not counted: that edge would make every package
    re-exporting its submodules look cyclic."""
    name = name or module_name(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(filter(None, (resolve(alias.name) for alias in node.names)))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: against the file's package
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)] if is_package else anchor[: len(anchor) - node.level]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                target = resolve(f"{base}.{alias.name}") if f"{base}.{alias.name}" in MODULES else resolve(base)
                if target is not None:
                    found.add(target)
    found.discard(name)
    return found


GRAPH = {name: imports_of(path) for name, path in MODULES.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as ``[a, b, ..., a]`` (depth-first search), or None when the graph is acyclic."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)) is not None:
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)) is not None:
            return cycle
    return None


def reachable(graph: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module ``start`` imports, directly or through others, mapped to the module that imports it."""
    seen: dict[str, str] = {}
    stack = [start]
    while stack:
        node = stack.pop()
        for nxt in graph.get(node, ()):
            if nxt not in seen and nxt != start:
                seen[nxt] = node
                stack.append(nxt)
    return seen


def chain(seen: dict[str, str], start: str, target: str) -> str:
    """``start -> ... -> target`` along :func:`reachable`'s parents."""
    links = [target]
    while links[-1] != start:
        links.append(seen[links[-1]])
    return " -> ".join(reversed(links))


def test_the_import_walk_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    """The walk itself: a lazy import inside a function counts, ``from pkg import sub`` names the submodule."""
    probe = MODULES["debias.evaluation.probe"]
    assert {"debias.evaluation.linear", "debias.training.classifier"} <= GRAPH[module_name(probe)]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    lazy = tmp_path / "lazy.py"
    lazy.write_text("import torch\n\n\ndef f():\n    from ..evaluation import linear\n    import debias.core.io.x\n"
                    "    from debias.metrics import scalars\n")
    assert imports_of(lazy, "debias.training.lazy") == {"debias.evaluation.linear", "debias.core.io", "debias.metrics"}


def test_no_import_cycle_in_src_debias() -> None:
    cycle = find_cycle(GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def ancestors(name: str) -> set[str]:
    """The packages above the module ``name`` (``debias.a.b`` -> ``debias``, ``debias.a``)."""
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def with_packages(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """``graph`` with the edges Python adds: importing ``a.b.c`` runs the packages ``a`` and ``a.b`` first. A module's
    own packages are left out (a package's ``__init__`` re-exporting its submodules is no cycle)."""
    return {name: {package for target in targets for package in {target, *ancestors(target)} if package in MODULES}
            - ancestors(name) - {name} for name, targets in graph.items()}


RUNTIME_GRAPH = with_packages(GRAPH)

# The floors of src/debias, lowest first: a module imports from its own floor or those below, never above.
# core: what everything shares; params: the sections (the leaf of the schema); data, losses, models, metrics: the
# building blocks; groups, training, evaluation: the research stages with their registries and declarations;
# schema: the whole schema built from those registries, and which params apply (the stages hand research code what
# it says); report: the report stage; harness: what runs a stage; tools: what a user runs around the pipeline.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("core",),
    ("params",),
    ("data", "losses", "models", "metrics"),
    ("groups", "training", "evaluation"),
    ("schema",),
    ("report",),
    ("harness",),
    ("tools",),
)



def floor(module: str) -> int:
    """The index in :data:`FLOORS` of the top-level package (or module) of src/debias that ``module`` lies in."""
    top = module.split(".")[1] if module.count(".") else ""
    top = top.removesuffix(".py")
    for index, names in enumerate(FLOORS):
        if top in names:
            return index
    raise AssertionError(f"{module} is on no floor: add its top-level name ({top}) to FLOORS in tests/test_structure.py")


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``a -> b (floor i -> j)`` for every import of ``graph`` from a lower floor to a higher one (the package
    ``debias`` itself is on none)."""
    return [f"{module} -> {target} (floor {floor(module)} -> {floor(target)})"
            for module, targets in sorted(graph.items()) if module != "debias"
            for target in sorted(targets) if target != "debias" and floor(target) > floor(module)]


def test_the_floor_rule_and_the_cycle_walk_see_what_they_must() -> None:
    """The walk with packages: importing ``a.b.c`` runs ``a.b``; an import from params to training is upward."""
    assert with_packages({"debias.x.y": {"debias.training.methods.registry"}}) == {
        "debias.x.y": {"debias.training.methods.registry", "debias.training.methods", "debias.training"}}
    assert upward_imports({"debias.params.root": {"debias.training.methods.registry", "debias.core.errors"}}) == [
        "debias.params.root -> debias.training.methods.registry (floor 1 -> 3)"]
    circle = {"debias.params": {"debias.groups.registry"}, "debias.groups.registry": {"debias.groups.methods.soft"},
              "debias.groups.methods.soft": {"debias.params.base"}, "debias.params.base": set()}
    assert find_cycle(GRAPH | circle) is None  # without the packages a submodule's import runs, the circle is unseen
    assert find_cycle(with_packages(circle)) == ["debias.groups.methods.soft", "debias.params", "debias.groups.registry",
                                                 "debias.groups.methods.soft"]


def test_no_import_cycle_counting_the_packages_an_import_runs() -> None:
    """Declarations import the params sections, the schema imports the registries: no circle through a package's
    ``__init__`` either (a section imported from ``debias.params`` runs ``debias/params/__init__.py``)."""
    cycle = find_cycle(RUNTIME_GRAPH)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_import_runs_from_a_lower_floor_to_a_higher_one() -> None:
    upward = upward_imports(RUNTIME_GRAPH)
    assert not upward, "imports from a lower floor to a higher one (FLOORS in tests/test_structure.py):\n  " + \
        "\n  ".join(upward)


def test_the_params_sections_import_nothing_above_core() -> None:
    """``debias.params`` is the leaf every declaration imports: it reaches no registry, declaration or stage code."""
    seen = reachable(RUNTIME_GRAPH, "debias.params")
    above = sorted(m for m in seen if not m.startswith(("debias.params", "debias.core")) and m != "debias")
    assert not above, f"debias.params reaches {above[0]}: {chain(seen, 'debias.params', above[0])}"


STAGE2_AND_EVALUATION = sorted(name for name in MODULES if name.startswith(("debias.training.methods",
                                                                           "debias.evaluation")))


@pytest.mark.parametrize("module", STAGE2_AND_EVALUATION)
def test_erm_is_imported_by_no_stage2_method_or_evaluation_module(module: str) -> None:
    """ERM is one method among others: what every training stage shares lives in training/classifier.py and
    training/outputs.py, never in erm.py (directly or through another module)."""
    seen = reachable(GRAPH, module)
    assert ERM not in seen, f"{module} imports {ERM}: {chain(seen, module, ERM)}"


@pytest.mark.parametrize("stage", ["train_contrastive", "infer_groups", "linear_probe", "evaluate"])
def test_erm_is_imported_by_no_other_stage(stage: str) -> None:
    path = ROOT / "pipeline" / f"{stage}.py"
    start = f"pipeline.{stage}"
    graph = {**GRAPH, start: imports_of(path, start)}
    seen = reachable(graph, start)
    assert ERM not in seen, f"pipeline/{stage}.py imports {ERM}: {chain(seen, start, ERM)}"


def test_no_module_exceeds_the_line_limit() -> None:
    long = {name: n for name, path in MODULES.items()
            if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split them along their seams): " + ", ".join(
        f"{MODULES[name].relative_to(ROOT)} ({n})" for name, n in sorted(long.items()))


def test_the_layout_in_docs_pipeline_md_matches_the_tree() -> None:
    """docs/pipeline.md's layout names every top-level module and package of src/debias, and nothing else."""
    text = (ROOT / "docs" / "pipeline.md").read_text(encoding="utf-8")
    block = text.split("## Layout", 1)[1].split("\n    benchmarks/", 1)[0]
    named = set(re.findall(r"^      ([a-z_]+(?:\.py|/))", block, re.M))
    package = ROOT / "src" / "debias"
    present = {p.name + "/" for p in package.iterdir() if (p / "__init__.py").is_file()}
    present |= {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    assert named == present, f"in the layout, not in src/debias: {sorted(named - present)}; " \
                             f"in src/debias, not in the layout: {sorted(present - named)}"


def test_the_harness_and_the_tools_are_no_stage_dependency() -> None:
    """No file under src/debias/harness or src/debias/tools is listed among any stage's deps or code in dvc.yaml."""
    deps = [d for stage in yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"].values()
            for d in [*stage.get("deps", []), *(stage.get("meta") or {}).get("code", [])]]
    assert [d for d in deps if d.startswith(("src/debias/harness/", "src/debias/tools/"))] == []
    assert any(d.startswith("src/debias/core/") for d in deps)  # the walk does reach the shared modules
