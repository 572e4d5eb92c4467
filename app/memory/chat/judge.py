"""The relevance judge (``MEMPROXY_RECALL_JUDGE``, off by default): before a chat's memories are
chosen within their budgets, the Manager's model (``MEMPROXY_MANAGER_MODEL``, else the chat's
own) is shown the message and the best of what search found
(:data:`~app.memory.search.ranking.JUDGED`, above the relevance threshold or not: a message that
implies a memory shares few words with it), and answers which of them help answer it, most
helpful first (Automatic Memory Manager v4's inlet). Those come first, in its order, whatever
their score; those it passed over are dropped; the candidates it was not shown follow in the
fused order, above the threshold.

Promises: it never fails a chat, nor holds it longer than ``MEMPROXY_RECALL_JUDGE_SECONDS``
(1.0) or the recall's own time (``MEMPROXY_RECALL_TIMEOUT_SECONDS``, less :data:`MARGIN`): on
a timeout, an unreachable model or an answer that does not fit, the fused order stands (logged,
counted in ``memproxy_recall_judge_total{outcome}``); an answer naming no candidate leaves the
fused order too (a model that found nothing relevant is more often wrong than the search);
answers are cached per user, model, message and candidates (their words too: :data:`CACHE_SIZE`),
so a client's retry or a regenerated answer asks once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

from pydantic import BaseModel, Field

from app.config import Settings
from app.memory.learning.failures import ManagerAnswerUnusable, ManagerUnavailable
from app.memory.learning.manager import Manager
from app.memory.search.ranked import Hit
from app.memory.search.ranking import Judge
from app.metrics import Metrics

logger = logging.getLogger("memproxy.memory")

CACHE_SIZE = 1024
MARGIN = 0.1
"""Seconds of the chat's recall time the judge leaves to the rest of recall."""
Key = tuple[str, str, str, tuple[tuple[int, str], ...]]
"""A cached answer's: the user, the model, the message, the candidates (key and words)."""
ANSWER_TOKENS = 60
"""The answer's length at most: a short list of numbers, in JSON (time is what it costs)."""
QUERY_CHARS = 1000
"""The end of a long message is what the model is shown of it (where the question is)."""

INSTRUCTIONS = """You choose which memories about the user help answer their message. You are \
shown the message and numbered memories. Answer "relevant": the numbers of the memories that \
help answer it or that the answer should take into account (a diet when asked for a recipe, \
an allergy when asked for a snack, a place when asked for plans), most helpful first; an \
empty list when none does."""


class Judged(BaseModel):
    relevant: list[int] = Field(default_factory=list)


class RecallJudge:
    def __init__(self, manager: Manager, settings: Settings, metrics: Metrics) -> None:
        self._manager = manager
        self._seconds = settings.recall_judge_seconds
        self._metrics = metrics
        self._cache: OrderedDict[Key, list[int]] = OrderedDict()

    def for_chat(self, user_id: str, model: str, *, deadline: float | None = None) -> Judge:
        """The judge of one chat of `user_id` whose request names `model`; `deadline`
        (``time.monotonic()``): when the chat's recall must be done (the judge takes at most
        what is left of it, less :data:`MARGIN`)."""

        async def judge(query: str, hits: Sequence[Hit]) -> list[Hit] | None:
            return await self.pick(user_id, model, query, hits, deadline=deadline)

        return judge

    async def pick(
        self,
        user_id: str,
        model: str,
        query: str,
        hits: Sequence[Hit],
        *,
        deadline: float | None = None,
    ) -> list[Hit] | None:
        """The `hits` that help answer `query`, most helpful first, or None: the fused order
        stands (the module docstring)."""
        if len(hits) < 2:
            return None  # nothing to choose between
        key = (user_id, model, query, tuple((h.key, h.content) for h in hits))
        picked = self._cache.get(key)
        if picked is not None:
            self._cache.move_to_end(key)
            self._metrics.recall_judge.labels("cached").inc()
        else:
            seconds = self._seconds
            if deadline is not None:
                seconds = min(seconds, deadline - time.monotonic() - MARGIN)
            if seconds <= 0:
                self._metrics.recall_judge.labels("timeout").inc()
                return None  # the recall's own time is out: the search's order stands
            picked = await self._ask(model, query, list(hits), seconds)
            if picked is None:
                return None
            self._cache[key] = picked
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return [hits[n - 1] for n in picked] or None

    async def _ask(
        self, model: str, query: str, shown: list[Hit], seconds: float
    ) -> list[int] | None:
        """The numbers the model picked (valid, once each), or None when it gave no answer in
        time; failures logged and counted."""
        lines = [f"{n}. {' '.join(h.content.split())}" for n, h in enumerate(shown, 1)]
        prompt = f"Message: {' '.join(query.split())[-QUERY_CHARS:]}\n\nMemories:\n" + "\n".join(
            lines
        )
        try:
            async with asyncio.timeout(seconds):
                answer = await self._manager.ask(model, Judged, INSTRUCTIONS, prompt,
                                                 max_tokens=ANSWER_TOKENS)  # fmt: skip
        except TimeoutError:
            outcome = "timeout"
        except (ManagerUnavailable, ManagerAnswerUnusable) as exc:
            outcome = "unavailable" if isinstance(exc, ManagerUnavailable) else "unusable"
            logger.info("relevance judge: %s; the fused order stands", exc)
        except Exception:  # a chat's recall never fails for the judge
            outcome = "error"
            logger.warning("relevance judge failed; the fused order stands", exc_info=True)
        else:
            self._metrics.recall_judge.labels("judged").inc()
            return [n for n in dict.fromkeys(answer.relevant) if 1 <= n <= len(shown)]
        if outcome == "timeout":
            logger.info("relevance judge: no answer within %.1f s; the fused order stands",
                        seconds)  # fmt: skip
        self._metrics.recall_judge.labels(outcome).inc()
        return None
