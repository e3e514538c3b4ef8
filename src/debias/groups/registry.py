"""The group-inference method registry (``groups.method``): every fact the rest of the code needs about a method,
declared by the method.

A method is one module of :mod:`debias.groups.methods` that calls :func:`register_group_method` (pydantic, the
params base and this module only at import: the params schema imports it). Its inference function takes
``(train, z, logits, params, seed)`` (the training split, its ERM embeddings [N, D] and logits [N, C], the
``groups`` params section, the seed) and returns a :class:`GroupInference`; given as ``"module:function"`` it is
imported when the method runs. :func:`discover` imports every module of the package, after the modules named in
``DEBIAS_METHODS`` (and the ``debias.methods`` entry points), which may register group methods too, as stage-2
methods (:mod:`debias.training.methods.registry`). The ``groups`` params section is built from the registry
(:mod:`debias.schema`, :func:`debias.params.groups.groups_model`): ``groups.method`` allows exactly the registered names and each method's own
section becomes ``groups.<section>``. docs/extending.md walks through adding one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from debias.core.declarations import check_section, import_declarations as _import_modules, resolve

if TYPE_CHECKING:
    import torch

PACKAGE = "debias.groups.methods"


@dataclass
class GroupInference:
    """Inferred bias label, group and minority flag per training point (row n = split index n)."""

    inferred_label: torch.Tensor  # int64 [N] bias label, comparable across classes
    inferred_group: torch.Tensor  # int64 [N] (class, label or within-class cluster), see the method's module
    minority: torch.Tensor  # bool [N] inferred bias-conflicting
    embedding2d: torch.Tensor | None = None  # float [N, umap_components] UMAP coordinates (cluster only)
    timings: dict[str, float] = field(default_factory=dict)  # seconds per step
    y: torch.Tensor | None = None  # int64 [N] class, filled by infer_groups and load_groups
    bias_scores: torch.Tensor | None = None  # float32 [N, K] soft bias scores, rows sum to 1 (soft only)

    def labels_by_group(self) -> dict[int, int]:
        """Inferred group -> its inferred bias label (every method gives one label per group)."""
        import torch

        pairs = torch.stack([self.inferred_group, self.inferred_label], 1).unique(dim=0)
        return {int(g): int(label) for g, label in pairs.tolist()}

    def __len__(self) -> int:
        return int(self.inferred_label.numel())


InferenceFn = Callable[[Any, Any, Any, Any, int], GroupInference]  # (train, z, logits, groups params, seed)


@dataclass(frozen=True)
class GroupMethodSpec:
    """A registered ``groups.method`` and what the code outside it needs to know.

    ``infer``: the inference function, or ``"module:function"`` imported on first use. ``section`` / ``params``:
    the method's own params section ``groups.<section>`` (a :class:`debias.params.Section`) with ``sources``, the
    source line of each of its leaf keys (relative to the section). ``needs_attribute``: the method reads the
    true bias attribute of the training split (an oracle: its labels are exact, no weak-groups warning; a split
    without attributes cannot run it). ``schema_default``: the ``groups.method`` of a params.yaml that names none
    (exactly one method). ``transfer``: ``(val, val_z, val_logits, train_z, train_inference, params) ->
    GroupInference``, the validation split's groups from the same fitted inference (or ``"module:function"``; None:
    the method labels no validation split, and selection by inferred groups is refused)."""

    name: str
    infer: InferenceFn | str
    display: str = ""
    needs_attribute: bool = False
    schema_default: bool = False
    section: str | None = None
    params: Any = None
    sources: dict[str, str] = field(default_factory=dict)
    transfer: Callable[..., GroupInference] | str | None = None

    def infer_fn(self) -> InferenceFn:
        """The inference function, imported on first use when given as ``"module:function"``."""
        return resolve(self.infer)

    def transfer_fn(self) -> Callable[..., GroupInference] | None:
        """The validation transfer, imported on first use when given as ``"module:function"``."""
        return None if self.transfer is None else resolve(self.transfer)

    @property
    def label(self) -> str:
        return self.display or self.name


METHODS: dict[str, GroupMethodSpec] = {}


def register_group_method(name: str, infer: InferenceFn | str, **facts: Any) -> GroupMethodSpec:
    """Register ``name`` as a ``groups.method`` value (``facts``: the other :class:`GroupMethodSpec` fields); a
    name once, a params section owned by one method, every leaf of it with its source."""
    if name in METHODS:
        raise ValueError(f"group-inference method '{name}' is registered twice")
    spec = GroupMethodSpec(name, infer, **facts)
    if spec.section == "method":
        raise ValueError(f"group-inference method '{name}': groups.method is the method's name; allowed: "
                         "another section name")
    check_section(f"group-inference method '{name}'", "groups", spec, METHODS.values())
    METHODS[name] = spec
    return spec


_discovered = False


def discover() -> dict[str, GroupMethodSpec]:
    """Every registered method: the extension modules (``DEBIAS_METHODS``, entry points) and every module of
    :data:`PACKAGE` imported once; a broken one is a DeclarationError naming it."""
    global _discovered
    if not _discovered:
        _import_modules(PACKAGE, packages=False)
        _discovered = True
    return METHODS


def schema_order(methods: dict[str, GroupMethodSpec]) -> tuple[str, ...]:
    """The registered names, the one declared the schema default first (a RuntimeError unless exactly one is)."""
    defaults = [name for name, spec in methods.items() if spec.schema_default]
    if len(defaults) != 1:
        raise RuntimeError(f"exactly one group-inference method must be the schema default; registered: "
                           f"{sorted(methods)}, defaults: {defaults}")
    return (defaults[0], *(name for name in methods if name != defaults[0]))


def group_method(name: str) -> GroupMethodSpec:
    """The registered method ``name``; a ValueError naming ``groups.method`` and the registered ones otherwise."""
    if name not in discover():
        raise ValueError(f"groups.method = '{name}' unknown; allowed: {', '.join(schema_order(METHODS))}")
    return METHODS[name]


def group_sections() -> dict[str, GroupMethodSpec]:
    """``section -> spec`` of every method with its own ``groups.<section>`` params."""
    return {spec.section: spec for spec in discover().values() if spec.section is not None}


def group_sources() -> dict[str, str]:
    """The source line of every leaf of every method's params section, by its dotted key."""
    return {f"groups.{spec.section}.{key}": line for spec in discover().values() if spec.section is not None
            for key, line in spec.sources.items()}
