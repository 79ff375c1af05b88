"""The selfcheck table, declared on reflexdb's ``metadata`` as its migration creates it
(``migrations/selfcheck_0001_verifications.py``): ``reflexdb db archive`` and ``restore`` read a
run's verdicts through this declaration (the package's ``Plugin.tables``)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, CheckConstraint, Column, ForeignKey, Table, Text

from reflexdb.schema import metadata

selfcheck_verifications = Table(
    "selfcheck_verifications",
    metadata,
    Column("trajectory_id", BigInteger, primary_key=True),
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("answer_trajectory_id", BigInteger, nullable=False),
    Column("verdict", Text),
    Column("answer_correct", Boolean, nullable=False),
    Column("agrees", Boolean, nullable=False),
    CheckConstraint("verdict IN ('yes', 'no')", name="selfcheck_verifications_verdict_check"),
)
