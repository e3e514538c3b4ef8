"""The root of the schema (:class:`Params`: every section and the checks across sections) and what reading,
describing and flattening params needs. The sections built from the registries (``groups``, ``stage2``, ``probe``)
are their bases here; :mod:`debias.schema` builds them from the declarations, completes :class:`Params` with them and
validates and loads params.yaml."""

from __future__ import annotations

import copy
import difflib
import functools
import hashlib
import json
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from debias.core.errors import NEEDS_BIAS_LABELS, ParamsError
from debias.params.base import Section, show
from debias.params.bias import BiasParams
from debias.params.data import DataParams
from debias.params.evaluate import EvaluateParams
from debias.params.groups import GroupsBase
from debias.params.health import HealthParams
from debias.params.loss import LossParams
from debias.params.model import ModelParams, has_batchnorm
from debias.params.optim import NEEDS_INFERRED_GROUPS, NEEDS_TRUE_GROUPS, ErmParams, Selection
from debias.params.probe import ProbeBase
from debias.params.report import ReportParams
from debias.params.stage2 import STAGE2_DEFAULTS, Stage2Base

# Source / protocol combinations that make no sense (Params._protocol_fits_source).
PHOTO_SOURCES = ("imagefolder", "waterbirds", "celeba")  # carry their own attribute
STROKE_PROTOCOLS = ("foreground", "background")  # paint grey digit strokes or backgrounds
UNATTRIBUTED_SOURCES = ("cifar10",)  # photos without a bias attribute
TABULAR_SOURCES = ("adult", "compas")  # feature vectors with their sensitive attribute
MIN_IMAGE_SIZE = {"lenet5": 16}  # smallest image side an encoder can take (LeNet-5: two 5x5 convs and 2x2 pools)


class Params(Section):
    """Every section and the checks across them; ``groups``, ``stage2`` and ``probe`` hold their bases here, the
    schema (:func:`debias.schema.schema`) replaces them with the sections built from the registries. The type of
    params in every signature; validate with :func:`debias.schema.validate`."""

    seed: int = Field(0, ge=0, lt=2**31)
    data: DataParams = Field(default_factory=DataParams)
    bias: BiasParams = Field(default_factory=BiasParams)
    model: ModelParams = Field(default_factory=ModelParams)
    erm: ErmParams = Field(default_factory=ErmParams)
    groups: GroupsBase = Field(default_factory=GroupsBase)
    stage2: Stage2Base = Field(default_factory=lambda: Stage2Base(**STAGE2_DEFAULTS))
    loss: LossParams = Field(default_factory=LossParams)
    probe: ProbeBase = Field(default_factory=ProbeBase)
    evaluate: EvaluateParams = Field(default_factory=EvaluateParams)
    report: ReportParams = Field(default_factory=ReportParams)
    health: HealthParams = Field(default_factory=HealthParams)

    @field_validator("seed", mode="before")
    @classmethod
    def _seed_is_int(cls, value: Any) -> Any:
        if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
            raise ValueError("seed must be a whole number")
        return value

    @model_validator(mode="after")
    def _erm_selects_without_inferred_groups(self) -> "Params":
        """ERM trains before its groups exist (infer_groups infers them from ERM's model): refuse a rule needing them."""
        if self.erm.selection in NEEDS_INFERRED_GROUPS:
            allowed = [name for name in get_args(Selection) if name not in NEEDS_INFERRED_GROUPS]
            raise ValueError(f"erm.selection = {self.erm.selection}: ERM has no inferred groups to select by (it trains "
                             "before infer_groups, which infers the groups from ERM's model); allowed: "
                             f"{', '.join(allowed)} (stage2.selection may use {self.erm.selection})")
        return self

    @model_validator(mode="after")
    def _protocol_fits_source(self) -> "Params":
        source, protocol = self.data.source, self.bias.protocol
        if source in PHOTO_SOURCES and protocol in STROKE_PROTOCOLS:
            raise ValueError(f"bias.protocol = {protocol} recolours grey digit strokes; data.source = {source} holds photos "
                             "that carry their own bias attribute; allowed: bias.protocol = auto, given (or corruption)")
        if source in TABULAR_SOURCES and protocol not in ("auto", "given"):
            raise ValueError(f"bias.protocol = {protocol} biases images; data.source = {source} holds feature vectors "
                             "with their own sensitive attribute; allowed: bias.protocol = auto or given")
        if source in UNATTRIBUTED_SOURCES and protocol == "given":
            raise ValueError(f"bias.protocol = given needs a bias attribute that data.source = {source} does not have; "
                             "allowed: bias.protocol = auto or corruption (Corrupted CIFAR-10)")
        if source == "imagefolder" and self.data.imagefolder.attribute_column is None and protocol == "given":
            raise ValueError("bias.protocol = given needs a bias attribute, and data.imagefolder.attribute_column is null; "
                             "allowed: bias.protocol = auto or none (data without bias labels)")
        smallest = MIN_IMAGE_SIZE.get(self.model.name)
        if smallest and source not in TABULAR_SOURCES and self.data.image_size < smallest:
            raise ValueError(f"model.name = {self.model.name} needs data.image_size >= {smallest} (its two 5x5 "
                             f"convolutions and pools), got {self.data.image_size}")
        return self

    @model_validator(mode="after")
    def _batches_fit_batchnorm(self) -> "Params":
        """BatchNorm in training mode needs two samples per batch (torch stops at the first step of a batch of one,
        naming no param): refuse ``erm.batch_size`` / ``stage2.batch_size`` 1 where the encoder has BatchNorm."""
        tabular = self.data.source in TABULAR_SOURCES
        if not has_batchnorm(self.model, tabular):
            return self
        encoder = (f"the mlp data.source = {self.data.source} uses, with model.mlp.batch_norm true" if tabular else
                   "model.name = mlp with model.mlp.batch_norm true" if self.model.name == "mlp" else
                   f"model.name = {self.model.name}")
        without = "mlp with model.mlp.batch_norm false" if tabular else "lenet5, or mlp with model.mlp.batch_norm false"
        for key, optim in (("erm", self.erm), ("stage2", self.stage2)):
            if optim.batch_size == 1:
                raise ValueError(f"{key}.batch_size = 1: the encoder ({encoder}) has BatchNorm, which needs at least 2 "
                                 f"samples per training batch; allowed: {key}.batch_size >= 2, or an encoder without "
                                 f"BatchNorm ({without})")
        return self

    @property
    def bias_labels(self) -> bool:
        """Whether the data carries the true bias attribute: not under ``bias.protocol: none``, nor for an image
        folder without attribute column (``auto`` resolves to ``none`` there)."""
        return not (self.bias.protocol == "none" or (self.data.source == "imagefolder"
                                                     and self.data.imagefolder.attribute_column is None))

    @model_validator(mode="after")
    def _needs_bias_labels(self) -> "Params":
        """Without bias labels, refuse up front every choice that reads the true attribute (naming the param)."""
        if self.bias_labels:
            return self
        why = ("data.imagefolder.attribute_column is null" if self.data.source == "imagefolder"
               and self.data.imagefolder.attribute_column is None else "bias.protocol = none")
        for key, value, allowed in needs_bias_labels_choices(self):
            raise ValueError(f"{key} = {value} {NEEDS_BIAS_LABELS}, and the data has none ({why}); allowed without "
                             f"them: {allowed}")
        return self


def _needs_attribute(section: BaseModel, name: str) -> tuple[list[str], list[str]]:
    """(values of ``section.name`` that read the true bias attribute, the others), as the registries declared them
    when the schema was built (the field's ``needs_attribute`` marker)."""
    field = type(section).model_fields[name]
    refused = list((field.json_schema_extra or {}).get("needs_attribute", []))  # type: ignore[union-attr]
    return refused, [str(v) for v in get_args(field.annotation) if v not in refused]


def needs_bias_labels_choices(params: Params) -> list[tuple[str, str, str]]:
    """``(param, value, allowed)`` for each chosen value that reads the true bias attribute: what the group-method
    and probe registries declare ``needs_attribute`` (the oracle groups, DFR's group-balanced halves, the
    equalized-odds post-processing) and :data:`~debias.params.optim.NEEDS_TRUE_GROUPS` (selection by true groups).
    Stage-2 methods read groups from the groups table, so ``groups.method`` covers them."""
    found = []
    for key, section, name in (("groups.method", params.groups, "method"), ("probe.method", params.probe, "method"),
                               ("probe.postprocess", params.probe, "postprocess")):
        refused, allowed = _needs_attribute(section, name)
        if getattr(section, name) in refused:
            found.append((key, getattr(section, name), ", ".join(allowed)))
    for key, optim, excluded in (("erm.selection", params.erm, NEEDS_TRUE_GROUPS + NEEDS_INFERRED_GROUPS),
                                 ("stage2.selection", params.stage2, NEEDS_TRUE_GROUPS)):
        if optim.selection in NEEDS_TRUE_GROUPS:
            allowed = [name for name in get_args(Selection) if name not in excluded]
            found.append((key, optim.selection, ", ".join(allowed)))
    return found


# --------------------------------------------------------------------------- loading


def _valid_keys(model: type[BaseModel], prefix: str = "") -> list[str]:
    keys: list[str] = []
    for name, field in model.model_fields.items():
        dotted = f"{prefix}{name}"
        keys.append(dotted)
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(_valid_keys(annotation, dotted + "."))
    return keys


def _field_at(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    """The pydantic FieldInfo at a dotted location, or None (list items, unions)."""
    field = None
    for part in loc:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        field = model.model_fields[part]
        model = field.annotation  # type: ignore[assignment]
    return field


def _allowed_range(field: Any) -> str | None:
    """'0 < value < 1' from a field's gt/ge/lt/le constraints."""
    if field is None:
        return None
    low = high = None
    for meta in field.metadata:
        for attr, sign in (("gt", "<"), ("ge", "<=")):
            if getattr(meta, attr, None) is not None:
                low = f"{getattr(meta, attr)} {sign} "
        for attr, sign in (("lt", "<"), ("le", "<=")):
            if getattr(meta, attr, None) is not None:
                high = f" {sign} {getattr(meta, attr)}"
    if low is None and high is None:
        return None
    return f"{low or ''}value{high or ''}"


EXPECTED_KIND = {"float_type": "a number", "float_parsing": "a number", "int_type": "a whole number",
                 "int_parsing": "a whole number", "int_from_float": "a whole number", "bool_type": "true or false"}


def _describe(error: dict[str, Any], model: type[BaseModel]) -> str:
    """One line for one pydantic error: the dotted key, the (bounded) value, what is allowed."""
    loc = tuple(error["loc"])
    key = ".".join(str(part) for part in loc)
    kind = error["type"]
    value = error.get("input")
    message = error["msg"].removeprefix("Value error, ")
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(key, _valid_keys(model), n=1, cutoff=0.6)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        return f"unknown parameter '{key}' (value {show(value)}){hint}"
    if not key:
        return message
    if kind == "value_error" and isinstance(value, dict):  # a section's own check; its message starts with a field
        return message if message.startswith(f"{key}.") else f"{key}.{message}"  # named in full already: not twice
    if kind == "literal_error":
        return f"{key} = {show(value)} is not allowed; allowed: {error['ctx']['expected']}"
    if kind in EXPECTED_KIND and isinstance(value, (bool, str)):
        message = f"{'a boolean' if isinstance(value, bool) else 'a string'} where {EXPECTED_KIND[kind]} is expected"
    allowed = _allowed_range(_field_at(model, loc))
    return f"{key} = {show(value)}: {message}" + (f"; allowed: {allowed}" if allowed else "")


def problems(exc: ValidationError, model: type[BaseModel]) -> str:
    """A pydantic ValidationError of ``model`` as ParamsError's text: one line per problem (at most 20)."""
    errors = exc.errors()
    lines = [_describe(err, model) for err in errors[:20]]
    more = f"\n  ... and {len(errors) - 20} more" if len(errors) > 20 else ""
    return "invalid params.yaml:\n  - " + "\n  - ".join(lines) + more


@functools.lru_cache(maxsize=4)
def _parse_yaml12(text: str) -> Any:
    """``text`` parsed as YAML 1.2 by ruamel's safe loader as DVC parses params.yaml (its C parser where installed,
    which ignores a ``%YAML 1.1`` directive as DVC does), once per distinct text."""
    from ruamel.yaml import YAML

    return YAML(typ="safe").load(text)


def read_yaml(path: Path) -> Any:
    """``path`` parsed as YAML 1.2 (as DVC parses params.yaml, so ``1e-3`` is a number for both); a file that is
    not UTF-8, not YAML, or repeats a key is a ParamsError naming the file and the place."""
    return parse_yaml(path.read_bytes(), path)


def parse_yaml(data: bytes, path: Path) -> Any:
    """``data``, the bytes of ``path``, parsed as :func:`read_yaml` parses the file."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise ParamsError(f"{path} is not UTF-8 text (byte {data[exc.start]:#04x} at line {line}); save it as UTF-8") from None
    try:
        return copy.deepcopy(_parse_yaml12(text))
    except Exception as exc:  # ruamel's YAMLError, DuplicateKeyError, ...
        lines = [line for line in str(exc).splitlines() if line.strip()][:6]
        raise ParamsError(f"{path} is not valid YAML ({type(exc).__name__}): " + " | ".join(l.strip() for l in lines)[:600]) from None


def section(params: Params, dotted: str) -> Any:
    """The value at a dotted key, e.g. ``section(p, 'bias.foreground')``."""
    value: Any = params
    for part in dotted.split("."):
        value = getattr(value, part)
    return value


def as_dict(params: Params, keys: list[str] | None = None) -> dict[str, Any]:
    """Plain mapping of the given top-level/dotted keys (all when None), for logging and hashing."""
    full = params.model_dump(mode="json", warnings=False)  # defaults hold tuples where params.yaml holds lists
    if keys is None:
        return full
    out: dict[str, Any] = {}
    for dotted in keys:
        value: Any = full
        for part in dotted.split("."):
            value = value[part]
        out[dotted] = value
    return out


def params_hash(values: dict[str, Any]) -> str:
    """Stable short hash of the params a stage read (sorted JSON, sha256, 12 hex digits)."""
    blob = json.dumps(values, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{'a': {'b': 1}}`` -> ``{'a.b': 1}``; lists are kept as JSON strings."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, dotted + "."))
        elif isinstance(value, (list, tuple)):
            flat[dotted] = json.dumps(value)
        else:
            flat[dotted] = value
    return flat
