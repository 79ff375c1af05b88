"""Errors raised by the collector, with messages meant for people (see :mod:`reflexdb.errors`)."""

from __future__ import annotations

from reflexdb.errors import ModelUnavailable, ReflexdbError, UnknownName

__all__ = ["CheckpointMismatch", "MissingDependency", "ModelUnavailable", "UnknownName"]


class CheckpointMismatch(ReflexdbError, ValueError):
    """A checkpoint handed to ``Engine.load_weights`` does not fit the loaded model's parameters."""

    exit_code = 7


class MissingDependency(ReflexdbError, ImportError):
    """An optional package that a requested feature needs is not installed; the message says how
    to install it."""
