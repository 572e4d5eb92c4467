"""index_images: search index images, loaded by a restart or another replica instead of a build

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-28

A user's search index (FAISS vectors, BM25 postings, what recall shows of each memory) is kept
as an image (app/memory/search/image.py) in parts of at most 16 MB, so that a new process loads
it and catches up from `memories.seq` rather than reading and analysing every memory. A cache
only: a replica of the version before neither reads nor writes it; dropping the table loses
nothing but time.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "index_images",
        sa.Column("user_id", sa.String(256), primary_key=True),
        sa.Column("part", sa.Integer(), primary_key=True),
        sa.Column("parts", sa.Integer(), nullable=False),
        sa.Column("version", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("written_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("index_images")
