"""Collection workflows by name: what work a collector claims and how it becomes complete groups.

    register_workflow("group")(GroupWorkflow)    # a built-in module below, or a plug-in
    make_workflow("group", collector, **options)

A method names the workflows its collectors run, in priority order (``Method.workflows``);
``Collector.run`` asks them for work in that order and writes what they return. See base.py.
"""

from __future__ import annotations

from reflexdb.plugins import ClassRegistry

from .base import CollectContext, Workflow

WORKFLOWS = ClassRegistry("workflow", __name__, ("cleaner", "eval", "group", "lte_hint", "nexgrpo_replay", "r3l"))
#: Class decorator: register a workflow under ``name`` (names are unique).
register_workflow = WORKFLOWS.register
get_workflow = WORKFLOWS.lookup


def make_workflow(name: str, ctx: CollectContext, **options) -> Workflow:
    """The workflow ``name`` for collector ``ctx``, with its options."""
    return get_workflow(name)(ctx, **options)


__all__ = ["WORKFLOWS", "CollectContext", "Workflow", "get_workflow", "make_workflow", "register_workflow"]
