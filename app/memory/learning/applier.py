"""Applying the Manager's decisions: the Automatic Memory Manager v4 rules, then one guard.

The Manager answers with :class:`Operation`s that name memories by the short integer alias it was
shown (models invent UUIDs; they copy small numbers faithfully). :class:`Applier` maps them back and
applies them, all of one job in one transaction (one version bump, every change audited with the
job's id):

- NEW creates, and never touches an existing memory (an id that came with it is ignored).
  ``profile`` marks what is created or updated as a standing fact (shown in every chat); an
  UPDATE without it leaves the memory's mark as it is.
  What a job writes (created or updated) is observed when the job's turns were said
  (`observed_at`: the job's ``created_at``), and the relative dates in its text are written as
  absolute dates from that day (:mod:`app.memory.learning.dates`: "yesterday" -> "on 23
  November 2026"), after the grounds are checked and before the duplicates.
- UPDATE and DELETE must name a memory the Manager was shown; any other id (or none) fails and is
  logged. UPDATE of a shown memory updates it (or creates, when it was deleted since, or when
  the new text is unrelated to it: :data:`~app.memory.learning.planning.UNRELATED_BELOW`);
  DELETE deletes it, with the episodes it was written from and the memories that say the
  same, as every deletion of a fact does (:meth:`app.memory.service.MemoryService.delete`).
  A pinned memory is never deleted by the Manager.
- Guards: a memory that is a line of the prompt
  (:data:`~app.memory.learning.planning.PROMPT_ECHOES`) fails; given the job's
  :class:`~app.memory.learning.grounding.Grounds`, a NEW or UPDATE whose words are not the
  user's is ``ungrounded`` and changes nothing; an UPDATE to the text the memory already holds
  is ``unchanged`` (no write, no history); a creation or update whose content is a
  near-duplicate of one of the user's memories (cosine of the best-matching part above
  ``MEMPROXY_DEDUP_THRESHOLD``; for an update, of another memory than the one it updates), or
  of an earlier operation of the same job, writes nothing.

Every operation gets an :class:`Applied`; none raises.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

import numpy as np

from app.memory.learning.decisions import Op, Operation
from app.memory.learning.episodes import index_keys, is_episode, write_episodes
from app.memory.learning.grounding import Grounds
from app.memory.learning.planning import Planned, plan_operation, same_words, unrelated_cosine
from app.memory.search.parts import Embedded, embed_for_store
from app.memory.search.provenance import linked_facts
from app.memory.service import MemoryService
from app.memory.store.links import rekey
from app.memory.store.records import in_utc, now
from app.memory.store.tables import Memory, MemorySource, MemoryType
from app.memory.store.unit import Writer

EPISODE = MemoryType.EPISODE.value

if TYPE_CHECKING:
    from app.memory.learning.jobs import JobQueue

logger = logging.getLogger("memproxy.manager")


Within = Callable[[Writer], Awaitable[None]]


class JobGone(Exception):
    """The job was no longer in the queue when its decisions were to be applied (another process
    applied it first): nothing was applied."""


@dataclass(frozen=True, slots=True)
class Applied:
    operation: Operation
    result: str
    """`created`, `updated`, `deleted`, `unchanged` (an UPDATE to the same text), `duplicate`
    (nothing created), `ungrounded` (not the user's words: nothing written) or `failed`."""
    memory_id: str | None = None
    """The memory created, changed or deleted; for `duplicate`, the one it duplicates."""
    reason: str | None = None
    also: tuple[str, ...] = ()
    """For `deleted`: the memories that went with it (its episodes, those saying the same)."""


class Applier:
    def __init__(self, service: MemoryService, *, dedup_threshold: float = 0.9) -> None:
        self._service = service
        self._threshold = dedup_threshold

    async def apply(
        self,
        user_id: str,
        operations: Sequence[Operation],
        aliases: dict[int, str],
        *,
        job_id: str,
        queue: JobQueue | None = None,
        grounds: Grounds | None = None,
        observed_at: datetime | None = None,
        episodes: Sequence[str] = (),
        kept: Sequence[str] = (),
        within: Within | None = None,
    ) -> list[Applied]:
        """Apply a job's operations (`aliases`: the numbers shown -> memory ids). With `queue`,
        the job is deleted from it in the same transaction, and nothing is applied when it is
        already gone (applied by another process: :class:`JobGone`): exactly once. With
        `grounds`, what is not the user's words is refused (the module docstring).
        `observed_at`: when the job's turns were said (now when None). `episodes`: the texts of
        the job's episodes, written in the same transaction, each fact linked to its own; `kept`:
        the ids of the episodes it wrote as it was parked (:mod:`~app.memory.learning.parking`),
        linked and keyed the same way. `within`: run first in the unit of work that applies
        (the idle work's check that its job is still held)."""
        outcomes: list[Applied] = []
        planned: list[Planned] = []
        for operation in operations:
            if grounds is not None and (refusal := grounds.refusal(operation)):
                logger.info("job %s: %s refused: %s", job_id, operation.op, refusal)
                outcomes.append(Applied(operation, "ungrounded", reason=refusal))
                continue
            failure = plan_operation(operation, aliases, planned, observed_at or now())
            if failure is not None:
                logger.warning("job %s: %s operation failed: %s", job_id, operation.op, failure)
                outcomes.append(Applied(operation, "failed", reason=failure))
        writes = [p for p in planned if p.operation.op is not Op.DELETE]
        contents = [p.operation.content or "" for p in writes]
        vectors = await embed_for_store(self._service.embedder, contents)
        for plan, embedded in zip(writes, vectors, strict=True):
            plan.embedded = embedded
        outcomes += await self._skip_duplicates(user_id, planned)
        planned = [p for p in planned if p.embedded is not None or p.operation.op is Op.DELETE]
        # An episode is found by its words and the facts drawn from them (episodes.index_keys):
        # not those a small model only restated (an UPDATE to the words it has: no link either)
        facts = [p.operation.content or "" for p in planned
                 if p.embedded is not None and not await self._restated(user_id, p)]  # fmt: skip
        new, rekeyed = await self._episode_keys(user_id, episodes, kept, facts)
        # what says the same as a memory deleted goes with it (MemoryService.delete's rule)
        deleting = [p.memory_id for p in planned if p.operation.op is Op.DELETE and p.memory_id]
        same = await self._service.restatements(user_id, deleting) if deleting else {}
        if planned or new or rekeyed or queue is not None:
            outcomes += await self._commit(
                user_id, planned, job_id, queue, observed_at, new, same=same, rekeyed=rekeyed,
                within=within,
            )  # fmt: skip
        return outcomes

    async def _episode_keys(
        self, user_id: str, episodes: Sequence[str], kept: Sequence[str], facts: Sequence[str]
    ) -> tuple[list[tuple[str, str, Embedded]], dict[str, tuple[str, Embedded]]]:
        """The job's new episodes (text, index key, its embedding), and the new keys of the
        episodes it kept as it was parked that are still there (id -> key, its embedding)."""
        kinds = await self._service.store.kinds(user_id, kept) if kept else {}
        stored = [(i, content) for i, (kind, content, _) in kinds.items() if kind == EPISODE]
        # a kept episode's key keeps the facts linked to it meanwhile (an import's)
        linked = await linked_facts(self._service.store, user_id, [i for i, _ in stored])
        earlier = [*([] for _ in episodes), *(list(linked[i].values()) for i, _ in stored)]
        keys = index_keys([*episodes, *(content for _, content in stored)], facts, earlier)
        vectors = await embed_for_store(self._service.embedder, keys)
        new = list(zip(episodes, keys, vectors, strict=False))
        rekeyed = {i: (key, embedded) for (i, _), key, embedded
                   in zip(stored, keys[len(new):], vectors[len(new):], strict=True)}  # fmt: skip
        return new, rekeyed

    async def _restated(self, user_id: str, plan: Planned) -> bool:
        """Whether `plan` UPDATEs a memory to the words it has (applied as ``unchanged``)."""
        if plan.operation.op is not Op.UPDATE or plan.memory_id is None:
            return False
        current = await self._service.store.get(user_id, plan.memory_id)
        return current is not None and same_words(current.content, plan.operation.content or "")

    async def _skip_duplicates(self, user_id: str, planned: list[Planned]) -> list[Applied]:
        """Drop (mark with `embedded` None) creations and updates whose text repeats another
        memory or an earlier operation of the job: small models UPDATE several memories with
        one text, which turned them into copies and lost what they held."""
        entry = await self._service.cache.get(user_id)
        outcomes = []
        earlier: list[np.ndarray] = []
        for plan in planned:
            if plan.embedded is None:
                continue
            whole = plan.embedded.vectors[0]
            keys, scores = entry.vectors.search(whole, 4)  # the memory updated may be one
            near = [(int(k), float(c)) for k, c in zip(keys, scores, strict=True)
                    if c > self._threshold and not is_episode(entry, int(k))][:2]  # fmt: skip
            rows = await self._service.store.get_many(user_id, [k for k, _ in near])
            others = [(rows[k].id if k in rows else None, c) for k, c in near
                      if k not in rows or rows[k].id != plan.memory_id]  # fmt: skip
            if others:
                duplicate, cosine = others[0]
                reason = f"cosine {cosine:.3f} with an existing memory"
                outcomes.append(Applied(plan.operation, "duplicate", duplicate, reason))
                plan.embedded = None
            elif any(float(whole @ other) > self._threshold for other in earlier):
                outcomes.append(Applied(plan.operation, "duplicate", None,
                                        "repeats an earlier operation of this job"))  # fmt: skip
                plan.embedded = None
            else:
                earlier.append(whole)
        return outcomes

    async def _commit(
        self,
        user_id: str,
        planned: list[Planned],
        job_id: str,
        queue: JobQueue | None,
        observed_at: datetime | None,
        episodes: Sequence[tuple[str, str, Embedded]] = (),
        *,
        same: Mapping[str, Mapping[int, float]] | None = None,
        rekeyed: Mapping[str, tuple[str, Embedded]] | None = None,
        within: Within | None = None,
    ) -> list[Applied]:
        outcomes: list[Applied] = []
        async with self._service.store.writing(user_id, MemorySource.MANAGER, job_id=job_id) as w:
            if queue is not None and not await queue.consume(w, job_id):
                raise JobGone(job_id)
            if within is not None:
                await within(w)
            if any(p.operation.op is Op.DELETE for p in planned):
                await w.lock()  # a delete elsewhere must not take what this job reads next
            rows = await w.rows([p.memory_id for p in planned if p.memory_id])
            stamp = now()
            said = in_utc(observed_at) if observed_at is not None else stamp
            dim = self._service.embedder.dim
            for plan in planned:
                operation = plan.operation
                row = rows.get(plan.memory_id) if plan.memory_id else None
                if operation.op is Op.DELETE:
                    if row is None and plan.memory_id in w.gone:
                        outcomes.append(Applied(operation, "deleted", plan.memory_id,
                                                "went with a memory this job deleted"))  # fmt: skip
                    elif row is None:
                        outcomes.append(Applied(operation, "failed", plan.memory_id,
                                                "no such memory (deleted since?)"))  # fmt: skip
                    elif row.pinned:
                        outcomes.append(Applied(operation, "failed", row.id, "pinned"))
                    else:  # with its episodes and what says the same (Writer.delete)
                        also = await w.delete(row, same=(same or {}).get(row.id))
                        for went in [row, *also]:
                            rows.pop(went.id, None)  # an UPDATE of one of them creates
                        ids = tuple(m.id for m in also)
                        outcomes.append(Applied(operation, "deleted", row.id, also=ids))
                    continue
                embedded = plan.embedded
                assert embedded is not None and operation.content is not None
                unrelated = unrelated_cosine(row, embedded, dim) if row is not None else None
                restated = row is not None and same_words(row.content, operation.content)
                if row is not None and unrelated is None and restated:
                    if operation.profile is None or operation.profile == row.profile:
                        outcomes.append(Applied(operation, "unchanged", row.id))
                    else:  # the same words, now (or no longer) a standing fact
                        row.profile = operation.profile
                        w.update(row, before=row.content, detail=_marked(row.profile))
                        outcomes.append(Applied(operation, "updated", row.id))
                    continue
                if row is not None and unrelated is None:  # UPDATE of a known memory
                    before = row.content
                    row.content, row.index_text = operation.content, None  # found by its words
                    row.type = (operation.type or MemoryType(row.type)).value
                    row.embedding, row.embedding_model = embedded.embedding, embedded.model
                    row.observed_at = said  # what it says now was said in this job's turns
                    marked = operation.profile is not None and operation.profile != row.profile
                    if operation.profile is not None:
                        row.profile = operation.profile
                    w.update(row, before=before, detail=_marked(row.profile) if marked else None)
                    outcomes.append(Applied(operation, "updated", row.id))
                    continue
                detail = (
                    f"UPDATE of an unrelated memory (cosine {unrelated:.2f}): created, "
                    f"{plan.memory_id} kept"
                    if unrelated is not None
                    else "UPDATE of a memory deleted since; created"
                    if plan.memory_id
                    else None
                )
                created = Memory(
                    id=_new_id(), user_id=user_id, content=operation.content,
                    type=(operation.type or MemoryType.FACT).value, meta={},
                    source=MemorySource.MANAGER.value, pinned=False,
                    profile=bool(operation.profile),
                    created_at=stamp, updated_at=stamp, observed_at=said, recall_count=0,
                    embedding=embedded.embedding,
                    embedding_model=embedded.model,
                )  # fmt: skip
                w.create(created, detail=detail)
                outcomes.append(Applied(operation, "created", created.id, detail))
            gone = {o.memory_id for o in outcomes if o.result == "deleted"}
            facts = [(o.memory_id, o.operation.content or "") for o in outcomes
                     if o.result in ("created", "updated") and o.memory_id
                     and o.memory_id not in gone]  # fmt: skip
            keys = {i: (k, e.embedding, e.model) for i, (k, e) in (rekeyed or {}).items()}
            stored = [(row.id, row.content) for row in await rekey(w, keys)]
            write_episodes(w, episodes, facts, written=stamp, said=said, stored=stored)
        return outcomes


def _marked(profile: bool) -> str:
    """What the history says of a change of the mark (as the API's writes say it)."""
    return "profile" if profile else "not profile"


def _new_id() -> str:
    return str(uuid.uuid4())
