"""Distilling at idle time, the Manager's second chance: the episodes of a conversation that
gave no fact (the model missed them, or its answer could not be used and the job was parked
with its words kept) are read by the Manager once more, as the user's turns of that day
(MemForest's session summary, in memproxy's terms: facts drawn from the words).

The episodes written after the user's last idle job that no fact links to are taken by the job
that wrote them (one conversation's exchange), at most :data:`TURNS` of each, and go through
what a chat's job goes through (:func:`app.memory.learning.deciding.decide`: the related
memories shown, the rules after the model, the grounds, the applier's guards), the facts it
writes linked to those episodes, dated the day they were said. Once: an episode is new to one
idle job only, and one a fact now comes from is no longer alone.

Bounds: :data:`GROUPS` conversations an idle job, within its deadline (the caller's); a run
stopped by either says where, for the next idle job to go on from. A conversation whose answer
cannot be used is passed over; an unreachable model ends the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from itertools import groupby

from app.config import Settings
from app.memory.learning.applier import Applier, JobGone
from app.memory.learning.deciding import decide
from app.memory.learning.failures import ManagerAnswerUnusable, ManagerUnavailable
from app.memory.learning.leases import Job
from app.memory.learning.manager import Manager
from app.memory.learning.parking import KEPT
from app.memory.learning.turns import dump, turn
from app.memory.service import MemoryService
from app.memory.store.unit import Writer
from app.memory.store.upkeep import lone_episodes

logger = logging.getLogger("memproxy.manager")

GROUPS = 10
"""Conversations distilled by one idle job at most."""
TURNS = 40
"""Episodes of one conversation read at once at most (its last: a long import's rest stays
words)."""


@dataclass(slots=True)
class Distilled:
    """What one run did."""

    conversations: int = 0
    facts: int = 0
    """Facts written (created or updated)."""
    refused: int = 0
    stopped_at: int | None = None
    """The version to go on from (a bound stopped the run), or None."""


class Distilling:
    def __init__(self, service: MemoryService, manager: Manager | None, settings: Settings) -> None:
        self._service = service
        self._manager = manager
        self._settings = settings
        self._applier = Applier(service, dedup_threshold=settings.dedup_threshold)

    async def run(
        self,
        user_id: str,
        *,
        since: int,
        model: str,
        job_id: str,
        deadline: float,
        holds: Callable[[Writer], Awaitable[bool]] | None = None,
    ) -> Distilled:
        """Distill the user's lone episodes written after version `since` (the module
        docstring), until `deadline` (``time.monotonic()``); `model`: the user's last chat's.
        Nothing without a model to ask."""
        done = Distilled()
        s = self._settings
        if self._manager is None or not (s.manager_model or model) or not s.consolidation:
            return done
        async with self._service.store.sessions() as session:
            lone = await lone_episodes(session.execute, user_id, since)

        async def held(w: Writer) -> None:
            if holds is not None and not await holds(w):
                raise JobGone(job_id)

        for _, grouped in groupby(lone, key=lambda e: e.created_at):
            group = list(grouped)[-TURNS:]
            if done.conversations >= GROUPS or time.monotonic() > deadline:
                done.stopped_at = group[0].seq - 1
                break
            said = group[0].observed_at
            ids = [e.id for e in group]
            job = Job(
                job_id, user_id, explicit=False, attempts=1, created_at=said,
                payload={"model": model, "context": [], "fingerprints": [], KEPT: ids,
                         "new": dump([turn("user", e.content, said) for e in group])},
            )  # fmt: skip
            done.conversations += 1
            try:
                decided = await decide(self._manager, self._service, job, episodes=False)
            except ManagerAnswerUnusable as exc:
                logger.info("job %s: distilling a conversation: unusable answer: %s", job_id, exc)
                done.refused += 1
                continue
            except ManagerUnavailable as exc:
                logger.info("job %s: distilling stops: %s", job_id, exc)
                break
            if not decided.operations:
                continue
            outcomes = await self._applier.apply(
                user_id, decided.operations, decided.aliases, job_id=job_id,
                grounds=decided.grounds, observed_at=said, kept=ids, within=held,
            )  # fmt: skip
            done.facts += sum(o.result in ("created", "updated") for o in outcomes)
        return done
