"""Memory's side of the proxy hooks: recall and inject before forwarding.

Promises (see :mod:`app.proxy.hooks` for when each hook runs):

- the user's memories most relevant to the last user message (:mod:`app.memory.context`) go into
  the system message, at most ``MEMPROXY_RECALL_LIMIT`` within ``MEMPROXY_MEMORY_TOKEN_BUDGET``,
  none below ``MEMPROXY_RELEVANCE_THRESHOLD``; a memory block the client sent back is replaced;
- the response says what recall did: ``X-Memories-Injected: N`` and ``Server-Timing:
  recall;dur=<ms>`` (``X-Memory-Recall: failed`` when it failed);
- recall never fails a chat: an error or a wait beyond ``MEMPROXY_RECALL_TIMEOUT_SECONDS`` is
  logged as a warning and counted (``memproxy_recall_failures``), and the chat goes on without
  memories;
- recall counters are updated after the request, off the hot path.
"""

from __future__ import annotations

import asyncio
import logging
import time

from app.config import Settings
from app.memory.context import memory_block, recall_query
from app.memory.recall import Hit
from app.memory.service import MemoryService
from app.metrics import Metrics
from app.proxy.hooks import BackgroundRunner, Completion, Preparation, RequestContext
from app.proxy.injection import BLOCK_START, insert_memory_block

logger = logging.getLogger("memproxy.memory")

INJECTED_HEADER = "X-Memories-Injected"


class RecallHooks:
    def __init__(
        self,
        service: MemoryService,
        settings: Settings,
        runner: BackgroundRunner,
        metrics: Metrics,
    ) -> None:
        self._service = service
        self._runner = runner
        self._metrics = metrics
        self._limit = settings.recall_limit
        self._threshold = settings.relevance_threshold
        self._budget = settings.memory_token_budget
        self._timeout = settings.recall_timeout_seconds

    async def before_forward(self, ctx: RequestContext) -> Preparation | None:
        started = time.perf_counter()
        query = recall_query(ctx.messages) if self._limit else None
        found: list[Hit] = []
        failed = False
        if query:
            try:
                found = await asyncio.wait_for(self._recall(ctx.user_id, query), self._timeout)
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
        self._metrics.recall_seconds.observe(elapsed)
        self._metrics.memories_injected.observe(len(found))
        headers = {
            INJECTED_HEADER: str(len(found)),
            "Server-Timing": f"recall;dur={elapsed * 1000:.2f}",
        }
        if failed:
            headers["X-Memory-Recall"] = "failed"
        body = None
        if found or _has_block(ctx):
            body = insert_memory_block(ctx.body, memory_block(found))
        if found:
            self._runner.spawn(
                self._service.mark_recalled(ctx.user_id, [h.key for h in found]),
                name=f"mark-recalled-{ctx.request_id}",
            )
        return Preparation(body=body, headers=headers)

    async def _recall(self, user_id: str, query: str) -> list[Hit]:
        return await self._service.recall(
            user_id,
            query,
            limit=self._limit,
            min_score=self._threshold,
            budget_tokens=self._budget,
        )

    async def after_response(self, ctx: RequestContext, completion: Completion) -> None:
        return None  # memory extraction (the Manager) attaches here


def _has_block(ctx: RequestContext) -> bool:
    return any(
        BLOCK_START in str(m.get("content"))
        for m in ctx.messages
        if isinstance(m, dict) and m.get("role") in ("system", "developer")
    )
