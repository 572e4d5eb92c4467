"""The search indexes as a cache of the store: rebuilt from SQLite they rank the same; another
process's writes reach them; restarts and model changes lose nothing; the LRU stays bounded."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search import bm25_scores
from app.memory.search.lexical import Analyzer, LexicalIndex
from app.memory.search.parts import decode
from app.memory.search.ranked import Hit, Ranked
from app.memory.service import MemoryService
from app.memory.store.db import create_engine, upgrade
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests import databases
from tests.fakes import FakeEmbedder

WORDS = ("violin garden roses nurse oslo ramen hiking beagle chess cello lyon paris piano "
         "marathon sushi tennis python coffee tea novel painting camping kayak").split()  # fmt: skip


def sentences(count: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 9))) for _ in range(count)]


def service(engine: AsyncEngine, embedder: FakeEmbedder | None = None, **kw: int) -> MemoryService:
    return MemoryService(MemoryStore(engine), embedder or FakeEmbedder(), **kw)  # type: ignore[arg-type]


async def ranking(
    memory: MemoryService, user: str, queries: list[str]
) -> list[list[tuple[str, float]]]:
    out = []
    for query in queries:
        found = await memory.search(user, query, limit=20, min_score=0.0)
        out.append([(f.memory.id, round(f.hit.score, 5)) for f in found])
    return out


async def test_rebuilt_from_sqlite_the_index_ranks_the_same(engine: AsyncEngine) -> None:
    memory = service(engine)
    texts = sentences(300)
    records = (await memory.add("ann", [NewMemory(t) for t in texts])).records
    await memory.search("ann", "warm up", limit=1, min_score=0)  # build, then change in place
    for record in records[:40]:
        await memory.update("ann", record.id, content=record.content + " kayak")
    await memory.delete("ann", [r.id for r in records[40:90]])
    await memory.add("ann", [NewMemory(t) for t in sentences(30, seed=9)])
    queries = [
        "violin and garden",
        "kayak camping trip",
        "coffee",
        "nothing matches zzz",
        "oslo nurse tea",
    ]
    incremental = await ranking(memory, "ann", queries)
    assert any(len(r) == 20 for r in incremental)
    loads = memory.cache.loads

    memory.cache.forget()
    rebuilt = await ranking(memory, "ann", queries)
    assert memory.cache.loads == loads + 1 and rebuilt == incremental
    assert await ranking(service(engine), "ann", queries) == incremental  # a fresh process too


async def test_another_processs_writes_reach_this_processs_index(tmp_path: Path) -> None:
    """Two app processes on one database file: A writes, B's warm cache catches up."""
    url = databases.url_in(tmp_path, "shared.db")
    engine_a, engine_b = create_engine(url), create_engine(url)
    await upgrade(engine_a)
    a, b = service(engine_a), service(engine_b)
    (first,) = (await a.add("ann", [NewMemory("my cello teacher lives in Lyon")])).records
    assert [f.memory.id for f in await b.search("ann", "cello", limit=5, min_score=0.1)] == [
        first.id
    ]

    (second,) = (await a.add("ann", [NewMemory("weekend kayak trips on the fjord")])).records
    assert [f.memory.id for f in await b.search("ann", "kayak fjord", limit=5, min_score=0.1)] == [
        second.id
    ]
    await a.update("ann", first.id, content="my piano teacher lives in Paris")
    assert await b.search("ann", "cello Lyon", limit=5, min_score=0.1) == []
    assert [f.memory.id for f in await b.search("ann", "piano", limit=5, min_score=0.1)] == [
        first.id
    ]
    await a.delete("ann", [second.id])
    assert await b.search("ann", "kayak fjord", limit=5, min_score=0.1) == []
    entry = b.cache.cached("ann")
    assert entry is not None and len(entry) == 1 and entry.version == await b.store.version("ann")
    await engine_a.dispose()
    await engine_b.dispose()


async def test_catch_up_reads_only_what_changed(engine: AsyncEngine) -> None:
    a, b = service(engine), service(engine)
    await a.add("ann", [NewMemory(t) for t in sentences(200)])
    await b.search("ann", "violin", limit=5, min_score=0)
    await a.add("ann", [NewMemory("one brand new memory about tennis")])
    read: list[int] = []
    original = b.store.snapshot

    async def counting(user_id: str, *, since: int = -1):  # type: ignore[no-untyped-def]
        snapshot = await original(user_id, since=since)
        read.append(len(snapshot.rows))
        return snapshot

    b.store.snapshot = counting  # type: ignore[method-assign]
    found = await b.search("ann", "brand new tennis", limit=1, min_score=0)
    assert found[0].memory.content == "one brand new memory about tennis" and read == [1]


async def test_memories_and_their_ranking_survive_a_restart(tmp_path: Path) -> None:
    url = databases.url_in(tmp_path, "keep.db")
    engine = create_engine(url)
    await upgrade(engine)
    memory = service(engine)
    await memory.add("ann", [NewMemory(t) for t in sentences(120)])
    before = await ranking(memory, "ann", ["violin garden", "sushi"])
    await engine.dispose()

    engine = create_engine(url)
    await upgrade(engine)
    restarted = service(engine)
    assert (await restarted.page("ann"))[1] == 120
    assert await ranking(restarted, "ann", ["violin garden", "sushi"]) == before
    await engine.dispose()


async def test_a_new_embedding_model_re_embeds_and_stores_the_vectors(engine: AsyncEngine) -> None:
    old = service(engine, FakeEmbedder("model-a"))
    records = (await old.add("ann", [NewMemory(t) for t in sentences(70)])).records
    assert {r.embedding_model for r in records} == {"model-a/parts-v1"}

    embedder = FakeEmbedder("model-b")
    new = service(engine, embedder)
    found = await new.search("ann", records[0].content, limit=1, min_score=0)
    assert found[0].memory.id == records[0].id
    embedded = sum(len(c) for c in embedder.calls)
    assert embedded == 70 + 1  # every memory once, in batches, and the query
    stored = await new.store.get("ann", records[5].id)
    assert stored is not None and stored.embedding_model == "model-b/parts-v1"
    assert np.allclose(decode(stored.embedding or b"", 64), [embedder.vector(records[5].content)])
    new.cache.forget()
    embedder.calls.clear()
    await new.search("ann", "violin", limit=1, min_score=0)
    assert embedder.calls == [["violin"]]  # vectors now come from the store


async def test_cache_is_bounded_by_memories_held(engine: AsyncEngine) -> None:
    memory = service(engine, cache_max_memories=100)
    for user in ("u1", "u2", "u3"):
        await memory.add(user, [NewMemory(t) for t in sentences(40)])
        await memory.search(user, "violin", limit=1, min_score=0)
    assert memory.cache.memories_cached <= 100
    assert memory.cache.cached("u1") is None and memory.cache.cached("u3") is not None
    await memory.search("u1", "violin", limit=1, min_score=0)  # evicted users come back
    assert memory.cache.cached("u1") is not None and memory.cache.cached("u2") is None


async def test_concurrent_writes_and_searches_leave_index_and_store_equal(
    engine: AsyncEngine,
) -> None:
    memory = service(engine)
    await memory.add("ann", [NewMemory(t) for t in sentences(50)])

    async def writer(i: int) -> None:
        written = (await memory.add("ann", [NewMemory(f"note {i} about chess")])).records
        if i % 3 == 0:
            await memory.delete("ann", [written[0].id])
        elif i % 3 == 1:
            await memory.update("ann", written[0].id, content=f"note {i} about tennis")

    async def reader() -> None:
        await memory.search("ann", "chess tennis", limit=10, min_score=0)

    await asyncio.gather(*(writer(i) for i in range(30)), *(reader() for _ in range(30)))
    await memory.search("ann", "chess", limit=1, min_score=0)
    entry = memory.cache.cached("ann")
    assert entry is not None
    assert set(entry.briefs) == await memory.store.keys("ann") and len(entry.vectors) == len(entry)
    final = await ranking(memory, "ann", ["chess", "tennis"])
    memory.cache.forget()
    assert await ranking(memory, "ann", ["chess", "tennis"]) == final


def test_bm25_stems_drops_question_words_and_normalises() -> None:
    index = LexicalIndex(Analyzer())
    index.add(1, "Caroline went to the LGBTQ support group yesterday")
    index.add(2, "Melanie painted a sunrise over the lake")
    index.add(3, "We went camping and painting by the lake")
    by_key = index.scores("When did Melanie paint the sunrise?").items()
    assert set(by_key) == {2, 3} and by_key[2] > by_key[3]  # "paint" finds "painted"/"painting"
    assert all(0 < s < 1 for s in by_key.values())
    assert Analyzer().query_terms("What did you say about it?") == []
    assert index.scores("when did").items() == {}  # only question words: nothing to match
    scores = index.scores("lake")
    lake = scores.items()
    assert np.allclose(scores.of(np.array([3, 1, 99])), [lake[3], 0, 0])
    assert set(scores.top(5).tolist()) == {2, 3}
    (best,) = scores.top(1).tolist()
    assert lake[best] == max(lake.values())

    index.remove(2)
    index.add(3, "replaced text about sushi")
    index.add(4, "a lake again, in the slot 2 left")  # slots are reused
    assert index.scores("Melanie sunrise").items() == {}
    assert set(index.scores("sushi").items()) == {3} and len(index) == 3
    assert set(index.scores("lake").items()) == {4}
    for key in range(10, 200):  # the slot arrays grow
        index.add(key, f"note number {key} about kayaks")
    assert len(index.scores("kayaks").items()) == 190 and len(index.scores("kayaks").top(7)) == 7


@pytest.mark.parametrize("few", [True, False])
def test_the_matches_read_from_the_postings_are_every_slot_scoring(
    few: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A query's matches are read from its words' postings (sorted when few, marked in a mask
    of the slots when many), not by a pass over every slot's score: the same slots, in order,
    each once; the same keys, scores and best (freed and reused slots too)."""
    monkeypatch.setattr(bm25_scores, "FEW_POSTINGS", 0 if few else 10**9)
    index = LexicalIndex(Analyzer())
    for key in range(1, 601):
        words = [w for n, w in ((97, "zeppelins"), (5, "kayaks"), (7, "lanterns")) if key % n == 0]
        said = [" and ".join(words) or "tea"] * (1 + key % 3)  # counts of 1 to 3
        index.add(key, f"note {key} about " + " ".join(said))
    index.remove(194)
    index.add(700, "the zeppelin's slot reused by kayaks")  # 97 * 2's slot, now another's
    queries = {"zeppelin kayak": 125, "lantern kayak": 189, "kayak lantern zeppelin": 193}
    for query, count in {**queries, "note about tea": 599, "nothing held": 0}.items():
        scores = index.scores(query)
        every = np.flatnonzero(scores._by_slot)
        assert np.array_equal(scores._matched(), every)
        expected = dict(
            zip(index._keys[every].tolist(), scores._by_slot[every].tolist(), strict=True)
        )
        assert scores.items() == expected and len(expected) == count
        best = sorted(expected.values(), reverse=True)[:3]  # (ties: any of them)
        assert sorted((expected[k] for k in scores.top(3).tolist()), reverse=True) == best
    assert 700 in index.scores("zeppelin").items() and 194 not in index.scores("zeppelin").items()


def test_a_query_word_no_memory_holds_counts_against_the_match() -> None:
    index = LexicalIndex(Analyzer())
    index.add(1, "Having people who back you makes such a huge difference")
    index.add(2, "Volunteering at the youth center on Saturdays")
    index.add(3, "Learning the difference between oil and acrylic paint")
    alone = index.scores("difference").items()
    # "tcp" and "udp" are in no memory: the memories that say "difference" answer a third of it
    asked = index.scores("What is the difference between TCP and UDP?").items()
    assert set(asked) == {1, 3}
    for key, score in asked.items():
        assert score == pytest.approx(alone[key] / 3)
    # the Manager's search (a whole exchange for a query) keeps the ceiling over the held words
    terms = index.analyzer.query_terms("What is the difference between TCP and UDP?")
    assert index.score_terms(terms, held_only=True).items() == pytest.approx(alone)
    # every word held: scored as before (the unknown words weigh as the rarest known one)
    assert index.scores("difference oil acrylic").items()[3] > 2 * asked[3]


async def test_hits_are_made_only_for_what_a_search_may_return(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """~100 candidates are ranked; a search makes hits for its limit, a chat's recall for those
    above its threshold (the choice reads them all), and they are the best of the ranking."""
    memory = service(engine)
    await memory.add("ann", [NewMemory(text) for text in sentences(120)])
    made: list[int] = []
    hits = Ranked.hits

    def counted(self: Ranked, positions: np.ndarray) -> list[Hit]:
        made.append(len(positions))
        found = hits(self, positions)
        assert [h.score for h in found] == sorted((h.score for h in found), reverse=True)
        return found

    monkeypatch.setattr(Ranked, "hits", counted)
    everything = await memory.search("ann", "violin chess tennis", limit=100, min_score=0.0)
    assert made == [len(everything)] and len(everything) > 20
    made.clear()
    best = await memory.search("ann", "violin chess tennis", limit=3, min_score=0.0)
    assert made == [3] and [f.hit for f in best] == [f.hit for f in everything[:3]]
    edge = everything[5].hit.score + 1e-9  # above that score, though not in float32
    assert all(f.hit.score >= edge for f in await memory.search("ann", "violin chess tennis",
                                                                limit=100, min_score=edge))  # fmt: skip
    made.clear()
    threshold = everything[10].hit.score
    recalled = await memory.recall(
        "ann", "violin chess tennis", limit=3, min_score=threshold, budget_tokens=10_000
    )
    above = [f.hit for f in everything if f.hit.score >= threshold]
    assert made == [len(above)] and recalled.hits == above[:3] and recalled.relevant == len(above)
