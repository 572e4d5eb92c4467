"""memories get observed_at (when what they say was said) and profile (a standing fact about the
person); memory_links (a fact and the episode it was written from) is created

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26

Every memory stored before is taken as said when it was written: ``observed_at`` is filled from
``created_at`` (added nullable, filled, then made NOT NULL: on SQLite a batch copies the table
once), and none is a profile fact. Both columns have server defaults (the time of the insert,
false) for a replica of the version before that still writes while another upgrades.

The downgrade drops both columns and the links, and deletes the memories of kind ``episode``,
which the version before does not know (it would show them as facts and fail on them); their
users' versions are bumped, so that a running cache notices.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("memories") as batch:
        batch.add_column(sa.Column("observed_at", WHEN, nullable=True))
        batch.add_column(
            sa.Column("profile", sa.Boolean(), nullable=False, server_default=sa.false())
        )
    op.execute("UPDATE memories SET observed_at = created_at")
    with op.batch_alter_table("memories") as batch:
        batch.alter_column(
            "observed_at",
            existing_type=WHEN,
            nullable=False,
            server_default=sa.func.current_timestamp(),
        )
    op.create_index("ix_memories_user_observed", "memories", ["user_id", "observed_at"])
    op.create_table(
        "memory_links",
        sa.Column("user_id", sa.String(256), nullable=False),
        sa.Column("fact_id", sa.String(36), nullable=False),
        sa.Column("episode_id", sa.String(36), nullable=False),
        sa.Column("created_at", WHEN, nullable=False),
        sa.PrimaryKeyConstraint("fact_id", "episode_id"),
    )
    op.create_index("ix_memory_links_user_episode", "memory_links", ["user_id", "episode_id"])


def downgrade() -> None:
    op.drop_index("ix_memory_links_user_episode", table_name="memory_links")
    op.drop_table("memory_links")
    op.execute(
        "UPDATE user_state SET version = version + 1 WHERE user_id IN"
        " (SELECT user_id FROM memories WHERE type = 'episode')"
    )
    op.execute("DELETE FROM memories WHERE type = 'episode'")
    op.drop_index("ix_memories_user_observed", table_name="memories")
    with op.batch_alter_table("memories") as batch:
        batch.drop_column("profile")
        batch.drop_column("observed_at")
