"""benchmarks/results holds what is cited: every file there is named by README.md, docs/, params.yaml, the code or
the tests (or by a results page they name, or is the .md / .csv twin of one), or lies in results/superseded/ listed
in its README.md with what replaced it."""

from __future__ import annotations

import re
from pathlib import Path

from tests.citations import cited_files
from tests.conftest import REPO

SUPERSEDED = "superseded"


def citing_sources(root: Path) -> list[Path]:
    """The files whose citations count: README.md, params.yaml, docs/, src/, tests/ and benchmarks/ outside its
    results."""
    found = [root / "README.md", root / "params.yaml", *sorted((root / "docs").glob("*.md"))]
    found += sorted((root / "src").rglob("*.py")) + sorted((root / "tests").glob("*.py"))
    found += [path for path in sorted((root / "benchmarks").rglob("*"))
              if path.is_file() and "results" not in path.relative_to(root / "benchmarks").parts
              and path.suffix in (".py", ".md", ".yaml", ".sh")]
    return [path for path in found if path.is_file()]


def cited(root: Path) -> set[Path]:
    """The files under ``root``/benchmarks/results that the sources cite, directly or through a results page they
    cite, each with its twins (the same name with another suffix)."""
    results = root / "benchmarks" / "results"
    found: set[Path] = set()
    todo, read = list(citing_sources(root)), set()
    while todo:
        page = todo.pop()
        if page in read:
            continue
        read.add(page)
        for path in cited_files(page.read_text(encoding="utf-8"), results):
            for twin in results.glob(f"{path.stem}.*"):
                found.add(twin)
                if twin.suffix == ".md":
                    todo.append(twin)
    return found


def listed(root: Path) -> set[Path]:
    """The files results/superseded/README.md lists: the backquoted names in its table's first column."""
    folder = root / "benchmarks" / "results" / SUPERSEDED
    readme = folder / "README.md"
    if not readme.is_file():
        return set()
    names = [name for line in readme.read_text(encoding="utf-8").splitlines() if line.startswith("| `")
             for name in re.findall(r"`([^`]+)`", line.split("|")[1])]
    return {folder / name for name in names}


def unaccounted(root: Path) -> list[str]:
    """Files under results/ neither cited nor listed as superseded, and listed names that hold no file."""
    results = root / "benchmarks" / "results"
    every = {path for path in results.rglob("*") if path.is_file()} - {results / SUPERSEDED / "README.md"}
    known, kept = cited(root), listed(root)
    problems = [f"{path.relative_to(root)}: cited by nothing, listed in no superseded README"
                for path in sorted(every - known - kept)]
    problems += [f"{path.relative_to(root)}: listed as superseded, no such file" for path in sorted(kept - every)]
    return problems


def test_every_results_file_is_cited_or_listed_as_superseded() -> None:
    assert unaccounted(REPO) == []


def test_the_check_names_an_uncited_file_and_a_listed_one_that_is_gone(tmp_path: Path) -> None:
    results = tmp_path / "benchmarks" / "results"
    (results / SUPERSEDED).mkdir(parents=True)
    (tmp_path / "README.md").write_text("Measured (`benchmarks/results/speed.md`).\n")
    (results / "speed.md").write_text("# speed\n\nSee `benchmarks/results/speed_base.md`.\n")
    for name in ("speed.csv", "speed_base.md", "speed_old.md", SUPERSEDED + "/steps.md"):
        (results / name).write_text("x\n")
    (results / SUPERSEDED / "README.md").write_text(
        "| file | replaced by |\n|---|---|\n| `steps.md`, `gone.md` | `speed.md` |\n")
    assert unaccounted(tmp_path) == [
        "benchmarks/results/speed_old.md: cited by nothing, listed in no superseded README",
        "benchmarks/results/superseded/gone.md: listed as superseded, no such file"]
