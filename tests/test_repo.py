"""Repository contracts: README's test command is what CI runs; dvc.yaml declares what stages read."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from debias.core import paths
from debias.harness.stage import STAGE_PARAMS
from tests.conftest import REPO, committed_text


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    return [line.strip() for line in text.splitlines() if line.startswith("    pip install")]


def test_readme_opens_with_two_commands_and_ci_runs_the_second_verbatim() -> None:
    install_and_run, test = readme_commands()[:2]
    assert install_and_run.endswith("dvc repro")
    assert "pytest" in test
    ci = (REPO / ".ci" / "run").read_text()
    assert test in [line.strip() for line in ci.splitlines()]


def test_readme_is_short_and_links_every_docs_page() -> None:
    """README is the first hour (<= 200 lines); everything else is a docs/ page, and none is unreachable from it."""
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    linked = set(re.findall(r"\]\((docs/[^)#\s]+\.md)", text))
    pages = {f"docs/{page.name}" for page in (REPO / "docs").glob("*.md")}
    assert pages and pages <= linked, sorted(pages - linked)
    for page in (REPO / "docs").glob("*.md"):  # each page leads back
        assert "](../README.md)" in page.read_text(), page.name


def test_readme_documents_the_commands_a_new_user_needs() -> None:
    text = (REPO / "README.md").read_text()
    for needed in ("debias check-params -S", "git checkout params.yaml", "dvc exp apply",
                   "mlflow ui --backend-store-uri sqlite:///mlflow.db", "Training runs", "Model training",
                   "--index-url https://download.pytorch.org/whl/cpu"):
        assert needed in text, needed
    from debias.harness.tracking import tracking_uri

    assert tracking_uri(REPO).endswith("/mlflow.db")  # the store the `mlflow ui` line opens



def readme_section_commands(title: str) -> list[str]:
    """The commands of README's ``## title`` section: its indented lines, a line ending in a backslash joined with
    the next, comments after ``#`` dropped."""
    text = (REPO / "README.md").read_text()
    section = text.split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    commands, pending = [], ""
    for line in section.splitlines():
        if not line.startswith("    "):
            continue
        pending += " " + line.strip()
        if pending.endswith("\\"):
            pending = pending[:-1]
            continue
        commands.append(" ".join(pending.split("  #", 1)[0].split()))
        pending = ""
    return commands


@pytest.mark.slow
def test_readme_own_data_block_runs_as_written_on_the_example_folder(tmp_path) -> None:
    """README's "Your own data" commands, verbatim but for the folder's path: `debias example-folder` writes the
    folder, `debias check-params` with README's -S accepts it (exit 0, source imagefolder), and `dvc exp run` there
    takes exactly the same -S (check-params applies them with DVC's own code to a copy of params.yaml)."""
    import os
    import shlex
    import subprocess
    import sys

    commands = readme_section_commands("Your own data")
    example = next(c for c in commands if c.startswith("debias example-folder "))
    check = next(c for c in commands if c.startswith("debias check-params "))
    run = next(c for c in commands if c.startswith("dvc exp run "))
    folder = shlex.split(example)[2]
    assert f"data.imagefolder.root={folder}" in check
    assert shlex.split(check)[2:] == shlex.split(run)[3:]  # the run is what was checked
    here = tmp_path / "shapes"
    (tmp_path / "params.yaml").write_text(committed_text("params.yaml"))
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    for command in (example, check):
        args = [a.replace(folder, str(here)) for a in shlex.split(command)]
        done = subprocess.run([sys.executable, "-m", "debias.tools.cli", *args[1:]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, f"{command}\n{done.stdout}{done.stderr}"
    assert "valid (source=imagefolder" in done.stdout, done.stdout


TRAINING_STAGES = {"train_erm", "train_contrastive"}  # launched with DEBIAS_NPROC processes


def test_dvc_yaml_declares_exactly_the_params_each_stage_reads() -> None:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert set(stages) == set(STAGE_PARAMS)
    for name, stage in stages.items():
        assert sorted(stage.get("params", [])) == sorted(STAGE_PARAMS[name]), name
        launcher = "python -m debias.harness.launch" if name in TRAINING_STAGES else "python -m debias.harness.launch --single"
        assert stage["cmd"] == f"{launcher} pipeline/{name}.py", name
        code = set(stage["meta"]["code"])
        if name in TRAINING_STAGES:  # the multi-process code changes what training computes
            assert {"src/debias/core/distributed.py", "src/debias/data/augment.py"} <= code, name
        assert "src/debias/harness/launch.py" not in code, name  # the launcher is harness (debias.tools.deps.HARNESS)


def test_stage_outputs_are_the_paths_the_code_writes() -> None:
    declared = set()
    for stage in yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"].values():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                declared.add(next(iter(entry)) if isinstance(entry, dict) else entry)
    for path in (paths.RAW, paths.BIAS_SUMMARY, paths.SAMPLE_GRID, paths.ERM_MODEL, paths.ERM_DIR):
        assert str(path) in declared, path
    assert not any(re.search(r"/(work|home|root|tmp)/", line) for line in committed_text("params.yaml").splitlines())


@pytest.mark.slow
def test_every_stage_depends_on_exactly_the_code_its_entrypoint_imports() -> None:
    """dvc.yaml's code deps are derived from the imports (`debias deps --write`): a stage never keeps a stale
    result after a change to code it runs, and lists no file it does not run."""
    from debias.tools.deps import stage_differences

    differences = stage_differences(REPO / "dvc.yaml")
    assert differences == {}, ("dvc.yaml's code deps differ from the imports (a method, module or import added or "
                               "removed): run `debias deps --write` and commit dvc.yaml; per stage (missing, extra): "
                               f"{differences}")


def lock_code_mismatches(lock_text: str, root) -> list[str]:
    """Every stage of a dvc.lock text whose recorded code does not match the files under ``root``: its code
    fingerprint dep (``data/code/<stage>.json``, the md5 of the document ``source`` would write now from the files
    its ``meta: code`` lists) or a code file listed as a dep itself (src/, pipeline/; DVC 3 hashes a file's bytes)."""
    import hashlib
    import tempfile

    from debias.core.fingerprint import code_fingerprints, stale_code
    from debias.core.io import save_json
    from debias.core.paths import code_fingerprint_path

    lock = yaml.safe_load(lock_text) or {}
    stages = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    documents = code_fingerprints(stages, root)
    found = []
    for name, entry in (lock.get("stages") or {}).items():
        recorded = {dep["path"]: dep.get("md5") for dep in entry.get("deps") or []}
        if name in documents:
            with tempfile.TemporaryDirectory() as folder:
                save_json(Path(folder) / "code.json", documents[name])
                actual = hashlib.md5((Path(folder) / "code.json").read_bytes()).hexdigest()
            path = str(code_fingerprint_path(name))
            if recorded.get(path) != actual:
                written = root / path
                changed = stale_code(json.loads(written.read_text()), documents[name]) if written.is_file() else []
                found.append(f"{name}: {path} (lock {recorded.get(path, 'missing')}, code now {actual}"
                             f"{'; changed: ' + ', '.join(changed[:5]) if changed else ''})")
        for dep in stages.get(name, {}).get("deps") or []:
            if not str(dep).startswith(("src/", "pipeline/")):
                continue
            path = root / dep
            actual = hashlib.md5(path.read_bytes()).hexdigest() if path.is_file() else None
            if recorded.get(dep) != actual:
                found.append(f"{name}: {dep} (lock {recorded.get(dep, 'missing')}, file {actual})")
    return found


def test_dvc_lock_describes_the_code_it_ships_with() -> None:
    """A fresh clone's `dvc status` shows no changed code dep: the committed dvc.lock holds every code dep's md5
    (rerun `dvc repro` and commit dvc.lock after changing a stage's code)."""
    stale = lock_code_mismatches((REPO / "dvc.lock").read_text(), REPO)
    assert not stale, "dvc.lock does not describe this code; run `dvc repro` and commit dvc.lock:\n" + "\n".join(stale)


def test_a_stale_lock_entry_is_found(tmp_path) -> None:
    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("x = 1\n")
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": {"cmd": "c", "deps": ["src/a.py", "data"]}}}))
    import hashlib

    good = hashlib.md5(b"x = 1\n").hexdigest()
    lock = {"schema": "2.0", "stages": {"s": {"cmd": "c", "deps": [{"path": "src/a.py", "md5": good}]}}}
    assert lock_code_mismatches(yaml.safe_dump(lock), tmp_path) == []
    (tmp_path / "src/a.py").write_text("x = 2\n")
    assert lock_code_mismatches(yaml.safe_dump(lock), tmp_path) == [
        f"s: src/a.py (lock {good}, file {hashlib.md5(b'x = 2' + chr(10).encode()).hexdigest()})"]


def test_a_lock_whose_code_fingerprint_is_not_the_code_is_found(tmp_path) -> None:
    """A stage that depends on its code fingerprint: the lock's md5 of data/code/<stage>.json is held against the
    document `source` would write from the files its meta lists, and an edit to one of them is found."""
    import hashlib

    from debias.core.fingerprint import code_fingerprint
    from debias.core.io import save_json

    (tmp_path / "src").mkdir()
    (tmp_path / "src/a.py").write_text("x = 1\n")
    stage = {"cmd": "c", "deps": ["data/code/s.json"], "meta": {"code": ["src/a.py"]}}
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": stage}}))
    save_json(tmp_path / "data/code/s.json", code_fingerprint(["src/a.py"], tmp_path))
    good = hashlib.md5((tmp_path / "data/code/s.json").read_bytes()).hexdigest()
    lock = {"schema": "2.0", "stages": {"s": {"cmd": "c", "deps": [{"path": "data/code/s.json", "md5": good}]}}}
    assert lock_code_mismatches(yaml.safe_dump(lock), tmp_path) == []
    (tmp_path / "src/a.py").write_text("x = 2\n")
    [found] = lock_code_mismatches(yaml.safe_dump(lock), tmp_path)
    assert found.startswith(f"s: data/code/s.json (lock {good}, code now ") and found.endswith("changed: src/a.py)")


def test_the_import_walk_follows_lazy_submodule_and_relative_imports(tmp_path) -> None:
    from debias.tools.deps import code_deps

    package = tmp_path / "src" / "debias"
    (package / "sub").mkdir(parents=True)
    (tmp_path / "pipeline").mkdir()
    files = {
        "src/debias/__init__.py": "",
        "src/debias/sub/__init__.py": "",
        "src/debias/sub/a.py": "from . import b\n",  # relative
        "src/debias/sub/b.py": "import json\n",
        "src/debias/sub/c.py": "",
        "src/debias/lazy.py": "def f():\n    from debias.sub import c  # inside a function\n",
        "src/debias/unused.py": "",
        "pipeline/stage.py": "from debias.sub import a\nfrom debias import lazy\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    deps = code_deps("python -m debias.harness.launch pipeline/stage.py  # a comment", tmp_path)
    assert deps == sorted(["pipeline/stage.py", "src/debias/__init__.py", "src/debias/lazy.py",
                           "src/debias/sub/__init__.py", "src/debias/sub/a.py", "src/debias/sub/b.py",
                           "src/debias/sub/c.py"])


ISSUE_NUMBER = re.compile(r"\bissues?\s*#?\d+\b|(?<![\w&])#\d{1,4}\b", re.IGNORECASE)
# 7-40 hex digits with at least one letter and one digit, standing alone: not a colour (#1f77b4), not inside a file
# name or path (quality_f0013e7_cnc.md, .../base/...), not part of a longer word
COMMIT_HASH = re.compile(r"(?<![\w#./-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")


def test_user_docs_hold_no_issue_number_and_no_commit_hash() -> None:
    """README.md and docs/*.md speak to users: development history (issue numbers, commit hashes) stays in git and
    in the results files under benchmarks/results, which keep their commands and dates."""
    for bad in ("see issue 27", "Issue 30's target", "issue #12", "(#14)", "at f0013e7,", "commit 2453a1e's code",
                "`dvc repro` at 11a1806"):
        assert ISSUE_NUMBER.search(bad) or COMMIT_HASH.search(bad), bad
    for fine in ("colour #1f77b4", "quality_f0013e7_cnc.md", "benchmarks/results/steps_ab_f0013e7.md", "tolerance 1e-7",
                 "sha256 of the file", "the issue's description", "deadbeef", "1234567 images", "[warnings](#warnings)"):
        assert not (ISSUE_NUMBER.search(fine) or COMMIT_HASH.search(fine)), fine
    found = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for number, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1):
            found += [f"{page.relative_to(REPO)}:{number}: {m.group(0)!r}" for pattern in (ISSUE_NUMBER, COMMIT_HASH)
                      for m in pattern.finditer(line)]
    assert not found, "\n".join(found)


def test_the_committed_metrics_are_dvc_yaml_s_git_tracked_outputs_and_a_fresh_copy_forgets_them(tmp_path: Path) -> None:
    """``committed_metrics`` names exactly the outputs dvc.yaml keeps out of DVC's cache (git-tracked: HEAD's numbers
    anywhere); ``forget_committed_run`` removes them with dvc.lock, and nothing else, from a copy that runs afresh."""
    from debias.core.headline import committed_metrics, forget_committed_run

    stages = yaml.safe_load(committed_text("dvc.yaml"))["stages"]
    uncached = {path for stage in stages.values() for kind in ("outs", "metrics", "plots")
                for entry in stage.get(kind) or [] if isinstance(entry, dict)
                for path, options in entry.items() if (options or {}).get("cache") is False}
    assert {p.relative_to(REPO).as_posix() for p in committed_metrics(REPO)} == uncached
    records = [tmp_path / "dvc.lock", *committed_metrics(tmp_path)]
    kept = tmp_path / "reports" / "metrics" / "other.json"
    for path in [*records, kept]:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("{}\n")
    forget_committed_run(tmp_path)
    assert not any(path.exists() for path in records) and kept.exists()


@pytest.mark.slow
def test_every_third_party_import_of_the_package_is_a_declared_dependency_or_one_of_theirs() -> None:
    """A module src/ imports comes from a distribution pyproject.toml declares (dependencies or an extra) or that one
    of those requires: a fresh `pip install -e .` then has it (an undeclared import passes only where it happens to be
    installed)."""
    import ast
    import sys
    import tomllib
    from importlib import metadata

    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = [Requirement(r).name for r in project["dependencies"]]
    declared += [Requirement(r).name for extra in project.get("optional-dependencies", {}).values() for r in extra]
    norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()  # noqa: E731

    allowed, todo = set(), [norm(n) for n in declared]
    while todo:  # the declared distributions and everything they require, as installed here
        name = todo.pop()
        if name in allowed:
            continue
        allowed.add(name)
        try:
            todo += [norm(Requirement(r).name) for r in metadata.requires(name) or []]
        except metadata.PackageNotFoundError:
            continue
    modules = set()
    for path in (REPO / "src" / "debias").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    providers = metadata.packages_distributions()
    undeclared = {m: providers.get(m) for m in modules - set(sys.stdlib_module_names) - {"debias"}
                  if not any(norm(d) in allowed for d in providers.get(m, []))}
    assert not undeclared, f"imported by src/ but no declared dependency provides it: {undeclared}"
