"""Contextual enrichment at idle time: each new fact and episode is given one generated sentence
of context (when, who, what about: the subject of the exchange it came from) that goes into its
index key, dense and BM25, and never into what the chat's model is shown (Anthropic's contextual
retrieval; Slowcat's idle-time enrichment).

The memories written after the user's last idle job are taken by the unit that wrote them (one
chat's job writes an exchange's facts and episodes together), at most :data:`GROUPS` groups an
idle job, and the Manager's model is asked once per group (:class:`Context`), shown the day and
the group's memories. The sentence is kept only if it is a sentence of the memories' own words
(:func:`~app.memory.learning.tidy_checks.grounded`, a few joining words aside), cut to its
first sentence and at most :data:`CONTEXT_CHARS` long; it is appended to each memory's key
after :data:`~app.memory.search.parts.CONTEXT_MARK` (BM25 reads it there) and embedded as one
more part of the memory's (:func:`~app.memory.search.parts.parts_of`: the words' own vectors stay
first, what consolidation compares). A key enriched already is not enriched again; a memory
whose words change (an edit, an update, a merge, an episode given new facts) gets its plain key
back and is enriched again by the next idle job. After
:data:`~app.memory.learning.consolidation.UNUSABLE_IN_A_ROW` unusable answers in a row the run
asks nothing more (the rest keep their keys). Off by default (``MEMPROXY_ENRICHMENT``):
measured on the dev LoCoMo set, docs/performance.md.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import groupby

from pydantic import BaseModel
from pydantic_ai.usage import RunUsage

from app.config import Settings
from app.memory.learning.consolidation import UNUSABLE_IN_A_ROW, Holds, held_unit
from app.memory.learning.failures import ManagerAnswerUnusable, ManagerUnavailable
from app.memory.learning.manager import Manager
from app.memory.learning.tidy_checks import grounded
from app.memory.search.parts import CONTEXT_MARK, embed_for_store, plain_key, with_context
from app.memory.service import MemoryService
from app.memory.store.upkeep import Keyed, fresh_keys, rekeyed

logger = logging.getLogger("memproxy.manager")

GROUPS = 20
"""Groups of memories (one exchange's each) an idle job enriches at most."""
MEMORIES = 12
"""Memories of one group shown to the model at most (the rest get the same sentence)."""
CONTEXT_CHARS = 300
ANSWER_TOKENS = 160
"""The answer's length at most: a sentence in JSON (a small model goes on to retell all)."""
NEW_WORDS = 6
"""Words of the context none of its memories has, at most ("talked", "shared", "experience"...)."""
_FIRST_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")

INSTRUCTIONS = """You help a search engine find what a person said. You are shown the day of a \
conversation and what was kept of it: the user's own words and the facts about the user. Write \
one short sentence of context (at most 30 words), in the third person, that says when it was \
and what it was about: the main subjects, with the names of the people, places, activities and \
events in it. Use only what is shown, in this form: "On <the day> the user talked about \
<the subjects>." """


class Context(BaseModel):
    """The model's answer about one group."""

    context: str


@dataclass(slots=True)
class Enriched:
    groups: int = 0
    memories: int = 0
    refused: int = 0
    stopped_at: int | None = None
    unreachable: bool = False
    """The run stopped because the model could not be reached."""
    gave_up: bool = False
    """The model's answers were unusable :data:`UNUSABLE_IN_A_ROW` times in a row: the rest of the
    run asked nothing (those memories keep their keys)."""


class Enrichment:
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
        deadline: float,
        holds: Holds | None = None,
    ) -> Enriched:
        """Enrich the user's memories written after version `since` (the module docstring),
        asking no question past `deadline` (``time.monotonic()``)."""
        done = Enriched()
        s = self._settings
        if not s.enrichment or self._manager is None or not (s.manager_model or model):
            return done
        async with self._service.store.sessions() as session:
            found = [k for k in await fresh_keys(session.execute, user_id, since)
                     if CONTEXT_MARK not in k.key]  # given its context already  # fmt: skip
        usage = RunUsage()
        unusable = 0  # answers in a row that fit no output mode
        for _, grouped in groupby(found, key=lambda k: k.created_at):
            group = list(grouped)
            if done.gave_up:
                break
            if done.groups >= GROUPS or time.monotonic() > deadline \
                    or usage.output_tokens >= s.manager_job_max_tokens:  # fmt: skip
                done.stopped_at = group[0].seq - 1
                break
            done.groups += 1
            try:
                async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                    context = await self._ask(group, model, usage)
            except TimeoutError:
                if done.groups > 1:  # asked again by the next idle job
                    done.stopped_at = group[0].seq - 1
                    break
                context = None  # the first: passed over, or no run would get on
            except ManagerAnswerUnusable as exc:  # the group keeps its key
                logger.info("job %s: enrichment: no usable answer: %s", job_id, exc)
                unusable += 1
                if unusable >= UNUSABLE_IN_A_ROW:
                    logger.info("job %s: enrichment asks no more: %d answers in a row "
                                "unusable", job_id, unusable)  # fmt: skip
                    done.gave_up = True
                done.refused += 1
                continue
            except ManagerUnavailable as exc:
                # asked again by the next idle job (after the user's quiet time)
                logger.info("job %s: enrichment stops: %s", job_id, exc)
                done.stopped_at, done.unreachable = group[0].seq - 1, True
                break
            unusable = 0
            if context is None:
                done.refused += 1
                continue
            keys = [with_context(k.key, context) for k in group]
            embedded = await embed_for_store(self._service.embedder, keys)
            async with held_unit(self._service, user_id, job_id, holds) as w:
                done.memories += await rekeyed(
                    w,
                    [
                        (k, key, e.embedding, e.model)
                        for k, key, e in zip(group, keys, embedded, strict=True)
                    ],
                )
        return done

    async def _ask(self, group: Sequence[Keyed], model: str, usage: RunUsage) -> str | None:
        """The group's context sentence, or None when the answer is not one to keep."""
        assert self._manager is not None
        keys = [plain_key(k.key) for k in group]
        prompt = context_prompt(group[0].observed_at, keys)
        answer = await self._manager.ask(model, Context, INSTRUCTIONS, prompt, usage=usage,
                                         max_tokens=ANSWER_TOKENS)  # fmt: skip
        return kept_context(answer.context, group[0].observed_at, keys)


def context_prompt(day: datetime, texts: Sequence[str]) -> str:
    """What the model is shown of one group: its day, and its memories' words."""
    lines = [f"- {' '.join(t.split())[:600]}" for t in texts[:MEMORIES]]
    return f"Day: {day.strftime('%d %B %Y')}\n" + "\n".join(lines)


def kept_context(answer: str, day: datetime, texts: Sequence[str]) -> str | None:
    """The model's context sentence, when it is one to keep (the module docstring): its first
    sentence (a small model goes on to retell everything, measured)."""
    text = _FIRST_SENTENCE.split(" ".join(answer.split()), maxsplit=1)[0]
    words = [*texts, day.strftime("%d %B %Y"), "the user"]
    if not text or len(text) > CONTEXT_CHARS or not grounded(text, words, allowed=NEW_WORDS):
        return None
    return text
