"""forgotten_memories.cause and .ended_at; manager_state.model and .idle_after

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-26

Consolidation at idle time (app/memory/learning/consolidation.py) takes memories out as
forgetting does, into `forgotten_memories`, for two more causes: a fact merged into another
(`merged`) and a fact that stopped being true (`superseded`, with `ended_at`, the day it did).
The idle work asks the model the user last chatted with (`manager_state.model`) unless
MEMPROXY_MANAGER_MODEL names one; an idle job stopped by its bound (or a model it could not
reach) has the next one wait until `manager_state.idle_after`. A replica of the version before
writes `forgotten` rows without a cause (the server default) and never reads the new columns.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("forgotten_memories") as batch:
        batch.add_column(
            sa.Column("cause", sa.String(16), nullable=False, server_default="forgotten")
        )
        batch.add_column(sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("manager_state") as batch:
        batch.add_column(sa.Column("model", sa.String(256), nullable=True))
        batch.add_column(sa.Column("idle_after", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("manager_state") as batch:
        batch.drop_column("idle_after")
        batch.drop_column("model")
    with op.batch_alter_table("forgotten_memories") as batch:
        batch.drop_column("ended_at")
        batch.drop_column("cause")
