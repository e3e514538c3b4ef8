"""DVC plots: each plot declared once (top-level ``plots:`` in dvc.yaml) with columns the stages write,
and the page ``dvc plots show``/``diff`` fill holds Vega inline and loads nothing remote.

Fast (no pipeline): reads dvc.yaml, .dvc/config and .dvc/plots/, and writes the page (the Vega bundle
comes from the user's cache after the first build, about 2-4 s once). The pipeline test
(tests/test_pipeline.py) runs ``dvc plots show`` on real stage outputs.
"""

from __future__ import annotations

import configparser
import csv
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from dvc_render import render_html
from dvc_render.vega import VegaRenderer
from dvc_render.vega_templates import TEMPLATES

from debias.metrics import SCALAR_KEYS
from debias.report.artifacts import PER_GROUP_CSV, write_per_group_csvs
from debias.report.inputs import load_inputs
from debias.report.plots_page import GLOBALS, PLOTS_TEMPLATE, render_page, write_plots_template
from tests.conftest import REPO

DVC_YAML = yaml.safe_load((REPO / "dvc.yaml").read_text())
# Columns every training stage writes to its curves CSV, whatever the method (erm.py, methods.py, fit's validation).
CURVE_COLUMNS = {"epoch", "train/loss", *(f"val/{key}" for key in SCALAR_KEYS)}
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=", re.IGNORECASE)
REMOTE_URL_ATTRIBUTE = re.compile(r"""\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


def declared_plots() -> dict[str, dict]:
    """Top-level plots by name: ``{name: {"x": ..., "y": {file: [columns]}, ...}}``."""
    plots = {}
    for entry in DVC_YAML["plots"]:
        (name, spec), = entry.items()
        assert name not in plots, f"plot {name!r} declared twice"
        y = {file: [columns] if isinstance(columns, str) else list(columns) for file, columns in spec["y"].items()}
        plots[name] = {**spec, "y": y}
    return plots


def stage_outs() -> dict[str, str]:
    """Every declared output path -> its stage."""
    outs = {}
    for stage_name, stage in DVC_YAML["stages"].items():
        for kind in ("outs", "metrics", "plots"):
            for entry in stage.get(kind, []):
                outs[next(iter(entry)) if isinstance(entry, dict) else entry] = stage_name
    return outs


def curve_csv_header(path: str, tmp_path: Path) -> set[str]:
    """The header the code writes to ``path``: the per-group CSVs from the report with no inputs (header only)."""
    if path in {str(p) for p in PER_GROUP_CSV.values()}:
        write_per_group_csvs(load_inputs(tmp_path), tmp_path, 0.95)
        with open(tmp_path / path, newline="") as handle:
            return set(next(csv.reader(handle)))
    assert path.endswith("_curves.csv"), path
    return CURVE_COLUMNS


def test_each_plot_is_declared_once_and_no_stage_declares_its_own() -> None:
    plots = declared_plots()
    assert len(plots) >= 5
    assert not [name for name, stage in DVC_YAML["stages"].items() if stage.get("plots")], \
        "a stage's `plots:` adds a second plot of the file drawing every column: declare it at top level"
    drawn: dict[tuple[str, str], str] = {}
    for name, spec in plots.items():
        for file, columns in spec["y"].items():
            for column in columns:
                assert (file, column) not in drawn, f"{file}:{column} drawn by {drawn[(file, column)]!r} and {name!r}"
                drawn[(file, column)] = name
    for file in {file for file, _ in drawn}:
        assert file in stage_outs(), f"{file} is no stage's output (dvc plots diff could not find it in experiments)"
    for stage, kind in (("train_erm", "erm"), ("train_contrastive", "stage2")):
        for column in ("train/loss", "val/worst_group", "val/avg", "val/unbiased"):
            assert (f"reports/plots/{kind}_curves.csv", column) in drawn, (stage, column)
    for file in PER_GROUP_CSV.values():
        assert (str(file), "group") in drawn


def test_declared_columns_are_ones_the_stages_write(tmp_path: Path) -> None:
    for name, spec in declared_plots().items():
        for file, columns in spec["y"].items():
            header = curve_csv_header(file, tmp_path)
            assert spec["x"] in header, (name, file, spec["x"])
            assert set(columns) <= header, (name, file, sorted(set(columns) - header))


def test_templates_exist_and_use_dvcs_anchors() -> None:
    built_in = {template.DEFAULT_NAME for template in TEMPLATES}
    for name, spec in declared_plots().items():
        template = spec.get("template", "linear")
        if template in built_in:
            continue
        text = (REPO / ".dvc" / "plots" / f"{template}.json").read_text()
        for anchor in ("<DVC_METRIC_DATA>", "<DVC_METRIC_X>", "<DVC_METRIC_Y>"):
            assert anchor in text, (name, template, anchor)
        assert '"url"' not in text, f"{template}: data must come from DVC, not a URL"


def test_dvc_config_points_at_the_page_the_report_stage_writes() -> None:
    config = configparser.ConfigParser(inline_comment_prefixes=("#",))
    config.read(REPO / ".dvc" / "config")
    template = config["plots"]["html_template"].strip()  # DVC resolves a relative path from .dvc/
    assert (REPO / ".dvc" / template).resolve() == (REPO / PLOTS_TEMPLATE).resolve()
    assert stage_outs()[str(PLOTS_TEMPLATE)] == "report"
    ignored = subprocess.run(["git", "check-ignore", "-q", str(PLOTS_TEMPLATE)], cwd=REPO)
    assert ignored.returncode == 0, f"{PLOTS_TEMPLATE} (generated, 0.9 MB) must not be committed"


def test_page_holds_vega_inline_and_dvc_fills_it_without_a_cdn(tmp_path: Path) -> None:
    page_path = write_plots_template(tmp_path / "template.html")
    page = page_path.read_text(encoding="utf-8")
    assert not REMOTE_SCRIPT.search(page) and not REMOTE_URL_ATTRIBUTE.search(page)
    assert page.count("{plot_divs}") == 1 and "{scripts}" not in page  # {scripts} is where DVC puts its CDN tags
    for name in GLOBALS:
        assert name in page
    assert len(page) > 300_000  # vega + vega-lite + vega-embed, not a stub

    renderer = VegaRenderer([{"epoch": "0", "train/loss": "1.5", "rev": "workspace"},
                             {"epoch": "1", "train/loss": "1.2", "rev": "workspace"}],
                            "loss", x="epoch", y="train/loss", template="curves",
                            template_dir=str(REPO / ".dvc" / "plots"))
    out = Path(render_html([renderer], tmp_path / "plots" / "index.html", html_template=page_path))
    filled = out.read_text(encoding="utf-8")
    assert "vegaEmbed('#loss'" in filled and "{plot_divs}" not in filled
    assert not REMOTE_SCRIPT.search(filled) and "cdn.jsdelivr" not in filled


@pytest.mark.parametrize("closing", ["</script>", "</SCRIPT >"])
def test_a_closing_script_tag_inside_the_bundle_cannot_end_the_element(closing: str) -> None:
    bundle = f"var s = '{closing}';" + ";".join(f"{name}=1" for name in GLOBALS)
    page = render_page(bundle, {"vega": "6", "vega_lite": "5", "vega_embed": "7", "vl_convert": "1"})
    assert page.lower().count("</script") == 1
