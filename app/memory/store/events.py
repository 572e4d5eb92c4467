"""The audit trail: one event per write to a memory, written in the write's own transaction (so
history and memories never disagree), kept after the memory is deleted, read per user."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.memory.store.records import aware, now
from app.memory.store.tables import EventAction, MemoryEvent, MemorySource


@dataclass(frozen=True, slots=True)
class Event:
    memory_id: str
    action: str
    actor: str
    job_id: str | None
    before: str | None
    after: str | None
    detail: str | None
    created_at: datetime


def record(
    session: AsyncSession,
    user_id: str,
    memory_id: str,
    action: EventAction,
    actor: MemorySource,
    *,
    before: str | None = None,
    after: str | None = None,
    job_id: str | None = None,
    detail: str | None = None,
) -> None:
    """Add an event to the session's transaction."""
    session.add(
        MemoryEvent(
            user_id=user_id, memory_id=memory_id, action=action.value, actor=actor.value,
            job_id=job_id, before=before, after=after, detail=detail, created_at=now(),
        )
    )  # fmt: skip


async def history(session: AsyncSession, user_id: str, memory_id: str) -> list[Event]:
    """The user's events for one memory, oldest first (empty for another user's memory)."""
    rows = await session.scalars(
        select(MemoryEvent)
        .where(MemoryEvent.user_id == user_id, MemoryEvent.memory_id == memory_id)
        .order_by(MemoryEvent.key)
    )
    return [
        Event(r.memory_id, r.action, r.actor, r.job_id, r.before, r.after, r.detail,
              aware(r.created_at))
        for r in rows
    ]  # fmt: skip
