"""Which params apply to a run: the one registry of ``param prefix -> predicate`` (source, protocol, method).

A param applies unless the longest registered prefix of its dotted key says otherwise: ``bias.foreground.*``
only under the foreground protocol, ``stage2.cnc.*`` only when stage 2 is CNC, ``data.imagefolder.*`` only for
the imagefolder source, and so on. The report's params tables list applicable params only; anything else
that must tell relevant params from irrelevant ones reads :func:`applies`.

``protocol`` is the protocol the run resolved (``data/biased/summary.json``); with ``bias.protocol: auto`` and
no summary it is unknown (None) and the protocol sections are all kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from debias.params import PATH_SOURCES, PRETRAINABLE, TABULAR_SOURCES, Params
from debias.training.methods.registry import method_sections, method_spec


@dataclass(frozen=True)
class RunContext:
    """What decides applicability: the params and the protocol the run resolved (None: unknown)."""

    params: Params
    protocol: str | None = None


Rule = Callable[[RunContext], bool]


def _source(*names: str) -> Rule:
    return lambda c: c.params.data.source in names


def _protocol(name: str) -> Rule:
    def rule(c: RunContext) -> bool:
        resolved = c.protocol or (None if c.params.bias.protocol == "auto" else c.params.bias.protocol)
        return resolved is None or resolved == name
    return rule


def _section_owner(section: str) -> Rule:
    """``stage2.<section>.*`` applies when the running method declares that section as its own."""
    return lambda c: method_spec(c.params.stage2.method).section == section


def _method_reads(prefix: str) -> Rule:
    """A shared section applies when the running method declares it reads it (``MethodSpec.reads``)."""
    return lambda c: prefix in method_spec(c.params.stage2.method).reads


def _head_fitted(c: RunContext) -> bool:
    return not method_spec(c.params.stage2.method).head_trained


RULES: dict[str, Rule] = {
    "data.path": _source(*PATH_SOURCES),
    "data.mnist_val_size": _source("mnist", "fashion_mnist"),
    "data.imagefolder.": _source("imagefolder"),
    "data.waterbirds.": _source("waterbirds"),
    "data.celeba.": _source("celeba"),
    "data.cifar10.": _source("cifar10"),
    "data.tabular.": _source(*TABULAR_SOURCES),
    "bias.foreground.": _protocol("foreground"),
    "bias.background.": _protocol("background"),
    "bias.corruption.": _protocol("corruption"),
    "model.pretrained": lambda c: c.params.model.name in PRETRAINABLE,
    "model.mlp.": lambda c: c.params.model.name == "mlp" or c.params.data.source in TABULAR_SOURCES,
    "groups.cluster.": lambda c: c.params.groups.method == "cluster",
    "groups.soft.": lambda c: c.params.groups.method == "soft",
    **{f"stage2.{section}.": _section_owner(section) for section in method_sections()},
    "stage2.head.": _head_fitted,
    "stage2.tabular_view.": lambda c: (_method_reads("stage2.tabular_view.")(c)
                                       and c.params.data.source in TABULAR_SOURCES),
    "loss.": _method_reads("loss."),
    "probe.dfr.": lambda c: c.params.probe.method == "dfr",
    "probe.train_split": lambda c: c.params.probe.method != "dfr",
}


def rule_for(key: str) -> str | None:
    """The longest registered prefix of the dotted ``key`` (a prefix ending in '.' names a section; one without,
    a single param), None when no rule covers it."""
    matches = [p for p in RULES if (key.startswith(p) if p.endswith(".") else key == p)]
    return max(matches, key=len) if matches else None


def applies(key: str, context: RunContext) -> bool:
    """Whether the param ``key`` has any effect on a run in ``context``."""
    prefix = rule_for(key)
    return True if prefix is None else bool(RULES[prefix](context))
