"""Runs the Manager's jobs in the background, never in a chat's way.

Each job: the user's memories most related to its new turns are numbered for the Manager, the
Manager decides (:mod:`app.memory.learning.manager`), and the operations are applied with the job
deleted in the same transaction (:mod:`app.memory.learning.applier`). Up to
``MEMPROXY_MANAGER_CONCURRENCY`` jobs run at once, never two of one user. A Manager that cannot
be reached, or any other failure, sends the job back with exponential backoff
(``MEMPROXY_MANAGER_RETRY_SECONDS``, doubled each time); after ``MEMPROXY_MANAGER_JOB_ATTEMPTS``
attempts the job is parked as failed with the reason (``memproxy jobs retry`` queues it again); a
Manager that could not be asked is named in it by URL and model. A job whose answer could not be
used is parked at once, with that answer: its turns are never dropped. Either way the job's
episodes are written as it parks, so the user's words are recalled meanwhile
(:mod:`app.memory.learning.parking`).

While it lives the worker renews the leases of the jobs its process holds (every third of
``MEMPROXY_MANAGER_LEASE_SECONDS``) and queues again the jobs of processes that stopped renewing
theirs (:mod:`app.memory.learning.leases`); it starts by doing both, and hands its own jobs
back when it stops. Nothing is re-queued merely because a process started.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress

from app.config import Settings
from app.memory.learning.applier import Applier, JobGone
from app.memory.learning.deciding import decide
from app.memory.learning.distilling import as_now, is_distil
from app.memory.learning.idle import IdleWork
from app.memory.learning.job_kinds import IDLE_JOB
from app.memory.learning.jobs import JobQueue
from app.memory.learning.leases import Job
from app.memory.learning.manager import Manager, ManagerAnswerUnusable, ManagerUnavailable
from app.memory.learning.parking import kept_episodes, park
from app.memory.service import MemoryService
from app.metrics import Metrics

logger = logging.getLogger("memproxy.manager")

IDLE_TASK = f"job-{IDLE_JOB}"
POLL_SECONDS = 1.0
"""How often the queue is looked at without a wake-up (jobs queued by other processes, retries
coming due)."""


class Worker:
    def __init__(
        self,
        queue: JobQueue,
        service: MemoryService,
        manager: Manager,
        settings: Settings,
        metrics: Metrics | None = None,
    ) -> None:
        self._metrics = metrics or Metrics()
        self._queue = queue
        self._service = service
        self._manager = manager
        self._applier = Applier(service, dedup_threshold=settings.dedup_threshold)
        self._episodes = settings.episodes
        self._concurrency = settings.manager_concurrency
        self._attempts = settings.manager_job_attempts
        self._retry_seconds = settings.manager_retry_seconds
        self.idle = IdleWork(queue, service, settings, self._metrics, manager)
        self._wakeup = asyncio.Event()
        self._running: dict[asyncio.Task[None], str] = {}
        self._loop_task: asyncio.Task[None] | None = None
        self._upkeep_task: asyncio.Task[None] | None = None
        self._stopping = False

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        await self._upkeep()
        self._upkeep_task = loop.create_task(self._keep_leases(), name="manager-leases")
        self._loop_task = loop.create_task(self._loop(), name="manager")

    def wake(self) -> None:
        self._wakeup.set()

    async def stop(self) -> None:
        """Stop now; the jobs cut off here were not committed: they are handed back, for this
        or another process to run (or, if the database cannot be reached, taken up by one once
        their leases run out)."""
        self._stopping = True  # the loop claims nothing more, even if a cancel went astray
        for task in (self._loop_task, self._upkeep_task):
            if task is not None:
                await _cancelled(task)
        for task in list(self._running):  # once the loop has ended: it starts no more
            await _cancelled(task)
        try:
            released = await self._queue.release()
        except Exception:
            logger.warning("could not hand the manager jobs back; their leases will run out",
                           exc_info=True)  # fmt: skip
            return
        if released:
            logger.info("%d manager job(s) handed back at stop", released)

    async def _keep_leases(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self._queue.lease_seconds / 3)
            await self._upkeep()

    async def _upkeep(self) -> None:
        """Renew this process's leases, queue again the jobs whose leases ran out, queue the
        idle jobs of users who went quiet (:mod:`app.memory.learning.idle_jobs`), and now and
        then erase the forgotten memories past their keep time."""
        with suppress(Exception):  # a failed read keeps the last offset
            await self._queue.sync_clock()
        try:
            await self._queue.renew()
            expired = await self._queue.expire()
        except Exception:
            logger.warning("could not renew the manager jobs' leases", exc_info=True)
            return
        if expired:
            self._metrics.leases_expired.inc(expired)
            logger.warning("%d manager job(s) of a process that stopped renewing them queued "
                           "again", expired)  # fmt: skip
            self._wakeup.set()
        if await self.idle.look():
            self._wakeup.set()

    async def _loop(self) -> None:
        while not self._stopping:
            try:
                jobs = await self._queue.claim(
                    self._concurrency - len(self._running),
                    exclude_users=set(self._running.values()),
                    # one slot may go to idle work while chats' jobs wait, so that a Manager
                    # busy for hours still keeps stores within their capacities; never the
                    # last slot (one job at a time: idle work waits for an empty queue)
                    idle_first=self._concurrency > 1
                    and not any(t.get_name().startswith(IDLE_TASK) for t in self._running),
                )
            except Exception:
                logger.warning("could not read the manager queue", exc_info=True)
                jobs = []
            for job in jobs:
                task = asyncio.get_running_loop().create_task(self._run(job), name=f"job-{job.id}")
                # (an idle job's id begins IDLE_JOB: its task's name begins IDLE_TASK)
                self._running[task] = job.user_id
                task.add_done_callback(self._finished)
            self._wakeup.clear()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that
            # arrives as the wait ends (the wake-up set at that moment), and stop() then waited
            # for this loop forever.
            with suppress(TimeoutError):
                async with asyncio.timeout(POLL_SECONDS):
                    await self._wakeup.wait()

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._running.pop(task, None)
        self._wakeup.set()

    async def _run(self, job: Job) -> None:
        try:
            await self._work(job)
        finally:
            # Applied, handed back, or (a hand-back that failed) dropped: its lease lapses.
            self._queue.let_go(job.id)

    async def _work(self, job: Job) -> None:
        try:
            if job.id.startswith(IDLE_JOB):
                await self.idle.work(job)
                return
            if is_distil(job):
                current = await as_now(self._service, job)
                if current is None:  # its words were all deleted meanwhile: nothing to learn
                    with suppress(JobGone):
                        await self._applier.apply(job.user_id, [], {}, job_id=job.id,
                                                  queue=self._queue)  # fmt: skip
                    return
                job = current
            decided = await decide(self._manager, self._service, job, episodes=self._episodes)
            try:
                outcomes = await self._applier.apply(
                    job.user_id, decided.operations, decided.aliases, job_id=job.id,
                    queue=self._queue, grounds=decided.grounds, observed_at=job.created_at,
                    episodes=decided.episodes, kept=kept_episodes(job),
                )  # fmt: skip
            except JobGone:
                self._metrics.jobs_skipped.inc()
                logger.info(
                    "job %s is no longer this process's (applied by another process, or its "
                    "lease ran out and another took it up): skipped", job.id,
                )  # fmt: skip
                return
            self._metrics.jobs_applied.inc()
            for outcome in outcomes:
                self._metrics.memory_operations.labels(outcome.result).inc()
            said = [o.result + (f" (+{len(o.also)} with it)" if o.also else "") for o in outcomes]
            logger.info("job %s applied: %s", job.id, ", ".join(said) or "-")
            if await self.idle.learned(job.user_id):
                self._wakeup.set()
        except asyncio.CancelledError:
            raise
        except ManagerAnswerUnusable as exc:
            # Asking the same model again gives the same answer: parked at once, with it, until
            # `memproxy jobs retry` (e.g. after MEMPROXY_MANAGER_MODEL names a better model).
            self._metrics.answers_unusable.inc()
            logger.warning("job %s parked: the manager's answer was unusable: %s", job.id, exc)
            _held(await self._park(job, str(exc)[:1000], answer=exc.answer), job)
            self._metrics.jobs_failed.inc()  # once parked: what it counts can be read then
        except Exception as exc:
            reason = (
                str(exc) if isinstance(exc, ManagerUnavailable) else f"{type(exc).__name__}: {exc}"
            )[:1000]
            if job.attempts >= self._attempts:
                logger.warning("job %s failed %d times, parked: %s", job.id, job.attempts, reason)
                _held(await self._park(job, reason), job)
                self._metrics.jobs_failed.inc()
            else:
                delay = self._retry_seconds * 2 ** (job.attempts - 1)
                logger.info("job %s failed (%s); retrying in %.0f s", job.id, reason, delay)
                _held(await self._queue.retry_later(job.id, reason, delay), job)

    async def _park(self, job: Job, reason: str, *, answer: str | None = None) -> bool:
        """Park the job for good, keeping its episodes (:mod:`app.memory.learning.parking`); if
        they cannot be kept (embedding them failed, say), parked without them, as before."""
        try:
            return await park(
                self._service, self._queue, job, reason, answer=answer, episodes=self._episodes
            )
        except Exception:
            logger.warning("job %s: its episodes could not be kept; parked without them", job.id,
                           exc_info=True)  # fmt: skip
            return await self._queue.park(job.id, reason, answer=answer)


def _held(held: bool, job: Job) -> None:
    if not held:
        logger.warning("job %s was no longer this process's (its lease ran out): another one "
                       "runs it", job.id)  # fmt: skip


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel `task` and wait until it has ended, cancelling again should it swallow a cancel."""
    while not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
    with suppress(asyncio.CancelledError, Exception):
        task.result()
