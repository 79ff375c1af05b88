"""best-of-n SFT: GRPO on every answer, plus an SFT term on each group's best answer.

Everything the package adds to reflexdb is declared in one object, ``plugin``, which the entry point
of its pyproject.toml names (``bestofn = "reflexdb_bestofn:plugin"``).
"""

from pathlib import Path

from reflexdb.plugins import Plugin
from reflexdb.trainer.method_api import Method

from .config import BestOfNConfig
from .hooks import BestOfNHooks
from .terms import terms

HERE = Path(__file__).parent


def check(cfg) -> None:
    """``Method.check``: keys that are valid alone but not together."""
    if cfg.collector.group_size < 2:
        raise ValueError(f"collector.group_size is {cfg.collector.group_size}; bestofn needs at least 2 "
                         "(a best of one is no choice, and GRPO's advantage in a group of one is 0)")


METHOD = Method(
    name="bestofn",  # algorithm: bestofn, and its config section bestofn:
    summary="GRPO plus SFT on each group's best answer (highest reward, then shortest)",
    loss="grpo",  # the main term's family unless learner.loss says otherwise
    config=BestOfNConfig,
    terms=terms,
    check=check,
    hooks=BestOfNHooks,
    settings=lambda cfg: {"bestofn.sft_weight": cfg.section("bestofn").sft_weight},  # table run_settings
)

plugin = Plugin(
    name="bestofn",  # the entry point's name: what `reflexdb -p no:bestofn` leaves out
    methods=(METHOD,),
    migrations=HERE / "migrations",  # its migration branch: table bestofn_picks
    sql=HERE / "sql",  # sql/roles.sql: what the learner role may do with that table
    tables=f"{__name__}.tables",  # the table as SQLAlchemy declares it: archive and restore read it
    archived=(("bestofn_picks", "run_id = %(run)s", "step, trajectory_id"),),  # kept with a run's archive
)
