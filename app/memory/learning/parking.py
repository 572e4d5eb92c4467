"""A job parked as failed keeps the user's words: its episodes are written as it parks.

A job is parked when the Manager fails for good (an answer that cannot be used, a model that
could not be asked after every attempt). Its turns wait in it for ``memproxy jobs retry``, but
what the user said does not wait with them: the job's episodes (none when
``MEMPROXY_EPISODES`` is off) are written in the transaction that parks it, and their ids are
kept in its payload (:data:`KEPT`). When the job is retried and applies, it writes no episode
again: its facts are linked to the kept episodes still there, whose index keys they extend
(:meth:`app.memory.learning.applier.Applier.apply`, `kept`). A job parked again keeps what it
kept the first time.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from app.memory.learning.episodes import episode_row, episode_texts
from app.memory.learning.extraction import CONTEXT_TURNS
from app.memory.learning.leases import Job, Leases
from app.memory.search.parts import embed_for_store
from app.memory.service import MemoryService
from app.memory.store.records import in_utc, now
from app.memory.store.tables import MemorySource

KEPT = "episodes"
"""The payload key of the ids of the episodes a parked job wrote."""
PARKED = "kept from a job parked as failed"
"""What the history says of an episode written as its job parked."""


class _NotHeld(Exception):
    """The job was no longer this process's: the unit of work is rolled back."""


def kept_episodes(job: Job) -> list[str]:
    """The ids of the episodes the job wrote when it was parked (none when it never was)."""
    kept = job.payload.get(KEPT)
    return [str(i) for i in kept] if isinstance(kept, list) else []


async def park(
    service: MemoryService,
    queue: Leases,
    job: Job,
    error: str,
    *,
    answer: str | None = None,
    episodes: bool = True,
) -> bool:
    """Park the held `job` with `error` (and the Manager's unusable `answer`), writing its
    episodes in the same transaction when `episodes` and it has none kept yet. False, with
    nothing written, when this process no longer held it."""
    texts: list[str] = []
    if episodes and KEPT not in job.payload:
        context, new = job.turns()
        texts = await asyncio.to_thread(episode_texts, context[-CONTEXT_TURNS:], new)
    if not texts:
        return await queue.park(job.id, error, answer=answer)
    vectors = await embed_for_store(service.embedder, texts)
    said: datetime = in_utc(job.created_at)
    stamp = now()
    rows = [
        episode_row(job.user_id, text, embedded, written=stamp, said=said)
        for text, embedded in zip(texts, vectors, strict=True)
    ]
    payload = job.payload | {KEPT: [row.id for row in rows]}
    try:
        async with service.store.writing(job.user_id, MemorySource.MANAGER, job_id=job.id) as w:
            if not await queue.park(job.id, error, answer=answer, within=w, payload=payload):
                raise _NotHeld(job.id)
            for row in rows:
                w.create(row, detail=PARKED)
    except _NotHeld:
        return False
    return True
