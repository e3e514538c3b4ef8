"""Imports deferred to first use, so a stage process pays only for the libraries its work touches.

Every stage imports the whole source registry, the group and evaluation packages and the tracking module,
but most stages use a fraction of what those import at their top: pandas (image-table and tabular
sources), scipy and scikit-learn (group matching) cost 0.5-1.7 CPU s each per process on a 2-core
machine. ``pd = lazy_module("pandas")`` and ``f = lazy_callable("scipy.optimize", "linear_sum_assignment")``
stand in for the import lines; the code that uses them stays as it was.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any


class LazyModule(ModuleType):
    """A module imported on its first attribute access (``pd.read_csv`` imports pandas, then is pandas')."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__dict__["_lazy_name"] = name

    def __getattr__(self, attribute: str) -> Any:
        module = importlib.import_module(self.__dict__["_lazy_name"])
        return getattr(module, attribute)

    def __repr__(self) -> str:
        return f"<lazy module {self.__dict__['_lazy_name']!r}>"


def lazy_module(name: str) -> Any:
    """A stand-in for ``import name`` that imports the module on first attribute access."""
    return LazyModule(name)


def lazy_callable(module: str, name: str) -> Callable[..., Any]:
    """A stand-in for ``from module import name`` (a function or class to call) importing it on the first call."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = f"{module}.{name}, imported on the first call"
    return call
