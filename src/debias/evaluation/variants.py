"""The registries of the linear probe's variants (``probe.method``) and of its post-processings (``probe.postprocess``):
every fact the rest of the code needs about one, declared by it.

A variant is one subpackage of :mod:`debias.evaluation.probes` whose ``__init__.py`` (pydantic, the params and
this module only: the params schema imports it) calls :func:`register_probe` or :func:`register_postprocess`,
and whose ``fit.py`` holds the code the declaration names by ``"module:function"`` (imported when it runs).
:func:`import_declarations` imports every such subpackage; a module named in ``DEBIAS_METHODS`` may register
variants too. The ``probe`` params section is built from the registries (:mod:`debias.schema`,
:func:`debias.params.probe.probe_model`):
``probe.method`` and ``probe.postprocess`` allow exactly the registered names, each variant's own params section
becomes ``probe.<section>``, and a shared probe param applies to the variants that declare they read it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from debias.core.declarations import check_section, import_declarations as _import_packages, resolve

PACKAGE = "debias.evaluation.probes"
NO_POSTPROCESS = "none"  # the probe.postprocess value that adds nothing

# fit(features, splits, probe params, seed) -> (report, chosen classifier, selection indices into val)
ProbeFit = Callable[..., tuple[dict, Any, Any]]
# report(classifier, features, splits, selection indices, seed) -> dict
PostprocessReport = Callable[..., dict]


@dataclass(frozen=True)
class ProbeVariant:
    """A ``probe.method``: ``fit`` (or ``"module:function"``) and ``splits(params)``, the biased splits it reads.
    ``reads``: the shared ``probe.*`` params it reads (the others do not apply to it). ``section`` / ``params`` /
    ``sources``: its own params section ``probe.<section>`` and the source of each of its leaf keys.
    ``schema_default``: the ``probe.method`` of a params.yaml that names none (exactly one variant).
    ``needs_attribute``: it reads the true bias attribute (refused for data without bias labels)."""

    name: str
    fit: ProbeFit | str
    splits: Callable[[Any], tuple[str, ...]]
    display: str = ""
    reads: tuple[str, ...] = ()
    schema_default: bool = False
    needs_attribute: bool = False
    section: str | None = None
    params: Any = None
    sources: dict[str, str] = field(default_factory=dict)

    def fit_fn(self) -> ProbeFit:
        return resolve(self.fit)


@dataclass(frozen=True)
class Postprocessing:
    """A ``probe.postprocess``: ``report(classifier, features, splits, selection indices, seed) -> dict`` (kept
    under the probe report's key of the same name), or ``"module:function"``; ``binary``: it needs a binary task;
    ``needs_attribute``: it reads the true bias attribute (refused for data without bias labels)."""

    name: str
    report: PostprocessReport | str
    binary: bool
    display: str = ""
    needs_attribute: bool = False

    def report_fn(self) -> PostprocessReport:
        return resolve(self.report)


PROBES: dict[str, ProbeVariant] = {}
POSTPROCESSINGS: dict[str, Postprocessing] = {}


def register_probe(name: str, splits: Callable[[Any], tuple[str, ...]], fit: ProbeFit | str | None = None,
                   **facts: Any) -> Any:
    """Register the probe variant ``name`` reading ``splits(params)`` (``facts``: the other :class:`ProbeVariant`
    fields) and return it; without ``fit``, a decorator registering the function it decorates."""
    def add(function: ProbeFit | str) -> Any:
        if name in PROBES:
            raise ValueError(f"probe.method {name!r} is registered twice")
        variant = ProbeVariant(name, function, splits, **facts)
        check_section(f"probe variant {name!r}", "probe", variant, PROBES.values())
        PROBES[name] = variant
        return function if fit is None else variant
    return add if fit is None else add(fit)


def register_postprocess(name: str, binary: bool, report: PostprocessReport | str | None = None,
                         display: str = "", needs_attribute: bool = False) -> Any:
    """Register the post-processing ``name`` and return it; without ``report``, a decorator registering the
    function it decorates."""
    def add(function: PostprocessReport | str) -> Any:
        if name in POSTPROCESSINGS or name == NO_POSTPROCESS:
            raise ValueError(f"probe.postprocess {name!r} is registered twice")
        POSTPROCESSINGS[name] = Postprocessing(name, function, binary, display, needs_attribute)
        return function if report is None else POSTPROCESSINGS[name]
    return add if report is None else add(report)


_discovered = False


def import_declarations() -> None:
    """Import the extension modules (``DEBIAS_METHODS``, entry points) and every subpackage of :data:`PACKAGE`
    once; a broken one is a DeclarationError naming it."""
    global _discovered
    if not _discovered:
        _import_packages(PACKAGE, packages=True)
        _discovered = True



def probe_variant(name: str) -> ProbeVariant:
    """The registered variant ``name``; a ValueError naming ``probe.method`` and the registered ones otherwise."""
    import_declarations()
    if name not in PROBES:
        raise ValueError(f"probe.method = {name!r} is not registered; allowed: {', '.join(sorted(PROBES))}")
    return PROBES[name]


def postprocessing(name: str) -> Postprocessing | None:
    """The registered post-processing ``name`` (None for ``none``); a ValueError naming ``probe.postprocess``
    and the registered ones otherwise."""
    import_declarations()
    if name == NO_POSTPROCESS:
        return None
    if name not in POSTPROCESSINGS:
        raise ValueError(f"probe.postprocess = {name!r} is not registered; allowed: "
                         f"{', '.join([NO_POSTPROCESS, *sorted(POSTPROCESSINGS)])}")
    return POSTPROCESSINGS[name]


def probe_sections() -> dict[str, ProbeVariant]:
    """``section -> variant`` of every variant with its own ``probe.<section>`` params."""
    import_declarations()
    return {v.section: v for v in PROBES.values() if v.section is not None}


def probe_sources() -> dict[str, str]:
    """The source line of every leaf of every variant's params section, by its dotted key."""
    return {f"probe.{v.section}.{key}": line for v in probe_sections().values() for key, line in v.sources.items()}
