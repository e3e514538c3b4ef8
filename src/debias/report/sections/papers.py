"""The papers section: the papers' numbers beside ours where protocol and method match."""

from __future__ import annotations

from debias.params import Params
from debias.report.card import pct
from debias.report.document import Block, Heading, Section, Table, Text, num
from debias.report.inputs import ReportInputs, fairkl_weight, stage2_method
from debias.report.paper import Comparison, compare, method_key, settings_for, strength_of
from debias.report.sections.base import ReportContext, ResultRow

TITLE = "Comparison with the papers"
METRIC_NAMES = {"avg": "average", "unbiased": "unbiased", "worst_group": "worst-group"}


def scale_rows(comparisons: list[Comparison], inputs: ReportInputs, params: Params,
               strength: float | None) -> list[list[str]]:
    """Paper scale against ours, one row per aspect (data, correlation, model, epochs, selection)."""
    splits = ((inputs.get("summary") or {}).get("splits")) or {}
    sizes = "/".join(f"{splits[s]['n']:,}" if s in splits else "?" for s in ("train", "val", "test"))
    realised = (splits.get("train") or {}).get("realised_correlation")
    settings = list({c.setting.key: c.setting for c in comparisons}.values())
    rows = []
    for setting in settings:
        paper_sizes = f"{setting.n_train:,}/{setting.n_val:,}/{setting.n_test:,}" if setting.n_val else \
            f"{setting.n_train:,}/none/{setting.n_test:,}"
        strengths = sorted({c.result.strength for c in comparisons if c.setting.key == setting.key}, reverse=True)
        train_n = (splits.get("train") or {}).get("n")
        share = f" ({100 * train_n / setting.n_train:.1f} % of the paper's training set)" if train_n else ""
        rows += [
            [setting.benchmark, "images (train/val/test)", f"{setting.source}: {paper_sizes}",
             f"{params.data.source}: {sizes}{share}"],
            [setting.benchmark, setting.strength_name, ", ".join(f"{s:g}" for s in strengths),
             f"{strength:g} (realised {num(realised)})" if strength is not None else "n/a"],
            [setting.benchmark, "model", setting.model, params.model.name],
            [setting.benchmark, "epochs", setting.epochs, f"ERM {params.erm.epochs}, stage 2 {params.stage2.epochs}"],
            [setting.benchmark, "model selection", setting.selection,
             f"ERM {params.erm.selection}, stage 2 {params.stage2.selection} (validation split)"],
            [setting.benchmark, "hardware / seeds", f"{setting.hardware}; mean over seeds", "this machine; one seed"],
        ]
    if any("fairkl" in c.result.matches[0] for c in comparisons if c.result.matches):
        rows.append(["", "FairKL bias labels", "true bias labels", f"`groups.method: {params.groups.method}`"])
    return rows


def paper_section(rows: list[ResultRow], inputs: ReportInputs, params: Params, labels: dict[str, str]) -> Section:
    """The papers' numbers beside ours where protocol and method match, with the scale difference; else why not."""
    if not params.report.paper_numbers:
        return Section(TITLE, [Text("Not shown: `report.paper_numbers` is false.")])
    protocol = (inputs.get("summary") or {}).get("protocol") or params.bias.protocol
    settings = settings_for(protocol)
    if not settings:
        return Section(TITLE, [Text(
            f"No paper number to compare with: the papers report the `foreground` (CMNIST*) and `background` "
            f"(Biased-MNIST) protocols, this run uses `{protocol}`.", note=True)])
    strength = strength_of(protocol, params.bias.foreground.p_corr, params.bias.background.rho)
    method = stage2_method(inputs, params)
    ours = {labels["erm"]: "erm"}
    if method is not None:
        ours[labels["stage2"]] = method_key(method, fairkl_weight(method, params))
    comparisons = compare(protocol, strength, ours)
    if not comparisons:
        return Section(TITLE, [Text(
            f"{', '.join(s.benchmark for s in settings)} ({protocol}) has no reported number for this run's methods "
            f"({', '.join(sorted(set(ours.values())))}).", note=True)])
    by_label = {r.label: r for r in rows}
    table_rows = []
    for c in comparisons:
        accuracy = by_label[c.our_row].accuracy or {}
        paper = f"{c.paper_value:.1f}" + (f" ± {c.paper_std:.1f}" if c.paper_std is not None else "")
        table_rows.append([c.setting.benchmark, c.result.method, f"{c.result.strength:g}", METRIC_NAMES[c.metric],
                           paper, c.our_row, pct(accuracy.get(c.metric))])
    blocks: list[Block] = [Table(["benchmark", "paper method", "strength", "metric", "paper %", "our row", "ours %"],
                                 table_rows, caption="; ".join(sorted({c.setting.paper for c in comparisons})))]
    if not all(c.same_strength for c in comparisons):
        strength_name = comparisons[0].setting.strength_name
        blocks.append(Text(f"Our {strength_name} = {strength:g} is not one the paper reports: its numbers are context, "
                           "not a like-for-like comparison.", note=True))
    blocks.append(Heading("Scale: the paper's run against ours"))
    blocks.append(Table(["benchmark", "", "paper", "ours"], scale_rows(comparisons, inputs, params, strength),
                        numeric=False))
    return Section(TITLE, blocks)


def section(context: ReportContext) -> Section:
    """This run against the papers."""
    return paper_section(context.rows, context.inputs, context.params, context.labels)
