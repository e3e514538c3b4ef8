"""The report's document model (Text, Heading, Table, Figure, Columns, Section) and its Markdown and HTML renderers.

``reports/report.*`` and ``debias compare``'s page are both a list of :class:`Section` of plain blocks, so the two
renderers share one content: markdown (images by relative path) and HTML (images as base64 data URIs, inline CSS,
no external reference: it opens from disk, offline).
"""

from __future__ import annotations

import base64
import html
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Text:
    """A paragraph; ``note`` marks what is missing or caveated. Backticks mark code."""

    text: str
    note: bool = False
    lead: bool = False  # the line a reader should act on (bold)


@dataclass(frozen=True)
class Heading:
    """A sub-heading inside a section."""

    text: str


@dataclass(frozen=True)
class Table:
    """A table of preformatted cells."""

    headers: list[str]
    rows: list[list[str]]
    caption: str | None = None
    numeric: bool = True  # right-align cells that read as numbers
    same_rows: str | None = None  # what the rows are ("epochs"): when every row but its first cell is the same, one line


@dataclass(frozen=True)
class Figure:
    """A PNG under the report root, with a caption."""

    path: Path
    caption: str


@dataclass(frozen=True)
class Columns:
    """Blocks shown side by side in HTML, one after another in markdown."""

    blocks: list[Block]


Block = Text | Heading | Table | Figure | Columns


@dataclass
class Section:
    """A titled part of the report (a heading in md, a <section> in HTML)."""

    title: str
    blocks: list[Block] = field(default_factory=list)
    card: bool = False  # the headline card: above the table of contents, boxed


def anchor(title: str) -> str:
    """The HTML id of a section title: lower case, runs of other characters as '-'."""
    return re.sub(r"[^a-z0-9]+", "-", title.lower()).strip("-")


def num(value: float | None, digits: int = 3) -> str:
    """A float with ``digits`` decimals, 'n/a' for None/NaN; the needs-bias-labels marker as itself."""
    if isinstance(value, str):
        return value
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def show(value: Any, width: int = 70) -> str:
    """A param value as written in params.yaml (JSON for lists and null), cut to ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def collapse_same_rows(table: Table) -> Block:
    """A :class:`Table` with ``same_rows`` whose rows all agree but in their first cell, as one line ('All 30 epochs
    (0–29): + side active % 100, …'); any other block unchanged."""
    if not table.same_rows or len(table.rows) < 2 or any(row[1:] != table.rows[0][1:] for row in table.rows):
        return table
    values = ", ".join(f"{h} {c}" for h, c in zip(table.headers[1:], table.rows[0][1:]))
    span = f"{table.rows[0][0]}–{table.rows[-1][0]}"
    caption = f" {table.caption}" if table.caption else ""
    return Text(f"All {len(table.rows)} {table.same_rows} ({span}) are the same: {values}.{caption}")


def alt_text(figure: Figure) -> str:
    """Short alternative text of a figure: its file name in words."""
    return figure.path.stem.replace("_", " ")


def _md_cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _markdown_blocks(blocks: list[Block], md_dir: Path, root: Path) -> list[str]:
    lines: list[str] = []
    for block in blocks:
        block = collapse_same_rows(block) if isinstance(block, Table) else block
        if isinstance(block, Text):
            lines += [f"> **Note:** {block.text}" if block.note else f"**{block.text}**" if block.lead else block.text, ""]
        elif isinstance(block, Heading):
            lines += [f"### {block.text}", ""]
        elif isinstance(block, Table):
            if block.caption:
                lines += [f"*{block.caption}*", ""]
            lines.append("| " + " | ".join(_md_cell(h) for h in block.headers) + " |")
            lines.append("|" + "|".join("---" for _ in block.headers) + "|")
            lines += ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in block.rows]
            lines.append("")
        elif isinstance(block, Figure):
            rel = os.path.relpath(root / block.path, md_dir)
            lines += [f"![{alt_text(block)}]({Path(rel).as_posix()})", "", f"*{block.caption}*", ""]
        elif isinstance(block, Columns):
            lines += _markdown_blocks(block.blocks, md_dir, root)
    return lines


def render_markdown(title: str, sections: list[Section], md_dir: Path, root: Path) -> str:
    """The report as markdown; images by path relative to ``md_dir``."""
    lines = [f"# {title}", ""]
    for section in sections:
        lines += [f"## {section.title}", ""]
        lines += _markdown_blocks(section.blocks, md_dir, root)
    return "\n".join(lines).rstrip() + "\n"


_NUMERIC = re.compile(r"^(n/a|[-+]?[\d,.]+( ± [\d.]+)?( / [-+]?[\d.]+)?|…)$")


def _inline(text: str) -> str:
    """Escape ``text`` for HTML, turn `code` spans into <code> and in-page links ``[text](#id)`` into <a>."""
    escaped = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return re.sub(r"\[([^\]]+)\]\((#[a-z0-9-]*)\)", r'<a href="\2">\1</a>', escaped)


def data_uri(path: Path) -> str:
    """A PNG file as a ``data:image/png;base64`` URI."""
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


def _html_blocks(blocks: list[Block], root: Path) -> list[str]:
    out: list[str] = []
    for block in blocks:
        block = collapse_same_rows(block) if isinstance(block, Table) else block
        if isinstance(block, Text):
            css = ' class="note"' if block.note else ' class="next"' if block.lead else ""
            out.append(f"<p{css}>{_inline(block.text)}</p>")
        elif isinstance(block, Heading):
            out.append(f"<h3>{_inline(block.text)}</h3>")
        elif isinstance(block, Table):
            out.append('<div class="table"><table>')
            if block.caption:
                out.append(f"<caption>{_inline(block.caption)}</caption>")
            if any(block.headers):
                out.append("<thead><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in block.headers) + "</tr></thead>")
            out.append("<tbody>")
            for row in block.rows:
                cells = "".join(f'<td class="num">{_inline(c)}</td>' if block.numeric and _NUMERIC.match(c)
                                else f"<td>{_inline(c)}</td>"
                                for c in row)
                out.append(f"<tr>{cells}</tr>")
            out.append("</tbody></table></div>")
        elif isinstance(block, Figure):
            out.append(f'<figure><img src="{data_uri(root / block.path)}" alt="{html.escape(alt_text(block))}">'
                       f"<figcaption>{_inline(block.caption)}</figcaption></figure>")
        elif isinstance(block, Columns):
            out.append('<div class="columns">' + "".join(_html_blocks(block.blocks, root)) + "</div>")
    return out


STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; margin: 0; background: #fafafa; }
main { max-width: 1100px; margin: 0 auto; padding: 1.5em 2em 4em; background: #fff; }
h1 { margin-top: 0; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 1.8em; }
h3 { margin: 1.2em 0 .4em; font-size: 1.02em; }
nav ol { columns: 2; margin: 0; } nav { background: #f3f5f8; padding: .6em 1em; border-radius: 4px; }
.table { overflow-x: auto; margin: .6em 0 1em; }
table { border-collapse: collapse; font-size: 13px; }
caption { caption-side: bottom; text-align: left; color: #555; font-size: 12px; padding-top: .3em; max-width: 900px; }
th, td { border: 1px solid #d8dbe0; padding: 3px 8px; vertical-align: top; }
th { background: #eef1f5; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafbfc; }
code { background: #f1f1f1; padding: 0 3px; border-radius: 3px; font-size: 12px; }
.note { background: #fff6e0; border-left: 4px solid #e0a800; padding: .4em .8em; }
#warnings { border: 1px solid #e0a800; border-radius: 4px; padding: 0 1em .6em; margin-top: 1em; background: #fffdf5; }
#warnings h2 { border: 0; margin-top: .6em; }
.card { border: 2px solid #3b6ea8; border-radius: 6px; padding: 0 1em .6em; margin: 1em 0; background: #f5f9ff; }
.card h2 { border: 0; margin-top: .5em; } .card .table { margin-bottom: .4em; }
.next { font-weight: 600; }
figure { margin: 1em 0; } figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
figcaption { color: #555; font-size: 12px; }
.columns { display: flex; flex-wrap: wrap; gap: 1.5em; align-items: flex-start; }
"""


def render_html(title: str, sections: list[Section], root: Path, style: str = "") -> str:
    """The report as one self-contained HTML page: inline CSS (``style`` added to it), images as data URIs, only
    in-page links."""
    toc = "".join(f'<li><a href="#{anchor(s.title)}">{html.escape(s.title)}</a></li>' for s in sections if not s.card)
    cards, body = [], []
    for section in sections:
        target = cards if section.card else body
        css = ' class="card"' if section.card else ""
        target.append(f'<section id="{anchor(section.title)}"{css}><h2>{html.escape(section.title)}</h2>')
        target += _html_blocks(section.blocks, root)
        target.append("</section>")
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{STYLE}{style}</style>\n</head>\n<body>\n<main>\n"
            f"<h1>{html.escape(title)}</h1>\n" + "".join(f"{line}\n" for line in cards)
            + f"<nav><ol>{toc}</ol></nav>\n" + "\n".join(body) + "\n</main>\n</body>\n</html>\n")
