"""Collection workflows by name: what work a collector claims and how it becomes complete groups.

    register_workflow("group")(GroupWorkflow)    # a built-in module below, or a plug-in
    make_workflow("group", collector, **options)

A method names the workflows its collectors run, in priority order (``Method.workflows``);
``Collector.run`` asks them for work in that order and writes what they return. See base.py.
"""

from __future__ import annotations

from collections.abc import Callable

from reflexdb.plugins import load_plugins

from .base import CollectContext, Workflow

WORKFLOWS: dict[str, type] = {}


def register_workflow(name: str) -> Callable[[type], type]:
    """Class decorator: register a workflow under ``name`` (names are unique)."""

    def wrap(cls: type) -> type:
        if WORKFLOWS.get(name, cls) is not cls:
            raise ValueError(f"workflow {name!r} is already registered")
        cls.name = name
        WORKFLOWS[name] = cls
        return cls

    return wrap


def get_workflow(name: str) -> type:
    from . import eval, group, nexgrpo_replay  # noqa: F401  (importing registers them)

    load_plugins()
    try:
        return WORKFLOWS[name]
    except KeyError:
        raise KeyError(f"unknown workflow {name!r}; registered: {', '.join(sorted(WORKFLOWS))}") from None


def make_workflow(name: str, ctx: CollectContext, **options) -> Workflow:
    """The workflow ``name`` for collector ``ctx``, with its options."""
    return get_workflow(name)(ctx, **options)


__all__ = ["WORKFLOWS", "CollectContext", "Workflow", "get_workflow", "make_workflow", "register_workflow"]
