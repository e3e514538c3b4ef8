"""The ``groups`` section: how stage 1's groups are inferred, built from the group-inference methods' declarations
(:mod:`debias.groups.registry`): ``groups.method`` allows exactly the registered names (the one declared the schema
default first) and each method's own params section becomes ``groups.<section>``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from debias.params.base import Section


class GroupsBase(Section):
    """What every group-inference method shares: its name, whatever YAML made of the word."""

    @field_validator("method", mode="before", check_fields=False)
    @classmethod
    def _yaml_booleans_are_names(cls, value: Any) -> Any:
        """YAML (and ``dvc exp run -S groups.method=true``) reads the words true and false as booleans; a method's
        name is a string."""
        return str(value).lower() if isinstance(value, bool) else value


def groups_model() -> type[GroupsBase]:
    """GroupsParams: ``method`` allowing exactly the registered methods, then each method's own section."""
    from pydantic import create_model

    from debias.groups.registry import import_declarations, schema_order

    methods = import_declarations()
    names = schema_order(methods)
    sections = {spec.section: (spec.params, Field(default_factory=spec.params, json_schema_extra={"owner": spec.name}))
                for spec in methods.values() if spec.section is not None}  # owner: read by debias.params.applicability
    return create_model("GroupsParams", __base__=GroupsBase, __module__=__name__,
                        method=(Literal[names], Field(names[0], json_schema_extra={  # type: ignore[valid-type]
                            "needs_attribute": [name for name in names if methods[name].needs_attribute]})),
                        **sections)
