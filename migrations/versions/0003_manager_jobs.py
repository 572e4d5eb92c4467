"""manager jobs, processed-turn fingerprints, per-user manager state

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

Key = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "manager_jobs",
        sa.Column("key", Key, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(36), nullable=False, unique=True),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("explicit", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_manager_jobs_status_user", "manager_jobs", ["status", "user_id", "key"])
    op.create_table(
        "processed_turns",
        sa.Column("user_id", sa.String(256), primary_key=True),
        sa.Column("fingerprint", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "manager_state",
        sa.Column("user_id", sa.String(256), primary_key=True),
        sa.Column("last_job_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("manager_state")
    op.drop_table("processed_turns")
    op.drop_index("ix_manager_jobs_status_user", table_name="manager_jobs")
    op.drop_table("manager_jobs")
