"""Self-verification, a reflexdb method from outside the library.

After each answer the model is asked, in a second conversation, whether the answer is correct; the
verification is a trajectory of its own (origin ``verification``) whose reward is whether its
verdict matched the answer's real correctness. The learner trains the answers (policy term) and the
verifications (verify term, its own weight) with the run's loss family.

Everything the method needs lives in this package and plugs in through reflexdb's registries, found
by the ``reflexdb.plugins`` entry point of its ``pyproject.toml``:

- ``migrations/``: its migration branch (origin ``verification``, table ``selfcheck_verifications``,
  view ``selfcheck_calibration``), added to a database by ``reflexdb db upgrade``;
- ``sql/roles.sql``: its grants to reflexdb's collector role, made again by ``reflexdb db roles``;
- ``workflow.py``: the collectors' workflow ``selfcheck`` (answer, then verify);
- ``store.py``: the attachment that writes each verdict with its group, in the group's transaction;
- ``method.py``: the method ``selfcheck`` (loss terms, config section ``selfcheck:``, metrics).
"""

from pathlib import Path

from reflexdb.plugins import ARCHIVED, MIGRATIONS, SQL

MIGRATIONS.register("selfcheck", Path(__file__).parent / "migrations")
# its SQL folder: sql/roles.sql, what the collector role may do with its table (reflexdb db roles)
SQL.register("selfcheck", Path(__file__).parent / "sql")
# its rows of a run, archived and restored with the run (reflexdb db archive / restore)
ARCHIVED.register("selfcheck", (("selfcheck_verifications", "run_id = %(run)s", "trajectory_id"),))

from . import method, workflow  # noqa: E402, F401  (importing registers them)
