"""memories get index_text: what an episode is found by (its words and the facts drawn from them)

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-26

An episode's index key is its text plus the facts written from it (LongMemEval's key
expansion: facts *appended to* a turn's key raised its recall@5 from .582 to .644, facts
*replacing* it lowered it to .530). The column holds that key for the lexical index and for
re-embedding; it is NULL for every other memory (the key is the content). Nullable, no default:
a replica of the version before writes rows without it, which are keyed by their content.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("memories") as batch:
        batch.add_column(sa.Column("index_text", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("memories") as batch:
        batch.drop_column("index_text")
