"""Linear probes on frozen encoders: loading them, probing each with the registered variant, shaping the output.

A probe is multinomial logistic regression (scikit-learn, lbfgs, L2 penalty ``C``) on the
encoder outputs z, optionally standardised with statistics of the probe's training features.
``C`` comes from ``probe.c_grid``: the one with the best validation worst-group accuracy wins;
ties go to the larger validation average, then to the earlier entry of the grid.

Training split (``probe.train_split``):
- ``train``: fit on the training split, choose ``C`` on the whole validation split;
- ``val`` (DFR-style): cut validation into two seeded halves stratified by group, fit on the
  first, choose ``C`` on the second. The reported ``val`` accuracies are then those of the
  second (selection) half, never of the points the probe was fitted on.
Accuracies are :func:`debias.metrics.accuracy_report`; a network whose own head was trained
with cross-entropy also reports that head (``head``: accuracy of its own logits). Binary tasks add a
``fairness`` block to every accuracy report (:func:`debias.metrics.fairness_report`: equalized-odds and
demographic-parity differences; per-group TPR/FPR go to the tables file).

``probe.method`` picks the variant from a registry (:mod:`debias.evaluation.variants`; each variant is a
subpackage of :mod:`debias.evaluation.probes`): the logistic probe above, DFR's last-layer retraining on
group-balanced validation data; ``probe.postprocess`` adds a registered post-processing of the chosen probe
(Hardt et al.'s equalized odds) under the probe report's key of the same name. The shared linear-classifier
helpers are :mod:`debias.evaluation.linear`'s.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sklearn.pipeline import Pipeline

from debias.core import progress
from debias.core.errors import NEEDS_BIAS_LABELS
from debias.data.store import BiasedSplit
from debias.evaluation.linear import split_report
from debias.evaluation.variants import postprocessing, probe_variant
from debias.models import Network, load_network
from debias.params import ProbeBase
from debias.training.classifier import predict

# Keys of an accuracy report that hold per-group tables (moved out of the scalar metrics file).
TABLE_KEYS = ("per_group", "group_counts", "empty_groups", "notes", "per_class", "class_counts")
FEATURE_BATCH = 1024


# --------------------------------------------------------------------------- encoders


@dataclass
class FrozenEncoder:
    """A trained network (None when its checkpoint does not exist yet), its method and checkpoint meta."""

    network: Network | None
    method: str
    meta: dict[str, Any] = field(default_factory=dict)
    note: str | None = None

    @property
    def trained(self) -> bool:
        return self.network is not None


def load_encoders(checkpoints: Mapping[str, str | Path], required: Iterable[str] = ("erm",)) -> dict[str, FrozenEncoder]:
    """Load each checkpoint with :func:`load_network`; a missing optional one is kept as "not trained"."""
    required = set(required)
    encoders: dict[str, FrozenEncoder] = {}
    for name, path in checkpoints.items():
        path = Path(path)
        if not path.exists():
            if name in required:
                raise FileNotFoundError(f"{path} not found: run the stage that trains the {name} encoder first (dvc repro)")
            encoders[name] = FrozenEncoder(None, "none", note=f"{path} not found: {name} not trained, skipped")
            continue
        network, payload = load_network(str(path))
        meta = dict(payload.get("meta") or {})
        encoders[name] = FrozenEncoder(network, str(meta.get("method", name)), meta)
    return encoders


def head_is_trained(encoder: FrozenEncoder) -> bool:
    """True when the network's own head was trained with CE, as its checkpoint records (``meta['head_trained']``:
    the stage-2 method registry's fact, ``debias.training.methods``; true for train_erm's). A checkpoint that does
    not record it counts as head-trained only if it is ERM's."""
    return bool(encoder.meta.get("head_trained", encoder.method == "erm"))


def encode(network: Network, x: torch.Tensor, device: torch.device,
           batch_size: int = FEATURE_BATCH) -> tuple[torch.Tensor, torch.Tensor]:
    """Frozen encoder outputs and head logits, float32 on CPU: ``(z [N,D], logits [N,C])``."""
    network = network.to(device)
    return predict(network, x, batch_size, device)


# --------------------------------------------------------------------------- the probe


def probe_report(features: Mapping[str, torch.Tensor], splits: Mapping[str, BiasedSplit], params: ProbeBase,
                 seed: int) -> dict:
    """Fit a probe per C on ``params.train_split``, choose C on validation, report test and validation accuracy.

    ``features[name]`` are the frozen encoder outputs of ``splits[name]`` (``train`` needed only when it
    is the probe's training split). Returns ``{c, train_split, n_fit, n_select, val_scores, val, test}``
    where ``val``/``test`` are full accuracy reports (per-group tables included); another ``probe.method``
    variant's report (DFR: :func:`debias.evaluation.probes.dfr.fit.dfr_probe`).
    """
    return fit_probe(features, splits, params, seed)[0]


def fit_probe(features: Mapping[str, torch.Tensor], splits: Mapping[str, BiasedSplit], params: ProbeBase,
              seed: int) -> tuple[dict, Pipeline, torch.Tensor]:
    """:func:`probe_report`'s report, the chosen classifier and the validation indices that chose it (the
    ``probe.method`` variant's fit)."""
    return probe_variant(params.method).fit_fn()(features, splits, params, seed)


def check_postprocess(params: ProbeBase, splits: Mapping[str, BiasedSplit]) -> None:
    """A post-processing registered as binary-only (``equalized_odds``: fairlearn's ThresholdOptimizer) needs a binary
    task: a ValueError naming the param otherwise, never a silently skipped post-processing."""
    classes = splits["val"].n_classes if "val" in splits else None
    post = postprocessing(params.postprocess)
    if post is not None and post.binary and classes not in (None, 2):
        raise ValueError(f"probe.postprocess = {params.postprocess} needs a binary task; this one has {classes} "
                         "classes; allowed here: probe.postprocess = none")


def probe_splits(params: ProbeBase) -> tuple[str, ...]:
    """The biased splits the probe reads (its ``probe.method`` variant's)."""
    return probe_variant(params.method).splits(params)


def probe_encoder(encoder: FrozenEncoder, splits: Mapping[str, BiasedSplit], params: ProbeBase, seed: int,
                  device: torch.device, batch_size: int = FEATURE_BATCH) -> dict:
    """Probe one frozen encoder; add its own head's accuracy when that head was trained with CE.

    Returns ``{trained, method, probe, head?}`` (``head``: ``{test, val}`` reports on the whole splits),
    or ``{trained: False, note}`` for an encoder that does not exist yet.
    """
    if not encoder.trained:
        return {"trained": False, "note": encoder.note}
    names = [name for name in probe_splits(params) if name in splits]
    encoded = {name: encode(encoder.network, splits[name].x, device, batch_size) for name in names}
    features = {name: z for name, (z, _) in encoded.items()}
    report, chosen, select_index = fit_probe(features, splits, params, seed)
    post = postprocessing(params.postprocess)
    if post is not None:
        report[params.postprocess] = post.report_fn()(chosen, features, splits, select_index, seed)
    result: dict[str, Any] = {"trained": True, "method": encoder.method, "probe": report}
    if head_is_trained(encoder):
        result["head"] = {name: split_report(splits[name], encoded[name][1].argmax(1)) for name in ("test", "val")}
    return result


def probe_encoders(encoders: Mapping[str, FrozenEncoder], splits: Mapping[str, BiasedSplit], params: ProbeBase,
                   seed: int, device: torch.device, batch_size: int = FEATURE_BATCH) -> dict[str, dict]:
    """:func:`probe_encoder` for every encoder, keyed by encoder name (a post-processing the task does not allow is
    refused first, before any feature is computed)."""
    check_postprocess(params, splits)
    results = {}
    for name, encoder in encoders.items():
        with progress.step("linear_probe", f"probe of {name}"):
            results[name] = probe_encoder(encoder, splits, params, seed, device, batch_size)
    return results


# --------------------------------------------------------------------------- output shaping


def split_tables(results: Any, table_keys: tuple[str, ...] = TABLE_KEYS) -> tuple[Any, Any]:
    """Split a nested result into (everything but the tables, only the tables along their paths)."""
    if not isinstance(results, dict):
        return results, None
    scalars_part: dict[str, Any] = {}
    tables_part: dict[str, Any] = {}
    for key, value in results.items():
        if key in table_keys:
            tables_part[key] = value
            continue
        kept, tables = split_tables(value, table_keys)
        scalars_part[key] = kept
        if tables:
            tables_part[key] = tables
    return scalars_part, tables_part


def flat_scalars(results: Mapping[str, Any], prefix: str = "") -> dict[str, float | str]:
    """Finite numeric leaves of nested dicts as ``{'a.b.c': value}`` (lists, strings, bools and None dropped), and
    the needs-bias-labels markers (the run logger names them in a tag)."""
    flat: dict[str, float] = {}
    for key, value in results.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_scalars(value, dotted + "."))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            flat[dotted] = float(value)
        elif value == NEEDS_BIAS_LABELS:
            flat[dotted] = value
    return flat
