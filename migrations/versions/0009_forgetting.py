"""forgotten_memories, the archive forgetting puts memories in; manager_state.idle_version

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-26

Forgetting over a capacity (app/memory/aging) moves a memory out of `memories` into
`forgotten_memories`, whole, so that the page can put it back with the same id. The idle-time
work of a user is due when their version has moved past `manager_state.idle_version` (NULL:
never done). Both are new: a replica of the version before neither reads nor writes them.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_KEY = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "forgotten_memories",
        sa.Column("key", _KEY, primary_key=True, autoincrement=True),
        sa.Column("id", sa.String(36), nullable=False, unique=True),
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("content", sa.Text(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("source", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("observed_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("recall_count", sa.Integer(), nullable=False),
        sa.Column("last_recalled_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("index_text", sa.Text(), nullable=True),
        sa.Column("links", sa.JSON(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index(
        "ix_forgotten_memories_user_when", "forgotten_memories", ["user_id", "forgotten_at"]
    )
    with op.batch_alter_table("manager_state") as batch:
        batch.add_column(sa.Column("idle_version", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("manager_state") as batch:
        batch.drop_column("idle_version")
    op.drop_index("ix_forgotten_memories_user_when", table_name="forgotten_memories")
    op.drop_table("forgotten_memories")
