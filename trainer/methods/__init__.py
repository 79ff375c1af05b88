"""Learner methods by name (``algorithm: <name>``): the built-in ones and any plug-in's.

    register_method(Method(...))   # a built-in module below, or a plug-in (reflexdb/plugins.py)
    get_method("nexgrpo")          # what the config validation, the collector and the learner use

A name that is not registered is refused with the list of those that are; a method of the
roadmap that is not built yet (``NOT_BUILT``) says so. See base.py for what a method is and
docs/design.md "Adding a method".
"""

from __future__ import annotations

from reflexdb.plugins import load_plugins

from .base import Hooks, LearnerContext, LossTerm, Method, WorkflowUse, best_of_group, valid_rows

METHODS: dict[str, Method] = {}

#: Methods of the roadmap without an implementation yet: refused, never trained as something else.
NOT_BUILT: dict[str, str] = {}


class UnknownMethod(ValueError):
    """``algorithm`` names no registered method."""


def register_method(method: Method) -> Method:
    """Add ``method`` under its name (names are unique; registering the same object twice is a no-op)."""
    if METHODS.get(method.name, method) is not method:
        raise ValueError(f"method {method.name!r} is already registered")
    METHODS[method.name] = method
    return method


def method_names() -> list[str]:
    _load()
    return sorted(METHODS)


def get_method(name: str) -> Method:
    """The method registered as ``name``.

    Raises:
        UnknownMethod: not registered; the message lists the registered ones.
    """
    _load()
    if name in METHODS:
        return METHODS[name]
    built = ", ".join(sorted(METHODS))
    if name in NOT_BUILT:
        raise UnknownMethod(f"algorithm {name!r}: {NOT_BUILT[name]} is not built yet; the methods built are: {built}")
    raise UnknownMethod(f"algorithm {name!r} is not a registered method; the methods built are: {built} "
                        "(a plug-in registers more: docs/design.md, 'Adding a method')")


def _load() -> None:
    from . import baselines, cleaner, lte, nexgrpo, r3l, raft  # noqa: F401  (importing registers them)

    load_plugins()


__all__ = ["METHODS", "NOT_BUILT", "Hooks", "LearnerContext", "LossTerm", "Method", "UnknownMethod", "WorkflowUse",
           "best_of_group", "get_method", "method_names", "register_method", "valid_rows"]
