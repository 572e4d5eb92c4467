"""Index images (app/memory/search/image.py, app/memory/store/images.py): a process that loads a
user's image searches exactly as one that built the index from the memories, also when the image
is stale (caught up first), changed in place after, of another model, or damaged; images go with
their user; a first build lets other work run."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

import numpy as np
import pytest
from sqlalchemy import update
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.search import cache as cache_module
from app.memory.search import image
from app.memory.search import upkeep as upkeep_module
from app.memory.search.lexical import Analyzer
from app.memory.search.parts import vector_model
from app.memory.search.user_index import UserIndex
from app.memory.service import MemoryService
from app.memory.store import images as images_module
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from app.memory.store.tables import IndexImage, MemoryType
from tests.fakes import FakeEmbedder
from tests.memory.search.test_recall_index import ranking, sentences

QUERIES = ["violin and garden", "kayak camping trip", "coffee", "nothing zzz", "oslo nurse tea"]


_MADE: list[MemoryService] = []


def service(engine: AsyncEngine, model: str = "fake-bow-64", images: int = 1) -> MemoryService:
    made = MemoryService(
        MemoryStore(engine),
        FakeEmbedder(model),  # type: ignore[arg-type]
        image_min_memories=images,
    )
    _MADE.append(made)
    return made


@pytest.fixture(autouse=True)
async def _settled() -> AsyncIterator[None]:
    """No image write of a test's services left running once it ends (its connection with it)."""
    yield
    while _MADE:
        made = _MADE.pop()
        await made.cache.settled()
        await made.cache.close()


@pytest.fixture(autouse=True)
def _images_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(upkeep_module, "IMAGE_EVERY_SECONDS", 0.0)
    monkeypatch.setattr(upkeep_module, "IMAGE_MIN_CHANGES", 5)


async def imaged(memory: MemoryService, user: str) -> UserIndex:
    """The user's index, once its image is written."""
    entry = await memory.cache.get(user)
    await memory.cache.settled()
    return entry


async def populate(memory: MemoryService, user: str = "ann") -> None:
    """Facts (some of several sentences, one pinned, one a profile fact), episodes linked to
    facts, then updates and deletions (freed slots, replaced postings)."""
    episode = str(uuid.uuid4())
    items = [NewMemory(t) for t in sentences(120)]
    items += [
        NewMemory("My cello teacher lives in Lyon. She plays every Sunday.", pinned=True),
        NewMemory("I am a nurse in Oslo", profile=True),
        NewMemory("Ann: we went kayaking near Lyon", type=MemoryType.EPISODE, id=episode),
        NewMemory("Ann went kayaking near Lyon", linked=(episode,)),
    ]
    records = (await memory.add(user, items)).records
    for record in records[:15]:
        await memory.update(user, record.id, content=record.content + " kayak tennis")
    await memory.delete(user, [r.id for r in records[20:35]])


def same_index(a: UserIndex, b: UserIndex) -> None:
    assert sorted(a.briefs) == sorted(b.briefs)
    assert all(a.briefs[k] == b.briefs[k] for k in a.briefs)
    assert a.standing == b.standing and a.links == b.links and a.version == b.version
    keys = list(a.briefs)
    for query in QUERIES:
        sa, sb = a.lexical.scores(query), b.lexical.scores(query)
        assert np.allclose(sa.of(np.array(keys)), sb.of(np.array(keys)))
        top = list(sa.top(10))
        assert a.lexical.feedback_terms(top, [], limit=5) == b.lexical.feedback_terms(
            top, [], limit=5
        )
        vector = np.ones(64, dtype=np.float32) / 8
        assert [x.tolist() for x in a.vectors.search(vector, 20)] == [
            x.tolist() for x in b.vectors.search(vector, 20)
        ]


async def test_a_restored_index_searches_as_the_built_one(engine: AsyncEngine) -> None:
    writer = service(engine)
    await populate(writer)
    built = await imaged(writer, "ann")
    assert await writer.store.image_version("ann") == built.version
    expected = await ranking(writer, "ann", QUERIES)
    assert any(len(r) == 20 for r in expected)

    restoring = service(engine)
    assert await ranking(restoring, "ann", QUERIES) == expected
    assert restoring.cache.upkeep.restores == 1
    same_index(built, await restoring.cache.get("ann"))
    assert await ranking(service(engine, images=0), "ann", QUERIES) == expected


async def test_a_stale_image_is_caught_up_before_it_serves(engine: AsyncEngine) -> None:
    writer = service(engine)
    await populate(writer)
    await imaged(writer, "ann")
    # written after the image: new memories, an update, deletions (the count goes down)
    added = (await writer.add("ann", [NewMemory("zebra marathon in paris")])).records[0]
    found = await writer.search("ann", "violin", limit=3, min_score=0)
    await writer.update("ann", found[0].memory.id, content="a changed zebra memory")
    await writer.delete("ann", [f.memory.id for f in found[1:]])

    restoring = service(engine)
    got = await ranking(restoring, "ann", [*QUERIES, "zebra"])
    assert restoring.cache.upkeep.restores == 1
    assert got == await ranking(service(engine, images=0), "ann", [*QUERIES, "zebra"])
    assert added.id in [i for i, _ in got[-1]]
    deleted = {f.memory.id for f in found[1:]}
    assert not deleted.intersection(i for r in got for i, _ in r)


async def test_a_restored_index_changed_in_place_stays_right(engine: AsyncEngine) -> None:
    """Adds, updates and deletions applied to a restored index (its postings and briefs still
    packed) rank as a fresh build does, and its next image holds them."""
    writer = service(engine)
    await populate(writer)
    await imaged(writer, "ann")
    restored = service(engine)
    await restored.search("ann", "warm up", limit=1, min_score=0)
    assert restored.cache.upkeep.restores == 1
    new = (await restored.add("ann", [NewMemory(t) for t in sentences(8, seed=3)])).records
    found = await restored.search("ann", "coffee violin", limit=6, min_score=0)
    for f in found[:3]:
        await restored.update("ann", f.memory.id, content=f.memory.content + " zebra")
    await restored.delete("ann", [f.memory.id for f in found[3:]] + [new[0].id])
    expected = await ranking(service(engine, images=0), "ann", [*QUERIES, "zebra"])
    assert await ranking(restored, "ann", [*QUERIES, "zebra"]) == expected

    entry = await imaged(restored, "ann")  # 8 + 3 + 4 changes: a new image
    assert restored.cache.upkeep.images >= 1
    assert await restored.store.image_version("ann") == entry.version
    again = service(engine)
    assert await ranking(again, "ann", [*QUERIES, "zebra"]) == expected
    same_index(entry, await again.cache.get("ann"))


async def test_an_image_of_another_model_or_damaged_is_built_anew(
    engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    writer = service(engine)
    await populate(writer)
    await imaged(writer, "ann")

    other = service(engine, model="fake-other")
    await other.search("ann", "warm up", limit=1, min_score=0)
    assert other.cache.upkeep.restores == 0  # re-embedded with its model, not the image's
    await other.cache.settled()  # and the old model's image, which would keep it out, replaced
    assert other.cache.upkeep.images == 1
    again = service(engine, model="fake-other")
    await again.search("ann", "warm up", limit=1, min_score=0)
    assert again.cache.upkeep.restores == 1

    async with writer.store.sessions.begin() as session:
        await session.execute(update(IndexImage).values(data=b"memproxy-index\n\x05\x00"))
    caplog.set_level(logging.WARNING, "memproxy.memory")
    # (after the other model's vectors were stored: PostgreSQL then reads the rows in another
    # order, and equal scores are ranked by it)
    expected = await ranking(service(engine, images=0), "ann", QUERIES)
    damaged = service(engine)
    assert await ranking(damaged, "ann", QUERIES) == expected
    assert damaged.cache.upkeep.restores == 0
    assert "an index image that is not one" in caplog.text
    await damaged.cache.settled()
    assert damaged.cache.upkeep.images == 1  # the damaged one replaced


def _flip(data: bytes) -> bytes:
    at = len(data) - 100
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d[: len(d) // 2],  # ends early
        _flip,  # one bit of its body: the checksum
        lambda d: d.replace(b'"<i8"', b'"|O8"', 1),  # an array of objects
        lambda d: d.replace(b'"<i8"', b'"<i4"', 1),  # another layout
        lambda d: d.replace(b'"arrays": [', b'"arrays": ' + b"[" * 100_000, 1),  # too deep
        lambda d: b"not an image",
    ],
)
async def test_a_damaged_image_loads_as_none(engine: AsyncEngine, damage: Any) -> None:
    memory = service(engine)
    await populate(memory)
    entry = await imaged(memory, "ann")  # no image write left running past the test
    model = vector_model(memory.embedder)
    data = image.dump(entry, model)
    assert image.load(data, model=model, dim=64, analyzer=Analyzer()) is not None
    assert image.load(damage(data), model=model, dim=64, analyzer=Analyzer()) is None


@pytest.mark.parametrize(
    "break_it",
    [
        ("lexical", "slots", lambda a: a + 10_000),  # postings of no document
        ("lexical", "doc_terms", lambda a: a + 10_000),  # terms of no vocabulary
        ("lexical", "tf", lambda a: a * 0),  # postings counted no time: matches scoring 0
        ("lexical", "tf", lambda a: a * np.nan),
        ("lexical", "term_ptr", lambda a: a[::-1].copy()),  # pointers out of order
        ("briefs", "keys", lambda a: a + 1),  # briefs of other memories
        ("briefs", "type", lambda a: a + 9),  # a type of no name
        ("vectors", "parts", lambda a: a * 0),  # memories of no vector
    ],
)
async def test_an_image_whose_checksum_holds_but_not_its_sense_loads_as_none(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch, break_it: Any
) -> None:
    """Made so (its checksum over what it holds): every array is checked before it is used."""
    memory = service(engine)
    await populate(memory)
    entry = await imaged(memory, "ann")  # no image write left running past the test
    part, name, change = break_it
    holder = {"lexical": entry.lexical, "briefs": entry.briefs, "vectors": entry.vectors}[part]
    exported = holder.export()
    exported[name] = change(exported[name]).astype(exported[name].dtype)
    monkeypatch.setattr(holder, "export", lambda: exported)
    model = vector_model(memory.embedder)
    assert image.load(image.dump(entry, model), model=model, dim=64, analyzer=Analyzer()) is None


async def test_images_go_with_their_user(engine: AsyncEngine) -> None:
    """Erased or moved: the image goes, and one being made of an older version (a write that
    began before the erasure) is refused, never stored."""
    memory = service(engine)
    for user in ("ann", "bob", "cid"):
        await memory.add(user, [NewMemory(t) for t in sentences(30)])
        entry = await imaged(memory, user)
        assert await memory.store.image_version(user) == entry.version
    late = image.dump(await memory.cache.get("ann"), vector_model(memory.embedder))
    version = (await memory.cache.get("ann")).version
    await memory.delete_all("ann")
    assert await memory.store.image("ann") is None
    assert not await memory.store.keep_image("ann", version, late)
    assert await memory.store.image("ann") is None
    await memory.move("bob", "cid")
    assert await memory.store.image("bob") is None
    assert await memory.store.image("cid") is None
    assert await ranking(service(engine), "cid", QUERIES) == await ranking(
        service(engine, images=0), "cid", QUERIES
    )


async def test_a_rebuild_reads_no_image_and_writes_a_new_one(engine: AsyncEngine) -> None:
    memory = service(engine)
    await populate(memory)
    first = await imaged(memory, "ann")
    rebuilt = await memory.cache.rebuild("ann")
    await memory.cache.settled()
    assert rebuilt is not first and memory.cache.upkeep.restores == 0
    assert await memory.store.image_version("ann") == rebuilt.version
    stored = await memory.store.image("ann")
    assert stored is not None and stored.version == rebuilt.version


async def test_only_users_above_the_minimum_get_an_image(engine: AsyncEngine) -> None:
    memory = service(engine, images=50)
    await memory.add("small", [NewMemory(t) for t in sentences(49)])
    await memory.add("large", [NewMemory(t) for t in sentences(50)])
    await imaged(memory, "small")
    await imaged(memory, "large")
    assert await memory.store.image_version("small") is None
    assert await memory.store.image_version("large") is not None
    assert memory.cache.upkeep.images == 1


async def test_a_large_image_is_stored_in_parts_and_read_whole(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(images_module, "PART_BYTES", 1000)
    store = MemoryStore(engine)
    data = bytes(range(256)) * 20
    assert await store.keep_image("ann", 3, data)
    assert (await store.image("ann")) == (3, [data[i : i + 1000] for i in range(0, 5120, 1000)])
    assert not await store.keep_image("ann", 3, b"older or as old")
    assert not await store.keep_image("ann", 2, b"older or as old")
    assert await store.keep_image("ann", 4, b"newer")
    assert (await store.image("ann")) == (4, [b"newer"])
    async with store.sessions.begin() as session:  # a part of another write: not whole
        session.add(IndexImage(user_id="ann", part=1, parts=2, version=9, data=b"x",
                               written_at=now()))  # fmt: skip
        await session.execute(update(IndexImage).where(IndexImage.part == 0).values(parts=2))
    assert await store.image("ann") is None


async def test_a_first_build_lets_other_work_run(
    engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "BUILD_BATCH", 10)
    memory = service(engine, images=0)
    await memory.add("ann", [NewMemory(t) for t in sentences(60)])
    memory.cache.forget()
    ticks = 0
    seen: list[int] = []
    put = UserIndex.put

    def recording(self: UserIndex, *args: Any, **kw: Any) -> None:
        seen.append(ticks)
        put(self, *args, **kw)

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0)
            ticks += 1

    monkeypatch.setattr(UserIndex, "put", recording)
    task = asyncio.create_task(ticker())
    await memory.cache.get("ann")
    task.cancel()
    assert len(seen) == 6 and seen == sorted(seen) and len(set(seen)) == 6
