"""Distilling, the Manager's second chance: the episodes of an exchange that gave no fact (the
model missed them, or its answer could not be used and the job was parked with its words kept)
are queued for the Manager once more, as the user's turns of that day (MemForest's session
summary, in memproxy's terms: facts drawn from the words).

The idle job (:mod:`.idle`) takes the episodes written after the user's last one that no fact
links to, by the unit that wrote them (one exchange), and queues each exchange as a job of a
past conversation (:data:`~app.memory.learning.job_kinds.HISTORY_JOB`: after every chat's job,
never dropped): the worker runs it as any job (leases, retries, the related memories shown, the
rules after the model, the grounds, the applier's guards), writes no episode again, and links
the facts it writes to those episodes. A short answer kept with the question it answers
(``No. (answering "Do you eat honey?")``) is given back as the assistant's question and the
user's answer: the question is never taken for the user's words.

Once: each episode is queued at most once (a mark in the turns taken, in the transaction that
queues it, while the idle job is still this process's); the words of a job that is still parked
are left to it (retried, it learns them), and those a fact came from that left (merged,
superseded, forgotten) are never queued (:func:`app.memory.store.archive.forget` marks them).
When the job runs, its turns are made again from those of its episodes the user still holds
(:func:`as_now`): words deleted meanwhile are not learned from.
At most :data:`GROUPS` exchanges an idle job; the rest are for the next (``stopped_at``).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from datetime import datetime
from itertools import groupby

from pydantic_ai.messages import ModelMessage

from app.config import Settings
from app.memory.learning.idle_jobs import Distil, IdleJobs
from app.memory.learning.job_kinds import HISTORY_JOB
from app.memory.learning.leases import Job
from app.memory.learning.parking import KEPT
from app.memory.learning.turns import dump, turn
from app.memory.service import MemoryService
from app.memory.store.archive import DISTIL, distil_marks
from app.memory.store.upkeep import Lone, lone_episodes

GROUPS = 20
"""Exchanges queued by one idle job at most."""
TURNS = 40
"""Episodes of one exchange given at once at most (its last)."""

_ANSWERING = re.compile(r'^(?P<answer>.*) \(answering "(?P<question>.*)"\)$', re.S)


@dataclass(slots=True)
class Distilled:
    queued: int = 0
    """Exchanges queued for the Manager."""
    stopped_at: int | None = None
    """The version to go on from (more exchanges than :data:`GROUPS`), or None."""


def turns_of(text: str, at: datetime) -> list[ModelMessage]:
    """An episode's words as the turns they were: a short answer after its question."""
    match = _ANSWERING.match(text)
    if match is None:
        return [turn("user", text, at)]
    return [turn("assistant", match["question"], at), turn("user", match["answer"], at)]


class Distilling:
    def __init__(self, queue: IdleJobs, service: MemoryService, settings: Settings) -> None:
        self._queue = queue
        self._service = service
        self._settings = settings

    async def run(self, user_id: str, *, since: int, model: str, job_id: str) -> Distilled:
        """Queue the user's exchanges written after version `since` that gave no fact (the
        module docstring), while the idle job `job_id` is still this process's; `model`: the
        user's last chat's (nothing without a model)."""
        done = Distilled()
        s = self._settings
        if not s.consolidation or not (s.manager_model or model):
            return done
        async with self._service.store.sessions() as session:
            lone = await lone_episodes(session.execute, user_id, since)
        held = await self._queue.kept_by_jobs(user_id)
        rows: list[Distil] = []
        free = (e for e in lone if e.id not in held)
        for _, grouped in groupby(free, key=lambda e: e.created_at):
            group = list(grouped)
            if len(rows) >= GROUPS:
                done.stopped_at = group[0].seq - 1
                break
            rows.append(_distil(group[-TURNS:], model))
        done.queued = await self._queue.queue_distil(user_id, rows, held=job_id)
        return done


def _distil(group: list[Lone], model: str) -> Distil:
    """The job of one exchange's episodes: their turns as new, the episodes as kept (none is
    written again), dated the day they were said; its id and mark name its first episode."""
    said = group[0]
    turns = [t for e in group for t in turns_of(e.content, said.observed_at)]
    ids = [e.id for e in group]
    payload = {"model": model, "context": [], "new": dump(turns), "fingerprints": [],
               "said_at": said.observed_at.isoformat(), KEPT: ids}  # fmt: skip
    return Distil(distil_job_id(said.id), distil_marks(ids), payload)


def is_distil(job: Job) -> bool:
    return job.id.startswith(f"{HISTORY_JOB}{DISTIL}")


async def as_now(service: MemoryService, job: Job) -> Job | None:
    """A distilling job as it runs: its turns made again from those of its episodes the user
    still holds (one deleted since is not learned from), or None when none is left."""
    kept = [str(i) for i in job.payload.get(KEPT) or ()]
    found = await service.store.kinds(job.user_id, kept)
    texts = [found[i][1] for i in kept if i in found]
    if not texts:
        return None
    turns = [t for text in texts for t in turns_of(text, job.created_at)]
    payload = {**job.payload, "new": dump(turns), KEPT: [i for i in kept if i in found]}
    return replace(job, payload=payload)


def distil_job_id(episode_id: str) -> str:
    """The id of the job that distils the exchange whose first episode is `episode_id` (a job
    id holds 36 characters)."""
    return f"{HISTORY_JOB}{DISTIL}{hashlib.sha256(episode_id.encode()).hexdigest()[:20]}"
