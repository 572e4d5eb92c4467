"""Past conversations queued as Manager jobs, durably, and what became of them.

Promises:

- :meth:`HistoryQueue.learn` queues an export's conversations in batches of whole ones, a batch
  in one transaction: a conversation's turns' fingerprints and all its jobs, or nothing of it.
  The fingerprints are a chat's (:mod:`.plan`), recorded as a chat's job records them: a turn is
  queued once, whether it came in a chat, an earlier learn of the same export, or another file
  (or earlier in the same one); a conversation with nothing new is *already learned*. So an
  export sent again queues nothing, and a learn cut off part way (a killed CLI, a lost
  connection) goes on where it stopped when run again;
- the jobs are the worker's (leases, applied once, a user's one at a time), dated when their
  words were said (the payload's ``said_at``, :func:`~app.memory.learning.leases.said_at`),
  and run after the chats' (:data:`~app.memory.learning.leases.HISTORY_JOB`);
- a learn run is named by the user and the export's bytes (:func:`run_id`): the same file learned
  again is the same run, and :meth:`HistoryQueue.progress` counts its jobs not yet applied.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.learning.history.export import BadExport, Conversation, Export
from app.memory.learning.history.plan import Piece, fingerprints, plan
from app.memory.learning.job_kinds import HISTORY_JOB
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import dump
from app.memory.store.db import insert_for, writing
from app.memory.store.records import now
from app.memory.store.tables import JobStatus, ManagerJob, ProcessedTurn
from app.proxy.offload import off_loop

BATCH_CONVERSATIONS = 32
BATCH_TURNS = 400
"""Conversations queued in one transaction: up to this many, or this many turns (a conversation
is never split). One transaction each took ~40 ms a conversation on SQLite, most of it the
commit; a batch holds the write lock for a few milliseconds more, and chats' job writes wait
that long at most."""
RUN_CHARS = 12
"""Hex digits of a run's id (48 bits of a hash): a job's id is ``learn-<run>-<16 hex>``, within
the 36 characters a job id has."""


@dataclass(frozen=True, slots=True)
class Learned:
    """What one learn did."""

    run: str
    format: str
    conversations: int
    """In the export."""
    messages: int
    """User and assistant messages read (current branches only)."""
    queued: int
    """Conversations with jobs queued now."""
    jobs: int
    """Jobs queued now."""
    already: int
    """Conversations learned (or queued) before: nothing new in them."""
    skipped: int
    """Conversations with nothing to learn from: no word of the user's."""


def run_id(user_id: str, raw: bytes) -> str:
    """The learn run of this export for this user."""
    digest = hashlib.sha256(user_id.encode() + b"\x00" + raw)
    return digest.hexdigest()[:RUN_CHARS]


def is_run_id(value: str) -> bool:
    return len(value) == RUN_CHARS and all(c in "0123456789abcdef" for c in value)


def manager_model(export: Export, given: str | None, configured: str) -> str | None:
    """The model the jobs name (None: each conversation's own): `given` (the request's), else
    the configured Manager's (its jobs' model is not asked for). A :class:`BadExport` naming the
    first conversation that has none."""
    if given or configured:
        return given or configured
    for conversation in export.conversations:
        if conversation.user_turns and not conversation.model:
            raise BadExport(
                f"conversations[{conversation.index}] names no model the Manager can learn "
                "with: set MEMPROXY_MANAGER_MODEL or name the model",
                "model",
                "model_required",
            )
    return None


class HistoryQueue:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._queue = JobQueue(sessions)

    async def learn(
        self,
        user_id: str,
        export: Export,
        *,
        run: str,
        model: str | None,
        done: Callable[[int], None] = lambda _: None,
    ) -> Learned:
        """Queue the export's conversations for the user (module docstring); `model`: the jobs'
        (None: each conversation's own, :func:`manager_model`); `done(n)` after each n."""
        made: list[int] = []
        skipped = 0
        batch: list[Conversation] = []
        for conversation in export.conversations:
            if not conversation.user_turns:
                skipped += 1
                done(1)
                continue
            batch.append(conversation)
            if len(batch) >= BATCH_CONVERSATIONS or _turns(batch) >= BATCH_TURNS:
                made += await self._batch(user_id, batch, run, model)
                done(len(batch))
                batch = []
        if batch:
            made += await self._batch(user_id, batch, run, model)
            done(len(batch))
        messages = sum(len(c.said) for c in export.conversations)
        queued = sum(1 for n in made if n)
        return Learned(run, export.format, len(export.conversations), messages, queued,
                       sum(made), len(made) - queued, skipped)  # fmt: skip

    async def _batch(
        self, user_id: str, batch: list[Conversation], run: str, model: str | None
    ) -> list[int]:
        """Queue what is new of these conversations, in one transaction: how many jobs each
        (0: nothing new). A turn said in two of them is the first one's."""
        size = sum(len(s.text) for c in batch for s in c.said)
        marks = await off_loop(size, lambda: [fingerprints(c) for c in batch])
        every = {m for ms in marks for m in ms if m is not None}
        processed = await self._queue.processed(user_id, sorted(every))
        fresh: list[set[str]] = []
        for ms in marks:
            fresh.append({m for m in ms if m is not None} - processed)
            processed |= fresh[-1]
        stamp = now()

        def rows(i: int, taken: set[str]) -> list[dict[str, Any]]:
            conversation = batch[i]
            chosen = model or conversation.model or ""
            return [_row(user_id, run, chosen, piece, stamp)
                    for piece in plan(conversation, marks[i], taken)]  # fmt: skip

        # Made before the write lock is taken: chats' job writes wait for the commit only.
        planned = await off_loop(size, lambda: [rows(i, f) for i, f in enumerate(fresh)])
        async with writing(self._sessions) as session:
            taken = await _take(session, user_id, set().union(*fresh), stamp)
            for i in range(len(batch)):
                if not fresh[i] <= taken:  # a chat or another learn took some meanwhile
                    planned[i] = rows(i, fresh[i] & taken)
            jobs = [row for made in planned for row in made]
            if jobs:
                await session.execute(insert(ManagerJob), jobs)
        return [len(made) for made in planned]

    async def progress(self, user_id: str, run: str) -> dict[str, int]:
        """The run's jobs not applied yet, by status, and ``pending``: queued or running."""
        query = (
            select(ManagerJob.status, func.count())
            .where(ManagerJob.user_id == user_id, ManagerJob.id.like(f"{HISTORY_JOB}{run}-%"))
            .group_by(ManagerJob.status)
        )
        async with self._sessions() as session:
            found = {status: int(n) for status, n in await session.execute(query)}
        counts = {s.value: found.get(s.value, 0) for s in JobStatus if s != JobStatus.AWAITING}
        return counts | {"pending": counts["queued"] + counts["running"]}


async def _take(
    session: AsyncSession, user_id: str, fingerprints: set[str], stamp: datetime
) -> set[str]:
    """Record the turns as taken: those no job had taken before (the database decides)."""
    if not fingerprints:
        return set()
    # Many parameter sets to one statement (compiled once, cached): a statement of as many
    # VALUES as turns was compiled anew each time, most of the time the write lock was held.
    statement = (
        insert_for(session)(ProcessedTurn)
        .on_conflict_do_nothing()
        .returning(ProcessedTurn.fingerprint)
    )
    rows = [{"user_id": user_id, "fingerprint": f, "created_at": stamp} for f in fingerprints]
    return set(await session.scalars(statement, rows))


def _row(user_id: str, run: str, model: str, piece: Piece, stamp: datetime) -> dict[str, Any]:
    """A job of a past conversation, as its row."""
    return {
        "id": f"{HISTORY_JOB}{run}-{secrets.token_hex(8)}", "user_id": user_id,
        "explicit": piece.explicit, "status": JobStatus.QUEUED.value, "attempts": 0,
        "next_attempt_at": stamp, "created_at": stamp, "owner": None, "lease_until": None,
        "payload": {"model": model, "context": dump(piece.context), "new": dump(piece.new),
                    "fingerprints": piece.fingerprints, "said_at": piece.said_at.isoformat()},
    }  # fmt: skip


def _turns(batch: list[Conversation]) -> int:
    return sum(len(c.said) for c in batch)
