"""The citation check of tests/test_citations.py: every number README, docs/, params.yaml's comments and the params'
sources quote as a result stands where its citation says; and they speak in the present.

Pages. A *block* of a page is a paragraph, a list item or a table (code blocks are skipped: commands). A block cites
the results files it names (`benchmarks/results/x.md`, `x.{md,csv}`, a bare `x.md` / `x.csv` that exists there, or
`benchmarks/x.md`; a `benchmarks/results/` path naming no file is reported); a table also cites what the prose block
before it names (or, if that names none, the one after it), and the rows that block names.

Results files. A results file is a list of *records*, each a list of *cells*: a Markdown table row (its cells under
their headers, labelled by its leading cells that are not numbers), a CSV row (its fields under their headers,
labelled by its text fields and ``seed N``), a line of a code block (a program's table, labelled by its first word),
and every other paragraph or list item of a Markdown file (one headerless cell).

Quoted numbers. Every decimal (49.7, -14.8), every integer with a unit (74 s, 47–55 min, 42 to 68 s, 1,353 MiB,
65 %, 5×), every clock time (13:48), every count (57 of 81) and every ratio word (a seventh, half, twice, three
times) of a citing block is a result unless it is a setting: inside
`code`, part of a version (2.15.0), right after a parameter's name or symbol or a key= (α 0.03, p_corr 0.995,
q = 0.7, lr ×0.1, stage2.epochs=30), after a threshold (≥ 65), a target (the target of 65, the 65 % target), the
level of an interval (95 % interval), a share of the data a schedule uses (a tenth of the anchors) or a bound (at
most ten times). A number after `/`, `=` or `×` is a result like any other ("75.2 / 57.7 s").

Where a number stands. A number stands in a cell that prints it, sign included (-3.0 is not 3.0 or +3.0), or a value
rounding to it as printed (0.063: 0.06), or that value read as a fraction in % (0.274: 27.4) or, where the page says
min, as seconds in minutes (3456.7: 57.6). A quote is one cell: the mean and spread of "29.7 ± 5.9", the mean and
bounds of "+3.0 [+0.2, +5.7]" (and of "-14.8 points, 95 % interval [-53.1, +23.4]") stand in the same cell. A number
with a column word beside it ("unbiased 85.4", "47.8 % worst-group", or its page table's column header) stands, in a
results table, under a header holding that word. A ratio word stands where a measured ratio is nearest to it (on a
log scale, among 1, a half ... a hundredth, twice ... a hundred times): a ratio column's value, a factor printed
with ×, or in a block naming rows the ratio of two of those rows' values of one time, cost or ratio column (0.81 and
5.71 times FairKL's cost: a seventh). A clock time stands where it is printed, or its seconds are. A count's two
numbers stand in one cell ("57 of 81"), unless no cell prints a count of that whole ("of 81"): then it is a tally of
rows, not read. The two ends of a range in prose ("42 to 68 s", "0.06–0.15"; not "from 184 to 131 s") stand under one header
of one table or both in one file's text: one quantity's extremes.

Words and names beside a number. A clause calling a difference "within ±D points" has each of its means with an
interval inside ±D ("within D points": the mean), "outside" beyond it; a margin word negated just before ("neither
... nor shown equivalent within ±1") is not read. A quote followed by a regime's name ("1.65 (digits)", see
:data:`REGIMES`) stands in a record of that regime (its heading or a label names it), where the cited files have
such records.

Rows. A block naming rows (row `cnc`, rows `a` and `b`) has its numbers stand, in each cited file holding one of
those rows, in those rows (and the file's paragraphs naming them); a number after a row named in its own clause
("(row `fairkl-released`) by -6.9") in that row; the intervals and ± quotes of one of its clauses
(up to a `;` or a sentence's end) that stand in those rows stand in one of them. A CSV row counts only where its
block names it (by a field, e.g. rows `eps_supinfonce_fairkl_true`): a CSV holds so many values that a number found
somewhere in it proves nothing. A page table whose header is a results table's header is checked cell by cell: each
page row is the results row with the same label cells, each of its numbers under the same header. In another page
table a row whose first cell labels a results row stands in that row, a row naming rows in those, a `seed` column
picks the CSV rows of that seed, and a column headed "paper" quotes the papers.

Outside the pages. params.yaml's comment blocks, the strings of src/debias/schema/sources.py and src/ docstrings that
say "measured" are held to the same rule; a number they quote without naming a results file is reported (unless
they quote a paper or released code), and a sources.py string naming a results file says "measured". README, docs/,
params.yaml's comments and sources.py's strings speak in the present: no development history (:data:`HISTORY`,
:data:`CHANGE_HISTORY`).
"""

from __future__ import annotations

import ast
import csv
import functools
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

RESULTS = "benchmarks/results"
PAGES = ("README.md", "docs")
MEASUREMENT_PAGES = ("docs/benchmarks.md", "docs/gpu.md")  # every decimal there is a measurement

# --------------------------------------------------------------------------------------------------- numbers

SIGN = r"[+\-−]"
# a decimal, or an integer with thousands separators; not part of a version (2.15.0) or of a word (v2, 1e-3)
DECIMAL = re.compile(rf"(?<![\w.,]){SIGN}?(?:\d{{1,3}}(?:,\d{{3}})+|\d+)\.\d+(?![\w.]*\d)(?!\.\w)")
UNIT = r" ?(?:s|min|ms|MiB|MB|GB|%)(?!\w)|×(?![\w\d])|x(?![\w\d])"
RANGE_TO = r"(?:–| to )"  # the dash or "to" between a range's two ends (47–55 min, 42 to 68 s)
# an integer with a unit of time, size or share, or a factor (74 s, 47–55 min, 42 to 68 s, 1,353 MiB, 65 %, 5×):
# both ends of a range
INTEGER_WITH_UNIT = re.compile(rf"(?<![\w.,−+-])(?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?=(?:{RANGE_TO}\d+)?(?:{UNIT}))"
                               rf"|(?<=–)\d+(?=(?:{UNIT}))")
# a clock time or a duration as a clock prints it (13:48, 1:02:03)
CLOCK = re.compile(r"(?<![\w.:])\d{1,2}:\d{2}(?::\d{2})?(?![\w:]|\.\d)")
# a count of a whole (57 of 81): both numbers stand in one cell
COUNT = re.compile(r"(?<![\w.,:/−+-])(\d+) of (\d+)(?![\w.,:]*\d)(?! ?%)")
ORDINALS = {"half": 2, "third": 3, "quarter": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8, "ninth": 9,
            "tenth": 10, "eleventh": 11, "twelfth": 12, "fifteenth": 15, "twentieth": 20, "fiftieth": 50,
            "hundredth": 100}
CARDINALS = {"two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
             "twenty": 20, "fifty": 50, "hundred": 100}
RATIO_WORD = re.compile(
    rf"\b(?:(?:a|one) (?P<fraction>{'|'.join(ORDINALS)})\b|(?P<half>half)\b(?! (?:of )?(?:a|an)\b)|(?P<twice>twice)\b"
    rf"|(?<![\w.-])(?P<times>{'|'.join(CARDINALS)}|\d+) times\b)", re.IGNORECASE)
# a ratio word that is a setting (a tenth of the anchors) or a bound (at most ten times), not a result
RATIO_SETTING_AFTER = re.compile(r"^\s*of\s+(?:the\s+|its\s+|Alg\. \d+'s\s+)?(?:\w+\s+)?"
                                 r"(?:anchors|batches|images|steps|epochs?|data|val|split)\b")
BOUND_BEFORE = re.compile(r"\b(?:at most|at least|up to|more than|less than)\s*$")
INLINE_CODE = re.compile(r"`[^`]*`")
LINK_TARGET = re.compile(r"\]\([^)]*\)")
# a setting's value: a parameter's name or symbol right before the number, possibly after other values of it
# ("p_corr 0.96 and 0.98", "q = 0.7", "lr ×0.1", "τ+ = 0.1")
SETTING_NAME = (r"\b(?:p_corr|rho|alpha|lambda|tau|eps|epsilon|lr|q|t|C|beta|kld|tolerance|weight|momentum|wd|"
                r"corruption_rate|rate|target(?: of)?|default|params\.yaml|CMNIST\*?|MNIST|CODE\s*\(|λ_up|τ\+|"
                r"tau_plus)"
                r"|\b(?:Sec|Table|App|Eq|Fig)\.?|[αλερτβηκ]⁺?|τ\s*/")
PARAMETER = re.compile(rf"(?:{SETTING_NAME})(?:\s*[=:]?\s*[\d.]+\s*(?:and|or|,|/|–|-))*\s*(?:[=:]|×)?\s*$"
                       r"|\b[a-z_][\w.]*=$")  # ... or a key=value assignment (-S stage2.weight_decay=0.00001)
THRESHOLD = re.compile(r"[≥≤<>^]\s*$")
SETTING_AFTER = re.compile(r"^\s*%?\s*(?:target|settings?\b|(?:confidence )?interval\b|power\b)")


@dataclass(frozen=True)
class Number:
    """A number as a page prints it: ``magnitude`` without sign or separators ("3.0", "1353"), ``negative`` when
    printed with a minus; a ratio word has ``ratio`` (the fraction or multiple it names) and no magnitude."""

    magnitude: str
    negative: bool
    start: int
    end: int
    unit: str = ""
    ratio: float = 0.0
    word: str = ""

    @property
    def printed(self) -> str:
        return ("-" if self.negative else "") + self.magnitude if self.magnitude else repr(self.word)

    @property
    def digits(self) -> int:
        return len(self.magnitude.split(".")[1]) if "." in self.magnitude else 0

    @property
    def seconds(self) -> float:
        """A clock time's (13:48, 1:02:03) value in seconds (minutes and seconds, or hours, minutes and seconds)."""
        value = 0.0
        for part in self.magnitude.split(":"):
            value = value * 60 + int(part)
        return value


def _mask_code(text: str) -> str:
    """``text`` with `code` spans as " CODE " padded to keep every offset, and link targets blanked."""
    text = INLINE_CODE.sub(lambda m: " CODE " + " " * (len(m.group(0)) - 6) if len(m.group(0)) >= 6
                           else " " * len(m.group(0)), text)
    return LINK_TARGET.sub(lambda m: "]" + " " * (len(m.group(0)) - 1), text)


def _unit_after(text: str, end: int) -> str:
    match = re.match(r"(?:(?:–| to )[\d.,]+)? ?(s|min|ms|MiB|MB|GB|%|×|x)(?![\w\d])", text[end:])
    return match.group(1) if match else ""


def is_setting(text: str, start: int, end: int) -> bool:
    """Whether the number at ``text[start:end]`` is a setting: after a parameter's name, a threshold, or before
    "target" / "settings" / "interval"."""
    before = text[max(0, start - 24):start]
    return (PARAMETER.search(before) is not None or THRESHOLD.search(before[-3:]) is not None
            or SETTING_AFTER.match(text[end:]) is not None)


def ratio_of(match: re.Match) -> float:
    """The ratio a :data:`RATIO_WORD` match names: a seventh 1/7, half 1/2, twice 2, three (or 3) times 3."""
    if match.group("fraction"):
        return 1 / ORDINALS[match.group("fraction").lower()]
    if match.group("half") or match.group("twice"):
        return 0.5 if match.group("half") else 2.0
    times = match.group("times").lower()
    return float(CARDINALS.get(times) or times)


def quoted_numbers(text: str, ratio_words: bool = True) -> list[Number]:
    """The numbers of ``text`` quoted as results, in order: decimals, integers with a unit and (``ratio_words``) ratio
    words; not in `code`, not a version, not a setting."""
    masked = _mask_code(text)
    found = []
    for match in sorted([*DECIMAL.finditer(masked), *INTEGER_WITH_UNIT.finditer(masked)], key=lambda m: m.start()):
        raw = match.group(0)
        sign = raw[0] if raw[0] in "+-−" else ""
        start = match.start() + len(sign)
        if is_setting(masked, match.start(), match.end()):
            continue
        found.append(Number(raw[len(sign):].replace(",", ""), sign in ("-", "−"), start, match.end(),
                            _unit_after(masked, match.end())))
    taken = {n.start for n in found}
    for match in CLOCK.finditer(masked):
        if not is_setting(masked, match.start(), match.end()):
            found.append(Number(match.group(0), False, match.start(), match.end(), "clock"))
    for match in COUNT.finditer(masked):
        if {match.start(1), match.start(2)} & taken or is_setting(masked, match.start(), match.end()):
            continue
        found += [Number(match.group(1), False, match.start(1), match.end(1), "count"),
                  Number(match.group(2), False, match.start(2), match.end(2), "count")]
    if ratio_words:
        for match in RATIO_WORD.finditer(masked):
            if RATIO_SETTING_AFTER.match(masked[match.end():]) or BOUND_BEFORE.search(masked[:match.start()]):
                continue
            found.append(Number("", False, match.start(), match.end(), "ratio", ratio_of(match), match.group(0)))
    return sorted(found, key=lambda n: n.start)


# --------------------------------------------------------------------------------------------------- quotes

COLUMN_WORDS = {"avg": r"average|avg", "unbiased": r"unbiased|unb", "worst": r"worst[- ]group|wg"}
COLUMN_WORD = "|".join(f"(?P<{key}>{pattern})" for key, pattern in COLUMN_WORDS.items())
WORD_BEFORE = re.compile(rf"\b(?:{COLUMN_WORD})(?: accuracy)?\s*[:=]?\s*(?:\*\*)?\s*$", re.IGNORECASE)
WORD_AFTER = re.compile(rf"^(?:\*\*)?\s*(?:%|points?)?\s*(?:test\s+)?\b(?:{COLUMN_WORD})\b", re.IGNORECASE)
HEADER_WORDS = {"avg": ("avg", "average"), "unbiased": ("unbiased", "unb"), "worst": ("worst",)}


@dataclass(frozen=True)
class Quote:
    """Numbers that stand in one cell (a number; a mean and its spread; a mean and its interval), or a ratio word;
    ``column``: the column word the text puts beside it ("avg", "unbiased", "worst" or "")."""

    numbers: tuple[Number, ...]
    column: str = ""

    @property
    def printed(self) -> str:
        parts = [n.printed for n in self.numbers]
        return parts[0] if len(parts) == 1 else f"{parts[0]} ({', '.join(parts[1:])})"


def _column_word(match: re.Match | None) -> str:
    return next((key for key in COLUMN_WORDS if match and match.group(key)), "")


SPREAD = re.compile(r"\s*±\s*[+\-−]?")
INTERVAL_OPENS = re.compile(r"\s*(?:%|points?)?\s*,?\s*(?:95 % interval\s*)?\[\s*[+\-−]?")
INTERVAL_GOES_ON = re.compile(r"\s*,\s*[+\-−]?")


def _continues(text: str, group: list[Number], number: Number) -> bool:
    """Whether ``number`` belongs to the quote ``group`` (of ``text``): its spread (± b), its interval's lower bound
    ([b, ...) or upper bound (..., c])."""
    between = text[group[-1].end:number.start]
    if number.unit == "count" or group[-1].unit == "count":
        return len(group) == 1 and group[0].unit == number.unit == "count" and between == " of "
    return (SPREAD.fullmatch(between) is not None
            or len(group) == 1 and INTERVAL_OPENS.fullmatch(between) is not None
            or INTERVAL_GOES_ON.fullmatch(between) is not None and "[" in text[group[0].end:group[-1].start])


def quotes(text: str, column: str = "") -> list[Quote]:
    """``text``'s quoted numbers grouped into :class:`Quote` s: "a ± b" and "a [b, c]" (also "a points, 95 % interval
    [b, c]") are one quote; each quote with the column word beside it (``column`` by default)."""
    masked = _mask_code(text)
    groups: list[list[Number]] = []
    for number in quoted_numbers(text):
        if groups and number.magnitude and groups[-1][-1].magnitude and _continues(masked, groups[-1], number):
            groups[-1].append(number)
        else:
            groups.append([number])
    out = []
    for group in groups:
        before = masked[max(0, group[0].start - 40):group[0].start]
        before = re.sub(r"[+\-−]$", "", before)
        word = _column_word(WORD_BEFORE.search(before))
        if not word:
            tail = masked[group[-1].end:]
            tail = re.sub(r"^\]", "", tail)
            tail = re.sub(r"^ ?(?:s|min|%)(?!\w)", "%", tail)
            word = _column_word(WORD_AFTER.match(tail))
        out.append(Quote(tuple(group), word or column))
    return out


# --------------------------------------------------------------------------------------------------- results files

@dataclass(frozen=True)
class Cell:
    """One cell of a results file: its column's header ("" for a line of text) and its text."""

    column: str
    text: str


@dataclass(frozen=True)
class Record:
    """A row of a results file: its cells, the labels that name it, and where it is (``table``: which table of the
    file, or -1 for text; ``code``: a line of a code block, e.g. a program's table; ``section``: the heading above
    it)."""

    file: str
    index: int
    table: int
    labels: tuple[str, ...]
    cells: tuple[Cell, ...]
    csv: bool = False
    code: bool = False
    section: str = ""  # the heading it stands under ("digits (40 cells; winner: ...)")


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def normalized(cell: str) -> str:
    """A cell's text as compared between a page and a results file: no emphasis, code marks or extra spaces."""
    return re.sub(r"\s+", " ", cell.replace("**", "").replace("`", "").replace("−", "-")).strip()


def _starts_with_number(cell: str) -> bool:
    return re.match(r"\s*(?:\*\*)?[+\-−]?\d", cell) is not None


def _label_cells(cells: list[str]) -> tuple[str, ...]:
    """The leading cells of a table row that are not numbers (at least the first)."""
    labels = []
    for i, cell in enumerate(cells):
        if i and (_starts_with_number(cell) or cell in ("", "—")):
            break
        labels.append(normalized(cell).strip("* "))
    return tuple(labels)


@functools.lru_cache(maxsize=256)
def _parse(name: str, text: str, is_csv: bool) -> tuple[Record, ...]:
    """The records of a results file named ``name`` holding ``text`` (see the module's docstring)."""
    records: list[Record] = []
    if is_csv:
        lines = [line for line in text.splitlines() if line.strip() and not line.startswith("#")]
        rows = list(csv.reader(io.StringIO("\n".join(lines))))
        if not rows:
            return ()
        header = rows[0]
        for i, row in enumerate(rows[1:]):
            labels = [value for value in row if value and not _is_float(value)]
            labels += [f"{key} {value}" for key, value in zip(header, row) if key == "seed"]
            records.append(Record(name, i, 0, tuple(labels), tuple(Cell(key, value) for key, value in zip(header, row)),
                                  csv=True))
        return tuple(records)
    lines = text.splitlines()
    fenced = False
    table = -1
    header: list[str] = []
    paragraph: list[str] = []
    section = ""

    def close() -> None:
        if paragraph:
            joined = " ".join(part.strip() for part in paragraph)
            records.append(Record(name, len(records), -1, (), (Cell("", joined),), section=section))
        paragraph.clear()

    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith("```"):
            close()
            fenced = not fenced
            continue
        if fenced:
            if stripped:
                records.append(Record(name, len(records), -1, (stripped.split()[0],), (Cell("", stripped),),
                                      code=True, section=section))
            continue
        if stripped.startswith("|"):
            close()
            cells = _cells(stripped)
            if all(re.fullmatch(r":?-{3,}:?", cell) for cell in cells):
                continue
            if i + 1 < len(lines) and re.fullmatch(r"\|?\s*:?-{3,}.*", lines[i + 1].strip()):
                table += 1
                header = [normalized(cell) for cell in cells]
                continue
            columns = header + [""] * (len(cells) - len(header))
            records.append(Record(name, len(records), table, _label_cells(cells),
                                  tuple(Cell(column, cell) for column, cell in zip(columns, cells)), section=section))
            continue
        if not stripped or re.match(r"\s*(?:[-*]|\d+\.)\s", line) or stripped.startswith("#"):
            close()
        if stripped.startswith("#"):
            section = stripped.lstrip("#").strip()
        if stripped:
            paragraph.append(stripped)
    close()
    return tuple(records)


def _is_float(value: str) -> bool:
    try:
        float(value)
    except ValueError:
        return False
    return True


def records(path: Path) -> tuple[Record, ...]:
    """The records of the results file ``path`` (see the module's docstring)."""
    return _parse(path.name, path.read_text(encoding="utf-8"), path.suffix == ".csv")


# a number a results file prints: signed where the sign starts a word, unsigned after a range's hyphen (0.936-1.027);
# not the digits of a name (cmnist-096, s0)
TOKEN = re.compile(rf"(?:(?<![\w.])({SIGN})|(?<![\w.+\-−])|(?<=\d-))"
                   rf"((?:\d{{1,3}}(?:,\d{{3}})+|\d+)(?:\.\d+)?(?:e[+-]?\d+)?)(?:(?!\w)|(?=x(?!\w)))")


@functools.lru_cache(maxsize=65536)
def _tokens(text: str) -> tuple[tuple[bool, str, float], ...]:
    """Every number ``text`` prints: (negative, magnitude as printed, value)."""
    out = []
    for sign, magnitude in TOKEN.findall(text):
        magnitude = magnitude.replace(",", "")
        out.append((sign in ("-", "−"), magnitude, float(magnitude)))
    return tuple(out)


def _rounds_to(value: float, magnitude: float, digits: int) -> bool:
    """Whether ``value`` rounds to ``magnitude`` at ``digits`` decimals (half to even, or half up)."""
    scale = 10 ** digits
    return round(value, digits) == magnitude or math.floor(value * scale + 0.5 + 1e-9) / scale == magnitude


def stands_in(number: Number, cell: Cell, is_csv: bool) -> bool:
    """Whether ``cell`` holds ``number`` as printed (sign included), or a value rounding to it, or that value read as
    a fraction in % or as seconds in minutes (page unit min)."""
    return matcher(number)(cell.text, is_csv)


def matcher(number: Number) -> Callable[[str, bool], bool]:
    """:func:`stands_in` for ``number`` as a function of a cell's text and whether it is a CSV's, the number's
    settings read once (a quote is checked against every cell of its candidates)."""
    if number.unit == "clock":
        return lambda text, is_csv: clock_stands(number, text)
    magnitude, negative, digits, minutes = number.magnitude, number.negative, number.digits, number.unit == "min"
    return lambda text, is_csv: _stands(magnitude, negative, digits, minutes, text, is_csv)


def clock_stands(number: Number, text: str) -> bool:
    """Whether ``text`` prints the clock time ``number`` (13:48), or a number of seconds it is, to the second."""
    if re.search(rf"(?<![\d:]){re.escape(number.magnitude)}(?![\d:])", text):
        return True
    return any(not negative and abs(value - number.seconds) < 0.5 for negative, _, value in _tokens(text))


@functools.lru_cache(maxsize=1 << 20)
def _stands(magnitude: str, negative: bool, digits: int, minutes: bool, text: str, is_csv: bool) -> bool:
    if is_csv and not _is_float(text):
        return False
    target = float(magnitude)
    for token_negative, token, value in _tokens(text):
        if token_negative != negative:
            continue
        if token == magnitude:
            return True
        token_digits = len(token.split(".")[1]) if "." in token else 0
        readings = []
        if token_digits > digits or is_csv:
            readings.append(value)
        if (is_csv or token_digits >= 2) and 0 <= value <= 1:
            readings.append(value * 100)
        if minutes and value >= 60:
            readings.append(value / 60)
        if any(_rounds_to(reading, target, digits) for reading in readings):
            return True
    return False


def column_fits(cell: Cell, column: str) -> bool:
    """Whether ``cell``'s header fits the column word ``column`` (no word, or no header: any)."""
    if not column or not cell.column:
        return True
    header = cell.column.lower().replace("_", " ")
    return any(word in header for word in HEADER_WORDS[column])


def tally(quote: Quote, candidates: list[Record]) -> bool:
    """Whether ``quote`` is a count (57 of 81) whose whole no candidate prints as one ("of 81"): a tally of the
    results' rows, which no cell holds, rather than a count the results print."""
    if not quote.numbers or quote.numbers[0].unit != "count":
        return False
    whole = re.compile(rf"\bof {quote.numbers[-1].magnitude}\b")
    return not any(whole.search(cell.text) for record in candidates for cell in record.cells)


def quote_cells(quote: Quote, candidates: list[Record]) -> list[Record]:
    """The records of ``candidates`` with one cell holding every number of ``quote`` under a fitting header (all of
    them for a :func:`tally`)."""
    if tally(quote, candidates):
        return list(candidates)
    matchers = [matcher(number) for number in quote.numbers]
    return [record for record in candidates
            if any(all(match(cell.text, record.csv) for match in matchers) and column_fits(cell, quote.column)
                   for cell in record.cells)]


RANGE_BETWEEN = re.compile(r"\s*(?:%|s|min|ms|MiB|MB|GB)?\s*(?:–|to)\s*[+\-−]?")


def ranges(text: str, found: list[Quote]) -> list[tuple[Quote, Quote]]:
    """The ranges among ``found`` (the quotes of ``text``): two single numbers of one kind joined by "to" or a dash
    (42 to 68 s, 47–55 min, 8:00 to 13:48)."""
    masked = _mask_code(text)
    return [(a, b) for a, b in zip(found, found[1:])
            if len(a.numbers) == len(b.numbers) == 1 and a.numbers[0].magnitude and b.numbers[0].magnitude
            and (a.numbers[0].unit == "clock") == (b.numbers[0].unit == "clock")
            and RANGE_BETWEEN.fullmatch(masked[a.numbers[0].end:b.numbers[0].start]) is not None
            and not re.search(r"\bfrom\s+$", masked[:a.numbers[0].start])]  # from 184 to 131 s: a change


def _column_of(record: Record, cell: Cell) -> tuple:
    """Where a cell's value belongs with others of its kind: its table's column, a code line, or the file's text."""
    if record.table >= 0 or record.csv:
        return record.file, record.table, cell.column
    return (record.file, record.index) if record.code else (record.file, "text")


def range_stands(low: Quote, high: Quote, candidates: list[Record]) -> bool:
    """Whether the two ends of a range stand under one header of one table, or both in one file's text: one
    quantity's extremes, not two numbers of different things."""
    places: list[set[tuple]] = [set(), set()]
    for record in candidates:
        for cell in record.cells:
            for place, quote in zip(places, (low, high)):
                if all(stands_in(n, cell, record.csv) for n in quote.numbers) and column_fits(cell, quote.column):
                    place.add(_column_of(record, cell))
    return bool(places[0] & places[1])


# the ratios a word can name, nearest first: 1 (no word: "as fast"), a half ... a hundredth, twice ... a hundred times
RATIO_VOCABULARY = (1.0, *(1 / n for n in (*range(2, 11), 12, 15, 20, 50, 100)),
                    *(float(n) for n in (*range(2, 11), 12, 15, 20, 50, 100)))
RATIO_HEADER = re.compile(r"ratio|speed-?up|faster| / | over |\bvs\b|×|\bx\b", re.IGNORECASE)
DIFFERENCE_HEADER = re.compile(r"Δ|\bdiff|points|lost|gain", re.IGNORECASE)  # a difference, not a ratio
# a column whose values two rows compare by a ratio word: a ratio, a time, a cost or a rate
COMPARED_HEADER = re.compile(rf"{RATIO_HEADER.pattern}|cost|time|wall|cpu|seconds|\bs$|\bmin$|/s\b", re.IGNORECASE)
FACTOR = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)[×x](?![\w\d])")  # 1.27x, 5×; not "2 x 2 epochs"


def nearest_ratio_word(ratio: float) -> float:
    """The ratio a word would name for ``ratio``: the nearest of :data:`RATIO_VOCABULARY` on a log scale."""
    return min(RATIO_VOCABULARY, key=lambda word: abs(math.log(ratio) - math.log(word)))


def ratios(candidates: list[Record], named: list[Record]) -> set[float]:
    """The measured ratios ``candidates`` hold: the values of ratio columns (a header with "ratio", " / ", " over ",
    "vs", "×"; not a difference, Δ) and factors printed with × anywhere; and the ratio of two values of one ratio,
    time, cost or rate column of the ``named`` rows (0.81 and 5.71 times FairKL's cost: a seventh)."""
    found: set[float] = set()
    columns: dict[tuple, list[float]] = {}
    for record in candidates:
        for cell in record.cells:
            if cell.column and RATIO_HEADER.search(cell.column) and not DIFFERENCE_HEADER.search(cell.column):
                found.update(v for negative, _, v in _tokens(cell.text) if v > 0 and not negative)
            found.update(float(v) for v in FACTOR.findall(cell.text) if float(v) > 0)
    for record in named:
        for cell in record.cells:
            if cell.column and COMPARED_HEADER.search(cell.column) and not DIFFERENCE_HEADER.search(cell.column):
                columns.setdefault((record.file, record.table, cell.column), []).extend(
                    v for negative, _, v in _tokens(cell.text) if v > 0 and not negative)
    for values in columns.values():
        found.update(a / b for a in values for b in values if a != b)
    return found


def ratio_stands(number: Number, candidates: list[Record], named: list[Record] = ()) -> bool:
    """Whether a ratio the candidates hold (see :func:`ratios`) is, to a word's precision, the one ``number`` names:
    the word is the nearest of :data:`RATIO_VOCABULARY` to it (0.81 / 5.71: a seventh, not a twentieth)."""
    return any(math.isclose(nearest_ratio_word(ratio), number.ratio) for ratio in ratios(candidates, list(named)))


# --------------------------------------------------------------------------------------------------- pages

CITATION = re.compile(r"(?:benchmarks/results/|(?<![/\w.*-]))((?:benchmarks/)?[\w*][\w.*-]*?)"
                      r"\.(md|csv|\{md,\s*csv\})(?![\w/])")
LINK = re.compile(r"\[[^\]]*\]\([^)]*\)")  # a link to another page: [gpu.md](gpu.md) is not docs/../results/gpu.md
ROWS = re.compile(r"\brows?\s+((?:`[^`]+`(?:,?\s+(?:and\s+|or\s+)?)?)+)", re.IGNORECASE)


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


def missing_files(block: str, results: Path) -> list[str]:
    """The `benchmarks/results/...` paths ``block`` names that hold no file."""
    missing = []
    for match in CITATION.finditer(LINK.sub(" ", block)):
        stem, ext = match.groups()
        if match.group(0).startswith("benchmarks/results/") and "*" not in stem:
            for suffix in (("md", "csv") if ext.startswith("{") else (ext,)):
                if not (results / f"{stem}.{suffix}").is_file():
                    missing.append(f"benchmarks/results/{stem}.{suffix}")
    return missing


def named_rows(block: str) -> tuple[str, ...]:
    """The row labels a block names (row `cnc-s30`, rows `a` and `b`)."""
    return tuple(label for found in ROWS.findall(block) for label in re.findall(r"`([^`]+)`", found))


def row_matches(record: Record, label: str) -> bool:
    """Whether ``record`` is the row ``label`` (``*`` a wildcard): a table row with the label among its label cells, a
    CSV row holding it as a field, a code line (a program's table) starting with it; never a paragraph. A label of
    several words (`cmnist_096 eps_supinfonce_fairkl_cluster`) names the rows holding each of them."""
    if record.table < 0 and not record.csv and not record.code:
        return False
    values = [normalized(value).strip("* ") for value in record.labels]

    def holds(part: str) -> bool:
        pattern = re.compile(re.escape(part).replace(r"\*", ".*") + "$")
        return any(pattern.match(value) for value in values)

    return holds(label) or len(label.split()) > 1 and all(holds(part) for part in label.split())


def mentions(record: Record, label: str) -> bool:
    """Whether ``record`` is a paragraph naming ``label`` as a whole word (a note on that row)."""
    word = re.escape(label).replace(r"\*", r"[\w.-]*")
    return (record.table < 0 and not record.csv and not record.code
            and re.search(rf"(?<![\w.-]){word}(?![\w.-])", record.cells[0].text) is not None)


@dataclass
class Context:
    """What a part of a block is checked against: the cited files' records, narrowed to the rows it names."""

    files: list[Path]
    rows: tuple[str, ...] = ()
    seed: str | None = None

    def candidates(self) -> list[Record]:
        """The records a number may stand in: in each file holding one of the named rows, those rows and the
        paragraphs naming them; in a CSV, only named rows (of ``seed`` when a seed column names one)."""
        rows = self.rows
        out = []
        for path in self.files:
            file_records = records(path)
            matched = [r for r in file_records if any(row_matches(r, label) for label in rows)] if rows else []
            if path.suffix == ".csv":
                chosen = matched
                if self.seed is not None:
                    chosen = [r for r in chosen if f"seed {self.seed}" in r.labels]
            elif matched:
                chosen = matched + [r for r in file_records if any(mentions(r, label) for label in rows)]
            else:
                chosen = list(file_records)
            out += chosen
        return out

    def unknown_rows(self) -> list[str]:
        """The named rows no cited file holds."""
        return [label for label in self.rows
                if not any(row_matches(r, label) for path in self.files for r in records(path))]


def _where(block: str) -> str:
    return repr(block.strip().splitlines()[0][:70])


def clauses(text: str) -> list[tuple[int, int]]:
    """The (start, end) spans of ``text``'s clauses: split at ``;`` and at a sentence's end."""
    spans, start = [], 0
    for match in re.finditer(r";|(?<![\d.])\.(?=\s|$)|(?<=\D)\.(?=\s+[A-Z(])", text):
        spans.append((start, match.end()))
        start = match.end()
    spans.append((start, len(text)))
    return spans


# a regime as the pages name it, and as results files' headings and rows name it
REGIMES = {"digits": "digits", "CMNIST*": "cmnist", "Biased-MNIST": "bmnist"}
REGIME_AFTER = re.compile(rf"^\s*(?:%|points?)?\s*\(({'|'.join(re.escape(name) for name in REGIMES)})\)")
# a difference called within (or outside) a margin: "within ±1 point", "**within ±2 points**", "within 2 points"
MARGIN = re.compile(r"\b(within|outside)\s+(?:\*\*)?(±)?\s*(\d+(?:\.\d+)?)\s*(?:\*\*)?\s*points?\b", re.IGNORECASE)
NEGATION = re.compile(r"\b(?:not|neither|nor|cannot|never|no)\b", re.IGNORECASE)


def in_regime(record: Record, key: str) -> bool:
    """Whether ``record`` is of the regime ``key`` (a :data:`REGIMES` value): its heading or a label names it."""
    return re.search(rf"(?<![\w-]){key}(?![\w-])", " ".join([record.section, *record.labels]).lower()) is not None


def narrowed(text: str, quote: Quote, context: Context, candidates: list[Record]) -> tuple[list[Record], str]:
    """The records ``quote`` of ``text`` may stand in, and what they are: the rows named last before it in its clause
    ("the released FairKL objective (row `fairkl-released`) by -6.9"), of the regime named right after it ("1.65
    (digits)") where the cited files split by regime; else ``candidates``."""
    at = quote.numbers[0].start
    start = next(begin for begin, end in clauses(text) if begin <= at < end or end == len(text))
    named = ROWS.findall(text[start:at])
    what = ""
    if named:
        labels = tuple(re.findall(r"`([^`]+)`", named[-1]))
        candidates = Context(context.files, labels, context.seed).candidates()
        what = f" row {', '.join(labels)}"
    regime = REGIME_AFTER.match(_mask_code(text)[quote.numbers[-1].end:])
    if regime:
        key = REGIMES[regime.group(1)]
        of_regime = [record for record in candidates if in_regime(record, key)]
        if of_regime:
            candidates, what = of_regime, f"{what} under {key}"
    return candidates, what


def margin_problems(name: str, text: str, found: list[Quote], where: str) -> list[str]:
    """In each clause calling a difference within (or outside) a margin (not negated just before: "neither ... nor
    shown equivalent within ±1 point"): each mean with its interval of
    the clause is within it (|mean| at most the margin; with ±, the whole interval), or outside it (the whole interval
    beyond it)."""
    problems = []
    for start, end in clauses(text):
        for match in MARGIN.finditer(text[start:end]):
            if NEGATION.search(text[max(start, start + match.start() - 40):start + match.start()]):
                continue
            word, both, margin = match.group(1).lower(), match.group(2), float(match.group(3))
            for quote in found:
                if not (start <= quote.numbers[0].start < end and len(quote.numbers) == 3):
                    continue
                mean, low, high = (float(n.magnitude) * (-1 if n.negative else 1) for n in quote.numbers)
                inside = (abs(low) <= margin and abs(high) <= margin) if both else abs(mean) <= margin
                outside = low > margin or high < -margin
                if (word == "within" and not inside) or (word == "outside" and not outside):
                    unit = "point" if margin == 1 else "points"
                    problems.append(f"{name}: {quote.printed} is not {word} {both or ''}{match.group(3)} {unit} "
                                    f"({where})")
    return problems


def prose_problems(name: str, text: str, context: Context, where: str) -> list[str]:
    """``name: number ...`` for each quote of ``text`` standing nowhere its citation allows; in a block naming rows,
    for each clause whose intervals and ± quotes stand in different ones of those rows."""
    problems = []
    candidates = context.candidates()
    bound: list[tuple[Quote, set[str]]] = []
    found_quotes = quotes(text)
    for low, high in ranges(text, found_quotes):
        if quote_cells(low, candidates) and quote_cells(high, candidates) and not range_stands(low, high, candidates):
            problems.append(f"{name}: the range {low.printed} to {high.printed} is no one column's or paragraph's "
                            f"of {_names(context)} ({where})")
    problems += margin_problems(name, text, found_quotes, where)
    for quote in found_quotes:
        if quote.numbers[0].ratio:
            named = [r for r in candidates if any(row_matches(r, label) for label in context.rows)]
            if not ratio_stands(quote.numbers[0], candidates, named):
                problems.append(f"{name}: {quote.printed} (a ratio word) is no ratio {_names(context)} holds "
                                f"({where})")
            continue
        found = quote_cells(quote, candidates)
        if found:
            mine, what = narrowed(text, quote, context, candidates)
            if not quote_cells(quote, mine):
                column = f" under a '{quote.column}' header" if quote.column else ""
                files = ", ".join(f.name for f in context.files)
                problems.append(f"{name}: {quote.printed} not in {files}{what}{column} ({where})")
        if not found:
            column = f" under a '{quote.column}' header" if quote.column else ""
            problems.append(f"{name}: {quote.printed} not in {_names(context)}{column} ({where})")
        elif len(quote.numbers) > 1:
            labels = {label for record in found for label in context.rows if row_matches(record, label)}
            if labels:
                bound.append((quote, labels))
    for start, end in clauses(text):
        inside = [(quote, labels) for quote, labels in bound if start <= quote.numbers[0].start < end]
        if len(inside) > 1 and not set.intersection(*(labels for _, labels in inside)):
            numbers = "; ".join(f"{q.printed} in row {', '.join(sorted(labels))}" for q, labels in inside)
            problems.append(f"{name}: one clause, intervals of different rows ({numbers}) ({where})")
    return problems


def _names(context: Context) -> str:
    row = f" row {', '.join(context.rows)}" if context.rows else ""
    seed = f" seed {context.seed}" if context.seed is not None else ""
    return f"{', '.join(f.name for f in context.files)}{row}{seed}"


# --------------------------------------------------------------------------------------------------- page tables

def _table(block: str) -> tuple[list[str], list[list[str]]]:
    lines = [line for line in block.splitlines() if line.strip().startswith("|")]
    header = [normalized(cell) for cell in _cells(lines[0])] if lines else []
    rows = [_cells(line) for line in lines[1:] if not all(re.fullmatch(r":?-{3,}:?", c) for c in _cells(line))]
    return header, rows


def mirrored(header: list[str], files: list[Path]) -> list[list[Record]]:
    """The cited files' tables whose header holds every column of the page table ``header`` (at least three): each a
    list of its records."""
    tables: dict[tuple[str, int], list[Record]] = {}
    for path in files:
        if path.suffix == ".csv":
            continue
        for record in records(path):
            if record.table >= 0:
                tables.setdefault((record.file, record.table), []).append(record)
    return [rows for rows in tables.values()
            if len(header) >= 3 and set(header) <= {cell.column for cell in rows[0].cells}]


def mirrored_row_problems(name: str, header: list[str], cells: list[str], tables: list[list[Record]],
                          where: str) -> list[str]:
    """A page row of a table mirroring a results table: the results row with the same label cells, holding each number
    of the page row under the same header."""
    labels = tuple(normalized(cell).strip("* ") for cell in _label_cells(cells))
    rows = [record for table in tables for record in table if record.labels[:len(labels)] == labels]
    if not rows:
        return [f"{name}: row {' | '.join(labels)!r} is in no cited table with this header ({where})"]
    best: list[str] | None = None
    for record in rows:
        by_column = {cell.column: cell for cell in record.cells}
        problems = []
        for column, text in zip(header, cells):
            if normalized(text) == normalized(by_column[column].text):
                continue
            for quote in quotes(text):
                if not all(stands_in(n, by_column[column], False) for n in quote.numbers):
                    problems.append(f"{name}: {quote.printed} not in row {' | '.join(labels)!r}, column {column!r} "
                                    f"of {record.file} ({where})")
        if not problems:
            return []
        best = problems if best is None or len(problems) < len(best) else best
    return best or []


def table_problems(name: str, block: str, context: Context) -> list[str]:
    """Each page row of a table: mirrored tables cell by cell; others number by number, a row whose first cell labels
    a results row against that row, a ``seed`` column picking the CSV rows of that seed."""
    header, rows = _table(block)
    tables = mirrored(header, context.files)
    problems = []
    for cells in rows:
        where = repr(f"| {' | '.join(cells)} |"[:70])
        if tables:
            problems += mirrored_row_problems(name, header, cells, tables, where)
            continue
        first = normalized(cells[0]).strip("* ") if cells else ""
        labelled = first and any(row_matches(r, first) for path in context.files for r in records(path))
        seed = next((normalized(cell) for column, cell in zip(header, cells)
                     if column == "seed" and re.fullmatch(r"\d+", normalized(cell))), None)
        rows_named = named_rows(" ".join(cells)) or context.rows
        row_context = Context(context.files, (first,) if labelled else rows_named, seed)
        candidates = row_context.candidates()
        for column, text in zip(header, cells):
            if "paper" in column.split() or column == "the paper":
                continue
            word = _column_word(re.search(COLUMN_WORD, column, re.IGNORECASE))
            for quote in quotes(text, word):
                if quote.numbers[0].ratio:
                    named = [r for r in candidates if any(row_matches(r, label) for label in row_context.rows)]
                    if not ratio_stands(quote.numbers[0], candidates, named):
                        problems.append(f"{name}: {quote.printed} (a ratio word) is no ratio {_names(row_context)} "
                                        f"holds ({where})")
                elif not quote_cells(quote, candidates):
                    fits = f" under a '{quote.column}' header" if quote.column else ""
                    problems.append(f"{name}: {quote.printed} not in {_names(row_context)}{fits} ({where})")
    return problems


# --------------------------------------------------------------------------------------------------- whole pages

def citing_blocks(text: str, results: Path) -> list[tuple[list[Path], tuple[str, ...], str, str]]:
    """Each block of ``text`` with the results files it cites and the rows it names (a table: its own and those of
    the prose block before it, or if that names no file, after it), and its kind."""
    parts = blocks(text)
    cited = [cited_files(block, results) for _, block in parts]
    rows = [named_rows(block) for _, block in parts]
    out = []
    for i, (kind, block) in enumerate(parts):
        files, names = list(cited[i]), rows[i]
        if kind == "table":
            before = [j for j in range(i - 1, -1, -1) if parts[j][0] == "prose"][:1]
            after = [j for j in range(i + 1, len(parts)) if parts[j][0] == "prose"][:1]
            source = next((j for j in before + after if cited[j]), None)
            if source is not None:
                files += [f for f in cited[source] if f not in files]
                names = names or rows[source]
        out.append((files, names, kind, block))
    return out


def block_problems(name: str, block: str, files: list[Path], rows: tuple[str, ...] = (),
                   kind: str = "prose") -> list[str]:
    """Every problem of a citing block: named rows no file holds, numbers standing nowhere their citation allows."""
    context = Context(files, rows)
    problems = [f"{name}: row `{label}` is in none of {', '.join(f.name for f in files)} ({_where(block)})"
                for label in context.unknown_rows()]
    if kind == "table":
        return problems + table_problems(name, block, context)
    return problems + prose_problems(name, block, context, _where(block))


def unsupported_numbers(repo: Path, pages: Sequence[str] = ()) -> list[str]:
    """``page: number ...`` for each number of README.md and docs/ (or of ``pages`` alone, named from the repository
    root) that does not stand where its block cites."""
    results = repo / RESULTS
    missing: list[str] = []
    for page in [repo / name for name in pages] or page_files(repo):
        name = str(page.relative_to(repo))
        for files, rows, kind, block in citing_blocks(page.read_text(encoding="utf-8"), results):
            missing += [f"{name}: {path} is no file ({_where(block)})" for path in missing_files(block, results)]
            if files:
                missing += block_problems(name, block, files, rows, kind)
    return missing


def uncited_measurements(repo: Path) -> list[str]:
    """``page: numbers (block)`` for each block of a measurement page quoting decimals without naming a results
    file."""
    found = []
    for name in MEASUREMENT_PAGES:
        for files, _, _, block in citing_blocks((repo / name).read_text(encoding="utf-8"), repo / RESULTS):
            numbers = [n.printed for n in quoted_numbers(block, ratio_words=False) if "." in n.magnitude]
            if numbers and not files:
                found.append(f"{name}: {', '.join(numbers[:5])} ({_where(block)})")
    return found


# --------------------------------------------------------------------------------------------------- outside the pages

# A comment or source line quoting a setting from a paper or the released code, not a measurement of this project
PAPER = re.compile(r"\b(?:paper|Table|App\.|Sec\.|Eq\.|released|code's|LfF|GroupDRO|SimCLR|SCARF|DFR|JTT|Khosla|Sagawa|"
                   r"conventional|rule of thumb)\b")
MEASURED = re.compile(r"(?<!not )\bmeasured\b", re.IGNORECASE)


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


def source_strings(repo: Path) -> list[tuple[str, str]]:
    """``(key, text)`` of every source line of src/debias/schema/sources.py."""
    sources = repo / "src/debias/schema/sources.py"
    out = []
    for node in ast.walk(ast.parse(sources.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and isinstance(value, (ast.Constant, ast.JoinedStr)):
                    out.append((str(key.value), str(value.value if isinstance(value, ast.Constant)
                                                    else ast.unparse(value))))
    return out


def measured_claims(repo: Path) -> list[tuple[str, str]]:
    """``(where, text)`` of every place outside README and docs/ that may state a measured number: params.yaml's
    comment blocks, the source lines of src/debias/schema/sources.py and the src/ docstrings that say "measured"."""
    claims = [(f"params.yaml:{line}", text) for line, text in comment_blocks(
        (repo / "params.yaml").read_text(encoding="utf-8"))]
    claims += [(f"sources.py: {key}", text) for key, text in source_strings(repo)]
    for path in sorted((repo / "src").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and MEASURED.search(doc):
                    claims.append((f"{path.relative_to(repo)}: {getattr(node, 'name', 'module')}", doc))
    return claims


def unsourced_measurements(repo: Path) -> list[str]:
    """Every number a :func:`measured_claims` text quotes that does not stand where the results file it names allows,
    or that it quotes without naming one (and without quoting a paper or the released code); every sources.py string
    naming a results file without saying "measured"."""
    results = repo / RESULTS
    found = []
    for where, text in measured_claims(repo):
        found += [f"{where}: {path} is no file ({text[:80]!r})" for path in missing_files(text, results)]
        files = cited_files(text, results)
        if where.startswith("sources.py") and files and not MEASURED.search(text):
            found.append(f"{where}: names {', '.join(f.name for f in files)} without saying measured ({text[:80]!r})")
        if where.startswith("sources.py") and not files and not MEASURED.search(text):
            continue  # a paper's or the code's setting, or ours without a measurement
        if files:
            found += block_problems(where, text, files, named_rows(text))
            continue
        numbers = quoted_numbers(text, ratio_words=False)
        if numbers and not PAPER.search(text):
            found.append(f"{where}: {', '.join(n.printed for n in numbers[:5])} quoted with no results file "
                         f"({text[:80]!r})")
    return found


# --------------------------------------------------------------------------------------------------- history

HISTORY = re.compile(
    r"\b(?:as before|no longer|earlier default|previous default|the earlier objective|once produced|was lent|"
    r"previously|used to be|not yet run|not run yet|formerly|any ?more|until now|since then|"
    r"what .{0,30} does now|(?:is|are|takes|leads|runs) now|now (?:takes|leads|runs|uses|is|are|gives)|"
    r"older (?:code|training step|version)|at the time|had been|the current (?:one|objective|code|training step)|"
    r"measured so far|before: |before, |validated for hours before|has yet|here yet|from before)", re.IGNORECASE)
CHANGE = (r"(?:changed|replaced|switched|swapped|reverted|renamed|moved|dropped|removed|raised|lowered|halved|"
          r"doubled|became|turned|rewritten|rewrote|reworked|retired|superseded)")
# a change in the project's own history: "before this search changed it", "the default was switched", "until this
# commit", "the search replaced", "was changed ... default"
CHANGE_HISTORY = re.compile(
    rf"\b(?:before|until|since) this\b|\bchanged it\b"
    rf"|\b(?:default|defaults|search)\b(?:\W+\w+){{0,3}}?\W+(?:(?:was|were|has been|have been|got) )?{CHANGE}\b"
    rf"|\b(?:was|were|has been|have been|got) {CHANGE}\b(?:\W+\w+){{0,6}}?\W+(?:default|defaults|search)\b"
    rf"|\b(?:default|defaults|search)\b(?:\W+\w+){{0,6}}?\W+(?:was|were|has been|have been|got) {CHANGE}\b",
    re.IGNORECASE)
QUOTED = re.compile(r'"[^"]*"|`[^`]*`')  # a program's message or code, quoted as it is


def history_in(text: str) -> list[str]:
    """The development-history phrases of ``text`` outside quotes and code."""
    prose = QUOTED.sub(lambda m: " " + "\n" * m.group(0).count("\n"), text)
    return [m.group(0) for pattern in (HISTORY, CHANGE_HISTORY) for m in pattern.finditer(prose)]


def history_phrases(repo: Path) -> list[str]:
    """``where: phrase`` for each development-history phrase in README.md, docs/, params.yaml's comments and
    sources.py's strings (outside quotes and code)."""
    found = []
    for page in page_files(repo):
        text = QUOTED.sub(lambda m: " " + "\n" * m.group(0).count("\n"), page.read_text(encoding="utf-8"))
        for number, line in enumerate(text.splitlines(), 1):
            found += [f"{page.relative_to(repo)}:{number}: {phrase!r}" for phrase in history_in(line)]
    for line, text in comment_blocks((repo / "params.yaml").read_text(encoding="utf-8")):
        found += [f"params.yaml:{line}: {phrase!r}" for phrase in history_in(text)]
    for key, text in source_strings(repo):
        found += [f"sources.py: {key}: {phrase!r}" for phrase in history_in(text)]
    return found
