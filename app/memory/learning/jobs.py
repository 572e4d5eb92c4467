"""The Manager's durable job queue, in the database (so several processes share it).

Promises:

- :meth:`JobQueue.enqueue` writes the job and the fingerprints of the turns it takes in one
  transaction, each naming the job: a turn is queued once. The chat hook writes it *awaiting*,
  before forwarding, so it exists before the response completes; :meth:`JobQueue.complete`
  adds the answer and makes it due, :meth:`JobQueue.withdraw` takes it back (and frees its
  turns) when the exchange fails;
- a job is deleted in the transaction that applies it, by the process holding it
  (:meth:`JobQueue.consume`), so it is applied once or not at all, whenever a process dies; a
  job a dead process held is queued again once its lease runs out (:mod:`.leases`);
- a user's jobs run one at a time, oldest first, across every process on the database (a
  unique index allows one running job per user) (:meth:`JobQueue.claim`);
- routine exchanges within ``MEMPROXY_PROCESSING_INTERVAL`` of the user's last job join that
  user's pending routine job, due at the end of the interval; an explicit request takes a
  pending routine job's turns along and is due at once; either only while the two hold at most
  :data:`~app.memory.learning.extraction.MAX_JOB_TURNS` new turns, were said on the same day
  (UTC: a job has one date), and the pending one was never parked, else each stays a job of its
  own;
- beyond ``MEMPROXY_MANAGER_QUEUE_LIMIT`` queued jobs, the oldest routine ones are dropped;
  explicit ones never are;
- jobs made from past conversations (:mod:`app.memory.learning.history`, their ids beginning
  :data:`~app.memory.learning.leases.HISTORY_JOB`) are no chat's: a chat's turns never join
  one, and they neither count towards the limit nor are dropped for it (a history of thousands
  of jobs would otherwise push every chat's out); idle jobs (:mod:`.idle_jobs`) neither.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic_ai.messages import ModelMessage, ModelRequest
from sqlalchemy import Select, delete, func, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.learning.extraction import MAX_JOB_TURNS, Exchange, for_manager
from app.memory.learning.idle_jobs import IdleJobs
from app.memory.learning.job_kinds import from_history, idle
from app.memory.learning.parking import KEPT
from app.memory.learning.turns import dump, fingerprints_of, role_of, text_of, turn
from app.memory.store.db import insert_for, writing
from app.memory.store.records import aware, in_utc, now
from app.memory.store.tables import JobStatus, ManagerJob, ManagerState, ProcessedTurn
from app.proxy.offload import pieces


@dataclass(frozen=True, slots=True)
class Queued:
    job_id: str
    dropped: int
    """Routine jobs dropped to keep the queue within its limit."""


SQL_BATCH = 256
"""Fingerprints per statement: a conversation of 50,000 turns in one statement took seconds to
compile (on the event loop) and exceeds SQLite's limit of bound parameters."""
INSERT_BATCH = 512
"""Fingerprints per round trip of a job's insert: ~5 ms of the event loop each (2,048: ~25 ms)."""
MODEL_CHARS = 256
"""What `manager_state.model` holds of a chat's model name at most."""


def _for_manager(message: ModelMessage) -> ModelMessage:
    """The turn as a job stores it: a long one cut to its start and end."""
    text = text_of(message)
    cut = for_manager(text)
    return message if cut is text else turn(role_of(message), cut)


def _owned(exchange: Exchange, taken: set[str]) -> list[ModelMessage]:
    """The exchange's new turns this job took: its user turns, each with the replies after it."""
    marks = dict(exchange.marks or fingerprints_of([*exchange.context, *exchange.new]))
    offset = len(exchange.context)
    out: list[ModelMessage] = []
    keep = False
    for i, message in enumerate(exchange.new):
        if isinstance(message, ModelRequest):
            keep = marks.get(offset + i) in taken
        if keep:
            out.append(_for_manager(message))
    return out


def _locked(condition: Any, status: JobStatus, *more: Any) -> Select[ManagerJob]:
    """The jobs matching, in `status`, locked until the transaction ends (``FOR UPDATE``), read
    afresh: a job is read then rewritten (turns appended, made due, deleted), and two chats of
    a user, or a chat and a claim, must not do that to one job at once. PostgreSQL waits for the
    other writer and reads the row as it left it (a job claimed meanwhile no longer matches);
    SQLite's writes are one at a time already (``BEGIN IMMEDIATE``) and it ignores the clause."""
    return (
        select(ManagerJob)
        .where(condition, ManagerJob.status == status.value, *more)
        .with_for_update()
        .execution_options(populate_existing=True)
    )


def _apart(pending: ManagerJob, job: ManagerJob) -> bool:
    """Whether the turns of `job` must not join those of `pending`: the two would be over the
    bound, or were said on different days (UTC), or `pending` was parked and retried (its
    episodes were written as it parked: :mod:`.parking`; turns joining it would get none, or
    the whole job them twice). A job has one date, its memories' `observed_at` and the day the
    Manager reads "yesterday" from: a job waiting since yesterday must not lend it to today's."""
    if (
        KEPT in pending.payload
        or len(pending.payload["new"]) + len(job.payload["new"]) > MAX_JOB_TURNS
    ):
        return True
    return in_utc(aware(pending.created_at)).date() != in_utc(aware(job.created_at)).date()


class JobQueue(IdleJobs):
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        limit: int = 1000,
        owner: str | None = None,
        lease_seconds: float = 30.0,
    ) -> None:
        super().__init__(sessions, owner=owner, lease_seconds=lease_seconds)
        self._limit = limit

    async def processed(self, user_id: str, fingerprints: list[str]) -> set[str]:
        """Which of these fingerprints a job already took."""
        found: set[str] = set()
        async with self._sessions() as session:
            for _, batch in pieces(fingerprints, SQL_BATCH):
                query = select(ProcessedTurn.fingerprint).where(
                    ProcessedTurn.user_id == user_id, ProcessedTurn.fingerprint.in_(batch)
                )
                found.update(await session.scalars(query))
        return found

    async def enqueue(
        self,
        user_id: str,
        model: str,
        exchange: Exchange,
        *,
        interval_seconds: float,
        awaiting: bool = False,
    ) -> Queued | None:
        """Queue the exchange's turns that no other job took; None when another took them all
        (two requests of one conversation finishing together). `awaiting`: the answer is still
        on its way; :meth:`complete` makes the job due, :meth:`withdraw` takes it back."""
        stamp = now()
        job_id = str(uuid.uuid4())
        async with writing(self._sessions) as session:
            # The database decides which turns are this job's: the fingerprints it inserts. One
            # statement, compiled once, given the rows a batch at a time (SQLAlchemy's
            # "insertmanyvalues" makes each batch one multi-row INSERT): a statement of its own
            # per batch was compiled every time, ~20 ms of the event loop each, 4 s for a
            # 50,000-turn conversation (bench/loop_stall.py).
            statement = (
                insert_for(session)(ProcessedTurn)
                .on_conflict_do_nothing()
                .returning(ProcessedTurn.fingerprint)
            )
            taken: set[str] = set()
            for _, batch in pieces(exchange.fingerprints, INSERT_BATCH):
                rows = [{"user_id": user_id, "fingerprint": f, "created_at": stamp,
                         "job_id": job_id} for f in batch]  # fmt: skip
                taken.update(await session.scalars(statement, rows))
            if not taken:
                return None
            # The turns name the job (a withdraw gives them back by it), so its payload does
            # not list them: the first job of a long conversation takes every turn, and 50,000
            # fingerprints were ~4 MB of JSON written and read at each step, on the event loop.
            job = ManagerJob(
                id=job_id, user_id=user_id, explicit=exchange.explicit,
                status=JobStatus.AWAITING.value, attempts=0, next_attempt_at=stamp,
                payload={"model": model,
                         "context": dump([_for_manager(t) for t in exchange.context]),
                         "new": dump(_owned(exchange, taken))},
                created_at=stamp, owner=self.owner, lease_until=self._lease(),
            )  # fmt: skip
            session.add(job)
            await session.flush()
            if awaiting:
                self._held.add(job.id)
                return Queued(job.id, 0)
            return await self._place(session, job, interval_seconds)

    async def complete(self, job_id: str, reply: str | None, *, interval_seconds: float) -> int:
        """The answer arrived: add it to the awaiting job and make the job due (joining or
        absorbing the user's pending routine job, as the module docstring says). Returns how
        many routine jobs were dropped to keep within the limit."""
        try:
            async with writing(self._sessions) as session:
                job = await session.scalar(_locked(ManagerJob.id == job_id, JobStatus.AWAITING))
                if job is None:
                    return 0  # taken up by another process once its lease ran out
                if reply and not reply.isspace():  # strip() would copy a long answer
                    new = [*job.payload["new"], *dump([turn("assistant", for_manager(reply))])]
                    job.payload = {**job.payload, "new": new}
                return (await self._place(session, job, interval_seconds)).dropped
        finally:
            self.let_go(job_id)  # had this failed, the lease lapses: another process takes it

    async def withdraw(self, job_id: str) -> None:
        """The exchange failed or the client left: the awaiting job goes, and its turns are
        free again for the conversation's next exchange."""
        self.let_go(job_id)
        async with writing(self._sessions) as session:
            job = await session.scalar(_locked(ManagerJob.id == job_id, JobStatus.AWAITING))
            if job is None:
                return
            # Its turns name it (a job is withdrawn only by the process that wrote it, so never
            # one of a replica of the version before, whose turns name none: migration 0012).
            await session.execute(delete(ProcessedTurn).where(ProcessedTurn.job_id == job.id))
            await session.delete(job)

    async def _place(self, session: AsyncSession, job: ManagerJob, interval: float) -> Queued:
        """Make an awaiting job due: merged into the user's pending routine job (routine), or
        absorbing it (explicit), or on its own after the processing interval. Says which job
        the turns are in now."""
        stamp = now()
        pending = await session.scalar(
            _locked(
                ManagerJob.user_id == job.user_id,
                JobStatus.QUEUED,
                ManagerJob.explicit.is_(False),
                ManagerJob.key != job.key,
                ~from_history(),
                ~idle(),
            ).order_by(ManagerJob.key.desc()).limit(1)
        )  # fmt: skip
        if pending is not None and _apart(pending, job):
            # One job is one Manager call, of one day: this one goes on its own. An explicit one
            # must not wait behind the routine one (a user's jobs run oldest first): that one is
            # due now.
            if job.explicit:
                pending.next_attempt_at = min(aware(pending.next_attempt_at), stamp)
            pending = None
        if pending is not None and not job.explicit:
            pending.payload = {**pending.payload, "model": job.payload["model"],
                               "new": pending.payload["new"] + job.payload["new"]}  # fmt: skip
            await session.delete(job)
            return Queued(pending.id, 0)
        due = stamp
        if pending is not None:  # explicit: take the waiting routine turns along, now
            job.payload = {**job.payload, "context": pending.payload["context"],
                           "new": pending.payload["new"] + job.payload["new"]}  # fmt: skip
            await session.delete(pending)
        elif not job.explicit:
            last = await session.scalar(
                select(ManagerState.last_job_at).where(ManagerState.user_id == job.user_id)
            )
            if last is not None:
                due = max(stamp, aware(last) + timedelta(seconds=interval))
        job.status = JobStatus.QUEUED.value
        job.next_attempt_at = due
        job.owner = job.lease_until = None
        insert = insert_for(session)
        model = str(job.payload["model"])[:MODEL_CHARS]  # the column's size (a name is shorter)
        await session.execute(
            insert(ManagerState)
            .values(user_id=job.user_id, last_job_at=due, model=model)
            .on_conflict_do_update(index_elements=[ManagerState.user_id],
                                   set_={"last_job_at": due, "model": model})
        )  # fmt: skip
        await session.flush()
        return Queued(job.id, await self._trim(session))

    async def _trim(self, session: AsyncSession) -> int:
        chats = (ManagerJob.status == JobStatus.QUEUED.value, ~from_history(), ~idle())
        excess = int(await session.scalar(select(func.count()).where(*chats)) or 0) - self._limit
        if excess <= 0:
            return 0
        oldest = select(ManagerJob.key).where(
            *chats, ManagerJob.explicit.is_(False)
        ).order_by(ManagerJob.key).limit(excess)  # fmt: skip
        keys = list(await session.scalars(oldest))
        await session.execute(delete(ManagerJob).where(ManagerJob.key.in_(keys)))
        return len(keys)
