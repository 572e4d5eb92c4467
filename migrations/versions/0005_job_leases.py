"""manager jobs get an owner and a lease; one running job per user, enforced by the database

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-24
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

RUNNING = "status = 'running'"


def upgrade() -> None:
    with op.batch_alter_table("manager_jobs") as batch:
        batch.add_column(sa.Column("owner", sa.String(128), nullable=True))
        batch.add_column(sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True))
    # Jobs left running or awaiting by processes of the version before: no owner, no lease, so
    # the first replica to look takes them up. Two running jobs of one user (which that version
    # let happen across processes) would fail the index: all but the oldest wait their turn.
    op.execute(
        "UPDATE manager_jobs SET status = 'queued' WHERE status = 'running' AND key NOT IN "
        "(SELECT MIN(key) FROM manager_jobs WHERE status = 'running' GROUP BY user_id)"
    )
    op.create_index(
        "ux_manager_jobs_running_user",
        "manager_jobs",
        ["user_id"],
        unique=True,
        sqlite_where=sa.text(RUNNING),
        postgresql_where=sa.text(RUNNING),
    )


def downgrade() -> None:
    op.drop_index("ux_manager_jobs_running_user", table_name="manager_jobs")
    with op.batch_alter_table("manager_jobs") as batch:
        batch.drop_column("lease_until")
        batch.drop_column("owner")
