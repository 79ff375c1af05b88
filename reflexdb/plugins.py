"""Plug-ins: a user's own workflows, methods and losses, found through Python entry points.

A package registers its parts by declaring, in its ``pyproject.toml``::

    [project.entry-points."reflexdb.plugins"]
    my_method = "my_method"          # a module: importing it registers its parts
    # or "my_method:register", a function called once with no arguments

Importing the module runs its ``register_workflow`` / ``register_method`` / ``register_loss``
calls. ``pip install my-method`` is then enough: reflexdb loads every ``reflexdb.plugins`` entry
point once, the first time a registry is read (``load_plugins``). An entry point that fails to
import stops with a message naming it (a run must not silently lose its method).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from importlib.metadata import entry_points

from .errors import ReflexdbError

GROUP = "reflexdb.plugins"
_loaded = False


class PluginError(ReflexdbError):
    """An installed plug-in could not be loaded."""


def load_plugins() -> None:
    """Import every ``reflexdb.plugins`` entry point (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    for ep in entry_points(group=GROUP):
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(f"plug-in {ep.name!r} ({ep.value}, entry point group {GROUP}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
        if callable(obj):  # "pkg:register": a function that registers the parts
            obj()


class ClassRegistry(dict):
    """Classes by name (workflows, environments): ``register(name)`` is a class decorator, ``get``
    imports the built-in modules and the plug-ins first.

    Args:
        kind: what the classes are, for messages (``workflow``).
        package, builtins: the built-ins are the modules ``package.<name>`` for each name in ``builtins``.
    """

    def __init__(self, kind: str, package: str, builtins: tuple[str, ...]):
        super().__init__()
        self.kind, self.package, self.builtins = kind, package, builtins

    def register(self, name: str) -> Callable[[type], type]:
        def wrap(cls: type) -> type:
            if self.get(name, cls) is not cls:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            cls.name = name
            self[name] = cls
            return cls

        return wrap

    def load(self) -> None:
        for module in self.builtins:  # importing registers them
            importlib.import_module(f"{self.package}.{module}")
        load_plugins()

    def lookup(self, name: str) -> type:
        self.load()
        try:
            return self[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; registered: {', '.join(sorted(self))}") from None

    def names(self) -> list[str]:
        self.load()
        return sorted(self)
