"""Consolidation at idle time: the facts a user's memories gained since their last idle job,
each with the user's facts nearest it, made into fewer and truer facts.

For each new fact (oldest written first), the user's facts at least
``MEMPROXY_CONSOLIDATION_COSINE`` like it (at most :data:`NEIGHBOURS`):

- those nearly its copy (cosine above ``MEMPROXY_DEDUP_THRESHOLD``, the same numbers and names)
  merge into whichever of the two was said last, in its words: the newest truth, no model
  needed;
- with the others, the Manager's model (``MEMPROXY_MANAGER_MODEL``, else the model of the
  user's last chat) is shown the group, oldest said first with its day, and answers
  :class:`Tidy`: which say the same thing (merged into one memory it writes, kept only when
  its words are the group's, keep what each fact said and each fact merged is alike the one it
  goes into), and which a newer fact of the group shows no longer true (superseded, with the
  day the newer one was said, when the newer fact says something changed): the checks are
  :mod:`.tidy_checks`'s, a small model's answer being a proposal only.

What leaves goes to the forgotten memories with its cause and an event naming the fact that
holds it (:mod:`app.memory.store.upkeep`), and can be put back from there. Bounds: a deadline
(the idle job's gives this step up to half of ``MEMPROXY_IDLE_JOB_TIMEOUT_SECONDS``; no answer is
waited for past it), the Manager's output tokens for one job (``MEMPROXY_MANAGER_JOB_MAX_TOKENS``,
for this step) and :data:`MAX_ASKED` questions; a run stopped by one says where, and the next
idle job goes on from there (the rest of facts written in one unit with ones it went through,
an import's, is passed over: every run gets on). A question the model cannot answer usably, or
in time, leaves its group as it is; after :data:`UNUSABLE_IN_A_ROW` unusable answers the run
asks nothing more (the rest get the near copies' merge alone; the next idle job asks about newer
facts only); a model that cannot be reached stops the run where it is, for the next idle
job (after the user's quiet time). Each merge or supersession is a unit of
work of its own, written only while the idle job is still this process's, and only over facts
whose words are still those the model was shown.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
from pydantic_ai.usage import RunUsage

from app.config import Settings
from app.memory.learning.applier import JobGone
from app.memory.learning.failures import ManagerAnswerUnusable, ManagerUnavailable
from app.memory.learning.manager import Manager
from app.memory.learning.tidy_checks import (
    ANSWER_TOKENS,
    INSTRUCTIONS,
    SAME_COSINE,
    Tidy,
    covers,
    grounded,
    keeps_details,
    question,
    same_details,
    tells_a_change,
)
from app.memory.search.parts import decode, embed_for_store, vector_model
from app.memory.service import MemoryService
from app.memory.store.tables import MemorySource
from app.memory.store.unit import Writer
from app.memory.store.upkeep import Fact, facts, merge, supersede

logger = logging.getLogger("memproxy.manager")

Holds = Callable[[Writer], Awaitable[bool]]
"""Whether the process still holds the idle job, asked in each unit that writes: one that lost
it (its lease ran out) writes nothing more (:class:`JobGone`)."""

NEIGHBOURS = 3
"""Facts shown with a new one at most: the model judges a small group well."""
MAX_ASKED = 50
"""Questions to the model in one idle job at most."""
UNUSABLE_IN_A_ROW = 3
"""Answers in a row that fit no output mode after which a run asks nothing more: a model that
cannot do this work is not asked for every fact, nor again at once by the next idle job."""


@dataclass(slots=True)
class Tidied:
    """What one run did."""

    merged: int = 0
    superseded: int = 0
    asked: int = 0
    refused: int = 0
    """Answers not used: unusable, or a merge whose words were not the group's."""
    stopped_at: int | None = None
    """The version to go on from (a bound stopped the run), or None when it got through."""
    gone: set[str] = field(default_factory=set)
    into: dict[str, str] = field(default_factory=dict)
    """Each fact merged -> the fact that holds it now."""
    unreachable: bool = False
    """The run stopped because the model could not be reached."""
    gave_up: bool = False
    """The model's answers were unusable :data:`UNUSABLE_IN_A_ROW` times in a row: the rest of
    the run asked nothing."""


class _Late(Exception):
    """An answer did not come before the step's deadline."""


class Consolidation:
    def __init__(self, service: MemoryService, manager: Manager | None, settings: Settings) -> None:
        self._service = service
        self._manager = manager
        self._settings = settings

    async def run(
        self,
        user_id: str,
        *,
        since: int,
        model: str,
        job_id: str,
        holds: Holds | None = None,
        deadline: float | None = None,
    ) -> Tidied:
        """Consolidate the user's facts written after version `since` (the module docstring);
        `model`: the model of the user's last chat (the Manager's unless one is configured);
        no answer waited for past `deadline` (``time.monotonic()``; by default half of the idle
        job's time from now)."""
        s = self._settings
        done = Tidied()
        if not s.consolidation:
            return done
        if deadline is None:
            deadline = time.monotonic() + s.idle_job_timeout_seconds / 2
        usage = RunUsage()
        asking = self._manager is not None and bool(s.manager_model or model)
        store = self._service.store
        model_of_vectors = vector_model(self._service.embedder)
        async with store.sessions() as session:
            every = [f for f in await facts(session.execute, user_id)
                     if f.embedding and f.embedding_model == model_of_vectors]  # fmt: skip
        if not every:
            return done
        dim = self._service.embedder.dim
        vectors = np.stack([decode(f.embedding or b"", dim)[0] for f in every])
        fresh = sorted((i for i, f in enumerate(every) if f.seq > since),
                       key=lambda i: every[i].seq)  # fmt: skip
        begun: int | None = None  # the version whose facts are being gone through
        unusable = 0  # answers in a row that fit no output mode
        seen: set[frozenset[tuple[str, str]]] = set()
        for i in fresh:
            fact = every[i]
            if fact.id in done.gone:
                continue
            if time.monotonic() > deadline or (
                asking
                and (done.asked >= MAX_ASKED or usage.output_tokens >= s.manager_job_max_tokens)
            ):
                # The next run goes on from here; the rest of facts written together with ones
                # gone through already (an import's) is passed over, so that every run gets on.
                done.stopped_at = fact.seq if fact.seq == begun else fact.seq - 1
                break
            begun = fact.seq
            near = self._near(vectors, i, every, done.gone)
            copies = [j for j, c in near if c >= s.dedup_threshold
                      and same_details(fact.content, every[j].content)]  # fmt: skip
            for j in copies:  # the newest truth: the one said last, in its words
                if fact.id in done.gone:
                    break
                newer, older = (fact, every[j]) if fact.observed_at >= every[j].observed_at \
                    else (every[j], fact)  # fmt: skip
                if older.pinned:
                    continue  # a pinned fact keeps its words and stays
                await self._merge(user_id, newer, [older], newer.content, job_id, done, holds)
            if fact.id in done.gone:
                continue
            group = [fact, *(every[j] for j, _ in near if j not in copies)]
            shown = frozenset((f.id, f.content) for f in group)
            if asking and len(group) > 1 and shown not in seen:
                seen.add(shown)  # a group is the nearest of each of its facts: asked once
                try:
                    await self._ask(user_id, group, vectors, every, model, usage, job_id, done,
                                    deadline, holds)  # fmt: skip
                except ManagerAnswerUnusable as exc:
                    logger.info("job %s: consolidation: no usable answer: %s", job_id, exc)
                    done.refused += 1
                    unusable += 1
                    if unusable >= UNUSABLE_IN_A_ROW:
                        logger.info("job %s: consolidation asks no more: %d answers in a row "
                                    "unusable", job_id, unusable)  # fmt: skip
                        asking, done.gave_up = False, True
                    continue
                except ManagerUnavailable as exc:
                    # asked again by the next idle job (after the user's quiet time)
                    logger.info("job %s: consolidation stops: %s", job_id, exc)
                    done.stopped_at, done.unreachable = fact.seq - 1, True
                    break
                except _Late:  # asked again by the next idle job
                    done.stopped_at = fact.seq - 1
                    break
                unusable = 0
        return done

    def _near(
        self, vectors: np.ndarray, i: int, every: Sequence[Fact], gone: set[str]
    ) -> list[tuple[int, float]]:
        """The facts nearest fact `i`, as (position, cosine), nearest first."""
        cosines = vectors @ vectors[i]
        order = np.argsort(-cosines)
        return [
            (int(j), float(cosines[j]))
            for j in order[: NEIGHBOURS + 1 + len(gone)]
            if j != i and every[j].id not in gone
            and cosines[j] >= self._settings.consolidation_cosine
        ][:NEIGHBOURS]  # fmt: skip

    async def _ask(
        self,
        user_id: str,
        group: list[Fact],
        vectors: np.ndarray,
        every: Sequence[Fact],
        model: str,
        usage: RunUsage,
        job_id: str,
        done: Tidied,
        deadline: float,
        holds: Holds | None,
    ) -> None:
        """Ask the model about `group` (an answer past `deadline` is not waited for: the group
        stays as it is) and do what it says, where the checks allow; an answer that fits no
        output mode raises :class:`ManagerAnswerUnusable`."""
        assert self._manager is not None
        group = sorted(group, key=lambda f: (f.observed_at, f.key))
        prompt = question([(f.observed_at, f.content) for f in group])
        done.asked += 1
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                tidy = await self._manager.ask(model, Tidy, INSTRUCTIONS, prompt, usage=usage,
                                               max_tokens=ANSWER_TOKENS)  # fmt: skip
        except TimeoutError:
            if done.asked > 1:
                raise _Late from None
            done.refused += 1  # the first question: passed over, or no run would get on
            return
        at = {f.id: n for n, f in enumerate(every)}
        same = [group[n - 1] for n in dict.fromkeys(tidy.same) if 1 <= n <= len(group)]
        if len(same) >= 2 and any(f.pinned for f in same):
            done.refused += 1  # a pinned fact keeps its words and stays
        elif len(same) >= 2:
            into = max(same, key=lambda f: (f.observed_at, f.key))
            like = vectors[at[into.id]]
            text = " ".join(tidy.memory.split())
            alike = [f for f in same if f is not into
                     and float(vectors[at[f.id]] @ like) >= SAME_COSINE
                     and covers(text, f.content) and keeps_details(text, f.content)]  # fmt: skip
            if (
                alike
                and covers(text, into.content)
                and keeps_details(text, into.content)
                and grounded(text, [f.content for f in (into, *alike)])
            ):
                await self._merge(user_id, into, alike, text, job_id, done, holds)
            else:
                done.refused += 1
        newest = max(group, key=lambda f: (f.observed_at, f.key))
        if not tidy.outdated or not tells_a_change(newest.content):
            return
        # The dates tell which fact ended, not the model (it names either): a fact flagged that
        # is not the newest; the newest flagged, in a pair, names the other.
        flagged = {group[n - 1].id for n in tidy.outdated if 1 <= n <= len(group)}
        if newest.id in flagged and len(group) == 2:
            flagged = {group[0].id}
        like = vectors[at[newest.id]]
        for older in group:
            if older.id not in flagged or older is newest or older.id in done.gone:
                continue
            if newest.id in done.gone or older.observed_at >= newest.observed_at:
                continue
            if float(vectors[at[older.id]] @ like) < self._settings.consolidation_cosine:
                continue  # the newer one is about something else
            async with held_unit(self._service, user_id, job_id, holds) as w:
                if await supersede(w, older.id, newest.id, read=_read(older, newest)):
                    done.superseded += 1
                    done.gone.add(older.id)

    async def _merge(
        self,
        user_id: str,
        into: Fact,
        others: list[Fact],
        text: str,
        job_id: str,
        done: Tidied,
        holds: Holds | None,
    ) -> None:
        (embedded,) = await embed_for_store(self._service.embedder, [text])
        async with held_unit(self._service, user_id, job_id, holds) as w:
            merged = await merge(w, into.id, [f.id for f in others], text,
                                 embedding=embedded.embedding, model=embedded.model,
                                 read=_read(into, *others))  # fmt: skip
        if merged is not None:
            done.merged += len(merged.gone)
            done.gone.update(merged.gone)
            for gone in merged.gone:  # what was merged into one of these goes on to `into`
                done.into.update({k: into.id for k, v in done.into.items() if v == gone})
                done.into[gone] = into.id


@contextlib.asynccontextmanager
async def held_unit(
    service: MemoryService, user_id: str, job_id: str, holds: Holds | None
) -> AsyncIterator[Writer]:
    """A unit of work of the idle job `job_id`, that writes only while `holds` says the job is
    still this process's (:class:`JobGone` otherwise): consolidation's and enrichment's."""
    async with service.store.writing(user_id, MemorySource.UPKEEP, job_id=job_id) as w:
        if holds is not None and not await holds(w):
            raise JobGone(job_id)
        yield w


def _read(*facts: Fact) -> dict[str, str]:
    """The words of these facts as this run read them (a write finding others leaves them)."""
    return {f.id: f.content for f in facts}
