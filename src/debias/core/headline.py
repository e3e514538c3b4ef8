"""Headline metrics: one small ``reports/metrics/<stage>.json`` per stage, the only files dvc.yaml declares as
DVC ``metrics`` (so ``dvc exp show`` has a few dozen columns, not hundreds); the detailed JSONs the stages
write stay ordinary outputs. Also each stage's warnings and model-selection block, read from those detailed
files.

The stage harness (:mod:`debias.harness.stage`) writes a stage's headline file from the detailed file it wrote
(:data:`DETAILED`) after the stage's body, and logs it to MLflow. Keys are flat (no dots), unique across
stages (DVC prefixes a column with its file's path only when a key repeats) and never start like a param
section, so ``dvc exp show --keep/--drop`` patterns can tell metrics from params:

    inject_bias        bias_corr, bias_conflicting, bias_n   training split: realised correlation, bias-conflicting
                                                          images, images
    train_erm          erm_avg, erm_unbiased, erm_worst    ERM on the test split (fractions)
    infer_groups       groups_matched, groups_recall       inferred bias labels: matched accuracy, minority recall
    train_contrastive  s2_avg, s2_unbiased, s2_worst       the stage-2 model on the test split
    linear_probe       probe_erm_*, probe_s2_*             linear probes of both encoders (avg, unbiased, worst)
    evaluate           align_erm, align_s2, mi_a_erm, mi_a_s2   alignment loss and Î(A;Z) (nats), test split

Binary tasks (a ``fairness`` block in the detailed file) add, on the test split, ``erm_eod``, ``erm_dpd``,
``s2_eod``, ``s2_dpd`` (equalized-odds and demographic-parity differences), ``s2_val_avg`` (the selected stage-2
model's validation accuracy, by which a grid of stage-2 runs is chosen) and, with ``probe.postprocess``, the
post-processed ERM probe's ``probe_erm_eo_avg``, ``probe_erm_eo_worst``, ``probe_erm_eo_eod``, ``probe_erm_eo_dpd``.

Data without bias labels: a key whose number needs them holds the text ``needs bias labels`` (never 0 or a dropped
key), and the accuracies add ``<prefix>_worst_class`` (worst-class accuracy, e.g. ``erm_worst_class``).

Values are rounded to :data:`DIGITS` decimals (a test split of 10,000 images moves an accuracy by 1e-4);
a value the detailed file lacks (a stage 2 that did not train) is left out, never written as 0.
Every reader tolerates files without ``warnings`` or ``selection``: older outputs have neither.

The headline files are git-tracked (``cache: false``), so a merge, a rebase or a hand edit can leave them out of step
with dvc.lock. Every reader of a metrics file outside a DVC stage (``debias compare``, the sweep, the report run by
hand) checks it against the md5 dvc.lock records (:func:`lock_mismatches`, :func:`mismatches`) and leaves a file that
does not match out, saying so (:func:`mismatch_message`); under DVC a stage reads only its deps, which DVC has brought
in line with dvc.lock before running it (:func:`checks_lock`). DVC deletes a stage's outputs before it runs it and
``dvc checkout`` cannot restore a ``cache: false`` one, so when a stage fails under DVC the harness puts its headline
file back as dvc.lock records it, from HEAD or DVC's cache (:func:`restore_recorded`): a failed run leaves the
recorded numbers.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import Any, NamedTuple

from debias.core import paths
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.core.io import atomic_path, load_json, save_json

DIGITS = 4


def percent_text(value: float, digits: int = 1) -> str:
    """A fraction as a percentage with ``digits`` decimals, as every page and terminal prints it: the fraction rounded
    to the :data:`DIGITS` decimals a headline file holds, then half up (0.604545 and its headline 0.6045 both read
    60.5; float formatting alone read 0.6045 as 60.4)."""
    if not math.isfinite(float(value)):
        return f"{100 * float(value):.{digits}f}"  # nan, inf: as Python prints them
    fraction = Decimal(repr(round(float(value), DIGITS)))
    return str((fraction * 100).quantize(Decimal(1).scaleb(-digits), rounding=ROUND_HALF_UP))
STAGES = ("inject_bias", "train_erm", "infer_groups", "train_contrastive", "linear_probe", "evaluate")

# The detailed file each stage writes, from which its headline is taken (and its warnings read).
DETAILED: dict[str, Path] = {
    "inject_bias": paths.BIAS_SUMMARY,
    "train_erm": paths.METRICS / "erm.json",
    "infer_groups": paths.GROUPS_METRICS,
    "train_contrastive": paths.METRICS / "stage2_train.json",
    "linear_probe": paths.METRICS / "probe.json",
    "evaluate": paths.METRICS / "representation.json",
}
# Further files of a stage that may carry warnings.
EXTRA_WARNING_FILES: dict[str, tuple[Path, ...]] = {
    "train_contrastive": (paths.METRICS / "stage2_train_info.json",),
}
ACCURACIES = {"avg": "avg", "unbiased": "unbiased", "worst": "worst_group"}

# Short labels of the headline keys (tables, the comparison page, README).
LABELS: dict[str, str] = {
    "bias_corr": "train correlation", "bias_conflicting": "bias-conflicting (train)", "bias_n": "training images",
    "erm_avg": "ERM avg", "erm_unbiased": "ERM unbiased", "erm_worst": "ERM worst-group",
    "groups_matched": "groups matched acc.", "groups_recall": "minority recall",
    "s2_avg": "stage-2 avg", "s2_unbiased": "stage-2 unbiased", "s2_worst": "stage-2 worst-group",
    "probe_erm_avg": "ERM probe avg", "probe_erm_unbiased": "ERM probe unbiased",
    "probe_erm_worst": "ERM probe worst-group",
    "probe_s2_avg": "stage-2 probe avg", "probe_s2_unbiased": "stage-2 probe unbiased",
    "probe_s2_worst": "stage-2 probe worst-group",
    "align_erm": "ERM alignment loss", "align_s2": "stage-2 alignment loss",
    "mi_a_erm": "ERM Î(A;Z)", "mi_a_s2": "stage-2 Î(A;Z)",
    "erm_eod": "ERM EOd", "erm_dpd": "ERM DP difference", "s2_eod": "stage-2 EOd", "s2_dpd": "stage-2 DP difference",
    "s2_val_avg": "stage-2 val avg",
    "erm_worst_class": "ERM worst-class", "s2_worst_class": "stage-2 worst-class",
    "probe_erm_worst_class": "ERM probe worst-class", "probe_s2_worst_class": "stage-2 probe worst-class",
    "probe_erm_eo_avg": "ERM probe + EO post-processing avg", "probe_erm_eo_worst": "ERM probe + EO worst-group",
    "probe_erm_eo_eod": "ERM probe + EO EOd", "probe_erm_eo_dpd": "ERM probe + EO DP difference",
}
FAIRNESS = {"eod": "equalized_odds_difference", "dpd": "demographic_parity_difference"}  # short -> metrics key
# Fractions shown as percentages (the rest: counts, a correlation, losses and nats, shown as they are).
PERCENT_KEYS = (frozenset(k for k in LABELS if k.startswith(("erm_", "s2_", "probe_")) and not k.endswith(tuple(FAIRNESS)))
                | {"groups_matched", "groups_recall"})


def headline_path(stage: str) -> Path:
    """``reports/metrics/<stage>.json``."""
    return paths.METRICS / f"{stage}.json"


def committed_metrics(root: Path) -> list[Path]:
    """The git-tracked headline metrics under ``root`` (``cache: false`` in dvc.yaml): the numbers of the run its
    dvc.lock records."""
    return [root / headline_path(stage) for stage in STAGES]


def forget_committed_run(root: Path) -> None:
    """Remove ``root``'s dvc.lock and the headline metrics of the run it records (a benchmark's or a test's fresh
    copy, with other params: every stage runs, and no number of another run is shown as its own)."""
    for path in [root / LOCK, *committed_metrics(root)]:
        path.unlink(missing_ok=True)


# --------------------------------------------------------------------------- metrics files against dvc.lock

LOCK = Path("dvc.lock")
# Why a metrics file's numbers are left out (after its path); the same words wherever a metrics file is read.
MISMATCH = "does not match dvc.lock (edited, merged or from another run)"
UNRECORDED = "is no output of a run dvc.lock records (dvc.lock replaced, or its stage never finished under DVC)"
LEFT_OUT = "its numbers are left out; run `dvc repro`, or `git checkout` it with dvc.lock"


def parse_lock(text: str) -> dict[str, Any] | None:
    """dvc.lock's text parsed as DVC parses it (ruamel.yaml, YAML 1.2); None for text that is no YAML mapping."""
    from ruamel.yaml import YAML
    from ruamel.yaml.error import YAMLError

    try:
        lock = YAML(typ="safe").load(text)
    except YAMLError:
        return None
    return lock if isinstance(lock, dict) else None


def read_lock(root: Path = Path(".")) -> dict[str, Any] | None:
    """``root/dvc.lock`` parsed (:func:`parse_lock`); None without one."""
    try:
        return parse_lock((root / LOCK).read_text(encoding="utf-8"))
    except OSError:
        return None


def recorded_outputs(lock: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """Output path -> its dvc.lock entry (``md5``, ``hash``, ``size``), every stage's outputs together."""
    stages = (lock or {}).get("stages") or {}
    return {str(out["path"]): out for entry in stages.values() if isinstance(entry, dict)
            for out in entry.get("outs") or [] if isinstance(out, dict) and out.get("path") is not None}


def dvc_md5(data: bytes, hash_name: str | None) -> str:
    """DVC's md5 of a file holding ``data``: the md5 of the bytes under DVC 3 (an entry with ``hash: md5``); DVC 2's
    ``md5-dos2unix`` (CRLF read as LF in a text file) for an entry without ``hash``."""
    import hashlib

    if hash_name == "md5":
        return hashlib.md5(data, usedforsecurity=False).hexdigest()
    import io

    from dvc_data.hashfile.hash import fobj_md5  # DVC's own, for the legacy rule

    return fobj_md5(io.BytesIO(data), name=hash_name or "md5-dos2unix")


def matches_lock(data: bytes, entry: dict[str, Any]) -> bool:
    """Whether a file holding ``data`` is the one a dvc.lock output ``entry`` records."""
    return entry.get("md5") is not None and dvc_md5(data, entry.get("hash")) == str(entry["md5"])


def mismatches(lock: dict[str, Any] | None, read: Callable[[str], bytes | None],
               files: Iterable[str]) -> dict[str, str]:
    """File -> why its bytes (``read``; None: absent, nothing shown, nothing to check) are not what ``lock`` records:
    :data:`MISMATCH`, or :data:`UNRECORDED` for a file no output of ``lock`` names or holds. A file inside a recorded
    folder is not checked (its md5 is in DVC's cache, not in dvc.lock). Empty without a lock (nothing recorded)."""
    if lock is None:
        return {}
    outputs = recorded_outputs(lock)
    found: dict[str, str] = {}
    for name in files:
        data = read(name)
        if data is None:
            continue
        entry = outputs.get(name)
        if entry is None:
            if not any(name.startswith(out.rstrip("/") + "/") for out in outputs):
                found[name] = UNRECORDED
        elif not str(entry.get("md5", "")).endswith(".dir") and not matches_lock(data, entry):
            found[name] = MISMATCH
    return found


def mismatch_message(name: str, why: str) -> str:
    """``'<file> does not match dvc.lock (...): its numbers are left out; run ...'``: one line, wherever it is shown."""
    return f"{name} {why}: {LEFT_OUT}"


def _read_bytes(root: Path) -> Callable[[str], bytes | None]:
    def read(name: str) -> bytes | None:
        try:
            return (root / name).read_bytes()
        except OSError:
            return None
    return read


def lock_mismatches(root: Path = Path("."), files: Iterable[Path | str] | None = None) -> dict[str, str]:
    """The files under ``root`` (relative paths; default: the git-tracked headline metrics) that do not match
    ``root``'s dvc.lock, each with why (:func:`mismatches`): what every reader of a metrics file leaves out."""
    names = [Path(f).as_posix() for f in (files if files is not None else [headline_path(s) for s in STAGES])]
    return mismatches(read_lock(root), _read_bytes(root), names)


# --------------------------------------------------------------------------- a failed stage keeps its headline


def _at_head(root: Path, name: str, entry: dict[str, Any]) -> bytes | None:
    """The file at git's HEAD (a fresh clone's, or the committed run's)."""
    import subprocess

    try:
        done = subprocess.run(["git", "show", f"HEAD:{name}"], cwd=root, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def _in_dvc_cache(root: Path, name: str, entry: dict[str, Any]) -> bytes | None:
    """The object of DVC's cache with the recorded md5 (DVC's run-cache stores ``cache: false`` outputs there)."""
    try:
        from dvc.repo import Repo

        with Repo(str(root)) as repo:
            return Path(repo.cache.local.oid_to_path(str(entry["md5"]))).read_bytes()
    except Exception:  # no DVC repository, no such object, a cache DVC cannot open: no copy here
        return None


# Where a copy of the headline file dvc.lock records may be, by the name the message gives it, cheapest first; each
# copy is checked against dvc.lock's md5 before it is written.
COPIES: dict[str, Callable[[Path, str, dict[str, Any]], bytes | None]] = {"HEAD": _at_head,
                                                                          "DVC's cache": _in_dvc_cache}


class Restored(NamedTuple):
    """What :func:`restore_recorded` left at ``path``: ``recorded``, whether dvc.lock records a headline file of the
    stage; ``source``, the copy its bytes came from (a :data:`COPIES` key; ``""``: the file already held them), None
    where the file is absent (no copy matches, or nothing recorded)."""

    path: str
    recorded: bool
    source: str | None


def restore_recorded(stage: str, root: Path = Path(".")) -> Restored | None:
    """After ``stage`` failed under DVC, which deleted its outputs (``cache: false`` ones too) before running it:
    leave its headline file as dvc.lock records it, from the first of :data:`COPIES` with dvc.lock's md5, or absent
    where no copy matches or dvc.lock records none (a file the failed run wrote is no result). None for a stage
    without a headline file. It reads dvc.lock, HEAD and DVC's cache, none of them a dep of the stage: only on the
    way out of a failed run, which produces no result, so they are inputs of none."""
    if stage not in STAGES:
        return None
    name = headline_path(stage).as_posix()
    path = root / name
    entry = recorded_outputs(read_lock(root)).get(name)
    if entry is None or entry.get("md5") is None:
        path.unlink(missing_ok=True)
        return Restored(name, False, None)
    if path.is_file() and matches_lock(path.read_bytes(), entry):
        return Restored(name, True, "")
    for source, copy in COPIES.items():
        data = copy(root, name, entry)
        if data is not None and matches_lock(data, entry):
            with atomic_path(path) as tmp:
                tmp.write_bytes(data)
            return Restored(name, True, source)
    path.unlink(missing_ok=True)
    return Restored(name, True, None)


def _number(value: Any) -> float | int | str | None:
    if value == NEEDS_BIAS_LABELS:  # data without bias labels: the key says so, never dropped
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return value if isinstance(value, int) else round(float(value), DIGITS)


def _accuracies(prefix: str, split: dict | None) -> dict[str, float]:
    split = split or {}
    out = {f"{prefix}_{short}": _number(split.get(key)) for short, key in ACCURACIES.items()}
    if split.get("worst_group") == NEEDS_BIAS_LABELS:  # without bias labels worst-class stands beside them
        out[f"{prefix}_worst_class"] = _number(split.get("worst_class"))
    return {k: v for k, v in out.items() if v is not None}


def _fairness(prefix: str, split: dict | None) -> dict[str, float]:
    fairness = (split or {}).get("fairness") or {}
    out = {f"{prefix}_{short}": _number(fairness.get(key)) for short, key in FAIRNESS.items()}
    return {k: v for k, v in out.items() if v is not None}


def _inject_bias(summary: dict) -> dict[str, Any]:
    train = (summary.get("splits") or {}).get("train") or {}
    return {"bias_corr": _number(train.get("realised_correlation")), "bias_conflicting": _number(train.get("n_conflicting")),
            "bias_n": _number(train.get("n"))}


def _train_erm(metrics: dict) -> dict[str, Any]:
    return {**_accuracies("erm", metrics.get("test")), **_fairness("erm", metrics.get("test"))}


def _infer_groups(report: dict) -> dict[str, Any]:
    return {"groups_matched": _number(report.get("matched_accuracy")), "groups_recall": _number(report.get("minority_recall"))}


def _train_contrastive(metrics: dict) -> dict[str, Any]:
    out = {**_accuracies("s2", metrics.get("test")), **_fairness("s2", metrics.get("test"))}
    if (metrics.get("test") or {}).get("fairness") is not None:  # binary tasks: the grid-choice accuracy
        out["s2_val_avg"] = _number((metrics.get("val") or {}).get("avg"))
    return out


def _trained(document: dict, model: str) -> dict:
    entry = document.get(model) or {}
    return entry if entry.get("trained") else {}


def _linear_probe(probe: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model, short in (("erm", "erm"), ("stage2", "s2")):
        out.update(_accuracies(f"probe_{short}", (_trained(probe, model).get("probe") or {}).get("test")))
    post = ((_trained(probe, "erm").get("probe") or {}).get("equalized_odds") or {}).get("test")
    if post:
        out.update({k: v for k, v in _accuracies("probe_erm_eo", post).items() if not k.endswith("_unbiased")})
        out.update(_fairness("probe_erm_eo", post))
    return out


def _evaluate(representation: dict) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model, short in (("erm", "erm"), ("stage2", "s2")):
        test = _trained(representation, model).get("test") or {}
        out[f"align_{short}"] = _number(test.get("alignment_loss"))
        out[f"mi_a_{short}"] = _number(test.get("mi_a"))
    return out


EXTRACT: dict[str, Callable[[dict], dict[str, Any]]] = {
    "inject_bias": _inject_bias, "train_erm": _train_erm, "infer_groups": _infer_groups,
    "train_contrastive": _train_contrastive, "linear_probe": _linear_probe, "evaluate": _evaluate,
}


def headline(stage: str, detailed: dict) -> dict[str, Any]:
    """The headline scalars of ``stage`` from its detailed file's content (missing values left out)."""
    return {key: value for key, value in EXTRACT[stage](detailed or {}).items() if value is not None}


def write_headline(stage: str, root: Path = Path(".")) -> dict[str, Any] | None:
    """Write ``reports/metrics/<stage>.json`` under ``root`` from the stage's detailed file; None (nothing
    written) for a stage without a headline or when its detailed file is missing."""
    if stage not in DETAILED or not (root / DETAILED[stage]).exists():
        return None
    values = headline(stage, load_json(root / DETAILED[stage]))
    save_json(root / headline_path(stage), values)
    return values


def read_headlines(root: Path = Path("."), stages: tuple[str, ...] = STAGES) -> dict[str, float]:
    """Every headline value found under ``root`` (flat, one dict; a missing or unreadable file is skipped)."""
    values: dict[str, float] = {}
    for stage in stages:
        path = root / headline_path(stage)
        try:
            values.update(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue
    return values


PIPELINE = ("download", *STAGES, "report")  # every harnessed stage, in the order DVC runs them


def upstream_stages(stage: str) -> tuple[str, ...]:
    """The headline stages that ran before ``stage`` or are ``stage``, in pipeline order (all of them for the
    report; none for a stage outside the pipeline). Their files on disk are current when ``stage`` ends; the
    files of later stages may still be an earlier run's."""
    if stage not in PIPELINE:
        return ()
    return tuple(s for s in STAGES if PIPELINE.index(s) <= PIPELINE.index(stage))


def warnings_summary(by_stage: dict[str, list[str]], width: int = 250) -> str:
    """``'2 warnings: degenerate-selection (train_erm), ...'``, or ``'none'``."""
    total = sum(len(messages) for messages in by_stage.values())
    if not total:
        return "none"
    codes = [f"{warning_code(m)} ({stage})" for stage, messages in by_stage.items() for m in messages]
    text = f"{total} warning{'s' if total > 1 else ''}: " + ", ".join(codes)
    return text if len(text) <= width else text[: width - 1] + "…"


# --------------------------------------------------------------------------- warnings and selection


def find_warnings(document: Any, depth: int = 4) -> list[str]:
    """Every string of every ``"warnings"`` list in a JSON document (nested dicts included), in order, once each."""
    found: list[str] = []

    def visit(node: Any, level: int) -> None:
        if not isinstance(node, dict) or level > depth:
            return
        for key, value in node.items():
            if key == "warnings" and isinstance(value, list):
                found.extend(str(item) for item in value if isinstance(item, str) and str(item) not in found)
            elif isinstance(value, dict):
                visit(value, level + 1)

    visit(document, 0)
    return found


def warning_code(message: str) -> str:
    """The code a warning starts with (``degenerate-selection: ...`` -> ``degenerate-selection``), else 'warning'."""
    head, sep, _ = message.partition(":")
    return head.strip() if sep and head.strip() and " " not in head.strip() else "warning"


def stage_documents(read: Callable[[Path], Any | None], stages: tuple[str, ...] = STAGES) -> dict[str, list[Any]]:
    """Stage (of ``stages``) -> the parsed detailed files ``read`` returns (None for a missing file is skipped); the
    files of other stages are never read."""
    documents: dict[str, list[Any]] = {}
    for stage in (s for s in STAGES if s in stages):
        for path in (DETAILED[stage], *EXTRA_WARNING_FILES.get(stage, ())):
            document = read(path)
            if document is not None:
                documents.setdefault(stage, []).append(document)
    return documents


def _read_local(root: Path) -> Callable[[Path], Any | None]:
    def read(path: Path) -> Any | None:
        try:
            return json.loads((root / path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    return read


def collect_warnings(documents: dict[str, list[Any]]) -> dict[str, list[str]]:
    """Stage -> its warnings (stages without any are left out)."""
    out = {}
    for stage, docs in documents.items():
        messages: list[str] = []
        for document in docs:
            messages += [m for m in find_warnings(document) if m not in messages]
        if messages:
            out[stage] = messages
    return out


def collect_selection(documents: dict[str, list[Any]]) -> dict[str, dict[str, Any]]:
    """Stage -> its ``selection`` block (rule, selected_epoch, degenerate, reason) where a file has one."""
    out = {}
    for stage, docs in documents.items():
        for document in docs:
            if isinstance(document, dict) and isinstance(document.get("selection"), dict):
                out[stage] = document["selection"]
                break
    return out


def local_warnings(root: Path = Path("."), stages: tuple[str, ...] = STAGES) -> dict[str, list[str]]:
    """The warnings of ``stages`` in the detailed files under ``root``."""
    return collect_warnings(stage_documents(_read_local(root), stages))


def local_notes(root: Path = Path("."), stages: tuple[str, ...] = STAGES) -> dict[str, list[str]]:
    """Stage -> the notes of ``stages`` under ``root`` (each detailed file's top-level ``"notes"`` list: the lines
    whose code :data:`debias.core.health.KINDS` calls a note); stages without any are left out. Notes are never
    warnings: no count, headline or tag of warnings reads them."""
    out: dict[str, list[str]] = {}
    for stage, documents in stage_documents(_read_local(root), stages).items():
        messages: list[str] = []
        for document in documents:
            found = document.get("notes") if isinstance(document, dict) else None
            messages += [str(m) for m in found or [] if isinstance(m, str) and m not in messages]
        if messages:
            out[stage] = messages
    return out


UNREAD_KEY = "unread_params"  # a run record's field: the stage's unread-param warnings (debias.harness.unread)


def recorded_unread(root: Path = Path("."), stages: tuple[str, ...] = PIPELINE) -> dict[str, list[str]]:
    """Stage -> the unread-param warnings its run record kept (the declared params changed since its previous run that
    it does not read, found as it started); stages without any are left out."""
    out: dict[str, list[str]] = {}
    for stage in stages:
        record = _read_local(root)(paths.RUNS / f"{stage}.json")
        found = record.get(UNREAD_KEY) if isinstance(record, dict) else None
        if isinstance(found, list) and found:
            out[stage] = [str(message) for message in found]
    return out


MISMATCH_CODE = "metrics-mismatch"  # a warning's code: a metrics file that is not the one dvc.lock records


def metrics_files(root: Path = Path(".")) -> list[str]:
    """The files under ``root`` the run's numbers are read from: every JSON under ``reports/metrics``, the per-epoch
    curves under ``reports/plots`` and the bias summary (the report's own outputs are none of them)."""
    found = [*(root / paths.METRICS).glob("*.json"), *(root / paths.PLOTS).glob("*_curves.csv"),
             root / paths.BIAS_SUMMARY]
    return sorted(p.relative_to(root).as_posix() for p in found if p.is_file())


def mismatch_warnings(root: Path = Path(".")) -> dict[str, list[str]]:
    """Stage (the one dvc.lock says wrote the file, else the reader, ``report``) -> a :data:`MISMATCH_CODE` warning for
    each of :func:`metrics_files` that does not match dvc.lock (:func:`lock_mismatches`)."""
    lock = read_lock(root)
    found = mismatches(lock, _read_bytes(root), metrics_files(root))
    writers = {str(out.get("path")): stage for stage, entry in ((lock or {}).get("stages") or {}).items()
               if isinstance(entry, dict) for out in entry.get("outs") or [] if isinstance(out, dict)}
    out: dict[str, list[str]] = {}
    for name, why in found.items():
        out.setdefault(writers.get(name, "report"), []).append(f"{MISMATCH_CODE}: {mismatch_message(name, why)}")
    return out


def checks_lock() -> bool:
    """Whether this process checks the metrics files it reads against dvc.lock: yes unless it is a stage DVC runs
    (``$DVC_STAGE`` set, as DVC sets it for every stage command). Under DVC a stage's inputs are exactly its deps as
    DVC saw them, and DVC reruns (or restores from its cache) a stage whose outputs differ from what dvc.lock records
    before any stage that reads them (tests/test_metrics_lock.py); comparing with dvc.lock's md5s there would read
    other stages' files and list their folder, reads no dep declares (tests/test_trace.py)."""
    return not os.environ.get("DVC_STAGE", "").strip()


def run_warnings(root: Path = Path(".")) -> dict[str, list[str]]:
    """Every warning of the run in the workspace, by stage in pipeline order: a metrics file that does not match
    dvc.lock (:func:`mismatch_warnings`, where :func:`checks_lock`), those its stages wrote into their metrics files
    (:func:`local_warnings`) and the unread-param warnings their run records kept (:func:`recorded_unread`)."""
    local, unread = local_warnings(root), recorded_unread(root)
    mismatched = mismatch_warnings(root) if checks_lock() else {}
    merged = {stage: mismatched.get(stage, []) + unread.get(stage, [])
              + [m for m in local.get(stage, []) if m not in unread.get(stage, [])] for stage in PIPELINE}
    return {stage: messages for stage, messages in merged.items() if messages}


def local_selection(root: Path = Path(".")) -> dict[str, dict[str, Any]]:
    return collect_selection(stage_documents(_read_local(root)))
