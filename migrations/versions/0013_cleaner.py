"""CLEANER in the store: what each rollback's error was, and the view ``cleaner_tool_errors``.

- ``purifications.error_status``: the failed call's status (``error``, ``timeout`` or ``limit``:
  ``collector/sandbox.py``'s ToolResult), beside the error text already there.
- ``cleaner_tool_errors``: per trajectory, its tool calls and failed ones, its raw twin's, its
  rollbacks (recovered, shallow, deep).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op

from reflexdb.migrations.sqlfiles import create_views, drop_views

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

VIEWS = ("cleaner_tool_errors",)


def upgrade() -> None:
    op.add_column("purifications", sa.Column("error_status", sa.Text(), nullable=True))
    op.create_check_constraint(op.f("ck_purifications_error_status"), "purifications",
                               "error_status IS NULL OR error_status IN ('error', 'timeout', 'limit')")
    create_views(VIEWS)


def downgrade() -> None:
    drop_views(VIEWS)
    op.drop_constraint(op.f("ck_purifications_error_status"), "purifications", type_="check")
    op.drop_column("purifications", "error_status")
