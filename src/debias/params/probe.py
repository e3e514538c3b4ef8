"""The ``probe`` section: the linear probe and its variants, built from the variants' declarations
(:mod:`debias.evaluation.variants`): ``probe.method`` and ``probe.postprocess`` allow exactly the registered names,
each variant's own params section becomes ``probe.<section>``."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from debias.params.base import Section, show


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


def probe_model() -> type[ProbeBase]:
    """ProbeParams: the shared fields, ``method`` allowing exactly the registered variants (the one declared the
    schema default first), each variant's own section, then ``postprocess`` (``none`` or a registered one). The
    fields carry what :mod:`debias.params.applicability` reads: each section its ``owner``, ``method`` the
    ``shared`` params and those each variant ``reads``."""
    from pydantic import create_model

    from debias.evaluation.variants import NO_POSTPROCESS, POSTPROCESSINGS, PROBES, import_declarations

    import_declarations()
    defaults = [name for name, variant in PROBES.items() if variant.schema_default]
    if len(defaults) != 1:
        raise RuntimeError(f"exactly one probe variant must be the schema default; registered: {sorted(PROBES)}, "
                           f"defaults: {defaults}")
    names = (defaults[0], *(name for name in PROBES if name != defaults[0]))
    for variant in PROBES.values():
        if variant.section in (*ProbeBase.model_fields, "method", "postprocess"):
            raise RuntimeError(f"probe variant '{variant.name}': probe.{variant.section} is a shared field; "
                               "allowed: another section name")
    sections = {v.section: (v.params, Field(default_factory=v.params, json_schema_extra={"owner": v.name}))
                for v in sorted(PROBES.values(), key=lambda v: v.name != defaults[0]) if v.section is not None}
    variants = "; ".join(f"{v.name}: {v.display or v.name} (reads {', '.join(v.reads) or 'no shared param'})"
                         for v in (PROBES[name] for name in names))
    posts = "; ".join(f"{p.name}: {p.display or p.name}{' (binary tasks)' if p.binary else ''}"
                      for p in POSTPROCESSINGS.values())
    return create_model(
        "ProbeParams", __base__=ProbeBase, __module__=__name__,
        method=(Literal[names], Field(names[0], description=variants,  # type: ignore[valid-type]
                                      json_schema_extra={"shared": [f"probe.{key}" for key in ProbeBase.model_fields],
                                                         "reads": {v.name: list(v.reads) for v in PROBES.values()},
                                                         "needs_attribute": [v.name for v in PROBES.values()
                                                                             if v.needs_attribute]})),
        **sections,
        postprocess=(Literal[(NO_POSTPROCESS, *POSTPROCESSINGS)],  # type: ignore[valid-type]
                     Field(NO_POSTPROCESS, description=f"{NO_POSTPROCESS}: the probe alone; {posts}; reported "
                                                       "beside the probe",
                           json_schema_extra={"needs_attribute": [p.name for p in POSTPROCESSINGS.values()
                                                                  if p.needs_attribute]})))
