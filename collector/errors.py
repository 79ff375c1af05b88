"""Errors raised by the collector, with messages meant for people (see :mod:`reflexdb.errors`)."""

from __future__ import annotations

from reflexdb.errors import ModelUnavailable, ReflexdbError

__all__ = ["CheckpointMismatch", "MissingDependency", "ModelUnavailable", "UnknownName"]


class UnknownName(ReflexdbError, LookupError):
    """A registry (engines, reward functions, prompt templates, task generators) was asked for a
    name nobody registered.

    Attributes:
        kind: what was looked up, e.g. ``reward function``.
        name: the name asked for.
        known: the names that are registered.
    """

    def __init__(self, kind: str, name: str, known: list[str]):
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none)'}")


class CheckpointMismatch(ReflexdbError, ValueError):
    """A checkpoint handed to ``Engine.load_weights`` does not fit the loaded model's parameters."""

    exit_code = 7


class MissingDependency(ReflexdbError, ImportError):
    """An optional package that a requested feature needs is not installed; the message says how
    to install it."""
