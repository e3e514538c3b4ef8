"""The stage-2 method registry: every fact the rest of the code needs about a method, declared by the method.

A method family is one subpackage of :mod:`debias.training.methods` whose ``__init__.py`` (the family's
declaration: pydantic and this module only, no torch) calls :func:`register_method` once per method, and whose
``train.py`` holds the training code the declaration names by ``"module:function"`` (imported when the method
runs). :func:`discover` imports the modules named in the ``DEBIAS_METHODS`` environment variable
(comma-separated, for a method kept outside the package), the ``debias.methods`` entry points of installed
distributions (a method shipped as its own package) and every such subpackage
(:func:`debias.core.declarations.import_declarations`). The params schema (:mod:`debias.schema`) is built from the
registry: each method's params section becomes the field ``stage2.<section>``, and ``stage2.method`` allows exactly
the registered names. docs/extending.md walks through adding one.

Nothing outside a method's own package branches on its name: the orchestration reads the :class:`MethodSpec`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from debias.core.declarations import (ENTRY_POINT_GROUP, ENV_VAR, check_section,  # noqa: F401  (re-exported)
                                      import_declarations as import_packages, register_module, resolve)

# This module imports nothing of debias above core (the params schema and the memory check import it): ``Params``
# below is debias.params.Params, ``Section`` debias.params.Section, ``StepPlan`` debias.core.resources.StepPlan.
Params = Section = StepPlan = Any

PACKAGE = "debias.training.methods"

TemperatureFn = Callable[[Params], tuple[str, float]]  # (dotted param key, its value)
MemoryPlanFn = Callable[[Params, int], StepPlan]  # (params, training points) -> one training step's plan


NO_PLAN = object()  # MethodSpec.memory_plan not given: refused (a method states its plan, None included)


def _no_erm_weights(params: Params) -> bool:
    return False


@dataclass(frozen=True)
class LossTerm:
    """A term of a method's stage-2 loss: ``weight(params)`` is its coefficient there (exactly 0: the term is off),
    set by the param ``weight_key``; ``reads``, the params only this term reads (none of the method's other terms
    does), which a run whose term is off does not read (:mod:`debias.schema.applicability`: ``unread-param``)."""

    name: str
    weight: Callable[[Params], float]
    weight_key: str
    reads: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodSpec:
    """A registered stage-2 method and what the code outside it needs to know.

    ``setup``: ``Stage2Inputs -> Stage2Setup``, or ``"module:function"`` imported on first use (the declaration
    stays free of torch). ``section`` / ``params``: the method's own params section ``stage2.<section>`` (a
    :class:`debias.params.Section`), with ``sources``, the source line of each of its leaf keys (relative to
    the section, e.g. ``"num_positives"``; tests/test_param_sources.py checks them). ``reads``: shared param
    prefixes the method reads besides its own section and ``stage2.*`` (e.g. ``"loss."``), for applicability.
    ``memory_plan``: the images and pairwise matrices of one training step (:class:`debias.core.resources.StepPlan`; None:
    ``stage2.batch_size`` images, no pairwise matrices, as ERM; every method states it, None included); ``memory_advice``: the params to lower after a real out-of-memory error. ``fairkl_weight``: lambda of FairKL
    as the method applies it (None: the method has no FairKL term). ``needs_erm_weights``: whether stage 2 starts
    from stage 1's weights under these params. ``loss_terms``: the terms of its loss that a param can weight to 0,
    each with the params only it reads (:class:`LossTerm`). ``capturable``: its task's step is split into host draws and device work
    (:mod:`debias.training.captured`), so ``stage2.speed.step: cuda_graph`` may capture it; ``capture_note`` says why
    a method's step is not (the refusal quotes it).
    """

    name: str
    setup: Callable[[Any], Any] | str
    display: str = ""
    schema_default: bool = False  # the stage2.method of a params.yaml that names none (exactly one method)
    head_trained: bool = False  # head trained with CE together with the encoder (else: per-epoch head fit)
    temperature: TemperatureFn | None = None  # the temperature param the method's loss reads, if any
    feature_activation: str = "relu"  # the encoder's feature layer under model.feature_activation: auto
    section: str | None = None
    params: type[Section] | None = None
    sources: dict[str, str] = field(default_factory=dict)
    reads: tuple[str, ...] = ()
    memory_plan: MemoryPlanFn | None | object = NO_PLAN
    memory_advice: tuple[str, ...] = ("stage2.batch_size",)
    fairkl_weight: Callable[[Params], float] | None = None
    epsilon_key: str | None = None  # the param of the margin its contrastive term reads (loss.epsilon, ...), if any
    reads_batch_size: bool = True  # whether its batches are stage2.batch_size points (CNC's are its own M and N)
    needs_erm_weights: Callable[[Params], bool] = _no_erm_weights
    loss_terms: tuple[LossTerm, ...] = ()
    # whether the method's task splits its step into host draws and device work (debias.training.captured), so
    # stage2.speed.step: cuda_graph can capture it; capture_note: why not, where it is not
    capturable: bool = False
    capture_note: str = "the method does not declare its step capturable (MethodSpec.capturable)"

    def setup_fn(self) -> Callable[[Any], Any]:
        """The setup function, imported on first use when given as ``"module:function"``."""
        return resolve(self.setup)

    @property
    def label(self) -> str:
        return self.display or self.name


METHODS: dict[str, MethodSpec] = {}


def register_method(name: str, setup: Callable[[Any], Any] | str, **facts: Any) -> MethodSpec:
    """Register ``name`` as a ``stage2.method`` value (``facts``: the other :class:`MethodSpec` fields).

    A name is registered once; a params section is owned by one method (the schema refuses a section that would
    shadow a field every method shares: ``stage2.batch_size``, ``stage2.head``, ...)."""
    if name in METHODS:
        raise ValueError(f"stage-2 method '{name}' is registered twice")
    spec = MethodSpec(name, setup, **facts)
    if spec.memory_plan is NO_PLAN:
        raise ValueError(f"stage-2 method '{name}' declares no memory_plan; allowed: a function (params, n_train) -> "
                         "StepPlan, or None for stage2.batch_size images and no pairwise matrices (docs/extending.md)")
    check_section(f"stage-2 method '{name}'", "stage2", spec, METHODS.values())
    read = [key for term in spec.loss_terms for key in term.reads]
    if len(read) != len(set(read)):
        raise ValueError(f"stage-2 method '{name}': a param is among the reads of two of its loss terms "
                         f"({sorted({key for key in read if read.count(key) > 1})}); a term's reads are the params "
                         "only it reads")
    METHODS[name] = spec
    return spec


_discovered = False


def discover() -> dict[str, MethodSpec]:
    """Every registered method: the extension modules (``DEBIAS_METHODS``, entry points) and every subpackage of
    :data:`PACKAGE` imported once; a broken one is a DeclarationError naming it."""
    global _discovered
    if not _discovered:
        import_packages(PACKAGE, packages=True)
        _discovered = True
    return METHODS


def method_spec(name: str) -> MethodSpec:
    if name not in discover():
        raise ValueError(f"stage2.method = '{name}' is unknown; allowed: {sorted(METHODS)}")
    return METHODS[name]


def head_trained_methods() -> frozenset[str]:
    """Names of the methods whose head is trained with cross-entropy together with the encoder."""
    return frozenset(name for name, spec in discover().items() if spec.head_trained)


def method_sections() -> dict[str, MethodSpec]:
    """``section -> spec`` of every method with its own ``stage2.<section>`` params."""
    return {spec.section: spec for spec in discover().values() if spec.section is not None}


def method_sources() -> dict[str, str]:
    """The source line of every leaf of every method's params section, by its dotted key."""
    return {f"stage2.{spec.section}.{key}": line for spec in discover().values() if spec.section is not None
            for key, line in spec.sources.items()}
