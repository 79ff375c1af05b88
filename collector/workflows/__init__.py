"""Collection workflows by name: what work a collector claims and how it becomes complete groups.

    register_workflow("group")(GroupWorkflow)    # a module named by a reflexdb.plugins entry point
    make_workflow("group", collector, **options)

A method names the workflows its collectors run, in priority order (``Method.workflows``);
``Collector.run`` asks them for work in that order and writes what they return. See base.py.
"""

from __future__ import annotations

from reflexdb.plugins import WORKFLOWS

from .base import CollectContext, Workflow


def register_workflow(name: str):
    """Class decorator: register a workflow under ``name`` (names are unique)."""
    return WORKFLOWS.register(name)


get_workflow = WORKFLOWS.get


def make_workflow(name: str, ctx: CollectContext, **options) -> Workflow:
    """The workflow ``name`` for collector ``ctx``, with its options."""
    return get_workflow(name)(ctx, **options)


__all__ = ["WORKFLOWS", "CollectContext", "Workflow", "get_workflow", "make_workflow", "register_workflow"]
