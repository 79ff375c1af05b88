"""sevenths: GRPO whose batch rule never trains every seventh group (group id divisible by
``sevenths.every``), a stand-in for a batch rule that drops groups (a zero-variance filter, say).

It declares the groups it drops in one view, ``sevenths_group_holds`` (its migration makes it), and
names that view in ``Method.drops``: the learner's default batch rule leaves them out, collectors'
admission control does not count them, and, as its part of the composed view ``group_holds``, it
gives ``untrained_groups`` their reason (``seventh``).
"""

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method

HERE = Path(__file__).parent


class SeventhsConfig(BaseModel):
    """``sevenths:`` in a run's YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    every: int = Field(7, ge=2, le=1000, description="A group whose id is divisible by this is never trained.")


METHOD = Method(
    name="sevenths",
    summary="GRPO that never trains every seventh group (a test of Method.drops)",
    loss="grpo",
    config=SeventhsConfig,
    settings=lambda cfg: {"sevenths.every": cfg.section("sevenths").every},  # the view reads it
    drops="sevenths_group_holds",  # the groups it never trains: admission control leaves them out
)

plugin = Plugin(
    name="sevenths",
    methods=(METHOD,),
    migrations=HERE / "migrations",  # its branch: the view sevenths_group_holds
    sql=HERE / "sql",  # sql/roles.sql: collectors may read the view (admission control)
)
