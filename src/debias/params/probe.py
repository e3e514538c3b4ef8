"""The ``probe`` section: the linear probe and its variants, built (by :mod:`debias.schema`) from the variants'
declarations (:mod:`debias.evaluation.variants`): ``probe.method`` and ``probe.postprocess`` allow exactly the registered names,
each variant's own params section becomes ``probe.<section>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from debias.core.errors import DeclarationError
from debias.params.base import Section, schema_order, show


def _positive_distinct(values: list[float]) -> list[float]:
    if any(v <= 0 for v in values):
        raise ValueError(f"every value must be > 0, got {show(values)}")
    if len(set(values)) != len(values):
        raise ValueError(f"values repeat in {show(values)}; allowed: distinct values")
    return values


class ProbeBase(Section):
    """The params the variants share (each applies to the variants that declare they read it)."""

    train_split: Literal["train", "val"] = "train"
    c_grid: list[float] = Field(default_factory=lambda: [0.01, 0.1, 1.0, 10.0], min_length=1,
                                description="inverse L2 strengths tried; the best validation worst-group wins")
    max_iter: int = Field(1000, ge=10, le=100000)
    standardize: bool = True

    @field_validator("c_grid")
    @classmethod
    def _positive(cls, values: list[float]) -> list[float]:
        return _positive_distinct(values)


def probe_model(probes: Mapping[str, Any], postprocessings: Mapping[str, Any],
                no_postprocess: str) -> type[ProbeBase]:
    """ProbeParams from the registered ``probes`` (name -> ProbeVariant) and ``postprocessings`` (name ->
    Postprocessing): the shared fields, ``method`` allowing exactly the registered variants (the schema default
    first), each variant's own section, then ``postprocess`` (``no_postprocess`` or a registered one). The fields
    carry what :mod:`debias.schema.applicability` and the source checks read: each section its ``owner``, ``method``
    the ``shared`` params and those each variant ``reads``, ``postprocess`` those that need the true attribute or a
    binary task."""
    from pydantic import create_model

    names = schema_order(probes, "probe variant")
    for variant in probes.values():
        if variant.section in (*ProbeBase.model_fields, "method", "postprocess"):
            raise DeclarationError(f"probe variant '{variant.name}': probe.{variant.section} is a shared field; "
                                   "allowed: another section name")
    sections = {v.section: (v.params, Field(default_factory=v.params, json_schema_extra={"owner": v.name}))
                for v in sorted(probes.values(), key=lambda v: v.name != names[0]) if v.section is not None}
    variants = "; ".join(f"{v.name}: {v.display or v.name} (reads {', '.join(v.reads) or 'no shared param'})"
                         for v in (probes[name] for name in names))
    posts = "; ".join(f"{p.name}: {p.display or p.name}{' (binary tasks)' if p.binary else ''}"
                      for p in postprocessings.values())
    return create_model(
        "ProbeParams", __base__=ProbeBase, __module__="debias.schema",
        method=(Literal[names], Field(names[0], description=variants,  # type: ignore[valid-type]
                                      json_schema_extra={"shared": [f"probe.{key}" for key in ProbeBase.model_fields],
                                                         "reads": {v.name: list(v.reads) for v in probes.values()},
                                                         "needs_attribute": [v.name for v in probes.values()
                                                                             if v.needs_attribute]})),
        **sections,
        postprocess=(Literal[(no_postprocess, *postprocessings)],  # type: ignore[valid-type]
                     Field(no_postprocess, description=f"{no_postprocess}: the probe alone; {posts}; reported "
                                                       "beside the probe",
                           json_schema_extra={"needs_attribute": [p.name for p in postprocessings.values()
                                                                  if p.needs_attribute],
                                              "binary": [p.name for p in postprocessings.values() if p.binary]})))
