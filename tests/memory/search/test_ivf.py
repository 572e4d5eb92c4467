"""The approximate vector index (app/memory/search/ivf.py): adopted from a snapshot with the
changes made meanwhile, it holds exactly what the exhaustive index holds; probing every list it
finds what the exhaustive scan finds; it goes into the index image and comes back; a user's
index becomes approximate past MEMPROXY_INDEX_IVF_MIN_VECTORS, in the background."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.config import Settings
from app.memory.search import upkeep as upkeep_module
from app.memory.search.dense import VectorIndex
from app.memory.search.ivf import build_ivf, nprobe_for
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from tests.fakes import FakeEmbedder
from tests.memory.search.test_recall_index import ranking, sentences

DIM = 16


def vectors(rng: np.random.Generator, parts: int) -> np.ndarray:
    out = rng.standard_normal((parts, DIM)).astype(np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def filled(rng: np.random.Generator, keys: range) -> tuple[VectorIndex, dict[int, np.ndarray]]:
    index = VectorIndex(DIM)
    held = {k: vectors(rng, int(rng.integers(1, 4))) for k in keys}
    index.add(list(held), list(held.values()))
    return index, held


def same_answers(a: VectorIndex, b: VectorIndex, rng: np.random.Generator) -> None:
    for _ in range(20):
        query = vectors(rng, 1)[0]
        ka, sa = a.search(query, 30)
        kb, sb = b.search(query, 30)
        assert ka.tolist() == kb.tolist()
        assert np.allclose(sa, sb, atol=1e-6)
        assert np.allclose(a.similarity(query, ka[::-1]), b.similarity(query, ka[::-1]), atol=1e-6)


def test_an_adopted_ivf_holds_the_changes_made_while_it_was_trained() -> None:
    rng = np.random.default_rng(3)
    index, held = filled(rng, range(1, 1201))
    ids, matrix = index.snapshot()
    ivf = build_ivf(DIM, ids, matrix)
    # meanwhile: new memories, replaced ones (another count of parts), removed ones
    new = {k: vectors(rng, 2) for k in range(5000, 5040)}
    replaced = {k: vectors(rng, 3) for k in range(1, 30)}
    index.add(list(new), list(new.values()))
    index.add(list(replaced), list(replaced.values()))
    index.remove([*range(100, 160), 5001])
    index.adopt(ivf, len(ids))
    assert index.approximate and index.trained_at == len(ids)

    expected = VectorIndex(DIM)
    now = held | new | replaced
    for k in [*range(100, 160), 5001]:
        now.pop(k)
    expected.add(list(now), list(now.values()))
    assert len(index) == len(expected) and index.vectors == expected.vectors
    ivf.nprobe = ivf.nlist  # every list: what the exhaustive scan finds
    same_answers(index, expected, rng)

    # and changed in place afterwards, as any index is
    index.remove([1, 2, 3])
    expected.remove([1, 2, 3])
    extra = {7000: vectors(rng, 2)}
    index.add(list(extra), list(extra.values()))
    expected.add(list(extra), list(extra.values()))
    same_answers(index, expected, rng)


def test_an_ivf_goes_into_the_image_and_comes_back() -> None:
    rng = np.random.default_rng(4)
    index, _ = filled(rng, range(1, 900))
    ids, matrix = index.snapshot()
    index.adopt(build_ivf(DIM, ids, matrix), len(ids))
    grown = {k: vectors(rng, 2) for k in range(2000, 3000)}
    index.add(list(grown), list(grown.values()))  # grown since its training
    restored = VectorIndex.restore(DIM, index.export())
    assert restored.approximate and restored.trained_at == len(ids) < restored.vectors
    same_answers(index, restored, rng)
    restored.remove([5, 6])
    assert len(restored) == len(index) - 2
    restored.exhaustive()  # no longer wanted: every vector searched again, the same ones
    assert not restored.approximate and restored.trained_at == 0
    index.remove([5, 6])
    ivf: Any = index._index
    ivf.nprobe = ivf.nlist  # every list: what the exhaustive scan finds
    same_answers(restored, index, rng)


def test_a_search_probes_a_quarter_of_the_lists_and_at_least_eight() -> None:
    assert [nprobe_for(n) for n in (5, 8, 40, 316, 1000)] == [5, 8, 10, 79, 250]


async def test_a_large_users_index_becomes_approximate_in_the_background(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upkeep_module, "IMAGE_EVERY_SECONDS", 0.0)
    memory = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        ivf_min_vectors=300,
        image_min_memories=100,
    )
    texts = sentences(400)
    await memory.add("ann", [NewMemory(t) for t in texts])
    exhaustive_first = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        image_min_memories=100,
    )
    await exhaustive_first.cache.get("ann")
    await exhaustive_first.cache.settled()
    assert await exhaustive_first.store.image("ann") is not None
    await memory.add("bob", [NewMemory(t) for t in texts[:100]])
    exhaustive = await ranking(MemoryService(MemoryStore(engine), FakeEmbedder()), "ann", ["cello"])  # type: ignore[arg-type]
    entry = await memory.cache.get("ann")
    await memory.cache.settled()
    assert entry.vectors.approximate and memory.cache.upkeep.trainings == 1
    assert not (await memory.cache.get("bob")).vectors.approximate  # below the minimum
    found = await ranking(memory, "ann", ["cello"])
    assert found[0][:3] == exhaustive[0][:3]

    # its image holds the approximate index (also when an image of the exhaustive one, of the
    # same memories, was stored before it): a new process does not train again
    again = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        ivf_min_vectors=300,
        image_min_memories=100,
    )
    restored = await again.cache.get("ann")
    await again.cache.settled()
    assert again.cache.upkeep.restores == 1 and restored.vectors.approximate
    assert again.cache.upkeep.trainings == 0

    # the setting turned off since: the image's IVF is searched exhaustively again
    off = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        image_min_memories=100,
    )
    assert not (await off.cache.get("ann")).vectors.approximate
    assert off.cache.upkeep.restores == 1
    assert await ranking(off, "ann", ["cello"]) == exhaustive


async def test_a_tiny_index_is_never_approximate(engine: AsyncEngine) -> None:
    memory = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        ivf_min_vectors=1,
    )
    await memory.add("ann", [NewMemory(t) for t in sentences(100)])
    entry = await memory.cache.get("ann")
    await memory.cache.settled()
    assert entry.vectors.vectors < 256 and not entry.vectors.approximate
    assert memory.cache.upkeep.trainings == 0


async def test_changes_made_while_it_trains_reach_the_approximate_index(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Memories added, changed and deleted (in place) while the IVF is trained in its thread
    are in it once adopted: probing every list, it ranks as an exhaustive index built anew."""
    gate = threading.Event()
    real = upkeep_module.build_ivf

    def held(*args: Any, **kw: Any) -> Any:
        assert gate.wait(10)
        return real(*args, **kw)

    monkeypatch.setattr(upkeep_module, "build_ivf", held)
    memory = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(),  # type: ignore[arg-type]
        ivf_min_vectors=300,
    )
    await memory.add("ann", [NewMemory(t) for t in sentences(400)])
    entry = await memory.cache.get("ann")  # its training starts, and waits for the gate
    assert not entry.vectors.approximate
    await memory.add("ann", [NewMemory(f"zebra {t}") for t in sentences(20, seed=5)])
    found = await memory.search("ann", "cello violin", limit=6, min_score=0)
    await memory.update("ann", found[0].memory.id, content="a zebra in Lyon. It sings.")
    await memory.delete("ann", [f.memory.id for f in found[1:]])
    assert memory.cache.cached("ann") is entry and entry.version == (
        await memory.store.version("ann")
    )  # all of it applied in place, while the training waits
    gate.set()
    await memory.cache.settled()
    assert entry.vectors.approximate and memory.cache.upkeep.trainings == 1
    ivf: Any = entry.vectors._index
    ivf.nprobe = ivf.nlist
    queries = ["zebra", "cello violin", "lyon sings", "kayak coffee"]
    fresh = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    assert await ranking(memory, "ann", queries) == await ranking(fresh, "ann", queries)


async def test_by_default_a_users_index_of_50000_vectors_is_made_approximate(
    make_client: Any,
) -> None:
    """Measured among ~58,000 vectors of one life (docs/performance.md), the IVF is on from
    50,000 vectors by default: the app's index cache is given that, and decides by it."""
    client = await make_client()
    upkeep = client._transport.app.state.services.memory.cache.upkeep
    assert upkeep.ivf_min == Settings().index_ivf_min_vectors == 50_000

    def sized(vectors: int) -> Any:
        return SimpleNamespace(vectors=SimpleNamespace(vectors=vectors))

    assert not upkeep_module._approximate(sized(49_999), upkeep.ivf_min)
    assert upkeep_module._approximate(sized(50_000), upkeep.ivf_min)
    off = await make_client(index_ivf_min_vectors=0)
    off_upkeep = off._transport.app.state.services.memory.cache.upkeep
    assert not upkeep_module._approximate(sized(10**7), off_upkeep.ivf_min)
