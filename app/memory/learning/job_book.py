"""The Manager queue's book-keeping: what became of jobs, for stats, the memory page and the CLI.

:class:`~app.memory.learning.jobs.JobQueue` is a :class:`JobBook`: this part reads counts and
lists and queues failed jobs again on request; :mod:`app.memory.learning.leases` runs jobs
(claims, leases, hand-backs), and the queue itself (:mod:`app.memory.learning.jobs`) decides
which turns become which job.
"""

from __future__ import annotations

from datetime import datetime
from typing import NamedTuple

from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.log import mask_urls_in
from app.memory.learning.job_kinds import JobKind, idle, kind_of
from app.memory.store.db import writing
from app.memory.store.records import aware, now
from app.memory.store.tables import JobStatus, ManagerJob


class Parked(NamedTuple):
    """A job parked as failed."""

    job_id: str
    user_id: str
    reason: str | None
    """Why, URLs in it masked (:func:`~app.log.mask_urls_in`): an error stored by an older
    version names the Manager's URL as it was set, query keys and password included."""
    answer: str | None
    """The Manager's last answer when it was unusable (None when it could not be asked)."""


class JobSummary(NamedTuple):
    """A job as the memory page lists it (its conversation text is not shown)."""

    job_id: str
    status: str
    explicit: bool
    """The user asked to remember or forget something."""
    attempts: int
    messages: int
    """How many new messages (the user's and the answers) it holds."""
    error: str | None
    """As :attr:`Parked.reason`."""
    answer: str | None
    created_at: datetime
    next_attempt_at: datetime
    kind: JobKind
    """A chat's, a past conversation's, or an idle job (:mod:`.job_kinds`)."""


class JobBook:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions

    async def retry_failed(self, user_id: str | None = None, job_id: str | None = None) -> int:
        """Failed jobs (of the user, or the one job) queued again, from their first attempt
        (`memproxy jobs retry`)."""
        query = update(ManagerJob).where(ManagerJob.status == JobStatus.FAILED.value)
        if user_id is not None:
            query = query.where(ManagerJob.user_id == user_id)
        if job_id is not None:
            query = query.where(ManagerJob.id == job_id)
        async with writing(self._sessions) as session:
            result = await session.execute(
                query.values(status=JobStatus.QUEUED.value, attempts=0, next_attempt_at=now())
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def counts(self, user_id: str | None = None) -> dict[str, int]:
        """Jobs by status."""
        query = select(ManagerJob.status, func.count()).group_by(ManagerJob.status)
        if user_id is not None:
            query = query.where(ManagerJob.user_id == user_id)
        async with self._sessions() as session:
            found = {status: int(n) for status, n in await session.execute(query)}
        return {s.value: found.get(s.value, 0) for s in JobStatus}

    async def progress(self, user_id: str) -> dict[str, int]:
        """The user's jobs by status, ``pending``: awaiting (the chat's answer still on its
        way), queued and running, but idle jobs: the exchanges not yet learned from; and
        ``idle``: idle jobs queued or running (:mod:`.idle_jobs`)."""
        counts = await self.counts(user_id)
        async with self._sessions() as session:
            upkeep = int(await session.scalar(
                select(func.count()).where(ManagerJob.user_id == user_id, idle(),
                                           ManagerJob.status != JobStatus.FAILED.value)
            ) or 0)  # fmt: skip
        pending = sum(counts.values()) - counts[JobStatus.FAILED.value] - upkeep
        return counts | {"pending": pending, "idle": upkeep}

    async def failed(self, user_id: str | None = None) -> list[Parked]:
        """Parked jobs, oldest first."""
        query = select(
            ManagerJob.id, ManagerJob.user_id, ManagerJob.error, ManagerJob.answer
        ).where(ManagerJob.status == JobStatus.FAILED.value)
        if user_id is not None:
            query = query.where(ManagerJob.user_id == user_id)
        async with self._sessions() as session:
            rows = await session.execute(query.order_by(ManagerJob.key))
            return [Parked(job, user, _shown(error), answer) for job, user, error, answer in rows]

    async def jobs(self, user_id: str, *, limit: int = 100) -> list[JobSummary]:
        """The user's jobs, oldest first (the order they run in)."""
        query = (
            select(ManagerJob)
            .where(ManagerJob.user_id == user_id)
            .order_by(ManagerJob.key)
            .limit(limit)
        )
        async with self._sessions() as session:
            return [
                JobSummary(
                    j.id, j.status, j.explicit, j.attempts, len(j.payload.get("new", ())),
                    _shown(j.error), j.answer, aware(j.created_at), aware(j.next_attempt_at),
                    kind_of(j.id),
                )
                for j in await session.scalars(query)
            ]  # fmt: skip


def _shown(error: str | None) -> str | None:
    return None if error is None else mask_urls_in(error)
