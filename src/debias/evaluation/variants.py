"""The registries of the linear probe's variants (``probe.method``) and of its post-processings (``probe.postprocess``).

A variant module registers itself (:func:`register_probe`, :func:`register_postprocess`) and is imported once by
:mod:`debias.evaluation.probe`, as the stage-2 methods are by :mod:`debias.training.methods`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from sklearn.pipeline import Pipeline

from debias.data.store import BiasedSplit
from debias.params import ProbeParams

ProbeFit = Callable[[Mapping[str, torch.Tensor], Mapping[str, BiasedSplit], ProbeParams, int],
                    tuple[dict, Pipeline, torch.Tensor]]
PostprocessReport = Callable[[Any, Mapping[str, torch.Tensor], Mapping[str, BiasedSplit], torch.Tensor, int], dict]
NO_POSTPROCESS = "none"  # the probe.postprocess value that adds nothing


@dataclass(frozen=True)
class ProbeVariant:
    """A ``probe.method``: ``fit(features, splits, params, seed) -> (report, chosen classifier, selection indices
    into val)`` and the biased splits it reads for given params."""

    fit: ProbeFit
    splits: Callable[[ProbeParams], tuple[str, ...]]


@dataclass(frozen=True)
class Postprocessing:
    """A ``probe.postprocess``: ``report(classifier, features, splits, selection indices, seed) -> dict`` (kept
    under the probe report's key of the same name); ``binary``: it needs a binary task."""

    report: PostprocessReport
    binary: bool


PROBES: dict[str, ProbeVariant] = {}
POSTPROCESSINGS: dict[str, Postprocessing] = {}


def register_probe(name: str, splits: Callable[[ProbeParams], tuple[str, ...]]) -> Callable[[ProbeFit], ProbeFit]:
    """Decorator: register ``fit`` as the probe variant ``name`` reading ``splits(params)``."""
    def add(fit: ProbeFit) -> ProbeFit:
        if name in PROBES:
            raise ValueError(f"probe.method {name!r} is registered twice")
        PROBES[name] = ProbeVariant(fit, splits)
        return fit
    return add


def register_postprocess(name: str, binary: bool) -> Callable[[PostprocessReport], PostprocessReport]:
    """Decorator: register ``report`` as the post-processing ``name``."""
    def add(report: PostprocessReport) -> PostprocessReport:
        if name in POSTPROCESSINGS or name == NO_POSTPROCESS:
            raise ValueError(f"probe.postprocess {name!r} is registered twice")
        POSTPROCESSINGS[name] = Postprocessing(report, binary)
        return report
    return add


def probe_variant(name: str) -> ProbeVariant:
    """The registered variant ``name``; a ValueError naming ``probe.method`` and the registered ones otherwise."""
    if name not in PROBES:
        raise ValueError(f"probe.method = {name!r} is not registered; allowed: {', '.join(sorted(PROBES))}")
    return PROBES[name]


def postprocessing(name: str) -> Postprocessing | None:
    """The registered post-processing ``name`` (None for ``none``); a ValueError naming ``probe.postprocess``
    and the registered ones otherwise."""
    if name == NO_POSTPROCESS:
        return None
    if name not in POSTPROCESSINGS:
        raise ValueError(f"probe.postprocess = {name!r} is not registered; allowed: "
                         f"{', '.join([NO_POSTPROCESS, *sorted(POSTPROCESSINGS)])}")
    return POSTPROCESSINGS[name]
