"""Memory's side of the proxy hooks: recall and inject before forwarding; queue the exchange's
new turns for the Manager while the answer streams (:mod:`app.memory.learning.extraction`).

Promises (see :mod:`app.proxy.hooks` for when each hook runs):

- the user's profile (pinned and profile memories, :mod:`app.memory.search.profile`) goes into
  the system message whatever the question, within ``MEMPROXY_PROFILE_TOKEN_BUDGET``; then the
  other memories most relevant to the last user message (:mod:`app.memory.chat.query`), at most
  ``MEMPROXY_RECALL_LIMIT`` within ``MEMPROXY_MEMORY_TOKEN_BUDGET``, none below
  ``MEMPROXY_RELEVANCE_THRESHOLD`` (with ``MEMPROXY_RECALL_JUDGE``, first those the model picks
  of the best, :mod:`app.memory.chat.judge`); a memory block the client sent back is replaced;
- the response says what recall did: ``X-Memories-Injected: N`` (both kinds) and
  ``Server-Timing: recall;dur=<ms>``, then each of its phases (``recall-index;dur=<ms>``...,
  :mod:`app.memory.search.timing`; ``X-Memory-Recall: failed`` when it failed);
- recall never fails a chat: an error or a wait beyond ``MEMPROXY_RECALL_TIMEOUT_SECONDS`` is
  logged as a warning and counted (``memproxy_recall_failures``), and the chat goes on without
  memories;
- recall counters are updated once the exchange is over (whatever its outcome), off the way to
  the first byte, for the memories found by the search only: the profile's order (most recalled
  first) must not feed itself;
- for a chat that may write memories, the exchange's new turns are queued for the Manager
  (durably, in the database, as an awaiting job) while the request is with the upstream, and
  the answer's first byte waits for that write before it reaches the client: a client that got
  an answer has its job. A write the database fails (:func:`app.storage_faults.storage_failure`:
  restarting, locked beyond patience, full) is tried again, with growing pauses, for up to
  ``MEMPROXY_JOB_WRITE_TIMEOUT_SECONDS`` from its start, not counting its waits for its turn on
  a SQLite file another writer holds (:class:`app.storage_faults.WriteBound`: the database
  answers, busy; they wait as every write does) nor the making of a large body's turns; when
  it is not written by then, the chat answers 503 ``storage_unavailable`` with
  ``Retry-After`` and none of the answer. A write
  that lands after that is kept, due without an answer: the client's retry, which carries the
  same turns, may already have found them taken (withdrawing the job then would leave them
  learned by no job). When the response completes the reply is added and the worker woken,
  and when it fails, or never starts, the job is withdrawn. A job that cannot be made for
  another reason (a bug) is logged and the chat goes on: its turns, not fingerprinted, go with
  the conversation's next exchange. ``X-Memory: read-only`` and ``off`` write no job, and never
  wait for the database.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Sequence
from typing import Any

from app.background import BackgroundRunner
from app.config import Settings
from app.errors import StorageUnavailable
from app.memory.block import BLOCK_START, Dated, insert_memory_block, memory_block
from app.memory.chat.job_write import JobWriter, written
from app.memory.chat.judge import RecallJudge
from app.memory.chat.query import recall_query
from app.memory.learning.jobs import JobQueue
from app.memory.learning.worker import Worker
from app.memory.search.ranking import Recalled
from app.memory.search.timing import server_timing
from app.memory.service import MemoryService
from app.metrics import Metrics
from app.proxy.hooks import Completion, Note, Outcome, Preparation, RequestContext
from app.proxy.offload import off_loop
from app.storage_faults import WriteBound

logger = logging.getLogger("memproxy.memory")

INJECTED_HEADER = "X-Memories-Injected"
JOB: Note[asyncio.Future[str | None]] = Note("memory job")
"""The write of the request's Manager job, begun in `before_forward`: the job's id, or None;
:class:`StorageUnavailable` when the database did not take it in time."""
REFUSED: Note[bool] = Note("answered 503")
"""The chat was answered 503: its job was not written in time (a late write is kept)."""
RECALLED: Note[list[int]] = Note("memories recalled")
"""The keys of the memories a chat was shown (the profile's aside), counted as recalled once the
exchange is over, whatever its outcome."""


class ChatMemory:
    def __init__(
        self,
        service: MemoryService,
        settings: Settings,
        runner: BackgroundRunner,
        metrics: Metrics,
        *,
        queue: JobQueue | None = None,
        worker: Worker | None = None,
        judge: RecallJudge | None = None,
    ) -> None:
        """`judge`: the relevance judge (MEMPROXY_RECALL_JUDGE), None when off."""
        self._judge = judge
        self._queue = queue
        self._worker = worker
        self._interval = settings.processing_interval
        self._jobs = (
            JobWriter(queue, metrics, threshold_turns=settings.conversation_threshold,
                      interval=settings.processing_interval)
            if queue is not None
            else None
        )  # fmt: skip
        self._service = service
        self._runner = runner
        self._metrics = metrics
        self._limit = settings.recall_limit
        self._profile_budget = settings.profile_token_budget
        self._recall_as_set = functools.partial(
            service.recall, limit=settings.recall_limit, min_score=settings.relevance_threshold,
            budget_tokens=settings.memory_token_budget,
            profile_tokens=settings.profile_token_budget, episode_share=settings.episode_share,
        )  # fmt: skip
        self._timeout = settings.recall_timeout_seconds
        self._write_seconds = settings.job_write_timeout_seconds

    async def before_forward(self, ctx: RequestContext) -> Preparation | None:
        started = time.perf_counter()
        # A pasted document is searched by its ends, but still read: off the loop when large.
        query = (
            await off_loop(ctx.body_bytes, recall_query, ctx.messages, ctx.user_name)
            if self._limit
            else None
        )
        recalled = Recalled([], [])
        failed = False
        if query or (self._limit and self._profile_budget):  # a profile needs no question
            try:
                deadline = time.monotonic() + self._timeout
                recalled = await asyncio.wait_for(self._recall(ctx, query, deadline),
                                                  self._timeout)  # fmt: skip
            except Exception as exc:  # memory must never fail a chat
                failed = True
                reason = "timeout" if isinstance(exc, TimeoutError) else type(exc).__name__
                self._metrics.recall_failures.labels(reason).inc()
                logger.warning(
                    "recall failed for request %s (%s); forwarding without memories",
                    ctx.request_id,
                    reason,
                    exc_info=not isinstance(exc, TimeoutError),
                )
        elapsed = time.perf_counter() - started
        found = recalled.hits
        shown = len(recalled.profile) + len(found)
        self._metrics.recall_seconds.observe(elapsed)
        self._metrics.memories_injected.observe(shown)
        headers = {
            INJECTED_HEADER: str(shown),
            "Server-Timing": server_timing(elapsed * 1000, recalled.timing),
        }
        if failed:
            headers["X-Memory-Recall"] = "failed"
        # Every message is looked at (~30 ms of the loop for 100,000 of them): off it when large.
        body = await off_loop(ctx.body_bytes, _with_memories, ctx, found, recalled.profile)
        if found:  # the profile's lines are not recalls (module docstring)
            # counted once the exchange is over: the write is off the way to the first byte
            ctx.note(RECALLED, [h.key for h in found])
        if shown and logger.isEnabledFor(logging.DEBUG):  # memory texts: never at INFO
            logger.debug(
                "injected for %s: %s",
                ctx.user_id,
                " | ".join(
                    [f"profile {s.content}" for s in recalled.profile]
                    + [f"{h.score:.3f} {h.content}" for h in found]
                ),
            )
        job = on_first_byte = None
        if self._jobs is not None and ctx.write_allowed:
            # The job is written while the upstream thinks (begun once recall is done, so the
            # two never compete), and the answer's first byte waits for it: a client that has
            # its answer has its job in the database (a kill -9 after loses nothing); an answer
            # that never comes withdraws it (after_response).
            bound = WriteBound(self._write_seconds)
            job = asyncio.ensure_future(self._jobs.write(ctx, bound))
            ctx.note(JOB, job)

            async def on_first_byte() -> None:
                try:
                    await written(job, bound)
                except StorageUnavailable:
                    ctx.note(REFUSED, True)
                    raise

        return Preparation(
            body=body,
            headers=headers,
            on_first_byte=on_first_byte,
            injected=shown,
            reading_body=job,
        )

    async def _recall(self, ctx: RequestContext, query: str | None, deadline: float) -> Recalled:
        judge = (self._judge.for_chat(ctx.user_id, ctx.model, deadline=deadline)
                 if self._judge else None)  # fmt: skip
        return await self._recall_as_set(ctx.user_id, query, judge=judge)

    async def after_response(self, ctx: RequestContext, completion: Completion) -> None:
        if recalled := ctx.noted(RECALLED):
            self._runner.spawn(self._service.mark_recalled(ctx.user_id, recalled),
                               name=f"mark-recalled-{ctx.request_id}")  # fmt: skip
        pending = ctx.noted(JOB)
        if pending is None or self._queue is None:
            return
        try:
            job_id = await pending
        except StorageUnavailable:
            return  # never written: the client was answered 503
        if job_id is None:
            return
        refused = ctx.noted(REFUSED) is True
        if completion.outcome is not Outcome.COMPLETED and not refused:
            await self._queue.withdraw(job_id)  # an answer the user never saw teaches nothing
            return
        # Written late, after a 503 (`refused`), it is kept, with no answer (the user saw
        # none): the retry may have found its turns taken already; withdrawn, they would go
        # unlearned.
        reply = None if refused else (await completion.read()).assistant_text
        dropped = await self._queue.complete(job_id, reply, interval_seconds=self._interval)
        if dropped:
            self._metrics.jobs_dropped.inc(dropped)
            logger.warning("manager queue full: %d routine job(s) dropped", dropped)
        if self._worker is not None:
            self._worker.wake()


def _with_memories(
    ctx: RequestContext, found: Sequence[Dated], profile: Sequence[Dated]
) -> dict[str, Any] | None:
    """The body with these memories in a block in its first system message (any earlier block
    taken out), or None when it has neither memories to add nor a block to take out."""
    if not (found or profile) and not _has_block(ctx):
        return None
    return insert_memory_block(ctx.body, memory_block(found, profile))


def _has_block(ctx: RequestContext) -> bool:
    return any(
        BLOCK_START in str(m.get("content"))
        for m in ctx.messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    )
