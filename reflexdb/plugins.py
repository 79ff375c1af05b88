"""One registry mechanism for every part that plugs in: methods, workflows, environments, loss
families, advantage transforms, reward functions, engines, prompt templates and migration branches.

Each kind of part is a :class:`Registry` below, kept here in the shared layer so that anything may
*read* one (the config validates a method's section through ``METHODS``) while the parts themselves
live a layer above and *register* into it. Built-in parts and a researcher's own are found the same
way, through the ``reflexdb.plugins`` entry point group (as pytest finds its own plug-ins and
third-party ones through one mechanism). reflexdb's own ``pyproject.toml`` lists its built-ins
there; a plug-in package declares its own::

    [project.entry-points."reflexdb.plugins"]
    my_method = "my_method"          # a module: importing it registers its parts
    # or "my_method:register", a function called once with no arguments

``pip install my-method`` is then enough: the first time any registry is read, every entry point of
the group is loaded once per process (``load_plugins``). An entry point that fails to import stops
with a message naming it (a run must not silently lose its method).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any, Generic, TypeVar

from .errors import ReflexdbError, UnknownName

GROUP = "reflexdb.plugins"
#: A part every complete install registers: when it is missing after loading the entry points, the
#: package metadata predates the code (an old ``pip install -e``), and the message says so.
_SENTINEL = ("loss", "grpo")
_loaded = False

T = TypeVar("T")


class PluginError(ReflexdbError):
    """An installed plug-in could not be loaded, or reflexdb's own parts are not registered."""


def load_plugins() -> None:
    """Import every ``reflexdb.plugins`` entry point, reflexdb's own first (once per process)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    found = sorted(entry_points(group=GROUP), key=lambda ep: (not ep.value.startswith("reflexdb."), ep.name))
    for ep in found:
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(f"plug-in {ep.name!r} ({ep.value}, entry point group {GROUP}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
        if callable(obj) and not isinstance(obj, type):  # "pkg:register": a function that registers the parts
            obj()
    kind, name = _SENTINEL
    if name not in REGISTRIES[kind]._items:
        raise PluginError("reflexdb's built-in methods, losses and workflows are not registered: the installed "
                          f"package metadata has no {GROUP} entry points of reflexdb (an install older than this "
                          "code); run `pip install -e .` (or reinstall reflexdb) again")


class Registry(Generic[T]):
    """Parts of one kind by name.

    ``register(name, obj)`` adds one (or, without ``obj``, is a decorator); registering the same
    object again is a no-op (a module imported twice), another object under a taken name is an
    error unless ``replace=True``. ``get``, ``names``, ``items`` and ``in`` load the plug-ins first.

    Args:
        kind: what the parts are, for messages (``workflow``, ``reward function``).
        names_class: set ``obj.name = name`` on a registered class (workflows, environments).
        error: builds the error for an unknown name (default ``UnknownName``).
    """

    def __init__(self, kind: str, *, names_class: bool = False,
                 error: Callable[[str, list[str]], Exception] | None = None):
        self.kind = kind
        self.names_class = names_class
        self._error = error
        self._items: dict[str, T] = {}

    def register(self, name: str, obj: Any = None, *, replace: bool = False) -> Any:
        def add(o: T) -> T:
            old = self._items.get(name, o)
            if old is not o and old != o and not replace:
                raise ValueError(f"{self.kind} {name!r} is already registered")
            if self.names_class:
                o.name = name
            self._items[name] = o
            return o

        return add(obj) if obj is not None else add

    def get(self, name: str) -> T:
        """The part registered as ``name``; unknown: ``UnknownName`` (or the registry's own error) listing the known."""
        load_plugins()
        try:
            return self._items[name]
        except KeyError:
            known = sorted(self._items)
            raise (self._error(name, known) if self._error else UnknownName(self.kind, name, known)) from None

    def names(self) -> list[str]:
        load_plugins()
        return sorted(self._items)

    def items(self) -> list[tuple[str, T]]:
        load_plugins()
        return sorted(self._items.items())

    def __contains__(self, name: object) -> bool:
        load_plugins()
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        load_plugins()
        return len(self._items)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(sorted(self._items))})"


def _unknown_method(name: str, known: list[str]) -> Exception:
    from .errors import UnknownMethod

    return UnknownMethod(name, known)


METHODS: Registry[Any] = Registry("method", error=_unknown_method)
WORKFLOWS: Registry[Any] = Registry("workflow", names_class=True)
ENVIRONMENTS: Registry[Any] = Registry("environment", names_class=True)
LOSSES: Registry[Any] = Registry("loss")
ADVANTAGE_TRANSFORMS: Registry[Any] = Registry("advantage transform")
REWARDS: Registry[Any] = Registry("reward function")
ENGINES: Registry[Any] = Registry("engine")
TEMPLATES: Registry[Any] = Registry("prompt template")
#: A method's migration branch: name -> the folder of its revisions (reflexdb/migrate.py).
MIGRATIONS: Registry[Any] = Registry("migration branch")
#: A method's tables that hold rows of a run: name -> ``((table, where, order by), ...)`` in the
#: order restore inserts them (reflexdb/archive.py; ``%(run)s`` in ``where`` is the run's id).
ARCHIVED: Registry[Any] = Registry("archived tables")
#: A package's SQL folder: name -> the path of its ``sql/`` (views, their pinned copies, query files,
#: ``roles.sql``; reflexdb/sqlfile.py). A view's file is found by its name in any registered folder.
SQL: Registry[Any] = Registry("sql folder")
#: A package's tables: name -> the module that declares them on ``reflexdb.schema.metadata``
#: (reflexdb/schema.py ``full_metadata``); importing the package has already imported it.
TABLES: Registry[Any] = Registry("tables")

#: Every registry by the kind it holds.
REGISTRIES: dict[str, Registry[Any]] = {r.kind: r for r in (METHODS, WORKFLOWS, ENVIRONMENTS, LOSSES,
                                                               ADVANTAGE_TRANSFORMS, REWARDS, ENGINES, TEMPLATES,
                                                               MIGRATIONS, ARCHIVED, SQL, TABLES)}
