"""The idle job's work on one quiet user's memories (:mod:`.idle_jobs` queues it): consolidation
of the facts written since the last one (:mod:`.consolidation`, each merge or supersession in a
unit of its own), after the words of conversations that gave no fact are distilled
(:mod:`.distilling`) and before new memories are given their context (:mod:`.enrichment`, off
by default), then forgetting over the capacities (:mod:`app.memory.aging.forgetting`), in
the unit of work that consumes the job (exactly once) and records the version the work was done
for (or the one consolidation stopped at, to go on from); bounded by
``MEMPROXY_IDLE_JOB_TIMEOUT_SECONDS`` (past it the job is retried, as a Manager job is). The
forgotten memories past their keep time are erased apart, every user's, now and then
(:meth:`IdleWork.purge`)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from dataclasses import dataclass

from app.config import Settings
from app.memory.aging.forgetting import Forgetting, Leaving
from app.memory.learning.applier import JobGone
from app.memory.learning.consolidation import Consolidation, Tidied
from app.memory.learning.distilling import Distilled, Distilling
from app.memory.learning.enrichment import Enriched, Enrichment
from app.memory.learning.job_kinds import OVER_JOB
from app.memory.learning.jobs import JobQueue
from app.memory.learning.leases import Job
from app.memory.learning.manager import Manager
from app.memory.service import MemoryService
from app.memory.store.unit import Writer
from app.metrics import Metrics

logger = logging.getLogger("memproxy.manager")

OVER = 0.05
"""How far past a capacity a user who keeps chatting may go before idle work runs anyway."""
PURGE_SECONDS = 600.0
"""How often a process erases a batch of the forgotten memories past their keep time."""


@dataclass(frozen=True, slots=True)
class Upkept:
    """What one idle job did."""

    forgotten: list[Leaving]
    tidied: Tidied
    distilled: Distilled
    enriched: Enriched
    upto: int | None
    """The version the next idle job goes on from (a step stopped at its bound), or None."""


class IdleWork:
    def __init__(
        self,
        queue: JobQueue,
        service: MemoryService,
        settings: Settings,
        metrics: Metrics,
        manager: Manager | None = None,
    ) -> None:
        """`manager`: whom consolidation asks (None: near copies are merged, nothing asked)."""
        self._queue = queue
        self.forgetting = Forgetting.configured(service, settings)
        self.consolidation = Consolidation(service, manager, settings)
        self.distilling = Distilling(queue, service, settings)
        self.enrichment = Enrichment(service, manager, settings)
        self._timeout = settings.idle_job_timeout_seconds
        self._quiet = settings.idle_seconds
        self._metrics = metrics
        self._next_purge = 0.0

    async def look(self) -> bool:
        """The worker's upkeep: queue the idle jobs of users who went quiet (none when
        ``MEMPROXY_IDLE_SECONDS`` is 0), and every :data:`PURGE_SECONDS` erase a batch of the
        forgotten memories past their keep time. Whether a job was queued; failures logged."""
        queued = False
        if self._quiet > 0:
            try:
                queued = await self._queue.queue_idle(self._quiet) > 0
            except Exception:
                logger.warning("could not queue the idle jobs", exc_info=True)
        if time.monotonic() >= self._next_purge:
            self._next_purge = time.monotonic() + PURGE_SECONDS
            try:
                if purged := await self.forgetting.purge():
                    logger.info("%d forgotten memories past their keep time erased", purged)
            except Exception:
                logger.warning("could not erase the forgotten memories past their keep time",
                               exc_info=True)  # fmt: skip
        return queued

    async def learned(self, user_id: str) -> bool:
        """After a chat's job wrote the user's memories: when they hold more than a capacity
        allows by :data:`OVER` (a user who chats all day is never quiet), an idle job is queued
        that runs without waiting for the user to go quiet. Whether one was; failures logged
        (the chat's job is applied either way)."""
        caps = self.forgetting.capacities
        if not (caps.facts or caps.episodes):
            return False
        try:
            if not self.forgetting.over(*await self.forgetting.store.held(user_id), by=OVER):
                return False
            return await self._queue.queue_over(user_id)
        except Exception:
            logger.warning("could not check the user's memories against the capacities",
                           exc_info=True)  # fmt: skip
            return False

    async def work(self, job: Job) -> None:
        """Run an idle job the worker claimed (:meth:`run`), counted and logged; its failures
        raise, for the worker to retry or park it as a Manager job's."""
        try:
            done = await self.run(job)
        except JobGone:
            self._metrics.jobs_skipped.inc()
            logger.info("idle job %s is no longer this process's: skipped", job.id)
            return
        self._metrics.idle_jobs.inc()
        for memory in done.forgotten:
            self._metrics.memories_forgotten.labels(memory.type).inc()
        tidied = done.tidied
        for result, count in (("merged", tidied.merged), ("superseded", tidied.superseded)):
            if count:
                self._metrics.memories_consolidated.labels(result).inc(count)
        used = tidied.asked - tidied.refused
        for outcome, count in (("used", used), ("refused", tidied.refused)):
            if count > 0:
                self._metrics.consolidation_questions.labels(outcome).inc(count)
        if done.distilled.queued:
            self._metrics.distilled_exchanges.inc(done.distilled.queued)
        if done.enriched.memories:
            self._metrics.enriched_memories.inc(done.enriched.memories)
        gave_up = tidied.gave_up or done.enriched.gave_up
        logger.info(
            "idle job %s done: %d exchanges' words queued to be distilled; %d facts merged, %d "
            "superseded (%d questions, %d refused%s); %d memories given a context%s; %d memories "
            "forgotten", job.id, done.distilled.queued, tidied.merged, tidied.superseded,
            tidied.asked, tidied.refused, ", then none: its answers fit nothing" if gave_up else "",
            done.enriched.memories,
            "" if done.upto is None else f" (stopped at its bound: goes on from {done.upto})",
            len(done.forgotten),
        )  # fmt: skip

    async def run(self, job: Job) -> Upkept:
        """Do the job's work and consume it; :class:`JobGone` when this process no longer held
        it (what it wrote before is kept: each step's writes are whole); TimeoutError past the
        bound (the job is retried, as a Manager job is). A user past a capacity who chats on
        (an ``-over`` job) gets forgetting alone: the rest waits for them to go quiet, and
        their chats' jobs are not held behind model calls."""

        async def consume(w: Writer) -> None:
            if not await self._queue.consume(w, job.id):
                raise JobGone(job.id)

        if job.id.endswith(OVER_JOB):
            async with asyncio.timeout(self._timeout):
                forgot = await self.forgetting.forget(job.user_id, job_id=job.id, within=consume)
            return Upkept(forgot.leaving, Tidied(), Distilled(), Enriched(), None)
        since = int(job.payload.get("since") or 0)
        holds = functools.partial(self._queue.holds, job_id=job.id)
        started = time.monotonic()
        async with asyncio.timeout(self._timeout):
            # Each step asks no question past its share of the job's time, each call bounded
            # by it (forgetting, which asks none, gets the rest). Enrichment comes after
            # consolidation: a fact merged into is given its context with its new words.
            distilled = await self.distilling.run(
                job.user_id, since=since, model=job.model, job_id=job.id
            )
            tidied = await self.consolidation.run(
                job.user_id, since=since, model=job.model, job_id=job.id, holds=holds,
                deadline=started + self._timeout * 0.5,
            )  # fmt: skip
            enriched = await self.enrichment.run(
                job.user_id, since=since, model=job.model, job_id=job.id, holds=holds,
                deadline=started + self._timeout * 0.85,
            )  # fmt: skip
            stops = [v for v in (distilled.stopped_at, tidied.stopped_at, enriched.stopped_at)
                     if v is not None]  # fmt: skip
            upto = min(stops, default=None)
            # A model that could not be reached is asked again after the user's quiet time;
            # a step stopped at its bound goes on at the next look.
            wait = self._quiet if tidied.unreachable or enriched.unreachable else 0.0
            done = functools.partial(self._queue.idle_done, upto=upto, wait=wait)
            forgot = await self.forgetting.forget(
                job.user_id, job_id=job.id, within=consume, after=done
            )
        return Upkept(forgot.leaving, tidied, distilled, enriched, upto)
