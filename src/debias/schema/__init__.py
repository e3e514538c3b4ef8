"""The whole params schema: the sections of :mod:`debias.params` completed with those the registries declare, and
the validation and loading of ``params.yaml`` every stage runs.

:func:`schema` builds it once, on first use (not on import, so a stage that fails to build it fails inside its
harness, with one line): the extension modules (``DEBIAS_METHODS``, entry points) and every declaration are imported
(:func:`debias.training.methods.registry.discover`, :func:`debias.groups.registry.discover`,
:func:`debias.evaluation.variants.import_declarations`), ``Stage2Params``, ``GroupsParams`` and ``ProbeParams`` are
built from them (:mod:`debias.params.stage2`, :mod:`~debias.params.groups`, :mod:`~debias.params.probe`) and
:class:`Params` (``debias.params.Params`` with these three sections) from those. The names ``Params``,
``Stage2Params``, ``GroupsParams`` and ``ProbeParams`` of this module are the built classes.

:func:`load_params` refuses a file that leaves out a section a registered variant declares (``stage2.cnc``, ...) or
the ``method`` of a section built from a registry: the schema's defaults would run in their place, unseen.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field, ValidationError, create_model

from debias.core.errors import ParamsError
from debias.evaluation.variants import NO_POSTPROCESS, POSTPROCESSINGS, PROBES, import_declarations as import_probes
from debias.groups.registry import discover as group_methods
from debias.params import STAGE2_DEFAULTS, Params as ParamsBase, parse_yaml, problems
from debias.params.groups import groups_model
from debias.params.probe import probe_model
from debias.params.stage2 import stage2_model
from debias.training.methods.registry import discover as stage2_methods

# The sections built from a registry: the params key of each and its registry's kind of variant.
REGISTRY_SECTIONS = {"stage2": "stage-2 method", "groups": "group-inference method", "probe": "probe variant"}

_BUILT: type[ParamsBase] | None = None
_SECTIONS: dict[str, type[BaseModel]] = {}


def schema() -> type[ParamsBase]:
    """The whole :class:`Params` model, built from the declarations on first call (a DeclarationError naming a
    broken declaration module)."""
    global _BUILT
    if _BUILT is None:
        stage2 = stage2_model(stage2_methods())  # first: it imports the extension modules every registry shares
        groups = groups_model(group_methods())
        import_probes()
        probe = probe_model(PROBES, POSTPROCESSINGS, NO_POSTPROCESS)
        _SECTIONS.update(Stage2Params=stage2, GroupsParams=groups, ProbeParams=probe)
        _BUILT = create_model("Params", __base__=ParamsBase, __module__=__name__,
                              groups=(groups, Field(default_factory=groups)),
                              stage2=(stage2, Field(default_factory=lambda: stage2(**STAGE2_DEFAULTS))),
                              probe=(probe, Field(default_factory=probe)))
    return _BUILT


def __getattr__(name: str) -> Any:
    """``Params``, ``Stage2Params``, ``GroupsParams``, ``ProbeParams``: the built classes (built on first use)."""
    if name == "Params":
        return schema()
    if name in ("Stage2Params", "GroupsParams", "ProbeParams"):
        schema()
        return _SECTIONS[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def valid_keys() -> list[str]:
    """Every dotted key of the whole schema, sections included (``stage2``, ``stage2.cnc``, ``stage2.cnc.temperature``)."""
    from debias.params import _valid_keys

    return _valid_keys(schema())


def validate(raw: dict[str, Any] | None) -> ParamsBase:
    """Validate a params mapping against the whole schema; a ParamsError listing every problem (at most 20). Keys
    left out take the schema's defaults (the papers'); :func:`load_params` refuses a file leaving out a section."""
    model = schema()
    try:
        params = model.model_validate(raw or {})
    except ValidationError as exc:
        raise ParamsError(problems(exc, model)) from None
    _refuse_uncapturable(params)
    return params


def _refuse_uncapturable(params: ParamsBase) -> None:
    """``stage2.speed.step: cuda_graph`` where the params alone rule it out (a method whose step is not capturable,
    bf16 autocast, a compiled encoder): refused here, before ``dvc exp run`` trains ERM."""
    from debias.params.optim import CUDA_GRAPH, capture_problems
    from debias.training.methods.registry import method_spec

    speed = params.stage2.speed
    if speed.step != CUDA_GRAPH:
        return
    spec = method_spec(params.stage2.method)
    found = capture_problems(spec.name, spec.capturable, spec.capture_note, speed.autocast, speed.compile)
    if found:
        raise ParamsError("invalid params.yaml:\n  - " + "\n  - ".join(
            f"stage2.speed.step = {CUDA_GRAPH} cannot run: {problem}" for problem in found)
            + "\n  allowed: stage2.speed.step eager (the default)")


def declared_keys() -> list[str]:
    """The keys a params file must state: the ``method`` of every section built from a registry and every section a
    registered variant declares (``stage2.method``, ``stage2.cnc``, ``groups.cluster``, ``probe.dfr``, ...)."""
    from debias.params import STAGE2_SHARED_FIELDS

    model, keys = schema(), []
    for top in REGISTRY_SECTIONS:
        shared = {*ParamsBase.model_fields[top].annotation.model_fields, *STAGE2_SHARED_FIELDS}  # type: ignore[union-attr]
        built = model.model_fields[top].annotation.model_fields  # type: ignore[union-attr]
        keys += [f"{top}.{name}" for name, field in built.items() if name not in shared and (
            name == "method" or isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel))]
    return keys


def missing_keys(raw: dict[str, Any]) -> list[str]:
    """The :func:`declared_keys` the mapping ``raw`` (a params file as read) leaves out."""
    missing = []
    for key in declared_keys():
        value: Any = raw
        for part in key.split("."):
            value = value.get(part, _ABSENT) if isinstance(value, dict) else _ABSENT
        if value is _ABSENT:
            missing.append(key)
    return missing


_ABSENT = object()


def check_complete(raw: dict[str, Any], path: Path) -> None:
    """A ParamsError naming the first key of :func:`missing_keys` (and how many more), unless ``raw`` has them all."""
    missing = missing_keys(raw)
    if not missing:
        return
    first, top = missing[0], missing[0].split(".")[0]
    what = (f"the {REGISTRY_SECTIONS[top]}" if first.endswith(".method")
            else f"the params section of a registered {REGISTRY_SECTIONS[top]}")
    more = f" (and {len(missing) - 1} more: {', '.join(missing[1:4])}{', ...' if len(missing) > 4 else ''})" \
        if len(missing) > 1 else ""
    raise ParamsError(f"{path} has no {first}{more}: {what}, which would run on the schema's defaults unseen; state it "
                      f"in {path}, as it states every value the pipeline uses")


def load_params(path: str | Path = "params.yaml") -> ParamsBase:
    """Read and validate ``params.yaml``; a missing or malformed file, or one leaving out a declared section or a
    registry's ``method`` (:func:`check_complete`), is a ParamsError."""
    return read_params(path)[0]


def read_params(path: str | Path = "params.yaml") -> tuple[ParamsBase, bytes]:
    """:func:`load_params`'s params and the bytes of the file they were read from: the same bytes always give the
    same params, so a later read that finds them unchanged need not validate again."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise ParamsError(f"{path} not found: run the stage from the repository root") from None
    raw = parse_yaml(data, path)
    if raw is not None and not isinstance(raw, dict):
        raise ParamsError(f"{path} must hold a mapping of sections, not {type(raw).__name__}")
    try:
        params = validate(raw or {})
    except ParamsError as exc:  # name the file it is: check-params OTHER.yaml is not params.yaml
        if path.name == "params.yaml":
            raise
        raise ParamsError(str(exc).replace("invalid params.yaml:", f"invalid {path}:", 1)) from None
    check_complete(raw or {}, path)
    return params, data
