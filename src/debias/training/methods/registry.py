"""The stage-2 method registry: every fact the rest of the code needs about a method, declared by the method.

A method family is one subpackage of :mod:`debias.training.methods` whose ``__init__.py`` (the family's
declaration: pydantic and this module only, no torch) calls :func:`register_method` once per method, and whose
``train.py`` holds the training code the declaration names by ``"module:function"`` (imported when the method
runs). :func:`discover` imports every such subpackage, the modules named in the ``DEBIAS_METHODS`` environment
variable (comma-separated, for a method kept outside the package) and the ``debias.methods`` entry points of
installed distributions (a method shipped as its own package). The params schema (:mod:`debias.params`) is
built from the registry when it is first imported: each method's params section becomes the field
``stage2.<section>``, and ``stage2.method`` allows exactly the registered names. docs/extending.md walks through
adding one.

Nothing outside a method's own package branches on its name: the orchestration reads the :class:`MethodSpec`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from debias.core.declarations import check_section, import_declarations as import_packages, resolve

# This module imports nothing else of debias (the params schema and the memory check import it): ``Params`` below is
# debias.params.Params, ``Section`` debias.params.Section, ``StepPlan`` debias.core.resources.StepPlan.
Params = Section = StepPlan = Any

PACKAGE = "debias.training.methods"
ENV_VAR = "DEBIAS_METHODS"  # modules that register methods from outside the package, comma-separated
ENTRY_POINT_GROUP = "debias.methods"

TemperatureFn = Callable[[Params], tuple[str, float]]  # (dotted param key, its value)
MemoryPlanFn = Callable[[Params, int], StepPlan]  # (params, training points) -> one training step's plan


def _no_erm_weights(params: Params) -> bool:
    return False


@dataclass(frozen=True)
class MethodSpec:
    """A registered stage-2 method and what the code outside it needs to know.

    ``setup``: ``Stage2Inputs -> Stage2Setup``, or ``"module:function"`` imported on first use (the declaration
    stays free of torch). ``section`` / ``params``: the method's own params section ``stage2.<section>`` (a
    :class:`debias.params.Section`), with ``sources``, the source line of each of its leaf keys (relative to
    the section, e.g. ``"num_positives"``; tests/test_param_sources.py checks them). ``reads``: shared param
    prefixes the method reads besides its own section and ``stage2.*`` (e.g. ``"loss."``), for applicability.
    ``memory_plan``: the images and pairwise matrices of one training step (:class:`debias.core.resources.StepPlan`; None:
    ``stage2.batch_size`` images, no pairwise matrices, as ERM); ``memory_advice``: the params to lower after a real out-of-memory error. ``fairkl_weight``: lambda of FairKL
    as the method applies it (None: the method has no FairKL term). ``needs_erm_weights``: whether stage 2 starts
    from stage 1's weights under these params.
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
    memory_plan: MemoryPlanFn | None = None
    memory_advice: tuple[str, ...] = ("stage2.batch_size",)
    fairkl_weight: Callable[[Params], float] | None = None
    epsilon_key: str | None = None  # the param of the margin its contrastive term reads (loss.epsilon, ...), if any
    needs_erm_weights: Callable[[Params], bool] = _no_erm_weights

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
    check_section(f"stage-2 method '{name}'", "stage2", spec, METHODS.values())
    METHODS[name] = spec
    return spec


_discovered = False


def discover() -> dict[str, MethodSpec]:
    """Every registered method: the schema imports the declarations when it is built, so this imports
    :mod:`debias.params` (by name: the schema imports this module)."""
    importlib.import_module("debias.params")
    return METHODS


def import_declarations() -> dict[str, MethodSpec]:
    """Import every method declaration once (the package's subpackages, ``DEBIAS_METHODS``, entry points); called
    by :mod:`debias.params` while it builds the schema."""
    global _discovered
    if _discovered:
        return METHODS
    _discovered = True
    import_packages(PACKAGE, packages=True)
    for module in filter(None, (part.strip() for part in os.environ.get(ENV_VAR, "").split(","))):
        register_module(module)
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        register_module(entry.value)
    return METHODS


def register_module(module: str) -> None:
    """Import ``module``, whose top level registers its methods; a clear error when it cannot be imported.

    Call it before :mod:`debias.params` is first imported (the schema is built then), or name the module in
    ``DEBIAS_METHODS``; stage processes read that variable."""
    import sys

    if getattr(sys.modules.get("debias.params"), "Stage2Params", None) is not None and module not in sys.modules:
        raise RuntimeError(f"register_module('{module}') after the params schema was built; name it in "
                           f"{ENV_VAR} (read when debias.params is first imported) instead")
    try:
        importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(f"{ENV_VAR} names '{module}', which cannot be imported ({exc}); allowed: a module on "
                          "PYTHONPATH that registers stage-2 methods, group-inference methods or probe variants "
                          "(docs/extending.md)") from exc


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
