"""Contextual enrichment at idle time (issue 27, point 3): off unless MEMPROXY_ENRICHMENT; on, an
exchange's new facts and episodes get the model's sentence of context in what they are found by
(BM25 and dense), never in their words; a sentence that is not the memories' words is refused;
a memory enriched again gets the new sentence in place of the old; words that change drop it."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import httpx
import numpy as np
import pytest
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker

from app.memory.learning.applier import JobGone
from app.memory.learning.enrichment import Enrichment
from app.memory.learning.manager import Manager
from app.memory.search.parts import CONTEXT_MARK, decode, plain_key, with_context
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import Memory, MemoryType
from app.memory.store.unit import Writer
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided

SAID = datetime(2026, 2, 3, 18, 0, tzinfo=UTC)
STUDIO = "On 03 February 2026 the user talked about a class at the pottery studio."


class Writes:
    def __init__(self, context: str) -> None:
        self.context = context
        self.prompts: list[str] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        self.prompts.append(str(request.parts[-1].content))  # type: ignore[union-attr]
        return decided(info, {"context": self.context})


def enrichment(engine: AsyncEngine, context: str = STUDIO, **options: Any) -> tuple[
    Enrichment, Writes, MemoryService
]:  # fmt: skip
    settings = make_settings(**{"enrichment": True, **options})
    model = Writes(context)
    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(model))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    return Enrichment(service, manager, settings), model, service


async def exchange(service: MemoryService, user: str) -> tuple[str, str]:
    written = await service.add(user, [
        NewMemory("I signed up for a class at the pottery studio.", type=MemoryType.EPISODE,
                  observed_at=SAID),
        NewMemory("Signed up for a class.", observed_at=SAID),
    ])  # fmt: skip
    episode, fact = written.records
    return episode.id, fact.id


async def keys(engine: AsyncEngine) -> dict[str, str | None]:
    async with async_sessionmaker(engine)() as session:
        rows = await session.execute(select(Memory.content, Memory.index_text))
        return {c: k for c, k in rows}


async def lexical(service: MemoryService, query: str) -> dict[str, float]:
    """The BM25 part of the score of each of ann's memories for `query`."""
    found = await service.search("ann", query, limit=10, min_score=0.0)
    return {f.memory.content: f.hit.lexical for f in found}


def later() -> float:
    return time.monotonic() + 60


async def test_an_exchange_is_found_by_its_context_and_shown_in_its_words(
    engine: AsyncEngine,
) -> None:
    enrich, model, service = enrichment(engine)
    await exchange(service, "ann")
    before = await lexical(service, "studio")
    done = await enrich.run("ann", since=0, model="m", job_id="idle-x", deadline=later())
    assert (done.groups, done.memories, done.refused) == (1, 2, 0)
    assert model.prompts == ["Day: 03 February 2026\n"
                             "- I signed up for a class at the pottery studio.\n"
                             "- Signed up for a class."]  # fmt: skip
    assert await keys(engine) == {
        "I signed up for a class at the pottery studio.":
            f"I signed up for a class at the pottery studio.{CONTEXT_MARK}{STUDIO}",
        "Signed up for a class.": f"Signed up for a class.{CONTEXT_MARK}{STUDIO}",
    }  # fmt: skip
    fresh = MemoryService(service.store, FakeEmbedder())  # another process: read from the store
    after = await lexical(fresh, "studio")
    fact = "Signed up for a class."
    assert after[fact] > 2 * before[fact]  # found by its context ("studio"); shown in its words
    assert all(CONTEXT_MARK not in f.memory.content
               for f in await fresh.search("ann", "studio", limit=10, min_score=0.0))  # fmt: skip
    # once: a memory given its context is not given one again (a resumed run reads it again)
    again = await enrich.run("ann", since=0, model="m", job_id="idle-y", deadline=later())
    assert again.groups == 0 and len(model.prompts) == 1


async def test_an_enriched_memory_embedded_again_by_a_new_model_keeps_its_context_part(
    engine: AsyncEngine,
) -> None:
    """After a change of embedding model, a search embeds the user's memories again from their
    keys: an enriched one gets its words' vectors and then its context's, as enrichment wrote."""
    enrich, _, service = enrichment(engine)
    await exchange(service, "ann")
    await enrich.run("ann", since=0, model="m", job_id="idle-x", deadline=later())
    other = FakeEmbedder("fake-bow-64-v2")
    await MemoryService(service.store, other).search("ann", "pottery", limit=5, min_score=0.0)
    async with async_sessionmaker(engine)() as session:
        rows = (await session.execute(select(Memory.content, Memory.embedding_model,
                                             Memory.embedding))).all()  # fmt: skip
    for content, model, stored in rows:
        assert model is not None and model.startswith("fake-bow-64-v2/")
        vectors = decode(stored, other.dim)
        assert np.allclose(vectors[0], other.vector(content))
        assert np.allclose(vectors[-1], other.vector(STUDIO)) and len(vectors) == 2


async def test_off_by_default_and_without_a_model(engine: AsyncEngine) -> None:
    enrich, model, service = enrichment(engine, enrichment=False)
    await exchange(service, "ann")
    assert (await enrich.run("ann", since=0, model="m", job_id="j", deadline=later())).groups == 0
    enrich, model, service = enrichment(engine)
    assert (await enrich.run("ann", since=0, model="", job_id="j", deadline=later())).groups == 0
    assert model.prompts == []


@pytest.mark.parametrize(
    "context",
    [
        "On 03 February 2026 the user flew to Tokyo to meet their sister and climb Mount Fuji.",
        "",
        "x " * 200,
    ],
    ids=["not-their-words", "empty", "too-long"],
)
async def test_a_context_the_checks_refuse_changes_nothing(
    engine: AsyncEngine, context: str
) -> None:
    enrich, _, service = enrichment(engine, context=context)
    await exchange(service, "ann")
    done = await enrich.run("ann", since=0, model="m", job_id="j", deadline=later())
    assert (done.refused, done.memories) == (1, 0)
    assert set((await keys(engine)).values()) == {None}


async def test_a_new_context_replaces_the_old_and_new_words_drop_it(engine: AsyncEngine) -> None:
    assert with_context(f"words{CONTEXT_MARK}old", "new") == f"words{CONTEXT_MARK}new"
    assert plain_key(f"words{CONTEXT_MARK}old") == "words"
    enrich, _, service = enrichment(engine)
    _, fact = await exchange(service, "ann")
    await enrich.run("ann", since=0, model="m", job_id="j", deadline=later())
    await service.update("ann", fact, content="Signed up for a class at the studio.")
    assert (await keys(engine))["Signed up for a class at the studio."] is None


async def test_a_bound_stops_and_a_lost_job_writes_nothing(engine: AsyncEngine) -> None:
    enrich, _, service = enrichment(engine)
    await exchange(service, "ann")
    past = await enrich.run("ann", since=0, model="m", job_id="j", deadline=time.monotonic() - 1)
    assert past.groups == 0 and past.stopped_at is not None

    async def lost(w: Writer) -> bool:
        return False

    with pytest.raises(JobGone):
        await enrich.run("ann", since=0, model="m", job_id="j", deadline=later(), holds=lost)
    assert set((await keys(engine)).values()) == {None}


async def test_a_model_that_cannot_be_reached_stops_the_run_for_later(engine: AsyncEngine) -> None:
    settings = make_settings(enrichment=True)

    def down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise TimeoutError  # as a job's time bound ends a call: unavailable

    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(down))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    enrich = Enrichment(service, manager, settings)
    await exchange(service, "ann")
    done = await enrich.run("ann", since=0, model="m", job_id="j", deadline=later())
    assert done.stopped_at == 0 and done.memories == 0


@pytest.mark.parametrize("usable", [(), (3,)])
async def test_a_model_whose_answers_are_unusable_three_times_in_a_row_is_asked_no_more(
    engine: AsyncEngine, usable: tuple[int, ...]
) -> None:
    """The rest keep their keys and are not left for the next idle job; a usable answer starts
    the count again."""
    settings = make_settings(enrichment=True, manager_max_retries=0)
    questions: dict[str, None] = {}

    def babble(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        request = next(m for m in messages if isinstance(m, ModelRequest))
        questions.setdefault(str(request.parts[-1].content))  # type: ignore[union-attr]
        if len(questions) in usable:
            return decided(info, {"context": STUDIO})
        return decided(info, {"context": ["not", "a", "sentence"]})

    manager = Manager(settings, http_client=httpx.AsyncClient(), model=FunctionModel(babble))
    service = MemoryService(MemoryStore(engine), FakeEmbedder())
    enrich = Enrichment(service, manager, settings)
    for n in range(8):  # eight exchanges, one unit of memories each
        await service.add("ann", [NewMemory(f"I signed up for class {n} at the pottery studio.",
                                            observed_at=SAID)])  # fmt: skip
    done = await enrich.run("ann", since=0, model="m", job_id="j", deadline=later())
    assert done.gave_up and done.stopped_at is None
    assert done.groups == len(questions) == max(usable, default=0) + 3
    assert done.refused == done.groups - len(usable) and done.memories == len(usable)
    assert sum(k is not None for k in (await keys(engine)).values()) == len(usable)
