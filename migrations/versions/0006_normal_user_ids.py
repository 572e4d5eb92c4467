"""user ids stored before ids were normalised are rewritten to the form requests now name them by

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-25

Every request's user id is now normalised (:func:`app.proxy.user_ids.normal_user_id`: trimmed,
NFC, some refused), so a user stored as NFD ``José`` (a combining accent, as macOS types it)
would be out of reach: their memories missing from chats, the page's "Open" showing an empty
user. This rewrites every stored id, in every table that holds one, to its trimmed NFC form;
where that form is a user already, the two become one user:

- memories and their history go to the NFC id; the user's change sequence goes past both
  users' versions and every sequence their memories carry (a user may have memories and no
  ``user_state`` row), and the memories moved carry it, so a cache of either user catches up;
- rows unique per user are kept once: a turn's fingerprint, the Manager's state (the later
  ``last_job_at``), one running Manager job (the oldest; the others wait queued).

Only trimming and NFC (Unicode keeps NFC stable forever), not the running version's rule: what
this revision does must not change when the rule does. Ids the running rule refuses (invisible
or bidirectional characters, look-alike letters) are otherwise left as they are stored and only
counted in the log: ``memproxy memories move`` and ``POST /v1/memories/move`` take a source
user as stored. No downgrade: merged users cannot be told apart.
"""

from __future__ import annotations

import logging
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.engine import Connection

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = (
    "memories", "user_state", "memory_events", "manager_jobs", "processed_turns", "manager_state",
)  # fmt: skip
"""Every table with a ``user_id`` column."""
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    connection = op.get_bind()
    stored = connection.execute(
        sa.text(" UNION ".join(f"SELECT user_id FROM {table}" for table in TABLES))
    ).scalars()
    users = set(stored)
    renamed = {old: new for old in sorted(users) if (new := _nfc(old)) not in ("", old)}
    for old, new in renamed.items():
        _merge(connection, old, new)
    _count_refused((users - renamed.keys()) | set(renamed.values()))


def downgrade() -> None:
    """Nothing to undo that can be undone: the old forms are not kept."""


def _nfc(user_id: str) -> str:
    """`user_id` trimmed and in NFC: what this revision makes of it, for ever."""
    return unicodedata.normalize("NFC", user_id.strip())


def _count_refused(users: Iterable[str]) -> None:
    """Say how many stored ids the running version's rule refuses (no id: logs are read by
    more people than the ids' owners), and how to give their memories to a good one."""
    from app.proxy.user_ids import UserIdRefused, normal_user_id  # the rule of the day

    refused = 0
    for user in users:
        try:
            normal_user_id(user)
        except UserIdRefused:
            refused += 1
    if refused:
        log.warning(
            "%d stored user id%s refused by the user id rule (look-alike or invisible"
            " characters); their memories stay theirs until given to a good id: see"
            " `memproxy users list` and `memproxy memories move --from OLD --to NEW`",
            refused, " is" if refused == 1 else "s are",
        )  # fmt: skip


def _merge(connection: Connection, old: str, new: str) -> None:
    """Give everything of `old` to `new` (who may have rows of their own already)."""

    def run(statement: str) -> sa.CursorResult[Any]:
        return connection.execute(sa.text(statement), {"old": old, "new": new})

    both = "user_id IN (:old, :new)"
    version = 1 + max(
        run(f"SELECT COALESCE(MAX(version), 0) FROM user_state WHERE {both}").scalar() or 0,
        run(f"SELECT COALESCE(MAX(seq), 0) FROM memories WHERE {both}").scalar() or 0,
    )
    run(f"DELETE FROM user_state WHERE {both}")
    connection.execute(
        sa.text("INSERT INTO user_state (user_id, version) VALUES (:new, :version)"),
        {"new": new, "version": version},
    )
    connection.execute(
        sa.text("UPDATE memories SET user_id = :new, seq = :version WHERE user_id = :old"),
        {"old": old, "new": new, "version": version},
    )
    run("UPDATE memory_events SET user_id = :new WHERE user_id = :old")
    # One running job per user (ux_manager_jobs_running_user): the oldest runs on.
    run(
        "UPDATE manager_jobs SET status = 'queued', owner = NULL, lease_until = NULL"
        f" WHERE {both} AND status = 'running' AND key <> (SELECT MIN(key) FROM manager_jobs"
        f" WHERE {both} AND status = 'running')"
    )
    run("UPDATE manager_jobs SET user_id = :new WHERE user_id = :old")
    run(
        "DELETE FROM processed_turns WHERE user_id = :old AND fingerprint IN"
        " (SELECT fingerprint FROM processed_turns WHERE user_id = :new)"
    )
    run("UPDATE processed_turns SET user_id = :new WHERE user_id = :old")
    run(
        "UPDATE manager_state SET last_job_at = (SELECT MAX(last_job_at) FROM manager_state"
        f" WHERE {both}) WHERE user_id = :new"
    )
    run(
        "DELETE FROM manager_state WHERE user_id = :old AND EXISTS"
        " (SELECT 1 FROM manager_state WHERE user_id = :new)"
    )
    run("UPDATE manager_state SET user_id = :new WHERE user_id = :old")
