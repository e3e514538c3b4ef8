"""Which params apply to a run: the one registry of ``param prefix -> predicate`` (source, protocol, method); and
which params apply but weigh almost nothing (:data:`WEAK_RULES`, :func:`weak`, :func:`weak_warnings`).

A param applies unless the longest registered prefix of its dotted key says otherwise: ``bias.foreground.*``
only under the foreground protocol, ``stage2.cnc.*`` only when stage 2 is CNC, ``data.imagefolder.*`` only for
the imagefolder source, and so on. The report's params tables list applicable params only; anything else
that must tell relevant params from irrelevant ones reads :func:`applies`.

A param that applies can still have (almost) no effect: one that enters only a term of the stage-2 loss whose
effective weight is below :data:`NEGLIGIBLE_SHARE` of the loss's total weight (e.g. ``loss.epsilon`` under the
released FairKL objective at alpha 0.03: the eps-SupInfoNCE term weighs alpha^2 * tau/0.07 = 0.0013 against
FairKL's lambda 0.5, 0.26 %). :func:`weak` says why; ``debias check-params`` prints a ``negligible-param`` warning
for each such param (:func:`weak_warnings`), and any other view of params (compare) reads the same functions.
A param that only a term of the stage-2 loss weighted exactly 0 reads does not apply either (``loss.epsilon`` and
``stage2.cnc.temperature`` under ``stage2.cnc.contrastive_weight: 0``, FairKL's under a FairKL weight of 0: each
method declares its terms, :attr:`~debias.training.methods.registry.MethodSpec.loss_terms`; :func:`off_term`).
A param changed where it does not apply at all (``loss.temperature`` under CNC) is ``unread-param``
(:func:`unread_warnings`): check-params says so for its ``-S`` keys, the report for the keys changed against the
committed params.yaml, compare for a param that differs between experiments none of which reads it.

``protocol`` is the protocol the run resolved (``data/biased/summary.json``); with ``bias.protocol: auto`` and
no summary it is unknown (None) and the protocol sections are all kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel

from debias.params import PATH_SOURCES, PRETRAINABLE, TABULAR_SOURCES, Params
from debias.schema import schema
from debias.training.methods.registry import LossTerm, method_sections, method_spec


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


def _owned_by(top: str, owner: str) -> Rule:
    """A declared section of ``<top>`` applies when ``<top>.method`` is the variant that declared it."""
    return lambda c: getattr(c.params, top).method == owner


def _read_by_variant(top: str, key: str) -> Rule:
    """A shared param of ``<top>`` applies when the running variant declares it reads it."""
    def rule(c: RunContext) -> bool:
        section = getattr(c.params, top)
        return key in type(section).model_fields["method"].json_schema_extra["reads"].get(section.method, ())
    return rule


def _declared_rules() -> dict[str, Rule]:
    """The rules the schema carries from the declarations of the sections built from a registry (``groups``,
    ``probe``; :mod:`debias.params.groups`, :mod:`debias.params.probe`): a section field marked with its ``owner``
    applies under that variant; where the ``method`` field lists the ``shared`` params and what each variant
    ``reads``, a shared param applies under the variants that read it. Read from the schema, not from the
    registries, so a stage that asks about other params does not depend on every variant's declaration."""
    rules: dict[str, Rule] = {}
    for top, info in schema().model_fields.items():
        model = info.annotation
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or "method" not in model.model_fields:
            continue
        shared = (model.model_fields["method"].json_schema_extra or {}).get("shared", ())
        for name, field in model.model_fields.items():
            owner = (field.json_schema_extra or {}).get("owner")
            if owner is not None:
                rules[f"{top}.{name}."] = _owned_by(top, owner)
            elif f"{top}.{name}" in shared:
                rules[f"{top}.{name}"] = _read_by_variant(top, f"{top}.{name}")
    return rules


def _method_reads(prefix: str) -> Rule:
    """A shared section applies when the running method declares it reads it (``MethodSpec.reads``)."""
    return lambda c: prefix in method_spec(c.params.stage2.method).reads


def _margin_of(key: str) -> Rule:
    """A margin param applies when the running method's contrastive term reads it (``MethodSpec.epsilon_key``):
    ``loss.epsilon`` under eps_supinfonce and CNC, ``loss.eps_supcon.epsilon`` under eps_supcon, none under supcon."""
    return lambda c: method_spec(c.params.stage2.method).epsilon_key == key


def _sgd(section: str) -> Rule:
    """``<section>.momentum`` is read by SGD only (Adam has none: :func:`debias.training.loop.build_optimizer`)."""
    return lambda c: getattr(c.params, section).optimizer == "sgd"


def _head_fitted(c: RunContext) -> bool:
    return not method_spec(c.params.stage2.method).head_trained


# The prefixes whose rules do not depend on the registered variants; :func:`rules` adds those built from them.
FIXED_RULES: dict[str, Rule] = {
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
    "stage2.head.": _head_fitted,
    "stage2.tabular_view.": lambda c: (_method_reads("stage2.tabular_view.")(c)
                                       and c.params.data.source in TABULAR_SOURCES),
    "erm.momentum": _sgd("erm"),
    "stage2.momentum": _sgd("stage2"),
    "stage2.batch_size": lambda c: method_spec(c.params.stage2.method).reads_batch_size,
    "loss.": _method_reads("loss."),
    "loss.epsilon": _margin_of("loss.epsilon"),
    "loss.eps_supcon.": _margin_of("loss.eps_supcon.epsilon"),  # eps_supcon's own margin and FairKL lambda
}
_RULES: dict[str, Rule] = {}


def rules() -> dict[str, Rule]:
    """The registry of ``param prefix -> predicate``: :data:`FIXED_RULES` with those of the registered variants'
    sections (``groups.<section>.``, ``probe.<section>.``, ``probe.train_split``, ``stage2.<section>.``), built on
    first use (the declarations imported then, inside the caller's error handling)."""
    if not _RULES:
        _RULES.update(FIXED_RULES)
        _RULES.update(_declared_rules())
        _RULES.update({f"stage2.{section}.": _section_owner(section) for section in method_sections()})
    return _RULES


def rule_for(key: str) -> str | None:
    """The longest registered prefix of the dotted ``key`` (a prefix ending in '.' names a section; one without,
    a single param), None when no rule covers it."""
    matches = [p for p in rules() if (key.startswith(p) if p.endswith(".") else key == p)]
    return max(matches, key=len) if matches else None


def off_term(key: str, context: RunContext) -> LossTerm | None:
    """The term of the running stage-2 method's loss that alone reads ``key`` (:attr:`MethodSpec.loss_terms`) when
    the run weights it exactly 0 (``stage2.cnc.contrastive_weight: 0`` for ``loss.epsilon``), else None."""
    terms = method_spec(context.params.stage2.method).loss_terms
    return next((term for term in terms if key in term.reads and term.weight(context.params) == 0), None)


def applies(key: str, context: RunContext) -> bool:
    """Whether the param ``key`` has any effect on a run in ``context``: its prefix's rule says so, and no loss term
    that alone reads it is weighted 0 (:func:`off_term`)."""
    prefix = rule_for(key)
    return (prefix is None or bool(rules()[prefix](context))) and off_term(key, context) is None


# The setting that decides whether a param of each top-level section applies (:func:`unread`'s message), and the
# rules decided by another setting than their section's.
DECIDED_BY = {"data": "data.source", "bias": "bias.protocol", "model": "model.name", "groups": "groups.method",
              "stage2": "stage2.method", "loss": "stage2.method", "probe": "probe.method"}
DECIDED_BY_RULE = {"erm.momentum": "erm.optimizer", "stage2.momentum": "stage2.optimizer"}


def unread(key: str, context: RunContext) -> str | None:
    """Which setting leaves the param ``key`` unread in ``context`` (``'not read under stage2.method cnc'``); None
    when it applies."""
    if applies(key, context):
        return None
    term = off_term(key, context)
    prefix = rule_for(key)
    if term is not None and (prefix is None or rules()[prefix](context)):  # read but for a term weighted 0
        return (f"not read under {term.weight_key} {_value(context.params, term.weight_key)}: only the loss's "
                f"{term.name} term reads it, and that term's weight is 0")
    decider = DECIDED_BY_RULE.get(prefix or "") or DECIDED_BY.get(key.split(".")[0])
    if decider is None:
        return "not read by this run's source, protocol, model or methods"
    return f"not read under {decider} {_value(context.params, decider)}"


def _value(params: Params, key: str) -> object:
    """The value of the dotted param ``key``."""
    value: object = params
    for part in key.split("."):
        value = getattr(value, part)
    return value


def unread_warnings(context: RunContext, changed: dict[str, object]) -> list[str]:
    """``unread-param: KEY = VALUE: ...`` for each changed ``key -> value`` that does not apply to the run."""
    reasons = {key: unread(key, context) for key in changed}
    return [f"unread-param: {key} = {value}: {reasons[key]}: changing it changes nothing in this run (a stage that "
            "declares it reruns and gives the same results)" for key, value in changed.items() if reasons[key]]


# Below this share of the stage-2 loss's total weight a term (and every param that enters only it) counts as
# negligible (ours: the rule of thumb, 1 %).
NEGLIGIBLE_SHARE = 0.01
RELEASED_BASE_TEMPERATURE = 0.07  # the released code's EpsilonSupInfoNCE scale tau / 0.07 (losses.supervised)


def loss_weights(params: Params) -> dict[str, float]:
    """The effective coefficients of the stage-2 objective's terms (``contrastive``, ``fairkl``) for the supcon
    family, as :mod:`debias.training.methods.supcon` composes them: ``kl`` / ``mean``: alpha and lambda;
    ``released``: alpha^2 * tau / 0.07 and lambda (alpha * tau / 0.07 alone when lambda is 0)."""
    loss, spec = params.loss, method_spec(params.stage2.method)
    weight = spec.fairkl_weight(params) if spec.fairkl_weight is not None else 0.0
    if loss.fairkl.variant != "released":
        return {"contrastive": loss.alpha, "fairkl": weight}
    scale = loss.temperature / RELEASED_BASE_TEMPERATURE
    return {"contrastive": (loss.alpha * loss.alpha if weight > 0 else loss.alpha) * scale, "fairkl": weight}


def _contrastive_only(c: RunContext) -> str | None:
    """Why a param of the contrastive term alone (its epsilon) weighs almost nothing, or None."""
    if method_spec(c.params.stage2.method).fairkl_weight is None:  # not a FairKL method
        return None
    weights = loss_weights(c.params)
    total = sum(weights.values())
    share = weights["contrastive"] / total if total > 0 else 0.0
    if share >= NEGLIGIBLE_SHARE:
        return None
    loss = c.params.loss
    return (f"it enters only the contrastive term, whose weight ({weights['contrastive']:.4g} under "
            f"loss.fairkl.variant {loss.fairkl.variant}, loss.alpha {loss.alpha:g}) is {share:.2%} of the stage-2 "
            f"loss's (FairKL lambda {weights['fairkl']:g}), below {NEGLIGIBLE_SHARE:.0%}: changing it changes "
            "almost nothing; to study it, give the term weight (loss.fairkl.variant kl, loss.alpha 1), which costs "
            "quality on the digit protocols (benchmarks/results/default_choice.md)")


# param (exact key) -> why it has almost no effect in a run (None: it has an effect); only params that apply are asked
WEAK_RULES: dict[str, Callable[[RunContext], str | None]] = {
    key: lambda c, key=key: _contrastive_only(c) if method_spec(c.params.stage2.method).epsilon_key == key else None
    for key in ("loss.epsilon", "loss.eps_supcon.epsilon")  # each judged for the methods whose margin it is
}


def weak(key: str, context: RunContext) -> str | None:
    """Why the param ``key`` applies to a run in ``context`` but has almost no effect there, else None."""
    rule = WEAK_RULES.get(key)
    return None if rule is None or not applies(key, context) else rule(context)


def weak_warnings(context: RunContext, keys: list[str] | None = None) -> list[str]:
    """``negligible-param: KEY = VALUE ...`` for each of ``keys`` (default: every key :data:`WEAK_RULES` covers)
    that has almost no effect in ``context``."""
    from debias.params import as_dict

    values = as_dict(context.params)
    found = []
    for key in keys if keys is not None else list(WEAK_RULES):
        reason = weak(key, context)
        if reason is not None:
            value = values
            for part in key.split("."):
                value = value[part]
            found.append(f"negligible-param: {key} = {value}: {reason}")
    return found
