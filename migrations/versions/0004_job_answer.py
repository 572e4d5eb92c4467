"""manager jobs keep the Manager's last unusable answer

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("manager_jobs") as batch:
        batch.add_column(sa.Column("answer", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("manager_jobs") as batch:
        batch.drop_column("answer")
