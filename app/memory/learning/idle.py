"""The idle job's work on one quiet user's memories (:mod:`.idle_jobs` queues it): forgetting
over the capacities (:mod:`app.memory.aging.forgetting`), in the unit of work that consumes the
job (exactly once) and records the version the work was done for; bounded by
``MEMPROXY_IDLE_JOB_TIMEOUT_SECONDS`` (past it the job is retried, as a Manager job is). The
forgotten memories past their keep time are erased apart, every user's, now and then
(:meth:`IdleWork.purge`)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from app.memory.aging.forgetting import Capacities, Forgetting, Leaving
from app.memory.learning.applier import JobGone
from app.memory.learning.jobs import JobQueue
from app.memory.learning.leases import Job
from app.memory.service import MemoryService
from app.memory.store.unit import Writer


@dataclass(frozen=True, slots=True)
class Upkept:
    """What one idle job did."""

    forgotten: list[Leaving]


class IdleWork:
    def __init__(
        self,
        queue: JobQueue,
        service: MemoryService,
        capacities: Capacities,
        *,
        keep_days: float,
        timeout_seconds: float,
    ) -> None:
        self._queue = queue
        self.forgetting = Forgetting(service, capacities, keep_days=keep_days)
        self._timeout = timeout_seconds

    async def run(self, job: Job) -> Upkept:
        """Do the job's work and consume it; :class:`JobGone` when this process no longer held
        it (nothing was written); TimeoutError past the bound (nothing was written)."""

        async def consume(w: Writer) -> None:
            if not await self._queue.consume(w, job.id):
                raise JobGone(job.id)

        async with asyncio.timeout(self._timeout):
            forgot = await self.forgetting.forget(
                job.user_id, job_id=job.id, within=consume, after=self._queue.idle_done
            )
        return Upkept(forgot.leaving)

    async def purge(self) -> int:
        """Erase a batch of the forgotten memories past the keep time, every user's: how many
        (the worker calls it now and then; the rest at the next call)."""
        return await self.forgetting.purge()
