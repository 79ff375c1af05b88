"""Exceptions with messages meant for people: the CLI prints them without a traceback."""

from __future__ import annotations


class ReflexdbError(Exception):
    """Base class: an error whose message alone tells the user what is wrong and what to do."""

    exit_code = 1


class DatabaseUnavailable(ReflexdbError):
    """The configured PostgreSQL server cannot be reached or refused the connection."""

    exit_code = 3


class SchemaOutdated(ReflexdbError):
    """The database schema is older (or newer) than this code expects."""

    exit_code = 4


class UnknownRevision(SchemaOutdated):
    """The database holds a revision that no installed package provides: a migration branch whose
    package is not installed here (uninstalled, or installed on another machine), a newer version of
    an installed package, or a newer reflexdb. Alembic cannot migrate such a database at all, so
    ``reflexdb db upgrade`` and ``downgrade`` refuse it; the message names the revision, its branch
    and the ways out (reflexdb/migrate.py).

    Attributes:
        revisions: the revisions the database holds that no installed package provides.
    """

    def __init__(self, message: str, revisions: list[str]):
        self.revisions = revisions
        super().__init__(message)


class MigrationRefused(ReflexdbError):
    """``reflexdb db upgrade`` or ``downgrade`` cannot go to the revision asked: a branch no
    installed package provides, a revision Alembic cannot find, or (a downgrade) rows of runs that
    still use an origin or a group kind the downgrade removes, or that a method's table it drops
    holds. Nothing was changed."""


class InvalidGroup(ReflexdbError, ValueError):
    """A group handed to the store is inconsistent; nothing of it was written.

    Attributes:
        field: dotted path of the offending field, e.g. ``trajectories[3].logprobs``.
    """

    exit_code = 5

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"invalid group: {field}: {problem}")


class NotFound(ReflexdbError, LookupError):
    """A run, group, trajectory or policy version that does not exist was asked for."""

    exit_code = 6


class ClaimLost(ReflexdbError):
    """The work item a group's transaction completes (a task claim, a replay request, a hint stage,
    ...) is no longer the writer's: its claim expired and another collector took it, or it was
    cancelled or released. Nothing of the group was written (reflexdb/attachments.py)."""

    exit_code = 7


#: The names this error had when NexGRPO and LTE each had their own (one error since the store's
#: generic work-item protocol): kept so that ``except ReplayRequestLost`` still catches it.
ReplayRequestLost = ClaimLost
LteStageLost = ClaimLost


class ModelUnavailable(ReflexdbError):
    """A model directory or checkpoint cannot be found, converted or loaded (reflexdb/models.py)."""

    exit_code = 7


class UnknownName(ReflexdbError, KeyError):
    """A registry (``reflexdb/plugins.py``: methods, workflows, environments, losses, reward
    functions, engines, prompt templates) was asked for a name nobody registered.

    Attributes:
        kind: what was looked up, e.g. ``reward function``.
        name: the name asked for.
        known: the names that are registered.
    """

    def __init__(self, kind: str, name: str, known: list[str], message: str | None = None):
        self.kind = kind
        self.name = name
        self.known = sorted(known)
        super().__init__(message or f"unknown {kind} {name!r}; known: {', '.join(self.known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class UnknownMethod(UnknownName, ValueError):
    """``algorithm`` (or a top-level section of a config) names no registered method."""

    def __init__(self, name: str, known: list[str]):
        super().__init__("method", name, known,
                         f"algorithm {name!r} is not a registered method; the methods built are: "
                         f"{', '.join(sorted(known))} (a plug-in registers more: docs/design.md, 'Adding a method')")
