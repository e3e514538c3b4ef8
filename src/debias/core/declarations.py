"""What every registry of declared variants shares (stage-2 methods, group-inference methods, probe variants): the
leaf keys of a declared params section, the check that each has its source, and the import of the declaration
modules (a package's own, then the modules named in ``DEBIAS_METHODS`` and the ``debias.methods`` entry points),
where a broken module becomes one :class:`~debias.core.errors.DeclarationError` naming it. Pydantic only, nothing
of debias above core: the params schema (:mod:`debias.schema`) is built from the declarations."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
import sys
from typing import Any

from debias.core.errors import DeclarationError

ENV_VAR = "DEBIAS_METHODS"  # modules that register methods from outside the packages, comma-separated
ENTRY_POINT_GROUP = "debias.methods"


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


def problem(exc: BaseException) -> str:
    """What is wrong, on one line: the exception's kind and message (a syntax error with its file and line)."""
    if isinstance(exc, SyntaxError):
        return f"SyntaxError: {exc.msg} ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {' '.join(str(exc).split()) or 'no message'}"


def load_module(module: str, why: str = "a declaration module") -> Any:
    """Import ``module``; any failure of it (import or syntax error, a registration refused: a name registered twice,
    a params section owned twice, a default without its source) is one DeclarationError naming it and ``why`` it
    is imported."""
    try:
        return importlib.import_module(module)
    except DeclarationError:
        raise
    except Exception as exc:  # ImportError, SyntaxError, the registries' ValueError, anything its top level raises
        raise DeclarationError(f"{why} '{module}' is broken: {problem(exc)}") from exc


def resolve(target: Any) -> Any:
    """``target`` itself when callable, else the function a ``"module:function"`` string names (imported now; a
    module that cannot be imported or lacks the function is a DeclarationError naming it)."""
    if callable(target):
        return target
    module, _, name = target.partition(":")
    found = getattr(load_module(module, "the module of a declared function"), name, None)
    if found is None:
        raise DeclarationError(f"a declaration names '{target}', and module '{module}' has no '{name}'")
    return found


def import_declarations(package: str, packages: bool) -> None:
    """Import every subpackage (``packages``) or every plain module (else) of ``package``, in name order, then the
    extension modules (:func:`import_extensions`); a broken one is a DeclarationError naming it."""
    found = importlib.import_module(package)
    for info in sorted(pkgutil.iter_modules(found.__path__), key=lambda i: i.name):
        if info.ispkg == packages:
            load_module(f"{package}.{info.name}")
    import_extensions()


_extensions_imported = False


def extension_modules() -> list[str]:
    """The modules named in ``DEBIAS_METHODS`` (comma-separated), then the ``debias.methods`` entry points'."""
    from importlib.metadata import entry_points

    named = [part.strip() for part in os.environ.get(ENV_VAR, "").split(",") if part.strip()]
    return named + [entry.value for entry in entry_points(group=ENTRY_POINT_GROUP)]


def import_extensions() -> None:
    """Import every extension module once (they may register stage-2 methods, group-inference methods and probe
    variants alike), before any registry imports its own package."""
    global _extensions_imported
    if not _extensions_imported:
        for module in extension_modules():
            if module not in sys.modules:
                register_module(module)
        _extensions_imported = True


def register_module(module: str) -> None:
    """Import ``module``, whose top level registers methods; a DeclarationError when it cannot be imported or
    registers wrongly. Call it before the params schema is first built (:mod:`debias.schema`), or name the module
    in ``DEBIAS_METHODS``; stage processes read that variable."""
    schema = sys.modules.get("debias.schema")
    if schema is not None and getattr(schema, "_BUILT", None) is not None and module not in sys.modules:
        raise DeclarationError(f"register_module('{module}') after the params schema was built; name it in "
                               f"{ENV_VAR} (read when the schema is first built) instead")
    if importlib.util.find_spec(module.split(".")[0]) is None:
        raise DeclarationError(f"{ENV_VAR} names '{module}', which cannot be imported (no module named "
                               f"'{module.split('.')[0]}'); allowed: a module on PYTHONPATH that registers stage-2 "
                               "methods, group-inference methods or probe variants (docs/extending.md)")
    load_module(module, f"{ENV_VAR} module")
