"""README and docs/ quote measured numbers only from the results files they name, and speak in the present.

A *block* of a page is a paragraph, a list item or a table (code blocks are skipped: commands). A block cites the
results files it names (`benchmarks/results/x.md`, `x.{md,csv}`, a bare `x.md` / `x.csv` that exists there, or
`benchmarks/x.md`); a table also cites what the prose block before it names (or, if that names none, the one after
it). Every decimal number of a citing block (49.7, 29.7 ± 5.9, 0.074) and every integer with a unit (74 s, 47–55
min, 1,353 MiB, 65 %; not bare integers, which are mostly counts, seeds and epochs) must stand in one of the files it
cites: as the same token, or as a value that rounds to it as printed
(in a CSV also after ×100: fractions quoted as %; and /60: seconds quoted as minutes). Numbers inside `code`, parts
of a version (2.15.0) and values right after a parameter's name or symbol (α 0.03, p_corr 0.995, ρ 0.997) are
settings, not results, and are not checked.

A number is checked against the row it claims where the block says which: a block naming rows (row `cnc`, rows
`a` and `b`) has its numbers stand in the cited files' lines holding one of those labels; a row of a page table whose
first cell is the first cell of a row of a cited file's table stands in that row. A number moved to another row of
its file is then reported.

params.yaml's comments, the source lines of src/debias/schema/sources.py and src/ docstrings that say "measured" are
held to the same rule: a comment block (consecutive commented lines) or a line quoting a result names the results
file that holds it, unless it quotes a paper or released code (a setting, not a measurement here).
"""

from __future__ import annotations

import functools
import math
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO

RESULTS = "benchmarks/results"
PAGES = ("README.md", "docs")
MEASUREMENT_PAGES = ("docs/benchmarks.md", "docs/gpu.md")  # every decimal there is a measurement

DECIMAL = re.compile(r"(?<![\w.])[-−]?\d{1,3}(?:,\d{3})*\.\d+(?![\w.]*\d)|(?<![\w.,])[-−]?\d+\.\d+(?![\w.]*\d)")
# an integer with a unit of time, size or share (74 s, 47–55 min, 1,353 MiB, 65 %)
UNIT = r" ?(?:s|min|ms|MiB|MB|GB|%)(?!\w)"
INTEGER_WITH_UNIT = re.compile(rf"(?<![\w.,−-])(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?=(?:–\d+)?{UNIT})|(?<=–)\d+(?={UNIT})")
INLINE_CODE = re.compile(r"`[^`]*`")
# a setting's value: a parameter's name or symbol (or a `code` span and an opening bracket) right before the number,
# possibly after other values of it ("p_corr 0.96 and 0.98")
SETTING_NAME = (r"\b(?:p_corr|rho|alpha|lambda|tau|eps|epsilon|lr|q|t|C|beta|kld|tolerance|weight|momentum|wd|"
                r"corruption_rate|"
                r"rate|target|default|CMNIST\*?|MNIST|CODE\s*\()|\b(?:Sec|Table|App|Eq|Fig)\.?|[αλερτβηκ]|τ⁺|τ\s*/|"
                r"[=×/^≥≤]")
PARAMETER = re.compile(rf"(?:{SETTING_NAME})(?:\s*[\d.]+\s*(?:and|or|,|/|–))*\s*[≥≤]?\s*$")
CITATION = re.compile(r"(?:benchmarks/results/|(?<![/\w.*-]))((?:benchmarks/)?[\w*][\w.*-]*?)"
                      r"\.(md|csv|\{md,\s*csv\})(?![\w/])")
LINK = re.compile(r"\[[^\]]*\]\([^)]*\)")  # a link to another page: [gpu.md](gpu.md) is not docs/../results/gpu.md
HISTORY = re.compile(
    r"\b(?:as before|no longer|earlier default|previous default|the earlier objective|once produced|was lent|"
    r"previously|used to be|not yet run|not run yet|formerly|any ?more|until now|since then|"
    r"what .{0,30} does now|(?:is|are|takes|leads|runs) now|now (?:takes|leads|runs|uses|is|are|gives)|"
    r"older (?:code|training step|version)|at the time|had been|the current (?:one|objective|code|training step)|"
    r"measured so far|before: |before, |validated for hours before|has yet|here yet|from before)", re.IGNORECASE)
QUOTED = re.compile(r'"[^"]*"|`[^`]*`')  # a program's message or code, quoted as it is


def page_files(repo: Path) -> list[Path]:
    """README.md and every docs/*.md page of ``repo``."""
    return [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]


def blocks(text: str) -> list[tuple[str, str]]:
    """The page's (kind, text) blocks in order, kind ``table`` or ``prose``; code blocks (fenced, or indented four
    spaces after a blank line) and headings dropped."""
    out: list[tuple[str, str]] = []
    current: list[str] = []
    kind = "prose"
    fenced = False

    def close() -> None:
        if current:
            out.append((kind, "\n".join(current)))
        current.clear()

    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("```"):
            fenced = not fenced
            close()
            continue
        table_line = stripped.startswith("|")
        item = re.match(r"\s*(?:[-*]|\d+\.)\s", line) is not None
        indented_code = line.startswith("    ") and not current and not item and not table_line
        if fenced or not stripped or line.startswith("#") or indented_code:
            close()
            continue
        if current and (table_line != (kind == "table") or (item and not table_line)):
            close()
        if not current:
            kind = "table" if table_line else "prose"
        current.append(line)
    close()
    return out


def cited_files(block: str, results: Path) -> list[Path]:
    """The results files ``block`` names that exist under ``results`` (`x.{md,csv}`: both; `benchmarks/x.md`: beside
    ``results``)."""
    found: list[Path] = []
    for stem, ext in CITATION.findall(LINK.sub(" ", block)):
        for suffix in (("md", "csv") if ext.startswith("{") else (ext,)):
            if stem.startswith("benchmarks/"):
                candidates = [results.parent / f"{stem.removeprefix('benchmarks/')}.{suffix}"]
            else:
                candidates = sorted(results.glob(f"{stem}.{suffix}"))
            found += [path for path in candidates if path.is_file() and path not in found]
    return found


def quoted_numbers(block: str) -> list[str]:
    """The numbers of ``block`` quoted as results (decimals, and integers with a unit), in order: not in `code`, not
    a version, not a setting's value."""
    text = INLINE_CODE.sub(" CODE ", block)
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets
    numbers = []
    matches = sorted([*DECIMAL.finditer(text), *INTEGER_WITH_UNIT.finditer(text)], key=lambda m: m.start())
    for match in matches:
        if PARAMETER.search(text[max(0, match.start() - 24):match.start()]):
            continue
        numbers.append(match.group(0).replace("−", "-").lstrip("-").replace(",", ""))
    return numbers


@functools.lru_cache(maxsize=256)
def tokens(text: str) -> frozenset[str]:
    """Every number written in ``text``, as printed (thousands separators dropped)."""
    return frozenset(m.group(0).replace(",", "")
                     for m in re.finditer(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?", text))


def values(text: str) -> list[float]:
    """Every number written in ``text`` (thousands separators dropped, exponents read)."""
    return [float(v.replace(",", "")) for v in
            re.findall(r"(?<![\w.])-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e-?\d+)?(?![\w])", text)]


def readings(v: float, csv: bool) -> list[float]:
    """How a file's value ``v`` may be quoted: as it is; from a CSV also a fraction in % and seconds in minutes."""
    return [v] + ([v * 100] if csv and 0 <= v <= 1 else []) + ([v / 60] if csv and v >= 60 else [])


@functools.lru_cache(maxsize=1024)
def rounded(text: str, csv: bool, digits: int) -> frozenset[float]:
    """Every reading of ``text``'s numbers rounded to ``digits`` decimals (half to even, and half up)."""
    scale = 10 ** digits
    return frozenset(x for v in values(text) for r in readings(v, csv)
                     for x in (round(r, digits), round(math.floor(r * scale + 0.5) / scale, digits)))


def stands_in(number: str, files: list[Path], rows: tuple[str, ...] = ()) -> bool:
    """``number`` (as printed) stands in one of ``files``: the same token, or a value that rounds to it as printed
    (a CSV's fraction also read in %, its seconds in minutes); with ``rows``, in a line of a file holding one of those
    row labels."""
    digits = len(number.split(".")[1]) if "." in number else 0
    value = round(float(number), digits)
    for path in files:
        text = path.read_text(encoding="utf-8")
        if rows:
            text = "\n".join(line for line in text.splitlines() if any(row_matches(line, row) for row in rows))
        if number in tokens(text) or value in rounded(text, path.suffix == ".csv", digits):
            return True
    return False


ROWS = re.compile(r"\brows? ((?:`[^`]+`(?:,? (?:and |or )?)?)+)")


def named_rows(block: str) -> tuple[str, ...]:
    """The row labels a block names (row `cnc-s30`, rows `a` and `b`)."""
    return tuple(label for found in ROWS.findall(block) for label in re.findall(r"`([^`]+)`", found))


def row_matches(line: str, label: str) -> bool:
    """Whether a results file's ``line`` is the row ``label``: a table row whose first cell is the label, a CSV row
    holding it as a field, or any line naming it in backquotes or as a whole word."""
    cells = [cell.strip() for cell in line.strip().strip("|").split("|")] if line.lstrip().startswith("|") else []
    if cells:
        return cells[0].strip("`* ") == label
    return label in line.split(",") or re.search(rf"(?<![\w.-]){re.escape(label)}(?![\w.-])", line) is not None


def table_row_labels(files: list[Path]) -> set[str]:
    """The first cells of the table rows of ``files`` (the labels a page table's rows can address)."""
    labels = set()
    for path in files:
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.lstrip().startswith("|"):
                labels.add(line.strip().strip("|").split("|")[0].strip().strip("`* "))
    return labels - {""}


def checked_parts(block: str, files: list[Path]) -> list[tuple[str, tuple[str, ...]]]:
    """``(text, rows)`` pieces of a citing block, each checked against ``rows`` (none: the whole files): a page table's
    row whose first cell labels a row of a cited file's table, against that row; the rest against the rows the block
    names (or none)."""
    rows = named_rows(block)
    labels = table_row_labels(files) if block.lstrip().startswith("|") else set()
    parts = []
    for line in block.splitlines():
        first = line.strip().strip("|").split("|")[0].strip().strip("`* ") if line.lstrip().startswith("|") else ""
        if first and first in labels:
            parts.append(("|".join(line.strip().strip("|").split("|")[1:]), (first,)))
        else:
            parts.append((line, rows))
    return parts


def citing_blocks(text: str, results: Path) -> list[tuple[list[Path], str]]:
    """Each block of ``text`` with the results files it cites (a table: its own and those of the prose block before
    it, or if that names none, after it)."""
    parts = blocks(text)
    cited = [cited_files(block, results) for _, block in parts]
    out = []
    for i, (kind, block) in enumerate(parts):
        files = cited[i]
        if kind == "table":
            before = [cited[j] for j in range(i - 1, -1, -1) if parts[j][0] == "prose"][:1]
            after = [cited[j] for j in range(i + 1, len(parts)) if parts[j][0] == "prose"][:1]
            files = files + [f for f in (before + [[]])[0] or (after + [[]])[0] if f not in files]
        out.append((files, block))
    return out


def unsupported_numbers(repo: Path) -> list[str]:
    """``page: number (files)`` for each decimal quoted in a block citing results files that do not hold it."""
    results = repo / RESULTS
    missing: list[str] = []
    for page in page_files(repo):
        name = str(page.relative_to(repo))
        text = page.read_text(encoding="utf-8")
        for files, block in citing_blocks(text, results):
            if files:
                missing += block_problems(name, block, files)
    return missing


def block_problems(name: str, block: str, files: list[Path]) -> list[str]:
    """``name: number not in files [row]`` for each number of a citing block that does not stand where it claims."""
    missing = []
    for part, rows in checked_parts(block, files):
        for number in quoted_numbers(part):
            if not stands_in(number, files, rows):
                where = block.strip().splitlines()[0][:70]
                row = f" row {', '.join(rows)}" if rows else ""
                missing.append(f"{name}: {number} not in {', '.join(f.name for f in files)}{row} ({where!r})")
    return missing


# A comment or source line quoting a setting from a paper or the released code, not a measurement of this project
PAPER = re.compile(r"\b(?:paper|Table|App\.|Sec\.|Eq\.|released|code's|LfF|GroupDRO|SimCLR|SCARF|DFR|JTT|Khosla|Sagawa|"
                   r"conventional|rule of thumb)\b")


def comment_blocks(text: str) -> list[tuple[int, str]]:
    """params.yaml's comment blocks: (first line, the comments of consecutive commented lines, joined)."""
    found, current, start = [], [], 0
    for number, line in enumerate(text.splitlines(), 1):
        if "#" in line:
            start = start if current else number
            current.append(line[line.index("#") + 1:].strip())
        elif current:
            found.append((start, " ".join(current)))
            current = []
    if current:
        found.append((start, " ".join(current)))
    return found


def measured_claims(repo: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of every place outside README and docs/ that may state a measured number: params.yaml's
    comment blocks, and the source lines of src/debias/schema/sources.py and the src/ docstrings that say
    "measured"."""
    import ast

    claims = [(f"params.yaml:{line}", text) for line, text in comment_blocks(
        (repo / "params.yaml").read_text(encoding="utf-8"))]
    sources = repo / "src/debias/schema/sources.py"
    for node in ast.walk(ast.parse(sources.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(value, (ast.Constant, ast.JoinedStr)):
                    text = str(value.value if isinstance(value, ast.Constant) else ast.unparse(value))
                    if re.search(r"\bmeasured\b", text, re.IGNORECASE):
                        claims.append((f"sources.py: {key.value}", text))
    for path in sorted((repo / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and re.search(r"\bmeasured\b", doc, re.IGNORECASE):
                    claims.append((f"{path.relative_to(repo)}: {getattr(node, 'name', 'module')}", doc))
    return claims


def unsourced_measurements(repo: Path) -> list[str]:
    """Every number a :func:`measured_claims` text quotes that does not stand in the results file it names, or that
    it quotes without naming one (and without quoting a paper or the released code)."""
    results = repo / RESULTS
    found = []
    for where, text in measured_claims(repo):
        numbers = quoted_numbers(text)
        if not numbers:
            continue
        files = cited_files(text, results)
        if files:
            found += block_problems(where, text, files)
        elif not PAPER.search(text):
            found.append(f"{where}: {', '.join(numbers[:5])} quoted with no results file ({text[:80]!r})")
    return found


def uncited_measurements(repo: Path) -> list[str]:
    """``page: numbers (block)`` for each block of a measurement page quoting decimals without naming a results
    file."""
    found = []
    for name in MEASUREMENT_PAGES:
        for files, block in citing_blocks((repo / name).read_text(encoding="utf-8"), repo / RESULTS):
            numbers = [number for number in quoted_numbers(block) if "." in number]
            if numbers and not files:
                found.append(f"{name}: {', '.join(numbers[:5])} ({block.strip().splitlines()[0][:70]!r})")
    return found


def history_phrases(repo: Path) -> list[str]:
    """``page:line: phrase`` for each development-history phrase in README.md and docs/ (outside quotes and code)."""
    found = []
    for page in page_files(repo):
        prose = QUOTED.sub(lambda m: " " + "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
        for number, line in enumerate(prose.splitlines(), 1):
            found += [f"{page.relative_to(repo)}:{number}: {m.group(0)!r}" for m in HISTORY.finditer(line)]
    return found


def test_every_number_quoted_beside_a_results_file_stands_in_it() -> None:
    missing = unsupported_numbers(REPO)
    assert not missing, "\n".join(missing)


def test_every_measurement_names_its_results_file() -> None:
    """docs/benchmarks.md and docs/gpu.md quote measurements: each paragraph, item or table quoting a decimal names
    the results file that holds it, so the test above checks it."""
    found = uncited_measurements(REPO)
    assert not found, "\n".join(found)


def copy_pages(tmp_path: Path) -> Path:
    """A copy of README.md, docs/ and benchmarks/results under ``tmp_path``."""
    for part in (*PAGES, RESULTS):
        source = REPO / part
        (shutil.copytree if source.is_dir() else shutil.copy)(source, tmp_path / part)
    return tmp_path


def test_a_number_removed_from_its_results_file_is_reported(tmp_path) -> None:
    repo = copy_pages(tmp_path)
    results = repo / RESULTS / "fullsize_protocol.md"
    text = results.read_text(encoding="utf-8")
    assert "| 12.9 ± 8.9 |" in text and not unsupported_numbers(repo)
    results.write_text(text.replace("| 12.9 ± 8.9 |", "| 13.0 ± 8.9 |"), encoding="utf-8")
    missing = unsupported_numbers(repo)
    assert missing and all(": 12.9 not in fullsize_protocol" in line for line in missing), missing


def test_a_number_the_csv_holds_only_as_a_fraction_or_in_seconds_still_counts(tmp_path) -> None:
    page, results = tmp_path / "page.md", tmp_path / "r.csv"
    results.write_text("seed,test_worst_group,train_seconds\n0,0.174,8790.0\n", encoding="utf-8")
    assert stands_in("17.4", [results]) and stands_in("146.5", [results]) and stands_in("0.174", [results])
    assert not stands_in("17.5", [results]) and not stands_in("146.6", [results])
    page.write_text("| train s |\n| 8790 |\n| 0.174 |\n", encoding="utf-8")  # a Markdown table: as printed
    assert stands_in("0.17", [page]) and not stands_in("146.5", [page]) and not stands_in("17.4", [page])


@pytest.mark.parametrize("text, expected", [
    ("worst-group 29.7 ± 5.9 at α 0.03, λ 0.75 (`loss.alpha=0.03`), torch 2.15.0", ["29.7", "5.9"]),
    ("p_corr 0.995, ρ 0.997: 1,353.5 MiB and −1.3 points", ["1353.5", "1.3"]),
    ("47–55 min of 3 epochs, 1,353 MiB, 65 % at ≥ 60 % worst-group, 5 seeds", ["47", "55", "1353", "65"]),
    ("174 s (2.9 min) measured, 97–99 % idle", ["174", "2.9", "97", "99"]),
])
def test_quoted_numbers_are_results_not_settings(text: str, expected: list[str]) -> None:
    assert quoted_numbers(text) == expected


def test_a_table_cites_the_files_of_the_paragraph_before_it(tmp_path) -> None:
    (tmp_path / RESULTS).mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / RESULTS / "x.md").write_text("| 49.7 |\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("Measured (`benchmarks/results/x.md`):\n\n| a |\n|---|\n| 49.7 |\n",
                                        encoding="utf-8")
    assert not unsupported_numbers(tmp_path)
    (tmp_path / "README.md").write_text("Measured (`benchmarks/results/x.md`):\n\n| a |\n|---|\n| 49.8 |\n",
                                        encoding="utf-8")
    assert unsupported_numbers(tmp_path) == ["README.md: 49.8 not in x.md ('| a |')"]
    (tmp_path / "README.md").write_text("See [x.md](docs/x.md):\n\n| a |\n|---|\n| 49.8 |\n", encoding="utf-8")
    assert not unsupported_numbers(tmp_path)  # a link to a page of the same name cites no results file


def test_user_docs_speak_in_the_present() -> None:
    """README.md and docs/ describe what is, not how it came to be ("as before", "no longer", "the earlier
    default", "now takes", ...)."""
    for bad in ("runs as before", "is no longer needed", "the earlier default", "once produced a 28 MB message",
                "no GPU was lent to this work", "each process now takes", "(before: Eq. 10)", "measured so far",
                "(not run yet)", "What a training step does now", "on an H100 with an older training step",
                "; before, it was silently skipped", "no preset has been run end to end here yet"):
        assert HISTORY.search(bad), bad
    for fine in ("a new Python process", "waits until the end", "the previous epoch's head",
                 "the epoch's sum so far", "the pid now belongs to another program"):
        assert not HISTORY.search(fine), fine
    found = history_phrases(REPO)
    assert not found, "\n".join(found)


def test_every_measured_number_outside_the_pages_names_its_results_file() -> None:
    """params.yaml's comments, the params' source lines and docstrings saying "measured": each number they quote stands
    in the results file they name."""
    found = unsourced_measurements(REPO)
    assert not found, "\n".join(found)


def test_a_measured_number_in_a_params_comment_without_a_results_file_is_reported(tmp_path) -> None:
    repo = copy_pages(tmp_path)
    shutil.copy(REPO / "params.yaml", repo / "params.yaml")
    shutil.copytree(REPO / "src", repo / "src")
    assert not unsourced_measurements(repo)
    text = (repo / "params.yaml").read_text(encoding="utf-8")
    (repo / "params.yaml").write_text(text.replace("\nseed: 0\n", "\nseed: 0\n\n# ours: 81.3 % worst-group with it\n", 1),
                                      encoding="utf-8")
    (found,) = unsourced_measurements(repo)
    assert found.startswith("params.yaml:") and "81.3 quoted with no results file" in found


def test_a_number_moved_to_another_row_of_its_file_is_reported(tmp_path) -> None:
    """A block naming its row (row `b`), and a page table whose rows are labelled like the file's: each number is
    checked against that row, not anywhere in the file."""
    (tmp_path / RESULTS).mkdir(parents=True)
    (tmp_path / "docs").mkdir()
    (tmp_path / RESULTS / "x.md").write_text("| run | worst |\n|---|---|\n| a | 49.7 |\n| b | 12.5 |\n", encoding="utf-8")
    page = tmp_path / "README.md"
    for text, bad in (("The run b gave 12.5 % (`benchmarks/results/x.md`, row `b`).\n", []),
                      ("The run b gave 49.7 % (`benchmarks/results/x.md`, row `b`).\n", ["49.7"]),
                      ("Measured (`benchmarks/results/x.md`):\n\n| run | worst |\n|---|---|\n| a | 49.7 |\n| b | 12.5 |\n", []),
                      ("Measured (`benchmarks/results/x.md`):\n\n| run | worst |\n|---|---|\n| a | 12.5 |\n| b | 49.7 |\n",
                       ["12.5", "49.7"])):
        page.write_text(text, encoding="utf-8")
        assert [line.split(": ")[1].split(" ")[0] for line in unsupported_numbers(tmp_path)] == bad, text
    assert "README.md: 49.7 not in x.md row b" in unsupported_numbers(tmp_path)[1]
