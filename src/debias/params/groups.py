"""The ``groups`` section: how stage 1's groups are inferred, built (by :mod:`debias.schema`) from the group-inference
methods' declarations (:mod:`debias.groups.registry`): ``groups.method`` allows exactly the registered names (the one declared the schema
default first) and each method's own params section becomes ``groups.<section>``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field, field_validator

from debias.params.base import Section, schema_order


class GroupsBase(Section):
    """What every group-inference method shares: its name, whatever YAML made of the word."""

    @field_validator("method", mode="before", check_fields=False)
    @classmethod
    def _yaml_booleans_are_names(cls, value: Any) -> Any:
        """YAML (and ``dvc exp run -S groups.method=true``) reads the words true and false as booleans; a method's
        name is a string."""
        return str(value).lower() if isinstance(value, bool) else value


def groups_model(methods: Mapping[str, Any]) -> type[GroupsBase]:
    """GroupsParams from the registered ``methods`` (name -> GroupMethodSpec): ``method`` allowing exactly them (the
    schema default first), then each method's own section."""
    from pydantic import create_model

    names = schema_order(methods, "group-inference method")
    sections = {spec.section: (spec.params, Field(default_factory=spec.params, json_schema_extra={"owner": spec.name}))
                for spec in methods.values() if spec.section is not None}  # owner: read by debias.schema.applicability
    return create_model("GroupsParams", __base__=GroupsBase, __module__="debias.schema",
                        method=(Literal[names], Field(names[0], json_schema_extra={  # type: ignore[valid-type]
                            "needs_attribute": [name for name in names if methods[name].needs_attribute]})),
                        **sections)
