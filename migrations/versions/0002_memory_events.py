"""memory events: the audit trail of every write

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Key = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "memory_events",
        sa.Column("key", Key, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("memory_id", sa.String(36), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("actor", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(64), nullable=True),
        sa.Column("before", sa.Text(), nullable=True),
        sa.Column("after", sa.Text(), nullable=True),
        sa.Column("detail", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_memory_events_user_memory", "memory_events", ["user_id", "memory_id"])


def downgrade() -> None:
    op.drop_index("ix_memory_events_user_memory", table_name="memory_events")
    op.drop_table("memory_events")
