"""What acts on all of a user's memories at once: erasing them (:meth:`WholeUser.delete_all`) and
giving them to another user (:meth:`WholeUser.move`). A part of the memory store
(:mod:`app.memory.store.memories`), whose promises it keeps: one unit of work each."""

from __future__ import annotations

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.memory.store.db import writing
from app.memory.store.images import erase_images
from app.memory.store.records import Moved, Removed
from app.memory.store.tables import (
    ForgottenMemory,
    JobStatus,
    ManagerJob,
    ManagerState,
    MemoryEvent,
    MemoryLink,
    MemorySource,
    ProcessedTurn,
)
from app.memory.store.unit import Writer


class WholeUser:
    sessions: async_sessionmaker[AsyncSession]

    async def delete_all(self, user_id: str, *, actor: MemorySource = MemorySource.API) -> Removed:
        """Erase everything kept about the user's memories, in one transaction: the memories and
        their links and history, processed turns' fingerprints, the Manager jobs not yet
        applied and its state, the forgotten memories kept to be put back."""
        async with writing(self.sessions) as session:
            w = Writer(session, user_id, actor, None)
            await w.lock()  # a restore or a forgetting under way commits first, or waits
            # The jobs first: a job being applied or parked holds its row until it commits, so
            # the memories are read after what it wrote (else its episodes would outlive this).
            await w.execute(delete(ManagerJob).where(ManagerJob.user_id == user_id))
            keys = await w.delete_matching(None)
            for table in (MemoryEvent, ProcessedTurn, ForgottenMemory, ManagerState):
                await w.execute(delete(table).where(table.user_id == user_id))
            await w.finish()
            assert w.version is not None
            await erase_images(session, {user_id: w.version})
        return Removed(keys, w.version)

    async def move(
        self, from_user: str, to_user: str, *, actor: MemorySource = MemorySource.API
    ) -> Moved:
        """Give all of `from_user`'s memories to `to_user` in one transaction: same ids, their
        links, their whole history (with a ``moved`` event each, and the events of memories
        deleted before), the fingerprints of the turns they were learned from (so the
        conversations are not learned from again), the forgotten memories kept to be put back,
        and the Manager jobs not running yet (a running job finishes for `from_user`). With
        neither memories nor such jobs nor forgotten memories, nothing changes."""
        if from_user == to_user:
            raise ValueError("cannot move a user's memories to the same user")
        async with writing(self.sessions) as session:
            source = Writer(session, from_user, actor, None)
            target = Writer(session, to_user, actor, None)
            keys = await source.hand_over(target)
            jobs = await session.execute(
                update(ManagerJob)
                .where(
                    ManagerJob.user_id == from_user,
                    ManagerJob.status != JobStatus.RUNNING.value,
                )
                .values(user_id=to_user)
            )
            moved_jobs = int(jobs.rowcount or 0)  # type: ignore[attr-defined]
            if keys or moved_jobs:
                await _give_the_rest(session, from_user, to_user)
            forgotten = await session.execute(  # also when nothing else moved
                update(ForgottenMemory)
                .where(ForgottenMemory.user_id == from_user)
                .values(user_id=to_user)
            )
            if keys or moved_jobs or forgotten.rowcount:  # type: ignore[attr-defined]
                await session.execute(  # that version was the other user's: weigh afresh
                    update(ManagerState)
                    .where(ManagerState.user_id == to_user)
                    .values(idle_version=None)
                )
            await source.finish()
            await target.finish()
            assert source.version is not None and target.version is not None
            await erase_images(session, {from_user: source.version, to_user: target.version})
        return Moved(keys, source.version, target.version, moved_jobs)


async def _give_the_rest(session: AsyncSession, from_user: str, to_user: str) -> None:
    """What else a move gives `to_user`: `from_user`'s history, the links between the memories
    moved, the fingerprints of the turns already learned from, and the Manager's state (where
    `to_user` has one already, or the same fingerprint, theirs stays: the user is part of those
    primary keys)."""
    known = select(ProcessedTurn.fingerprint).where(ProcessedTurn.user_id == to_user)
    await session.execute(
        delete(ProcessedTurn).where(
            ProcessedTurn.user_id == from_user, ProcessedTurn.fingerprint.in_(known)
        )
    )
    has_state = select(ManagerState.user_id).where(ManagerState.user_id == to_user)
    if await session.scalar(has_state) is not None:
        await session.execute(delete(ManagerState).where(ManagerState.user_id == from_user))
    for table in (MemoryEvent, MemoryLink, ProcessedTurn, ManagerState):
        await session.execute(
            update(table).where(table.user_id == from_user).values(user_id=to_user)
        )
