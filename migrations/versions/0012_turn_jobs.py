"""turn_jobs: a processed turn names the chat job that took it

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-29

A chat's Manager job is written before the answer arrives and withdrawn when the exchange
fails, giving its turns back. It listed their fingerprints in its payload to do that: the
first job of a long conversation takes every turn, and 50,000 fingerprints (~4 MB of JSON)
were written and read again at each step of the job, on the event loop. Now each processed
turn a chat's job takes names the job (`job_id`), and a withdraw deletes by it. NULL for every
row before, and for the turns history, distilling and idle jobs mark (never withdrawn). A job
is withdrawn only by the process that wrote it: a replica of the version before writes no
`job_id` and withdraws its own jobs by their list, as before.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("processed_turns") as batch:
        batch.add_column(sa.Column("job_id", sa.String(36), nullable=True))
    op.create_index("ix_processed_turns_job", "processed_turns", ["job_id"])


def downgrade() -> None:
    op.drop_index("ix_processed_turns_job", table_name="processed_turns")
    with op.batch_alter_table("processed_turns") as batch:
        batch.drop_column("job_id")
