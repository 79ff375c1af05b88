"""reflexdb: asynchronous off-policy RL for language models around a PostgreSQL experience store.

The public Python API of the store::

    from reflexdb import Store, GroupIn, TrajectoryIn, TurnIn, TaskIn

The records and the store are imported on first use (PEP 562): a command that needs neither
(``reflexdb check``, ``--help``) does not pay for SQLAlchemy, psycopg and numpy.
"""

from .errors import (
    ClaimLost,
    DatabaseUnavailable,
    InvalidGroup,
    NotFound,
    ReflexdbError,
    ReplayRequestLost,
    SchemaOutdated,
)

__version__ = "0.1.0"

_RECORDS = ("Group", "GroupIn", "PolicyVersion", "Sibling", "TaskIn", "Trajectory", "TrajectoryIn", "Turn", "TurnIn",
            "WrittenGroup")

__all__ = [
    "ClaimLost", "DatabaseUnavailable", "Group", "GroupIn", "InvalidGroup", "NotFound", "PolicyVersion", "ReflexdbError",
    "ReplayRequestLost", "SchemaOutdated", "Sibling", "Store", "TaskIn", "Trajectory", "TrajectoryIn", "Turn", "TurnIn", "WrittenGroup",
]


def __getattr__(name: str):
    if name in _RECORDS:
        from . import records

        return getattr(records, name)
    if name == "Store":
        from .store import Store

        return Store
    raise AttributeError(f"module 'reflexdb' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
