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

A method package declares itself as one :class:`Plugin` object, named by its entry point
(``my_method = "my_method:plugin"``): its methods, workflows, loss families, SQL folder, tables,
archived tables and migration branch in one place, checked when loaded (a table it archives must
be one it declares, its folders must exist) and registered into the registries below. A module
entry point that registers its parts on import still works.

``REFLEXDB_DISABLE_PLUGINS=name,other`` (or ``reflexdb -p no:NAME``, as pytest's ``-p no:NAME``)
leaves installed plug-ins out: they are not even imported. reflexdb's ``core.*`` parts cannot be
left out.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from .errors import ReflexdbError, UnknownName

GROUP = "reflexdb.plugins"
#: Comma-separated entry point names of installed plug-ins to leave out (``reflexdb -p no:NAME``).
DISABLE_ENV = "REFLEXDB_DISABLE_PLUGINS"
#: A part every complete install registers: when it is missing after loading the entry points, the
#: package metadata predates the code (an old ``pip install -e``), and the message says so.
_SENTINEL = ("loss", "grpo")
_loaded = False

T = TypeVar("T")


class PluginError(ReflexdbError):
    """An installed plug-in could not be loaded, or reflexdb's own parts are not registered."""


def disabled_plugins() -> set[str]:
    """The entry point names ``REFLEXDB_DISABLE_PLUGINS`` leaves out."""
    return {n.strip() for n in os.environ.get(DISABLE_ENV, "").split(",") if n.strip()}


#: What :func:`load_plugins` found: entry point name -> ``(value, Plugin or None, disabled)``.
LOADED: dict[str, tuple[str, Any, bool]] = {}


def load_plugins() -> None:
    """Import every ``reflexdb.plugins`` entry point, reflexdb's own first (once per process);
    register each :class:`Plugin` after checking it; skip the disabled ones."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    found = sorted(entry_points(group=GROUP), key=lambda ep: (not ep.value.startswith("reflexdb."), ep.name))
    off = disabled_plugins()
    core = sorted(n for n in off if n.startswith("core."))
    if core:
        raise PluginError(f"{DISABLE_ENV} names {', '.join(core)}: reflexdb's own core parts cannot be left out")
    for ep in found:
        if ep.name in off:
            LOADED[ep.name] = (ep.value, None, True)
            continue
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(f"plug-in {ep.name!r} ({ep.value}, entry point group {GROUP}) failed to load: "
                              f"{type(exc).__name__}: {exc}") from exc
        if isinstance(obj, ModuleType) and isinstance(getattr(obj, "plugin", None), Plugin):
            obj = obj.plugin  # an entry point that names the module (metadata of an older install)
        if isinstance(obj, Plugin):
            if obj.name != ep.name:
                raise PluginError(f"plug-in {ep.name!r} ({ep.value}): its Plugin object is named {obj.name!r}; "
                                  f"name the entry point as the plugin")
            obj.register()
        elif callable(obj) and not isinstance(obj, type):  # "pkg:register": a function that registers the parts
            obj()
        LOADED[ep.name] = (ep.value, obj if isinstance(obj, Plugin) else None, False)
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
#: order restore inserts them (reflexdb/ops/archive.py; ``%(run)s`` in ``where`` is the run's id).
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


# ---------------------------------------------------------------------------------- Plugin


@dataclass(frozen=True)
class Plugin:
    """Everything one package plugs into reflexdb, declared once; its entry point names this object
    (``[project.entry-points."reflexdb.plugins"] my_method = "my_method:plugin"``).

    Loading checks it (:meth:`check`) and registers each part (:meth:`register`). Names are the
    registries' keys: a method's ``name`` is the value of ``algorithm``; a workflow's and an
    environment's are what configs and methods refer to them by.

    Attributes:
        name: the plug-in's name, equal to its entry point's (what ``-p no:NAME`` leaves out).
        methods: its :class:`reflexdb.trainer.method_api.Method` objects.
        workflows: collector workflows by name (classes; :mod:`reflexdb.collector.workflows`).
        environments: collector environments by name (classes).
        losses: loss families by name (:mod:`reflexdb.trainer.losses.registry` specs).
        advantage_transforms: advantage transforms by name.
        rewards: reward functions by name.
        templates: prompt templates by name.
        sql: its ``sql/`` folder (views, their pinned copies, query files, ``roles.sql``).
        tables: the module that declares its tables on ``reflexdb.schema.metadata``.
        archived: its rows of a run that ``reflexdb db archive`` keeps and ``restore`` puts back:
            ``(table, where, order by)`` in insertion order, ``%(run)s`` in ``where`` the run's id;
            every table must be one ``tables`` declares.
        kept_by_downgrade: tables of ``archived`` whose rows its branch's own downgrade copies back
            into reflexdb's tables before dropping them (a table split out of one of reflexdb's):
            ``reflexdb db downgrade`` drops them while runs hold rows there, where it refuses to drop
            the other archived tables (:class:`reflexdb.migrate.RowsGuard`).
        migrations: its alembic branch's folder of revisions (the branch is named ``name``).
    """

    name: str
    methods: Sequence[Any] = ()
    workflows: Mapping[str, Any] = field(default_factory=dict)
    environments: Mapping[str, Any] = field(default_factory=dict)
    losses: Mapping[str, Any] = field(default_factory=dict)
    advantage_transforms: Mapping[str, Any] = field(default_factory=dict)
    rewards: Mapping[str, Any] = field(default_factory=dict)
    templates: Mapping[str, Any] = field(default_factory=dict)
    sql: Path | str | None = None
    tables: str | None = None
    archived: Sequence[tuple[str, str, str]] = ()
    kept_by_downgrade: Sequence[str] = ()
    migrations: Path | str | None = None

    def problems(self, *, tables: bool = False) -> list[str]:
        """What is wrong with this declaration (empty: nothing). Loading checks it without
        importing anything (``reflexdb check`` imports no database stack); ``tables``: also import
        the ``tables`` module and check that it declares every archived table (what
        :func:`reflexdb.schema.full_metadata` does before archive, restore and the schema test)."""
        out: list[str] = []
        if not self.name or not self.name.replace("_", "a").replace(".", "a").isalnum():
            out.append(f"name {self.name!r} is not a plain name (letters, digits, '_')")
        seen: set[str] = set()
        for m in self.methods:
            n = getattr(m, "name", None)
            if not isinstance(n, str) or not n:
                out.append(f"methods: {m!r} has no name")
            elif n in seen:
                out.append(f"methods: {n!r} is declared twice")
            else:
                seen.add(n)
        for what, folder in (("sql", self.sql), ("migrations", self.migrations)):
            if folder is not None and not Path(folder).is_dir():
                out.append(f"{what}: {folder} is not a folder")
        if self.migrations is not None and Path(self.migrations).is_dir() and \
                not any(p.suffix == ".py" for p in Path(self.migrations).rglob("*.py")):
            out.append(f"migrations: {self.migrations} holds no revision (.py)")
        declared: set[str] | None = None
        if self.tables is not None and tables:
            try:
                importlib.import_module(self.tables)
            except Exception as exc:  # noqa: BLE001 - any import error is the plug-in's to fix
                out.append(f"tables: module {self.tables!r} failed to import: {type(exc).__name__}: {exc}")
            from .schema import metadata

            declared = set(metadata.tables)
        if self.archived and self.tables is None:
            out.append(f"archived: {', '.join(repr(e[0]) for e in self.archived if isinstance(e, tuple) and e)} "
                       "but no tables module (Plugin.tables): archive and restore need their columns")
        for entry in self.archived:
            if not (isinstance(entry, tuple) and len(entry) == 3 and all(isinstance(x, str) for x in entry)):
                out.append(f"archived: {entry!r} is not (table, where, order by)")
                continue
            table, where, _ = entry
            if "%(run)s" not in where:
                out.append(f"archived: {table}'s condition {where!r} does not name the run (%(run)s)")
            if declared is not None and table not in declared:
                out.append(f"archived: table {table!r} is not declared by the plug-in's tables module "
                           f"({self.tables}): archive and restore need its columns")
        archived = {e[0] for e in self.archived if isinstance(e, tuple) and e}
        for table in self.kept_by_downgrade:
            if table not in archived:
                out.append(f"kept_by_downgrade: {table!r} is not one of its archived tables")
        return out

    def check(self, *, tables: bool = False) -> None:
        """Raise :class:`PluginError` listing every problem of the declaration (``tables``: as
        :meth:`problems`)."""
        problems = self.problems(tables=tables)
        if problems:
            raise PluginError(f"plug-in {self.name!r} is declared wrong: " + "; ".join(problems))

    def register(self) -> None:
        """:meth:`check`, then add every part to its registry (the same object twice: a no-op)."""
        self.check()
        for m in self.methods:
            METHODS.register(m.name, m)
        for registry, parts in ((WORKFLOWS, self.workflows), (ENVIRONMENTS, self.environments),
                                (LOSSES, self.losses), (ADVANTAGE_TRANSFORMS, self.advantage_transforms),
                                (REWARDS, self.rewards), (TEMPLATES, self.templates)):
            for key, part in parts.items():
                registry.register(key, part)
        if self.sql is not None:
            SQL.register(self.name, Path(self.sql))
        if self.tables is not None:
            TABLES.register(self.name, self.tables)
        if self.archived:
            ARCHIVED.register(self.name, tuple(self.archived))
        if self.migrations is not None:
            MIGRATIONS.register(self.name, Path(self.migrations))
