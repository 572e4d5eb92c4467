"""A chat's Manager job, written while the upstream thinks and before the answer's first byte.

:class:`JobWriter` makes the conversation's turns and their fingerprints (off the event loop
for a large body), asks the queue which it has seen, and queues an awaiting job of the new
ones; a write the database fails is tried again, with growing pauses, within the request's
:class:`~app.storage_faults.WriteBound`, then :class:`~app.errors.StorageUnavailable`.
:func:`written` is what the answer's first byte waits for. The promises are
:mod:`app.memory.chat.glue`'s (its module docstring); the job's completion and withdrawal,
once the exchange is over, are :class:`~app.memory.chat.glue.ChatMemory`'s.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random

from app.errors import StorageUnavailable, first_line
from app.memory.learning.extraction import exchange
from app.memory.learning.jobs import JobQueue
from app.memory.learning.turns import Turns, fingerprints_of, turns_of
from app.metrics import Metrics
from app.proxy.hooks import RequestContext
from app.proxy.offload import off_loop
from app.storage_faults import WriteBound, storage_failure

logger = logging.getLogger("memproxy.memory")

FIRST_PAUSE_SECONDS = 0.05
"""The pause before a failed job write's second try; doubled each time up to
:data:`MAX_PAUSE_SECONDS`, with jitter (replicas whose writes failed together retry apart)."""
MAX_PAUSE_SECONDS = 0.5


class JobWriter:
    """Writes the Manager job of a chat that may write memories."""

    def __init__(
        self, queue: JobQueue, metrics: Metrics, *, threshold_turns: int, interval: float
    ) -> None:
        self._queue = queue
        self._metrics = metrics
        self._threshold_turns = threshold_turns
        self._interval = interval

    async def write(self, ctx: RequestContext, bound: WriteBound) -> str | None:
        """Queue the request's new user turns, awaiting the answer: the job's id, or None (no
        job to make). A write the database fails is tried again within `bound`; then
        :class:`StorageUnavailable`."""
        bound.watch()
        try:
            with bound.aside():
                turns, marks = await off_loop(ctx.body_bytes, turns_and_marks, ctx)
            for attempt in itertools.count(1):
                try:
                    return await self._queue_turns(ctx, turns, marks, bound)
                except Exception as exc:
                    if not storage_failure(exc):
                        raise
                    pause = min(MAX_PAUSE_SECONDS, FIRST_PAUSE_SECONDS * 2 ** min(attempt - 1, 8))
                    pause *= random.uniform(0.5, 1)
                    if bound.out_of_time(after=pause):
                        logger.warning(
                            "the database did not take the Manager's job of request %s in %d "
                            "tries (%s: %s); the chat is answered 503",
                            ctx.request_id,
                            attempt,
                            type(exc).__name__,
                            first_line(exc),
                        )
                        raise StorageUnavailable() from exc
                    await asyncio.sleep(pause)
        except StorageUnavailable:
            raise
        except Exception:
            # Not the database's doing (a bug): the chat goes on, and the turns, unprocessed,
            # go with the conversation's next exchange.
            logger.warning("could not queue the exchange for the manager", exc_info=True)
        return None

    async def _queue_turns(
        self, ctx: RequestContext, turns: Turns, marks: list[tuple[int, str]], bound: WriteBound
    ) -> str | None:
        processed = await self._queue.processed(ctx.user_id, [f for _, f in marks])
        with bound.aside():  # the machine's work, and a large body's waits its turn in the lane
            found = await off_loop(
                ctx.body_bytes,
                exchange,
                turns,
                processed,
                threshold=self._threshold_turns,
                marks=marks,
            )
        if found is None:
            return None
        queued = await self._queue.enqueue(
            ctx.user_id, ctx.model, found, interval_seconds=self._interval, awaiting=True
        )
        if queued is None:
            return None  # another request of this conversation queued these turns
        self._metrics.jobs_queued.labels("explicit" if found.explicit else "routine").inc()
        return queued.job_id


async def written(job: asyncio.Future[str | None], bound: WriteBound) -> None:
    """Before the answer's first byte: returns once the job is in the database (or there is
    none to write); raises :class:`StorageUnavailable` when it is not within `bound`. A write
    still under way goes on (never cancelled): should it land, the refused exchange keeps it,
    due without an answer (`after_response`)."""
    if not await bound.wait(job) or job.cancelled():
        logger.warning("the Manager's job was not written in time; the chat is answered 503")
        raise StorageUnavailable()
    error = job.exception()
    if isinstance(error, StorageUnavailable):
        raise StorageUnavailable() from error


def turns_and_marks(ctx: RequestContext) -> tuple[Turns, list[tuple[int, str]]]:
    """The conversation's turns and their fingerprints: converting, stripping and hashing a
    large body takes long, so this runs off the loop for one (:mod:`app.proxy.offload`)."""
    turns = turns_of(ctx.history, None)
    return turns, fingerprints_of(turns)
