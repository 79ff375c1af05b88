"""Learner methods by name (``algorithm: <name>``): reflexdb's own and any plug-in's, in one registry.

    register_method(Method(...))   # a module named by a reflexdb.plugins entry point (reflexdb/plugins.py)
    get_method("grpo")             # what the config validation, the collector and the learner use

The built-in methods are found like a plug-in's: each module is an entry point of the
``reflexdb.plugins`` group in reflexdb's ``pyproject.toml``. A name that is not registered is
refused with the list of those that are. See base.py for what a method is and docs/design.md
"Adding a method".
"""

from __future__ import annotations

from reflexdb.errors import UnknownMethod
from reflexdb.plugins import METHODS

from .base import Hooks, LearnerContext, LossTerm, Method, WorkflowUse, best_of_group, valid_rows


def register_method(method: Method) -> Method:
    """Add ``method`` under its name (names are unique; registering the same object twice is a no-op)."""
    return METHODS.register(method.name, method)


def method_names() -> list[str]:
    return METHODS.names()


def get_method(name: str) -> Method:
    """The method registered as ``name``.

    Raises:
        UnknownMethod: not registered; the message lists the registered ones.
    """
    return METHODS.get(name)


__all__ = ["METHODS", "Hooks", "LearnerContext", "LossTerm", "Method", "UnknownMethod", "WorkflowUse",
           "best_of_group", "get_method", "method_names", "register_method", "valid_rows"]
