"""What every registry of declared variants shares (stage-2 methods, group-inference methods, probe variants): the
leaf keys of a declared params section, the check that each has its source, and the import of a package's
declaration modules. Pydantic only, nothing of debias: the params schema is built from the declarations."""

from __future__ import annotations

import importlib
import pkgutil
from typing import Any


def leaf_keys(model: Any, prefix: str = "") -> list[str]:
    """The dotted leaf keys of a pydantic model (nested sections walked), relative to it."""
    from pydantic import BaseModel

    keys: list[str] = []
    for key, info in model.model_fields.items():
        annotation = info.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys.extend(leaf_keys(annotation, f"{prefix}{key}."))
        else:
            keys.append(prefix + key)
    return keys


def check_sources(owner: str, section: str, params: Any, sources: dict[str, str]) -> None:
    """A ValueError unless ``sources`` names exactly the leaves of ``params`` (the section ``section``, a dotted
    params key such as ``groups.cluster``, declared by ``owner``)."""
    leaves = set(leaf_keys(params))
    missing, stale = sorted(leaves - set(sources)), sorted(set(sources) - leaves)
    if missing:
        raise ValueError(f"{owner}: no source for {section}.{missing[0]}"
                         f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}; every default "
                         "names its source (paper:, code: or ours: with the reason)")
    if stale:
        raise ValueError(f"{owner}: a source for {section}.{stale[0]}, which {params.__name__} does not have")


def check_section(owner: str, prefix: str, spec: Any, registered: Any) -> None:
    """A ValueError unless ``spec`` (a declaration with ``name``, ``section``, ``params``, ``sources``) gives both
    its params section and its model or neither, owns a section no ``registered`` declaration owns, and names the
    source of every leaf of it (``prefix``: the params key above the section, e.g. ``stage2``)."""
    if (spec.section is None) != (spec.params is None):
        raise ValueError(f"{owner}: give both section and params, or neither")
    if spec.section is None:
        return
    owners = [other.name for other in registered if other.section == spec.section]
    if owners:
        raise ValueError(f"{owner}: params section {prefix}.{spec.section} is already {owners[0]}'s")
    check_sources(owner, f"{prefix}.{spec.section}", spec.params, spec.sources)


def resolve(target: Any) -> Any:
    """``target`` itself when callable, else the function a ``"module:function"`` string names (imported now)."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    return getattr(importlib.import_module(module), name)


def import_declarations(package: str, packages: bool) -> None:
    """Import every subpackage (``packages``) or every plain module (else) of ``package``, in name order."""
    found = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(found.__path__), key=lambda i: i.name):
        if info.ispkg == packages:
            importlib.import_module(f"{package}.{info.name}")
