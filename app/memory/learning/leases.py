"""Who runs a Manager job, among the processes sharing the database.

A job is claimed (:meth:`Leases.claim`: a user's oldest due job, one running per user, enforced
by a unique index) by one process, its `owner`, with a `lease_until` the owner renews
(:meth:`Leases.renew`) while it lives; an awaiting job (its chat's answer still on its way) is
held the same way by the process serving the chat. Any process queues a job again once its
lease has run out (:meth:`Leases.expire`): a process killed mid-job is replaced by whichever one
looks next, and none re-runs a job a live process holds. Only the owner deletes a job as applied
(:meth:`Leases.consume`) or hands it back (:meth:`Leases.retry_later`, :meth:`Leases.park`); a
stopping process hands its jobs back at once (:meth:`Leases.release`).

Leases are reckoned on the database's clock (:meth:`Leases.sync_clock`), not on each process's:
replicas on several machines whose clocks disagree by more than a lease would otherwise take
up each other's live jobs.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import case, delete, func, or_, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.learning.job_book import JobBook
from app.memory.learning.job_kinds import IDLE_JOB, OVER_JOB, idle, lane, said_at
from app.memory.learning.job_kinds import Job as Job
from app.memory.store.db import writing
from app.memory.store.records import aware, now
from app.memory.store.tables import JobStatus, ManagerJob
from app.memory.store.unit import Writer

HELD = (JobStatus.RUNNING.value, JobStatus.AWAITING.value)
"""The statuses a job has an owner and a lease in."""
UNHELD = {"owner": None, "lease_until": None}


def _uncounted() -> Any:
    """A running job's attempts less the one its claim counted; an awaiting job's as they are."""
    return case(
        (ManagerJob.status == JobStatus.RUNNING.value, ManagerJob.attempts - 1),
        else_=ManagerJob.attempts,
    )


def process_name() -> str:
    """This process among those sharing the database: host, pid, and a random part (a pid is
    reused, e.g. by every container's first process)."""
    return f"{socket.gethostname()[:80]}:{os.getpid()}:{secrets.token_hex(4)}"


class Leases(JobBook):
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        owner: str | None = None,
        lease_seconds: float = 30.0,
    ) -> None:
        super().__init__(sessions)
        self.owner = owner or process_name()
        """The jobs this process holds say so in their `owner`."""
        self.lease_seconds = lease_seconds
        self._offset = timedelta(0)
        """The database's clock minus this process's."""
        self._held: set[str] = set()
        """The jobs this process is working on: running here, or awaiting a chat's answer here.
        Only their leases are renewed: a job this process still owns but dropped (its hand-back
        failed) lapses, and another process takes it up."""

    def let_go(self, job_id: str) -> None:
        """This process is done with the job (applied, handed back, or given up on)."""
        self._held.discard(job_id)

    def _now(self) -> datetime:
        return now() + self._offset

    def _lease(self) -> datetime:
        return self._now() + timedelta(seconds=self.lease_seconds)

    async def sync_clock(self) -> None:
        """Read the database's clock (PostgreSQL; a SQLite file is on this machine's) and
        reckon leases on it from now on."""
        async with self._sessions() as session:
            if session.bind is None or session.bind.dialect.name != "postgresql":
                return
            before = now()
            database = await session.scalar(select(func.clock_timestamp()))
            after = now()
        if database is not None:
            self._offset = aware(database) - (before + (after - before) / 2)

    async def retry_later(self, job_id: str, error: str, delay_seconds: float) -> bool:
        """The held job queued again after `delay_seconds`; False when this process no longer
        held it (its lease ran out and another took it up: that one decides)."""
        due = self._now() + timedelta(seconds=delay_seconds)
        return await self._hand_back(
            job_id, status=JobStatus.QUEUED.value, error=error, next_attempt_at=due
        )

    async def park(
        self,
        job_id: str,
        error: str,
        *,
        answer: str | None = None,
        within: Writer | None = None,
        payload: dict[str, Any] | None = None,
    ) -> bool:
        """The held job failed for good, until `memproxy jobs retry`, with the Manager's unusable
        `answer`, in the unit of work `within` with a new `payload` (:mod:`.parking`). False when
        this process no longer held it."""
        more: dict[str, Any] = {} if payload is None else {"payload": payload}
        return await self._hand_back(job_id, within=within, status=JobStatus.FAILED.value,
                                     error=error, answer=answer, **more)  # fmt: skip

    async def renew(self) -> int:
        """This process is alive: the leases of the jobs it works on run on. How many."""
        held = list(self._held)
        if not held:
            return 0
        async with writing(self._sessions) as session:
            result = await session.execute(
                update(ManagerJob)
                .where(ManagerJob.owner == self.owner, ManagerJob.status.in_(HELD),
                       ManagerJob.id.in_(held))
                .values(lease_until=self._lease())
            )  # fmt: skip
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def expire(self) -> int:
        """Jobs whose lease ran out (their process died, or lost the database for longer than
        a lease) queued again, for any process; awaiting ones without their answer (the user's
        words are what counts). Jobs with no lease at all were left by a version before leases.
        How many."""
        stamp = self._now()
        async with writing(self._sessions) as session:
            result = await session.execute(
                update(ManagerJob)
                .where(
                    ManagerJob.status.in_(HELD),
                    or_(ManagerJob.lease_until.is_(None), ManagerJob.lease_until < stamp),
                )
                .values(status=JobStatus.QUEUED.value, next_attempt_at=stamp, **UNHELD)
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def release(self) -> int:
        """This process stops: the jobs it holds are queued again now (no waiting for their
        leases to run out); a running one's attempt is not counted (it did not fail). How
        many."""
        self._held.clear()
        async with writing(self._sessions) as session:
            result = await session.execute(
                update(ManagerJob)
                .where(ManagerJob.owner == self.owner, ManagerJob.status.in_(HELD))
                .values(
                    status=JobStatus.QUEUED.value,
                    next_attempt_at=self._now(),
                    attempts=_uncounted(),
                    **UNHELD,
                )
            )
            return int(result.rowcount or 0)  # type: ignore[attr-defined]

    async def claim(
        self, limit: int, *, exclude_users: set[str], idle_first: bool = False
    ) -> list[Job]:
        """Up to `limit` due jobs, each a user's oldest, of users with no job running (here or
        in another process) and not in `exclude_users`; marked running, held by this process.
        Chats' jobs first, then a past conversation's (a long history never keeps a chat waiting
        for more than its one running job), then an idle job (:data:`IDLE_JOB`), only while
        its user has no other job waiting; `idle_first`: one idle job before them all."""
        if limit <= 0:
            return []
        stamp = self._now()
        async with writing(self._sessions) as session:
            running = set(await session.scalars(
                select(ManagerJob.user_id).where(ManagerJob.status == JobStatus.RUNNING.value)
            ))  # fmt: skip
            waiting = set(await session.scalars(
                select(ManagerJob.user_id).distinct().where(
                    ManagerJob.status.in_((JobStatus.QUEUED.value, JobStatus.AWAITING.value)),
                    ~idle(),
                )
            ))  # fmt: skip
            kind = lane()
            firsts = (  # each user's oldest job of each kind
                select(func.min(ManagerJob.key))
                .where(ManagerJob.status == JobStatus.QUEUED.value)
                .group_by(ManagerJob.user_id, kind)
            )
            # A job another transaction holds (a chat appending to it) is passed over this time.
            candidates = (await session.execute(
                select(ManagerJob.key, ManagerJob.id, ManagerJob.user_id, ManagerJob.explicit,
                       ManagerJob.next_attempt_at, ManagerJob.created_at)
                .where(ManagerJob.key.in_(firsts))
                .order_by(kind, ManagerJob.key)
                .with_for_update(skip_locked=True)
            )).all()  # fmt: skip
            if idle_first:  # idle jobs first; a stable sort keeps each kind in claim order
                candidates = sorted(candidates, key=lambda c: not c.id.startswith(IDLE_JOB))
            claimed: list[Job] = []
            idles = 0
            for key, job_id, user_id, explicit, due, created_at in candidates:
                if len(claimed) >= limit:
                    break
                if user_id in running or user_id in exclude_users or aware(due) > stamp:
                    continue
                if job_id.startswith(IDLE_JOB):
                    behind = user_id in waiting and not job_id.endswith(OVER_JOB)
                    if behind or (idle_first and idles):
                        continue
                    idles += 1
                taken = await self._take(session, key)
                if taken is not None:
                    self._held.add(job_id)
                    running.add(user_id)  # its other candidate waits: one job per user
                    attempts, payload = taken
                    claimed.append(Job(job_id, user_id, explicit, attempts, dict(payload),
                                       said_at(payload, created_at)))  # fmt: skip
            return claimed

    async def _take(self, session: AsyncSession, key: int) -> tuple[int, Any] | None:
        """Mark the job running, held by this process: its attempts and payload as of the claim
        itself (a merge may have grown it since the read); None when it is no longer queued, or
        when another process has just started a job of the user (the unique index refuses a
        second: the running jobs read above may be older than that process's commit)."""
        try:
            async with session.begin_nested():
                taken = (
                    await session.execute(
                        update(ManagerJob)
                        .where(
                            ManagerJob.key == key, ManagerJob.status == JobStatus.QUEUED.value
                        )
                        .values(status=JobStatus.RUNNING.value, attempts=ManagerJob.attempts + 1,
                                owner=self.owner, lease_until=self._lease())
                        .returning(ManagerJob.attempts, ManagerJob.payload)
                    )
                ).first()  # fmt: skip
        except IntegrityError:
            return None
        return None if taken is None else (taken[0], taken[1])

    async def consume(self, w: Writer, job_id: str) -> bool:
        """Delete the job inside the unit of work that applies it, if this process still holds
        it; False when it does not (another process took it up after this one's lease ran out,
        or applied it, or it was dropped): the caller must then apply nothing."""
        result = await w.execute(
            delete(ManagerJob).where(
                ManagerJob.id == job_id,
                ManagerJob.owner == self.owner,
                ManagerJob.status == JobStatus.RUNNING.value,
            )
        )
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def holds(self, w: Writer, job_id: str) -> bool:
        """Whether this process still holds the job, read inside the unit of work `w` (row
        locked where the database can): a job whose work is written in several units (an
        idle job's) checks it in each."""
        found = await w.execute(
            select(ManagerJob.key)
            .where(
                ManagerJob.id == job_id,
                ManagerJob.owner == self.owner,
                ManagerJob.status == JobStatus.RUNNING.value,
            )
            .with_for_update()
        )
        return found.first() is not None

    async def _hand_back(self, job_id: str, *, within: Writer | None = None, **values: Any) -> bool:
        statement = (
            update(ManagerJob)
            .where(
                ManagerJob.id == job_id,
                ManagerJob.owner == self.owner,
                ManagerJob.status == JobStatus.RUNNING.value,
            )
            .values(**values, **UNHELD)
        )
        if within is not None:  # parked with what it keeps (parking.py)
            return bool((await within.execute(statement)).rowcount)  # type: ignore[attr-defined]
        async with writing(self._sessions) as session:
            return bool((await session.execute(statement)).rowcount)  # type: ignore[attr-defined]
