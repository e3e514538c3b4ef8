"""The run's report: ``reports/report.md`` and a self-contained ``reports/report.html`` from every stage's outputs.

:func:`build_report` reads the files the upstream stages wrote (:mod:`debias.report.inputs`: metrics JSON, curves
CSV, run records, UMAP payloads), draws the figures as PNGs under ``reports/figures/`` and writes the per-group
accuracy CSVs for ``dvc plots`` (:mod:`debias.report.artifacts`), builds the sections (one module each under
:mod:`debias.report.sections`, in its registry's order) and renders the one document twice
(:mod:`debias.report.document`): markdown (images by relative path) and HTML (images as base64 data URIs, inline
CSS, no external reference: it opens from disk, offline).
A missing input never fails the build: its section says which file is missing and the rest is built.
"""

from __future__ import annotations

from pathlib import Path

from debias.core.io import atomic_path
from debias.params import Params
from debias.report.artifacts import FIGURE_FILES, draw_figures, protocol_colours, write_per_group_csvs
from debias.report.document import Section, render_html, render_markdown
from debias.report.inputs import ReportInputs, load_inputs, stage2_label, stage2_method
from debias.report.sections import REGISTRY
from debias.report.sections.base import ReportContext, model_summaries, result_rows

REPORT_MD = Path("reports/report.md")
REPORT_HTML = Path("reports/report.html")


def report_sections(inputs: ReportInputs, params: Params, root: Path, run_id: str | None,
                    labels: dict[str, str], drawn: dict[str, bool]) -> list[Section]:
    """The report's sections, in :data:`debias.report.sections.REGISTRY` order."""
    context = ReportContext(inputs, params, root, run_id, labels, drawn, result_rows(inputs, labels),
                            model_summaries(inputs, labels, params.report.confidence))
    return [module.section(context) for module in REGISTRY]


def build_report(root: Path, params: Params, run_id: str | None = None) -> list[Path]:
    """Read the stage outputs under ``root``, write figures, per-group CSVs, report.md and report.html; return them."""
    root = Path(root)
    inputs = load_inputs(root)
    labels = {"erm": "ERM", "stage2": stage2_label(stage2_method(inputs, params), params)}
    drawn = draw_figures(inputs, root, labels, params.report.dpi, protocol_colours(inputs.get("summary"), params))
    written = [root / path for path in FIGURE_FILES.values()] + write_per_group_csvs(inputs, root, params.report.confidence)
    sections = report_sections(inputs, params, root, run_id, labels, drawn)
    md_path, html_path = root / REPORT_MD, root / REPORT_HTML
    with atomic_path(md_path) as tmp:
        tmp.write_text(render_markdown(params.report.title, sections, md_path.parent, root), encoding="utf-8")
    with atomic_path(html_path) as tmp:
        tmp.write_text(render_html(params.report.title, sections, root), encoding="utf-8")
    return [md_path, html_path, *written]


def params_warnings(root: Path) -> list[str]:
    """The unread-param warnings of the run's stages (each declared param changed since the stage's previous run that
    the run does not read, as each stage found it when it started; :func:`debias.core.headline.recorded_unread`)."""
    from debias.core.headline import recorded_unread

    return list(dict.fromkeys(m for messages in recorded_unread(root).values() for m in messages))
