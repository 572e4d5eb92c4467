"""Idle jobs: the upkeep of a quiet user's memories (:mod:`app.memory.learning.idle`), queued
as Manager jobs so that they get what those have: leases, exactly once, one job per user at a
time across processes, retries, the page's jobs view.

Promises (:meth:`IdleJobs.queue_idle`):

- a user gets an idle job once they have been quiet for ``MEMPROXY_IDLE_SECONDS`` (no job of
  theirs queued and no memory of theirs written in that time), have no job waiting or running
  (nor an idle job parked as failed), hold memories, and their memories changed since their
  last idle job finished (:meth:`IdleJobs.idle_done`);
- one idle job per user and version of their memories, whichever processes look at once (its
  id says both: a second insert of it is a no-op);
- a chat of the user that comes while the idle job waits is learned from first
  (:meth:`~app.memory.learning.leases.Leases.claim`); idle jobs never count towards the
  queue's limit and are never dropped for it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, insert, or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.memory.learning.job_kinds import IDLE_JOB, OVER_JOB, idle
from app.memory.learning.leases import Leases
from app.memory.learning.parking import KEPT
from app.memory.store.db import insert_for, writing
from app.memory.store.tables import (
    JobStatus,
    ManagerJob,
    ManagerState,
    Memory,
    ProcessedTurn,
    UserState,
)
from app.memory.store.unit import Writer

IDLE_BATCH = 200
"""Users given an idle job per look: the rest at the next one."""


@dataclass(frozen=True, slots=True)
class Distil:
    """A job that distils one exchange's episodes (:mod:`.distilling`)."""

    id: str
    marks: list[str]
    """One per episode, recorded as turns taken: an episode is queued once ever."""
    payload: dict[str, Any]


def idle_job_id(user_id: str, version: int, *, over: bool = False) -> str:
    """The id of the user's idle job for this version of their memories."""
    digest = hashlib.sha256(user_id.encode("utf-8")).hexdigest()[:12]
    return f"{IDLE_JOB}{digest}-{version}{OVER_JOB if over else ''}"


def _row(
    user_id: str,
    version: int,
    stamp: datetime,
    model: str | None,
    since: int | None,
    *,
    over: bool = False,
) -> dict[str, Any]:
    """The idle job's row; its `model` is the one of the user's last chat with a job (the idle
    work asks it, unless MEMPROXY_MANAGER_MODEL names one; "": no chat's job ever), `since` the
    version the user's last idle work was done for (what was written after it is new to it)."""
    return {
        "id": idle_job_id(user_id, version, over=over), "user_id": user_id, "explicit": False,
        "status": JobStatus.QUEUED.value, "attempts": 0, "next_attempt_at": stamp,
        "payload": {"model": model or "", "context": [], "new": [], "fingerprints": [],
                    "version": version, "since": since or 0},
        "created_at": stamp,
    }  # fmt: skip


async def _insert(session: AsyncSession, rows: list[dict[str, Any]]) -> int:
    """Insert these idle jobs, but those whose id exists already (another process queued it):
    how many were inserted."""
    inserted = await session.scalars(
        insert_for(session)(ManagerJob)
        .values(rows)
        .on_conflict_do_nothing(index_elements=[ManagerJob.id])
        .returning(ManagerJob.id)
    )
    return len(list(inserted))


class IdleJobs(Leases):
    async def queue_idle(self, quiet_seconds: float, *, limit: int = IDLE_BATCH) -> int:
        """Queue an idle job for each user due one (the module docstring): how many."""
        quiet_since = self._now() - timedelta(seconds=quiet_seconds)
        stamp = self._now()
        busy = select(ManagerJob.user_id).where(  # a parked idle job holds its version's work
            or_(ManagerJob.status != JobStatus.FAILED.value, idle())
        )
        last_write = (  # the newest memory's writing (the seq index finds it)
            select(Memory.updated_at).where(Memory.user_id == UserState.user_id)
            .order_by(Memory.seq.desc()).limit(1).scalar_subquery()
        )  # fmt: skip
        due = (
            select(
                UserState.user_id, UserState.version, ManagerState.model, ManagerState.idle_version
            )
            .outerjoin(ManagerState, ManagerState.user_id == UserState.user_id)
            .where(
                UserState.version > func.coalesce(ManagerState.idle_version, 0),
                or_(ManagerState.idle_after.is_(None), ManagerState.idle_after < stamp),
                or_(ManagerState.last_job_at.is_(None), ManagerState.last_job_at < quiet_since),
                last_write < quiet_since,  # no memory at all (an erased user): NULL, not due
                UserState.user_id.not_in(busy),
            )
            .order_by(UserState.user_id)
            .limit(limit)
        )
        async with self._sessions() as session:  # a plain read: most looks find no one
            found = list(await session.execute(due))
        if not found:
            return 0
        rows = [_row(user_id, int(version), stamp, model, since)
                for user_id, version, model, since in found]  # fmt: skip
        async with writing(self._sessions) as session:
            return await _insert(session, rows)

    async def queue_over(self, user_id: str) -> bool:
        """Queue an idle job for a user past a capacity, to run without their going quiet
        (:data:`OVER_JOB` ends its id: the claim does not hold it behind their chats' jobs);
        none while an idle job of theirs exists. Whether one was queued."""
        stamp = self._now()
        async with writing(self._sessions) as session:
            waiting = await session.scalar(
                select(ManagerJob.id).where(ManagerJob.user_id == user_id, idle()).limit(1)
            )
            version = await session.scalar(
                select(UserState.version).where(UserState.user_id == user_id)
            )
            state = (await session.execute(
                select(ManagerState.model, ManagerState.idle_version)
                .where(ManagerState.user_id == user_id)
            )).first()  # fmt: skip
            if waiting is not None or version is None:
                return False
            model, since = state if state is not None else (None, None)
            row = _row(user_id, int(version), stamp, model, since, over=True)
            return await _insert(session, [row]) > 0

    async def queue_distil(self, user_id: str, jobs: Sequence[Distil], *, held: str) -> int:
        """Queue these jobs of the user, while this process still holds the idle job `held`
        (a user erased or moved meanwhile gets none), each only if every one of its episodes'
        marks is taken by this transaction (another process queued it otherwise): how many."""
        if not jobs:
            return 0
        stamp = self._now()
        async with writing(self._sessions) as session:
            holds = await session.scalar(
                select(ManagerJob.key).where(
                    ManagerJob.id == held, ManagerJob.owner == self.owner,
                    ManagerJob.status == JobStatus.RUNNING.value,
                ).with_for_update()
            )  # fmt: skip
            if holds is None:
                return 0
            marks = insert_for(session)(ProcessedTurn).on_conflict_do_nothing()
            taken = set(await session.scalars(
                marks.returning(ProcessedTurn.fingerprint),
                [{"user_id": user_id, "fingerprint": m, "created_at": stamp}
                 for j in jobs for m in j.marks],
            ))  # fmt: skip
            rows = [
                {"id": j.id, "user_id": user_id, "explicit": False,
                 "status": JobStatus.QUEUED.value, "attempts": 0, "next_attempt_at": stamp,
                 "created_at": stamp, "payload": j.payload}
                for j in jobs if set(j.marks) <= taken
            ]  # fmt: skip
            if rows:
                await session.execute(insert(ManagerJob), rows)
            return len(rows)

    async def kept_by_jobs(self, user_id: str) -> set[str]:
        """The ids of the episodes the user's jobs keep (a parked job's words: it learns them
        when retried)."""
        async with self._sessions() as session:  # idle work runs when only parked ones are left
            payloads = await session.scalars(
                select(ManagerJob.payload).where(
                    ManagerJob.user_id == user_id, ManagerJob.status == JobStatus.FAILED.value
                )
            )
            return {str(i) for p in payloads for i in (p or {}).get(KEPT) or ()}

    async def idle_done(self, w: Writer, *, upto: int | None = None, wait: float = 0.0) -> None:
        """In the unit `w` that consumes the user's idle job (its lock taken): their idle work
        is done as of the version `w` commits (none is due until their memories change again),
        or only `upto` that version (it stopped at its bound, or could not reach the model: the
        next idle job goes on from there, no sooner than `wait` seconds from now)."""
        version = await w.committing() if upto is None else upto
        after = self._now() + timedelta(seconds=wait) if upto is not None else None
        values = {"idle_version": version, "idle_after": after}
        statement = w.insert(ManagerState).values(user_id=w.user_id, **values)
        await w.execute(statement.on_conflict_do_update(
            index_elements=[ManagerState.user_id], set_=values
        ))  # fmt: skip
