"""bestofn's table as its migration creates it, declared on reflexdb's metadata (``Plugin.tables``):
``reflexdb db archive`` and ``restore`` read its columns here."""

from sqlalchemy import BigInteger, Column, ForeignKey, Integer, Table

from reflexdb.schema import metadata

bestofn_picks = Table(
    "bestofn_picks",
    metadata,
    Column("run_id", BigInteger, ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("step", Integer, primary_key=True),
    Column("trajectory_id", BigInteger, primary_key=True),
    Column("group_id", BigInteger, nullable=False),
)
