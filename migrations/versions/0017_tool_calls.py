"""Every tool call recorded with its turn, and groups a collector had refused counted.

- ``turns.tool_call`` (JSONB, NULL on other turns): on a tool turn, the sandbox's record of the
  call (collector/sandbox.py, ``ToolResult.record``): status, exit code, detail, wall and CPU
  time, peak memory, bytes of output, the code's size and SHA-256.
- View ``tool_calls``: one row per recorded call with its trajectory, run and the code that ran.
- ``collectors.rejected_groups`` and ``collectors.last_rejection``: groups the store refused for
  their content (a collector counts and skips them, never stops; docs/sandbox.md) and the last
  reason.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

VIEWS = ("tool_calls",)


def upgrade() -> None:
    op.add_column("turns", sa.Column("tool_call", postgresql.JSONB(), nullable=True))
    op.add_column("collectors", sa.Column("rejected_groups", sa.Integer(), server_default=sa.text("0"),
                                          nullable=False))
    op.add_column("collectors", sa.Column("last_rejection", sa.Text(), nullable=True))
    create_views(VIEWS)


def downgrade() -> None:
    drop_views(VIEWS)
    op.drop_column("collectors", "last_rejection")
    op.drop_column("collectors", "rejected_groups")
    op.drop_column("turns", "tool_call")
