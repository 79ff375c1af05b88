"""Per-token arrays as little-endian bytea (``token_bytes``), read back as arrays through views.

Native arrays (``int4[]``, ``float4[]``, ``bool[]``) cost a per-element encode and decode on the
server and the client: at 1M trajectories that was most of a learner sample (docs/benchmarks.md).
A bytea is sent as one block and numpy reads it with ``frombuffer``.

- ``token_bytes``: the columns of ``token_payloads``, each one bytea of little-endian values
  (int32 ids and versions, float32 log-probs, one byte per mask flag), with length checks, and
  ``toast_tuple_target`` at its maximum so rows up to ~8 KB stay inline and uncompressed.
- The existing rows are converted (read in id order with the numpy codecs, written by binary
  COPY), then ``token_payloads`` is dropped.
- SQL functions ``int4_array``, ``float4_array``, ``bool_array`` decode a column exactly.
- Views ``token_payloads`` (the old table's columns and types, so queries keep working) and
  ``trajectory_tokens`` (the arrays beside the trajectory's outcome).

Downgrade converts back in SQL through the same functions.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25
"""

import numpy as np
import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from reflexdb import codecs
from reflexdb.migrations.sqlfiles import create_functions, create_views, drop_functions, drop_views

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

FUNCTIONS = ("int4_array", "float4_array", "bool_array")
SIGNATURES = ("int4_array(bytea)", "float4_array(bytea)", "bool_array(bytea)")
VIEWS = ("token_payloads", "trajectory_tokens")
COLUMNS = ("trajectory_id", "prompt_ids", "response_ids", "logprobs", "token_policy_versions", "loss_mask")
DTYPES = ("<i4", "<i4", "<f4", "<i4", "u1")  # prompt_ids .. loss_mask
CHUNK = 2000  # trajectories converted per round trip


def upgrade() -> None:
    op.create_table(
        "token_bytes",
        sa.Column("trajectory_id", sa.BigInteger(), nullable=False),
        sa.Column("prompt_ids", postgresql.BYTEA(), nullable=False),
        sa.Column("response_ids", postgresql.BYTEA(), nullable=False),
        sa.Column("logprobs", postgresql.BYTEA(), nullable=True),
        sa.Column("token_policy_versions", postgresql.BYTEA(), nullable=False),
        sa.Column("loss_mask", postgresql.BYTEA(), nullable=False),
        sa.CheckConstraint("length(prompt_ids) % 4 = 0 AND length(response_ids) % 4 = 0",
                           name=op.f("ck_token_bytes_whole_int4s")),
        sa.CheckConstraint("logprobs IS NULL OR length(logprobs) = length(response_ids)",
                           name=op.f("ck_token_bytes_logprobs_length")),
        sa.CheckConstraint("length(token_policy_versions) = length(response_ids)",
                           name=op.f("ck_token_bytes_versions_length")),
        sa.CheckConstraint("4 * length(loss_mask) = length(response_ids)", name=op.f("ck_token_bytes_mask_length")),
        sa.ForeignKeyConstraint(["trajectory_id"], ["trajectories.id"],
                                name=op.f("fk_token_bytes_trajectory_id_trajectories"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trajectory_id", name=op.f("pk_token_bytes")),
        postgresql_with={"toast_tuple_target": 8160},
    )
    _convert_rows()
    op.drop_table("token_payloads")
    create_functions(FUNCTIONS)
    create_views(VIEWS)


def _convert_rows() -> None:
    """Copy every ``token_payloads`` row into ``token_bytes``, arrays as little-endian bytes."""
    conn = op.get_bind().connection.driver_connection
    codecs.register(conn)
    read = conn.cursor(binary=True)
    cols = ", ".join(COLUMNS)
    after = -1
    while True:
        rows = read.execute(f"SELECT {cols} FROM token_payloads WHERE trajectory_id > %s "
                            f"ORDER BY trajectory_id LIMIT {CHUNK}", (after,)).fetchall()
        if not rows:
            return
        with conn.cursor().copy(f"COPY token_bytes ({cols}) FROM STDIN (FORMAT BINARY)") as cp:
            cp.set_types(["int8"] + ["bytea"] * 5)
            for tid, *arrays in rows:
                cp.write_row((tid, *(None if a is None else np.ascontiguousarray(a, dtype=d).tobytes()
                                     for a, d in zip(arrays, DTYPES))))
        after = rows[-1][0]


def downgrade() -> None:
    drop_views(VIEWS)
    op.create_table(
        "token_payloads",
        sa.Column("trajectory_id", sa.BigInteger(), nullable=False),
        sa.Column("prompt_ids", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("response_ids", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("logprobs", postgresql.ARRAY(postgresql.REAL()), nullable=True),
        sa.Column("token_policy_versions", postgresql.ARRAY(sa.Integer()), nullable=False),
        sa.Column("loss_mask", postgresql.ARRAY(sa.Boolean()), nullable=False),
        sa.ForeignKeyConstraint(["trajectory_id"], ["trajectories.id"],
                                name=op.f("fk_token_payloads_trajectory_id_trajectories"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("trajectory_id", name=op.f("pk_token_payloads")),
    )
    op.execute("INSERT INTO token_payloads (trajectory_id, prompt_ids, response_ids, logprobs, token_policy_versions, "
               "loss_mask) SELECT trajectory_id, int4_array(prompt_ids), int4_array(response_ids), "
               "float4_array(logprobs), int4_array(token_policy_versions), bool_array(loss_mask) FROM token_bytes")
    drop_functions(SIGNATURES)
    op.drop_table("token_bytes")
