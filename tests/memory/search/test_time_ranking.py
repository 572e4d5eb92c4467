"""Recall favours what was said, or is dated, when the query says (issue 25, point 5), and
ranks a query that names no time exactly as the fused score alone does."""

from __future__ import annotations

from datetime import UTC, date, datetime, time

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

import app.memory.search.ranking
from app.memory.search.when import TIME_BONUS, asked_times
from app.memory.service import Found, MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests.fakes import FakeEmbedder

TODAY = date(2026, 11, 24)
MAY = datetime(2026, 5, 16, 18, tzinfo=UTC)
SEPTEMBER = datetime(2026, 9, 12, 10, tzinfo=UTC)


def _untimed(monkeypatch: pytest.MonkeyPatch) -> None:
    """Search as if no query named a time (the rule off)."""
    monkeypatch.setattr(app.memory.search.ranking, "asked_times", lambda text, today: ())


async def _store(engine: AsyncEngine) -> MemoryService:
    memory = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    await memory.add("ann", [
        NewMemory("Went hiking in the Alps", observed_at=MAY),
        NewMemory("Lives in Lyon", observed_at=MAY),
        NewMemory("Went hiking in the Vosges", observed_at=SEPTEMBER),  # the same, later
        NewMemory("Went hiking in the Jura on 30 May 2026", observed_at=SEPTEMBER),
        NewMemory("Plays the cello", observed_at=SEPTEMBER),
        NewMemory("Cooked a risotto for lunch", observed_at=datetime.combine(TODAY, time(9), UTC)),
    ])  # fmt: skip
    return memory


def _fused(found: Found) -> float:
    return 0.5 * max(found.hit.dense, 0.0) + 0.5 * found.hit.lexical


async def _search(memory: MemoryService, query: str) -> list[Found]:
    asked = datetime.combine(TODAY, time(12), UTC)  # the request's time: "last May" is read from it
    return await memory.search("ann", query, limit=10, min_score=0.0, now=asked)


async def test_what_did_i_do_last_may_ranks_the_may_memories_first(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    memory = await _store(engine)
    query = "Where did I go hiking last May?"
    found = await _search(memory, query)
    timed = [f.memory.content for f in found]
    assert timed.index("Went hiking in the Alps") < timed.index("Went hiking in the Vosges")
    assert {f.memory.content for f in found[:2]} == {
        "Went hiking in the Alps",  # said in May
        "Went hiking in the Jura on 30 May 2026",  # said later, of a day in May
    }
    for f in found:
        in_may = (
            "Alps" in f.memory.content or "May" in f.memory.content or "Lyon" in f.memory.content
        )
        bonus = TIME_BONUS if in_may else 0.0
        assert f.hit.score == pytest.approx(min(1.0, _fused(f) + bonus), abs=1e-6)
    _untimed(monkeypatch)
    untimed = [f.memory.content for f in await _search(memory, query)]
    # without the rule, of the two alike, the later one first ("May" is a word of the Jura's)
    assert untimed.index("Went hiking in the Vosges") < untimed.index("Went hiking in the Alps")


@pytest.mark.parametrize("query", [
    "Where did I go hiking?", "What instrument do I play?",
    # the present is no time to favour: everything said today would be lifted
    "What should I cook tonight?", "Where should I go hiking this week?",
    "What do I play this year?",
])  # fmt: skip
async def test_a_query_that_names_no_time_ranks_as_the_fused_score_alone(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, query: str
) -> None:
    memory = await _store(engine)
    found = await _search(memory, query)
    assert asked_times(query, TODAY) == ()
    _untimed(monkeypatch)
    before = [(f.memory.id, f.hit.score) for f in await _search(memory, query)]
    assert [(f.memory.id, f.hit.score) for f in found] == before  # identical, not just close
    for f in found:
        assert f.hit.score == pytest.approx(_fused(f), abs=1e-6)
