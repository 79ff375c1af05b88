"""Self-verification, a reflexdb method from outside the library.

After each answer the model is asked, in a second conversation, whether the answer is correct; the
verification is a trajectory of its own (origin ``verification``) whose reward is whether its
verdict matched the answer's real correctness. The learner trains the answers (policy term) and the
verifications (verify term, its own weight) with the run's loss family.

Everything the method needs lives in this package and is declared in one place, the ``plugin``
object below (``reflexdb.plugins.Plugin``), found by the ``reflexdb.plugins`` entry point of its
``pyproject.toml`` (``selfcheck = "reflexdb_selfcheck"``: the module, whose ``plugin`` reflexdb
loads, checks and registers; ``reflexdb plugins`` lists it, ``reflexdb -p no:selfcheck`` leaves it out):

- ``migrations/``: its migration branch (origin ``verification``, table ``selfcheck_verifications``,
  view ``selfcheck_calibration``), added to a database by ``reflexdb db upgrade``;
- ``sql/roles.sql``: its grants to reflexdb's collector role, made again by ``reflexdb db roles``;
- ``workflow.py``: the collectors' workflow ``selfcheck`` (answer, then verify);
- ``store.py``: the attachment that writes each verdict with its group, in the group's transaction;
- ``method.py``: the method ``selfcheck`` (loss terms, config section ``selfcheck:``, metrics);
- ``tables.py``: its table as SQLAlchemy declares it, for archive and restore.
"""

from pathlib import Path

from reflexdb.plugins import Plugin

from .method import METHOD
from .workflow import SelfCheckWorkflow

HERE = Path(__file__).parent

plugin = Plugin(
    name="selfcheck",
    methods=(METHOD,),
    workflows={"selfcheck": SelfCheckWorkflow},
    migrations=HERE / "migrations",
    sql=HERE / "sql",  # sql/roles.sql: what the collector role may do with its table (reflexdb db roles)
    tables=f"{__name__}.tables",
    # its rows of a run, archived and restored with the run (reflexdb db archive / restore)
    archived=(("selfcheck_verifications", "run_id = %(run)s", "trajectory_id"),),
)
