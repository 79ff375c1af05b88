"""reflexdb: asynchronous off-policy RL for language models around a PostgreSQL experience store.

The public Python API of the store::

    from reflexdb import Store, GroupIn, TrajectoryIn, TurnIn, TaskIn
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
from .records import (
    Group,
    GroupIn,
    PolicyVersion,
    Sibling,
    TaskIn,
    Trajectory,
    TrajectoryIn,
    Turn,
    TurnIn,
    WrittenGroup,
)
from .store import Store

__version__ = "0.1.0"

__all__ = [
    "ClaimLost", "DatabaseUnavailable", "Group", "GroupIn", "InvalidGroup", "NotFound", "PolicyVersion", "ReflexdbError",
    "ReplayRequestLost", "SchemaOutdated", "Sibling", "Store", "TaskIn", "Trajectory", "TrajectoryIn", "Turn", "TurnIn", "WrittenGroup",
]
