"""One digest over a published version's whole manifest (issue 60).

A version in object storage (``learner.checkpoint_url``) is its files and a ``manifest.json``
naming each file with its size and sha256. Until now the row recorded only the sha256 of the
``*.safetensors`` weights, so a bucket's config, tokenizer and chat template files were trusted
from storage.

- ``policy_versions.manifest_sha256``: the sha256 of the ``manifest.json`` bytes the learner
  uploaded. A collector and ``reflexdb eval --checkpoint`` check the manifest against it before
  reading anything else, and then every file against the manifest. NULL for a version in a local
  directory (read in place) and for versions published before this revision (their weights alone
  are checked against ``sha256``, with a warning).

Revision ID: 0029
Revises: 0028
Create Date: 2026-11-29
"""

import sqlalchemy as sa
from alembic import op

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("policy_versions", sa.Column("manifest_sha256", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("policy_versions", "manifest_sha256")
