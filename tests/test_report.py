"""The report stage: report.md and a self-contained report.html from a small synthetic set of stage outputs.

Inputs are minimal valid versions of every file the upstream stages write (3 classes x 3 attributes,
one empty test group); the report is built once per variant and checked for its sections, self-containment
(every image a data: URI decoding to a PNG, no external reference), the figures and CSVs, the params diff,
the papers' numbers and a missing stage 2. A headless-Chromium screenshot runs when Chromium is installed.
"""

from __future__ import annotations

import base64
import csv
import importlib.util
import json
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml

from debias.core import paths
from debias.core.io import save_json, save_torch
from debias.metrics import GroupAccuracy, wilson_interval
from debias.schema import Params, validate
from debias.schema.applicability import RunContext, applies, rule_for
from debias.report import card, paper, params_table
from debias.report.artifacts import FIGURE_FILES, PER_GROUP_CSV, protocol_colours
from debias.report.build import REPORT_HTML, REPORT_MD, build_report
from debias.report.document import Section, Table, Text, anchor, render_markdown
from debias.report.inputs import (CURVE_INPUTS, JSON_INPUTS, ReportInputs, load_inputs, stage2_label, stage2_method,
                                  umap_test_path)
from debias.report.figures import placeholder
from debias.report.sections import SECTIONS
from debias.report.sections.base import result_rows
from debias.report.sections.curves import fairkl_activity_blocks
from debias.report.sections.papers import paper_section
from debias.report.sections.run_params import params_section
from debias.report.sections.stage_warnings import warnings_section
from tests.conftest import REPO, committed_text

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N = 3  # classes and attributes


def accuracy(avg: float, worst: float) -> dict:
    return {"avg": avg, "unbiased": avg - 0.01, "worst_group": worst, "aligned": 0.95, "conflicting": avg - 0.05, "n": 40}


WORST_CELL = (1, 2)  # the worst test group of both models
GROUP_N = 10  # test images per non-empty group
UNTRAINED_CELL = (1, 0)  # a test group without a training image (not the worst)
TRAIN_COUNTS = [[20, 1, 1], [0, 21, 1], [0, 1, 20]]  # the training split's images per (y, a); (2, 0) empty in test too


def group_table(value: float, worst: float) -> dict:
    """A 3x3 per-group report with the (2, 0) group empty and ``worst`` in :data:`WORST_CELL`."""
    per_group = [[None if (y, a) == (2, 0) else worst if (y, a) == WORST_CELL else value for a in range(N)]
                 for y in range(N)]
    counts = [[0 if (y, a) == (2, 0) else GROUP_N for a in range(N)] for y in range(N)]
    return {"test": {"per_group": per_group, "group_counts": counts, "empty_groups": [[2, 0]]}}


def representation(loss: float) -> dict:
    kinds = ("pos_aligned", "pos_conflicting", "neg_aligned", "neg_conflicting")
    return {"alignment_loss": loss, "mi_y": 0.9, "mi_a": 0.4, "h_y": 1.09, "h_a": 1.09, "n": 40,
            "distances": {kind: {"mean": 0.1 * (i + 1), "std": 0.1, "n_pairs": 10} for i, kind in enumerate(kinds)}}


def umap_payload(n: int = 30) -> dict:
    generator = torch.Generator().manual_seed(0)
    return {"coords": torch.randn(n, 2, generator=generator), "index": torch.arange(n),
            "y": torch.arange(n) % N, "a": (torch.arange(n) // N) % N}


def write_inputs(root: Path, protocol: str = "foreground", stage2_method: str = "cnc", train_umap: bool = True) -> Path:
    """Minimal valid versions of every file the report reads, under ``root``."""
    counts = {"train": TRAIN_COUNTS, "val": [[3] * N] * N, "test": [[5, 5, 5], [5, 5, 5], [0, 5, 5]]}
    save_json(root / paths.BIAS_SUMMARY, {"protocol": protocol, "splits": {
        name: {"n": sum(map(sum, c)), "n_classes": N, "n_attrs": N, "realised_correlation": 0.9, "n_aligned": 60,
               "n_conflicting": 6, "empty_groups": sum(v == 0 for row in c for v in row), "group_counts": c}
        for name, c in counts.items()}, "target_correlation": {"train": 0.9, "val": 1 / N, "test": 1 / N}})
    metrics = root / paths.METRICS
    save_json(metrics / "erm.json", {"selected_epoch": 1, "test": accuracy(0.6, 0.1), "val": accuracy(0.6, 0.1),
                                     "warnings": ["degenerate-selection: validation worst-group is 0 at every epoch"],
                                     "selection": {"rule": "last", "selected_epoch": 1, "degenerate": True,
                                                   "reason": "worst-group 0 at every epoch"}})
    save_json(metrics / "erm_groups.json", group_table(0.6, 0.1))
    save_json(metrics / "stage2_train.json", {"selected_epoch": 0, "method": stage2_method, "test": accuracy(0.8, 0.5)})
    save_json(metrics / "stage2_train_groups.json", group_table(0.8, 0.5))
    save_json(metrics / "stage2_train_info.json", {"method": stage2_method, "sampler": {"skipped_classes": [1]}})
    save_json(metrics / "probe.json", {
        "erm": {"trained": True, "method": "erm", "probe": {"test": accuracy(0.65, 0.2)}},
        "stage2": {"trained": True, "method": stage2_method, "probe": {"test": accuracy(0.82, 0.55)}}})
    save_json(metrics / "representation.json", {
        "erm": {"trained": True, "method": "erm", "test": representation(12.5)},
        "stage2": {"trained": True, "method": stage2_method, "test": representation(0.3)}})
    save_json(root / paths.GROUPS_METRICS, {
        "method": "cluster", "matched_accuracy": 0.9, "nmi": 0.7, "ari": 0.75, "minority_recall": 0.5,
        "minority_precision": 0.4, "n": 66, "n_inferred_minority": 8, "n_true_conflicting": 6, "n_found_conflicting": 3,
        "inferred_minority_per_class": [3, 3, 2], "true_conflicting_per_class": [2, 2, 2]})
    for name, columns in (("erm_curves.csv", "epoch,train/acc,train/loss,val/avg,val/worst_group"),
                          ("stage2_curves.csv", "epoch,train/loss,val/avg,val/worst_group")):
        extra = ",0.5" if name.startswith("erm") else ""
        rows = [f"{e}{extra},{1.5 - 0.5 * e},{0.3 + 0.1 * e},{0.1 * e}" for e in range(3)]
        (root / paths.PLOTS).mkdir(parents=True, exist_ok=True)
        (root / paths.PLOTS / name).write_text("\n".join([columns, *rows]) + "\n")
    for i, stage in enumerate(("download", "inject_bias", "train_erm", "infer_groups", "train_contrastive",
                               "linear_probe", "evaluate")):
        save_json(root / paths.RUNS / f"{stage}.json", {
            "stage": stage, "run_id": f"run{i:02d}{'0' * 26}", "tracking_uri": "sqlite:////repo/mlflow.db",
            "params_hash": f"hash{i}", "dvc_experiment": "exp-tiny", "wall_time_s": 1.5 * (i + 1)})
    save_json(root / paths.GROUPS_TIMINGS, {"total_s": 0.1})  # not a run record
    for model in ("erm", "stage2"):
        save_torch(root / umap_test_path(model), umap_payload(), kind="umap")
    train = umap_payload(66) if train_umap else {"coords": torch.zeros(0, 2), "index": torch.zeros(0, dtype=torch.long)}
    save_torch(root / paths.UMAP_TRAIN, {"coords": train["coords"], "index": train["index"]}, kind="umap")
    pd.DataFrame({"index": range(66), "y": [i % N for i in range(66)], "inferred_label": [i % N for i in range(66)],
                  "inferred_group": [(i % N) * N + (i % N) for i in range(66)],
                  "minority": [i % 9 == 0 for i in range(66)]}).to_parquet(root / paths.GROUPS_TABLE)
    placeholder(root / paths.SAMPLE_GRID, "samples")
    return root


def tiny_params(**changes: dict) -> Params:
    """Params with ``erm.lr`` changed from its default (plus ``changes``)."""
    raw: dict = {"erm": {"lr": 0.05}, "report": {"dpi": 60}}
    for key, value in changes.items():
        raw.setdefault(key, {}).update(value)
    return validate(raw)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    root = write_inputs(tmp_path_factory.mktemp("report"))
    return root, build_report(root, tiny_params(bias={"foreground": {"p_corr": 0.9}}), run_id="reportrun")


@pytest.fixture(scope="module")
def without_stage2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Inputs as after a pipeline whose stage 2 never ran, and whose groups stage ran no UMAP."""
    root = write_inputs(tmp_path_factory.mktemp("report-nostage2"), train_umap=False)
    for rel in (JSON_INPUTS["stage2"], JSON_INPUTS["stage2_groups"], JSON_INPUTS["stage2_info"],
                CURVE_INPUTS["stage2"], umap_test_path("stage2"), paths.RUNS / "train_contrastive.json"):
        (root / rel).unlink()
    note = {"trained": False, "note": "models/stage2.pt not found: stage2 not trained, skipped"}
    for name in ("probe", "representation"):
        path = root / JSON_INPUTS[name]
        save_json(path, {**json.loads(path.read_text()), "stage2": note})
    build_report(root, tiny_params())
    return root


class _Refs(HTMLParser):
    """Every src/href attribute and tag name of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.refs: list[tuple[str, str, str]] = []
        self.tags: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.refs += [(tag, name, value or "") for name, value in attrs if name in ("src", "href", "srcset", "poster")]


def page_refs(text: str) -> _Refs:
    parser = _Refs()
    parser.feed(text)
    return parser


@pytest.mark.slow
def test_every_section_heading_is_in_markdown_and_html(built) -> None:
    root, written = built
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    assert {root / REPORT_MD, root / REPORT_HTML} <= set(written)
    for title in SECTIONS:
        assert f"\n## {title}\n" in md, title
        css = ' class="card"' if title == "Headline" else ""
        assert f'<section id="{anchor(title)}"{css}><h2>{title}</h2>' in page, title


def test_html_is_self_contained_every_image_a_png_data_uri(built) -> None:
    root, _ = built
    refs = page_refs((root / REPORT_HTML).read_text())
    images = [value for tag, name, value in refs.refs if tag == "img"]
    assert len(images) == 5  # sample grid, per-group, UMAP, curves, inferred-group UMAP
    for tag, name, value in refs.refs:
        if name == "href":
            assert value.startswith("#"), value  # in-page links only
        else:
            assert value.startswith("data:image/png;base64,"), value[:80]
            assert base64.b64decode(value.split(",", 1)[1])[:8] == PNG_MAGIC
    assert not {"script", "link", "iframe"} & refs.tags


def test_markdown_images_point_at_pngs_beside_the_report(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    targets = [line.split("](", 1)[1].rstrip(")") for line in md.splitlines() if line.startswith("![")]
    assert len(targets) == 5
    for target in targets:
        assert (root / REPORT_MD).parent.joinpath(target).read_bytes()[:8] == PNG_MAGIC


def test_every_figure_and_per_group_csv_is_written(built) -> None:
    root, written = built
    for rel in FIGURE_FILES.values():
        assert (root / rel).read_bytes()[:8] == PNG_MAGIC, rel
        assert root / rel in written
    with open(root / PER_GROUP_CSV["erm"], newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == N * N - 1  # the empty group is left out, not written as 0
    assert {"group", "class", "attribute", "n", "accuracy", "low", "high"} == set(rows[0])
    assert ("2", "0") not in {(r["class"], r["attribute"]) for r in rows}


def test_outside_git_the_params_table_says_so_and_lists_departures_from_the_papers(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    params = md[md.index("## Params"):]
    assert "Not available: `git show HEAD:params.yaml` failed" in params
    assert "| `erm.lr` | 0.05 | 0.001 | no comment in params.yaml |" in params
    assert "`seed`" not in params and "stage2.cnc" not in md.split("## Params")[1].split("Not listed")[0]


def test_provenance_names_stage_runs_wall_times_and_the_experiment(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    assert "| train_erm | run02" in md and "| 4.5 |" in md
    assert "exp-tiny" in md and "reportrun" in md
    assert "infer_groups_timings" not in md  # reports/runs/ also holds step timings: not a stage


@pytest.mark.slow
def test_warnings_come_first_with_the_selection_blocks(built, without_stage2: Path) -> None:
    root, _ = built
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    assert md.index("## Warnings") < md.index("## Provenance")
    assert "| train_erm | degenerate-selection | degenerate-selection: validation worst-group is 0 at every epoch |" in md
    assert "| train_erm | last | 1 | yes | worst-group 0 at every epoch |" in md
    assert '<section id="warnings"><h2>Warnings</h2>\n<p class="note">1 warning from 1 stage' in page
    path = without_stage2 / JSON_INPUTS["erm"]
    save_json(path, {k: v for k, v in json.loads(path.read_text()).items() if k not in ("warnings", "selection")})
    section = render_markdown("t", [warnings_section(without_stage2)], without_stage2, without_stage2)
    assert "None: no stage reported a warning." in section


def test_umap_colours_the_attribute_as_the_protocol_paints_it() -> None:
    params = tiny_params()
    assert protocol_colours({"protocol": "foreground"}, params) == [list(c) for c in params.bias.foreground.colours]
    assert protocol_colours({"protocol": "background"}, params)[9] == [128, 128, 128]
    assert protocol_colours({"protocol": "given"}, params) is None


def test_feature_vectors_get_a_feature_summary_figure_not_a_placeholder(tmp_path: Path) -> None:
    from debias.data.store import BiasedSplit
    from debias.report.figures import feature_summary

    generator = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 2
    a = (torch.arange(60) // 2) % 2
    x = torch.randn(60, 30, generator=generator)
    x[:, 3] += 3 * a  # the attribute shows in one feature
    split = BiasedSplit(x, y, a, a == y, 2, 2, tuple(f"f{i}" for i in range(30)))
    feature_summary(split, tmp_path / "features.png")
    assert (tmp_path / "features.png").read_bytes()[:8] == PNG_MAGIC
    assert (tmp_path / "features.png").stat().st_size > 15_000  # a heatmap with labels, not a line of text


def test_results_table_has_erm_stage2_and_both_probes(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    low, high = wilson_interval(1, GROUP_N, 0.95)
    assert (f"| ERM | 60.0 | 59.0 | 10.0 | y=1, a=2 · n = 10 (< 30) · [{100 * low:.1f}, {100 * high:.1f}] | 95.0 | 55.0 "
            "| 12.500 | 0.900 | 0.400 |") in md
    assert "| ERM linear probe | 65.0 | 64.0 | 20.0 | – |" in md
    assert "| stage 2 (cnc) | 80.0 |" in md
    assert "| ERM linear probe | 65.0 |" in md and "| stage-2 linear probe | 82.0 |" in md
    assert "skipped classes [1]" in md


def test_paper_numbers_beside_ours_with_our_data_size(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    assert "| CMNIST* | CNC | 0.995 | worst-group | 77.4 ± 3.0 | stage 2 (cnc) | 50.0 |" in md
    assert "54,000/6,000/10,000" in md and "digits: 65/27/40" in md
    assert "p_corr = 0.9 is not one the paper reports" in md


def test_missing_stage2_degrades_gracefully(without_stage2: Path) -> None:
    root = without_stage2
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    for title in SECTIONS:
        assert f"## {title}" in md and f"<h2>{title}</h2>" in page
    assert "`reports/metrics/stage2_train.json` not found" in md
    assert "| stage 2 | n/a | n/a |" in md
    assert "stage2 not trained" in md
    assert "No UMAP of the training features" in md
    for rel in FIGURE_FILES.values():
        assert (root / rel).read_bytes()[:8] == PNG_MAGIC
    assert (root / PER_GROUP_CSV["stage2"]).read_text().strip() == "group,class,attribute,n,accuracy,low,high"
    assert "| CMNIST* | ERM | 0.995 | average | 20.1 | ERM | 60.0 |" in md  # ERM still compared


def paper_text(root: Path, params: Params) -> str:
    inputs = load_inputs(root)
    labels = {"erm": "ERM", "stage2": stage2_label(stage2_method(inputs, params), params)}
    section = paper_section(result_rows(inputs, labels), inputs, params, labels)
    return render_markdown("t", [section], root / "reports", root)


def test_biased_mnist_numbers_match_protocol_rho_and_fairkl(tmp_path: Path) -> None:
    root = write_inputs(tmp_path, protocol="background", stage2_method="eps_supinfonce")
    params = tiny_params(bias={"protocol": "background", "background": {"rho": 0.997}},
                         loss={"fairkl": {"weight": 0.5}})
    text = paper_text(root, params)
    assert "| Biased-MNIST | ε-SupInfoNCE + FairKL | 0.997 | unbiased | 96.2 ± 0.2 | stage 2 (eps_supinfonce + FairKL λ=0.5 (kl)) | 79.0 |" in text
    assert "| Biased-MNIST | CE | 0.997 | unbiased | 62.5 ± 2.9 |" in text
    assert "not one the paper reports" not in text
    assert "60,000/none/10,000" in text and "FairKL bias labels" in text


def test_no_paper_numbers_for_other_protocols_or_when_switched_off(tmp_path: Path) -> None:
    root = write_inputs(tmp_path, protocol="given")
    assert "this run uses `given`" in paper_text(root, tiny_params(bias={"protocol": "given"}))
    assert "Not shown" in paper_text(root, tiny_params(bias={"protocol": "given"}, report={"paper_numbers": False}))


def test_paper_matching_needs_protocol_and_method() -> None:
    assert paper.compare("foreground", 0.995, {"stage 2": "wcl"}) == []
    assert paper.compare("background", 0.995, {"stage 2": "cnc"}) == []
    matched = paper.compare("foreground", 0.995, {"stage 2": "jtt"})
    assert {(c.result.method, c.metric, c.paper_value, c.same_strength) for c in matched} == {
        ("JTT", "worst_group", 74.5, True), ("JTT", "avg", 90.2, True)}
    assert paper.method_key("eps_supinfonce", 0.5) == "eps_supinfonce+fairkl"
    assert paper.method_key("eps_supinfonce", 0.0) == "eps_supinfonce"


@pytest.mark.slow
def test_entrypoint_builds_the_report_in_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from debias.harness.tracking import StageRun

    write_inputs(tmp_path)
    monkeypatch.chdir(tmp_path)
    spec = importlib.util.spec_from_file_location("report_entry", REPO / "pipeline" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.run(tiny_params(), StageRun(None, None))
    assert (tmp_path / REPORT_HTML).stat().st_size > 10_000 and (tmp_path / REPORT_MD).exists()


def _load_check_script():
    spec = importlib.util.spec_from_file_location("check_report", REPO / "scripts" / "check_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(_load_check_script().find_chromium() is None,
                    reason="chromium is not installed (apt-get install -y chromium)")
def test_report_renders_in_headless_chromium(built, tmp_path: Path) -> None:
    root, _ = built
    check = _load_check_script()
    shot = tmp_path / "report.png"
    assert check.main([str(root / REPORT_HTML), "--out", str(shot), "--window-size", "1280,2000"]) == 0
    assert shot.read_bytes()[:8] == PNG_MAGIC and shot.stat().st_size > check.MIN_SCREENSHOT_BYTES


# --------------------------------------------------------------------------- headline card, intervals, params


def section_order(md: str) -> list[str]:
    return [line[3:] for line in md.splitlines() if line.startswith("## ")]


def test_headline_card_comes_first_with_worst_group_n_and_interval(built) -> None:
    root, _ = built
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    assert section_order(md) == list(SECTIONS) and SECTIONS[0] == "Headline"
    card_md = md.split("\n## ")[1]
    low, high = wilson_interval(5, GROUP_N, 0.95)  # stage 2's worst group: 50 % of 10
    assert "| average % [95 % interval] | 60.0 [" in card_md
    assert "| unbiased % (mean over groups) | 59.0 | 79.0 |" in card_md
    assert "| worst-group % | 10.0 (n = 10: " in card_md and " | 50.0 (n = 10: " in card_md
    assert "| worst group (class y, attribute a) | y=1, a=2 | y=1, a=2 |" in card_md
    assert "| its test images n | 10 (fewer than 30: read with care) | 10 (fewer than 30: read with care) |" in card_md
    assert f"[{100 * low:.1f}, {100 * high:.1f}] |" in card_md
    assert "1 warning: [degenerate-selection](#warnings) (train_erm)." in card_md
    assert "**Next: Read the warning `degenerate-selection` of train_erm first" in card_md
    # HTML: the card before the table of contents and every other section, its warning a working in-page link
    first_section = page.index("<section")
    assert page.index('<section id="headline" class="card">') == first_section < page.index("<nav>")
    assert '<a href="#warnings">degenerate-selection</a> (train_erm)' in page and 'id="warnings"' in page


def test_every_group_accuracy_carries_its_interval_and_n(built) -> None:
    root, _ = built
    md = (root / REPORT_MD).read_text()
    table = md[md.index("| y | a | test images n |"):].split("\n\n")[0].splitlines()[2:]
    assert len(table) == N * N - 1  # every non-empty group, the empty one left out
    low, high = wilson_interval(1, GROUP_N, 0.95)
    assert table[0].startswith(f"| 1 | 2 | 10 (< 30) | 1 | 10.0 [{100 * low:.1f}, {100 * high:.1f}] | 50.0 [")  # lowest first
    with open(root / PER_GROUP_CSV["erm"], newline="") as handle:
        rows = {(r["class"], r["attribute"]): r for r in csv.DictReader(handle)}
    assert float(rows[("1", "2")]["low"]) == pytest.approx(low, abs=1e-6)
    assert float(rows[("1", "2")]["high"]) == pytest.approx(high, abs=1e-6)


def facts(**changes) -> card.Facts:
    base = dict(warnings=[], erm_worst=0.1, s2_worst=0.5, worst=GroupAccuracy(1, 2, 0.5, 100, 0.4, 0.6), min_n=30,
                confidence=0.95, seeds=None)
    return card.Facts(**{**base, **changes})


def test_the_next_step_line_follows_the_results() -> None:
    small = GroupAccuracy(3, 1, 5 / 13, 13, *wilson_interval(5, 13, 0.95))
    assert card.next_step(facts(warnings=[("train_erm", "degenerate-selection: x"), ("evaluate", "y")])) == (
        "Read the warning `degenerate-selection` of train_erm first (and 1 more): [Warnings](#warnings).")
    assert card.next_step(facts(s2_worst=None)).startswith("Stage 2 has no test result")
    line = card.next_step(facts(worst=small))
    assert "(y=3, a=1) has only n = 13 test images (< 30)" in line and "[17.7, 64.5] spans 47 points" in line
    assert card.next_step(facts(s2_worst=0.1)).startswith("Stage 2 does not beat ERM on worst-group (10.0 % against 10.0 %)")
    assert card.next_step(facts()) == ("Stage 2 beats ERM on worst-group by 40.0 points on one run: check it holds "
                                       "over >= 3 seeds (`debias compare`).")
    assert "(mean of 2 seeds): run >= 3 seeds" in card.next_step(facts(seeds=2))
    assert card.next_step(facts(seeds=3)).startswith("Stage 2 beats ERM on worst-group by 40.0 points over 3 seeds")


def test_a_table_whose_rows_are_all_the_same_is_one_line() -> None:
    same = Table(["epoch", "+ side active %", "− side active %"], [[str(e), "100", "100"] for e in range(30)],
                       same_rows="epochs")
    text = render_markdown("t", [Section("s", [same])], Path("."), Path("."))
    assert "All 30 epochs (0–29) are the same: + side active % 100, − side active % 100." in text
    assert "| 29 |" not in text
    differs = Table(same.headers, [*same.rows[:-1], ["29", "100", "50"]], same_rows="epochs")
    assert "| 29 | 100 | 50 |" in render_markdown("t", [Section("s", [differs])], Path("."), Path("."))
    plain = Table(same.headers, same.rows)  # only tables that say what their rows are collapse
    assert "| 29 | 100 | 100 |" in render_markdown("t", [Section("s", [plain])], Path("."), Path("."))


def test_yaml_comments_read_the_block_above_and_the_inline_comment() -> None:
    text = ("erm:\n  # block about the\n  # optimiser\n  optimizer: sgd\n  lr: 0.01   # inline\n"
            "             # continued\n  epochs: 10\n\nbias:\n  foreground:\n    p_corr: 0.9  # 'quoted # not a comment'\n")
    comments = params_table.yaml_comments(text)
    assert comments["erm.optimizer"] == "block about the optimiser"
    assert comments["erm.lr"] == "inline continued"
    assert comments["erm.epochs"] == ""
    assert params_table.reason("erm.epochs", comments) == "inline continued"  # the nearest comment above it
    assert comments["bias.foreground.p_corr"] == "'quoted # not a comment'"
    assert params_table.reason("bias.foreground.colours", comments) == ""


def test_params_that_do_not_apply_are_not_listed() -> None:
    folder = tiny_params(data={"source": "imagefolder", "imagefolder": {"root": "/x"}}, bias={"protocol": "given"},
                         stage2={"method": "eps_supinfonce"})
    context = RunContext(folder, "given")
    assert not applies("bias.foreground.p_corr", context) and not applies("stage2.cnc.num_positives", context)
    assert applies("data.imagefolder.root", context) and applies("erm.lr", context)
    digits = RunContext(tiny_params(stage2={"method": "cnc"}), "foreground")
    assert applies("stage2.cnc.num_positives", digits) and applies("bias.foreground.p_corr", digits)
    assert not applies("data.imagefolder.root", digits) and not applies("loss.fairkl.weight", digits)
    assert not applies("stage2.head.max_iter", digits)  # CNC trains its head with the encoder
    assert applies("stage2.head.max_iter", RunContext(tiny_params(stage2={"method": "supcon"})))
    auto = RunContext(tiny_params(), None)  # protocol auto and no summary yet: every protocol section is kept
    assert applies("bias.background.rho", auto) and applies("bias.foreground.p_corr", auto)
    assert rule_for("data.imagefolder.root") == "data.imagefolder." and rule_for("seed") is None


def git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True, capture_output=True)


def test_params_table_against_the_committed_file_with_the_reasons(tmp_path: Path) -> None:
    """In git: this run's change against HEAD:params.yaml, and the committed departures from the papers with
    params.yaml's comment; an imagefolder run lists neither bias.foreground.* nor stage2.cnc.*."""
    text = committed_text("params.yaml")
    (tmp_path / "params.yaml").write_text(text)
    git(tmp_path, "init", "-q")
    git(tmp_path, "add", "params.yaml")
    git(tmp_path, "commit", "-qm", "params")
    committed = yaml.safe_load(text)
    run = validate({**committed, "erm": {**committed["erm"], "lr": 0.2}})
    section = params_section(ReportInputs({}, {}, {}, {}, None, None, None, []), run, tmp_path)
    md = render_markdown("t", [section], tmp_path, tmp_path)
    changed, departures = md.split("### Where the committed params depart from the papers")
    assert f"| `erm.lr` | 0.2 | {committed['erm']['lr']} |" in changed
    assert changed.count("| `") == 1  # nothing else changed
    p_corr = next(line for line in departures.splitlines() if line.startswith("| `bias.foreground.p_corr`"))
    assert "| 0.995 |" in p_corr and "CNC uses 0.995" in p_corr  # the reason from params.yaml's comment
    folder = validate({**committed, "data": {**committed["data"], "source": "imagefolder",
                                             "imagefolder": {**committed["data"]["imagefolder"], "root": "/x"}},
                       "bias": {**committed["bias"], "protocol": "given"},
                       "stage2": {**committed["stage2"], "method": "eps_supinfonce"}})  # stage2.cnc.* do not apply
    inputs = ReportInputs({"summary": {"protocol": "given"}}, {}, {}, {}, None, None, None, [])
    md = render_markdown("t", [params_section(inputs, folder, tmp_path)], tmp_path, tmp_path)
    assert "| `data.source` | imagefolder |" in md and "| `data.imagefolder.root` | /x |" in md
    assert "| `bias.foreground" not in md and "| `stage2.cnc" not in md
    assert "Not listed:" in md and "`bias.foreground.p_corr`" in md.split("Not listed:")[-1]


def test_fairkl_activity_constant_over_epochs_is_one_line() -> None:
    """The issue's case: FairKL active in 100 % of the steps at each of 30 epochs is one line, not 30 rows; the
    pair counts, which do vary, are summarised by their mean and range."""
    epochs = [{"epoch": e, "pos_active": 1.0, "neg_active": 1.0,
               "pairs": {"pos_aligned": 10.0 + e % 2, "pos_conflicting": 2.0, "neg_aligned": 40.0, "neg_conflicting": 8.0}}
              for e in range(30)]
    info = {"fairkl": {"sampler": "shuffle", "batch_size": 256, "epochs": epochs}}
    inputs = ReportInputs({"stage2_info": info}, {}, {}, {}, None, None, None, [])
    [block] = fairkl_activity_blocks(inputs)
    assert isinstance(block, Text)
    assert "In every one of the 30 epochs the + side was active in 100 % and the − side in 100 % of the steps" in block.text
    assert "same y, same b 10.5 (10.0–11.0)" in block.text
    epochs[3]["neg_active"] = 0.5  # the activity changes: the per-epoch table
    [table] = fairkl_activity_blocks(inputs)
    assert isinstance(table, Table) and len(table.rows) == 30 and table.rows[3][2] == "50"


def test_the_warnings_line_counts_each_code_once_with_its_stages() -> None:
    found = [("train_erm", "chance-level: val"), ("train_erm", "chance-level: test"), ("infer_groups", "weak-groups: x"),
             ("train_contrastive", "chance-level: test")]
    assert card.warnings_line(found) == ("4 warnings: [chance-level](#warnings) × 3 (train_erm, train_contrastive), "
                                         "[weak-groups](#warnings) (infer_groups). Read them before the numbers.")
    assert card.warnings_line([]) == "No warnings."


def test_a_group_with_no_training_image_is_named_so_in_the_card_the_heatmap_and_compare(tmp_path) -> None:
    """A worst group the training split holds no image of is named "no training image" wherever its accuracy is
    shown: the card's worst group, the results rows (its name), compare's worst group; the heatmap crosses it out."""
    from debias.report import figures
    from debias.tools.compare.collect import GROUP_FILES, Experiment
    from debias.tools.compare.page import worst_groups

    table = {"per_group": [[0.9, 0.0], [0.8, 0.7]], "group_counts": [[10, 5], [10, 10]]}
    summary = {"splits": {"train": {"group_counts": [[50, 0], [3, 40]]}}}
    train_counts = card.train_group_counts(summary)
    summary_of = card.model_summary("stage 2", {"avg": 0.7, "unbiased": 0.6, "worst_group": 0.0}, table, 0.95,
                                    train_counts)
    assert summary_of.worst_group.train_n == 0
    assert card.group_name(summary_of.worst_group) == "y=0, a=1, no training image"
    _, rows = card.card_table([summary_of], 30, 0.95)
    assert ["worst group (class y, attribute a)", "y=0, a=1, no training image"] in rows
    unknown = card.model_summary("stage 2", None, table, 0.95)  # no bias summary: nothing claimed
    assert unknown.worst_group.train_n is None and card.group_name(unknown.worst_group) == "y=0, a=1"
    seen = card.model_summary("stage 2", None, {**table, "per_group": [[0.0, 0.5], [0.8, 0.7]]}, 0.95, train_counts)
    assert card.group_name(seen.worst_group) == "y=0, a=0"  # a group trained on is named as before
    files = {str(GROUP_FILES["stage2"]): json.dumps({"test": table}), "data/biased/summary.json": json.dumps(summary)}
    run = Experiment("e", "experiment", {"seed": 0}, {}, reader=lambda path: files.get(str(path)))
    assert card.group_name(worst_groups(run, 0.95)["stage2"]) == "y=0, a=1, no training image"
    figures.per_group_heatmaps([("stage 2", table["per_group"], table["group_counts"])], tmp_path / "h.png",
                               train_counts)
    assert (tmp_path / "h.png").read_bytes().startswith(PNG_MAGIC)


# --------------------------------------------------------------------------- what one image weighs, untrained groups


def test_the_headline_gives_the_worst_groups_n_and_what_one_image_moves_it_by(built) -> None:
    """Next to each model's worst-group number: its n and the step of one image, 100 / n points, in both pages."""
    root, _ = built
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    step = f"{100 / GROUP_N:.1f}"  # 10.0 points: one of the worst group's ten test images
    row = f"| worst-group % | 10.0 (n = {GROUP_N}: one image = {step} points) | 50.0 (n = {GROUP_N}: one image = {step} points) |"
    assert row in md.split("\n## ")[1]
    card_html = page[page.index('<section id="headline"'):page.index("</section>")]
    assert f"50.0 (n = {GROUP_N}: one image = {step} points)" in card_html


def test_the_step_of_one_image_is_a_hundred_over_n_points() -> None:
    """The tracker's case: 4 of 13 reads '30.8 (n = 13: one image = 7.7 points)'; a large n keeps two digits."""
    worst = GroupAccuracy(3, 1, 4 / 13, 13, *wilson_interval(4, 13, 0.95))
    model = card.ModelSummary("stage 2", 0.9, 0.8, 4 / 13, 100, None, worst, (worst,))
    _, rows = card.card_table([model], 30, 0.95)
    assert ["worst-group %", "30.8 (n = 13: one image = 7.7 points)"] in rows
    assert ["its test images n", "13 (fewer than 30: read with care)"] in rows
    assert [card.points_text(card.image_step(n)) for n in (1, 3, 13, 400, 10_000)] == [
        "100.0", "33.3", "7.7", "0.25", "0.010"]
    no_table = card.ModelSummary("stage 2", 0.9, 0.8, 0.5, 100, None, None)  # no per-group file: no n to give
    assert ["worst-group %", "50.0"] in card.card_table([no_table], 30, 0.95)[1]


def test_a_test_group_with_no_training_image_is_named_in_the_headline_and_the_per_group_table(built) -> None:
    """The fixture's (1, 0) has test images but no training image and is not the worst group: the card names it
    with each model's accuracy, and its row of the per-group table says so; trained groups give their count."""
    root, _ = built
    md, page = (root / REPORT_MD).read_text(), (root / REPORT_HTML).read_text()
    y, a = UNTRAINED_CELL
    assert TRAIN_COUNTS[y][a] == 0
    line = f"No training image: y={y}, a={a} (n = {GROUP_N} test images: ERM 60.0 %, stage 2 (cnc) 80.0 %)."
    assert line in md.split("\n## ")[1]
    assert line in page[page.index('<section id="headline"'):page.index("</section>")]
    table = md[md.index("| y | a | test images n | training images n |"):].split("\n\n")[0].splitlines()[2:]
    rows = {tuple(row.split(" | ")[:2]): row for row in table}
    assert rows[(f"| {y}", f"{a}")].startswith(f"| {y} | {a} | {GROUP_N} (< 30) | 0 (no training image) | 60.0 [")
    wy, wa = WORST_CELL
    assert rows[(f"| {wy}", f"{wa}")].startswith(f"| {wy} | {wa} | {GROUP_N} (< 30) | {TRAIN_COUNTS[wy][wa]} | 10.0 [")
    assert sum("no training image" in row for row in table) == 1


def test_a_worst_group_without_a_training_image_is_named_so_in_the_headline(tmp_path: Path) -> None:
    """When the worst group is the untrained one, the card's worst-group row, the untrained line and the next-step
    line say so; without training counts (no bias summary) nothing is claimed and the table has no such column."""
    from debias.report.sections.headline import headline_section
    from debias.report.sections.per_group import interval_rows

    table = {"per_group": [[0.9, 2 / 13], [0.8, 0.7]], "group_counts": [[40, 13], [40, 40]]}
    train = [[50, 0], [3, 40]]
    summaries = {model: card.model_summary(label, {"avg": 0.8, "unbiased": 0.7, "worst_group": 2 / 13}, table, 0.95,
                                           train)
                 for model, label in (("erm", "ERM"), ("stage2", "stage 2"))}
    md = render_markdown("t", [headline_section(summaries, tmp_path, tiny_params())], tmp_path, tmp_path)
    assert "| worst group (class y, attribute a) | y=0, a=1, no training image | y=0, a=1, no training image |" in md
    assert "| worst-group % | 15.4 (n = 13: one image = 7.7 points) |" in md
    assert "No training image: y=0, a=1 (n = 13 test images: ERM 15.4 %, stage 2 15.4 %)." in md
    assert "The worst group (y=0, a=1, no training image) has only n = 13" in md
    rows = interval_rows(summaries, 30)
    assert rows[0][:4] == ["0", "1", "13 (< 30)", "0 (no training image)"]
    assert {(row[0], row[1]): row[3] for row in rows} == {("0", "0"): "50", ("0", "1"): "0 (no training image)",
                                                          ("1", "0"): "3", ("1", "1"): "40"}
    unknown = {m: card.model_summary(s.label, None, table, 0.95) for m, s in summaries.items()}
    assert card.untrained_line(list(unknown.values())) is None
    assert [len(row) for row in interval_rows(unknown, 30)] == [5] * 4  # y, a, test n and the two models: no train n
    md = render_markdown("t", [headline_section(unknown, tmp_path, tiny_params())], tmp_path, tmp_path)
    assert "No training image" not in md and "no training image" not in md
