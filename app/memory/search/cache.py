"""Per-user search indexes (dense and lexical), built lazily from the store and kept current.

Promises:

- an index is a cache of the store: :meth:`IndexCache.get` returns one that reflects at least the
  store's state when the call began. It reads the user's change sequence (one small query) and,
  when another process wrote since, reads back only the rows written since (``seq > version``),
  plus the key list when the count shows deletions;
- this process's own writes are applied in place (:meth:`IndexCache.written`,
  :meth:`IndexCache.deleted`) when they follow directly on the cached version, otherwise left to
  the next catch-up; an index is never marked newer than what it holds;
- memories without a vector of the configured model are embedded while loading, and the vectors
  stored back (a model change re-embeds lazily, or all at once with ``memproxy index rebuild``);
- the cache is bounded (least recently used users evicted) by the number of memories it holds;
- with images on (``image_min_memories``), a user of at least that many memories is loaded from
  their stored index image (:mod:`app.memory.search.image`) and caught up from the store as any
  stale index is; an index that has changed enough since its image (:data:`IMAGE_SHARE`) offers
  a new one, written in the background, one user at a time, never while a catch-up runs. A
  first build yields to the event loop between batches: other chats go on meanwhile.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from app.memory.search import image
from app.memory.search.dense import VectorIndex
from app.memory.search.embedder import TextEmbedder
from app.memory.search.lexical import Analyzer, LexicalIndex
from app.memory.search.parts import decode, embed_for_store, vector_model
from app.memory.search.user_index import UserIndex
from app.memory.store.memories import MemoryStore
from app.memory.store.records import IndexRow, Removed, Written
from app.memory.store.tables import MemoryType

logger = logging.getLogger("memproxy.memory")

STORE_BATCH = 256
"""Memories embedded and written back per round while loading an index."""
BUILD_BATCH = 1000
"""Memories indexed between two yields to the event loop in a first build (~20-40 ms of work:
a 100,000-memory user's build no longer stalls everyone else's chats for seconds)."""
IMAGE_SHARE = 50
"""An index offers a new image once a 50th of its memories (and at least
:data:`IMAGE_MIN_CHANGES`) were put or dropped since its last: the catch-up of a restore then
reads at most that many rows."""
IMAGE_MIN_CHANGES = 200
IMAGE_EVERY_SECONDS = 60.0
"""The least time between two images of a user from this process (a large import changes many
memories in a row: one image at its end, not one per batch)."""


def _load(parts: list[bytes], model: str, dim: int, analyzer: Analyzer) -> UserIndex | None:
    return image.load(b"".join(parts), model=model, dim=dim, analyzer=analyzer)


class IndexCache:
    def __init__(
        self,
        store: MemoryStore,
        embedder: TextEmbedder,
        *,
        max_memories: int = 300_000,
        analyzer: Analyzer | None = None,
        image_min_memories: int = 0,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._analyzer = analyzer or Analyzer()
        self._max_memories = max_memories
        self._image_min = image_min_memories
        """Users with at least this many memories have an image (0: no images)."""
        self._entries: OrderedDict[str, UserIndex] = OrderedDict()
        self._loading: dict[str, asyncio.Task[UserIndex]] = {}
        self._imaging: dict[str, asyncio.Task[None]] = {}
        self._imaged_at: dict[str, float] = {}
        self._one_image = asyncio.Lock()
        self.loads = 0
        """Full builds and catch-ups done (tests and metrics read it)."""
        self.restores = 0
        """Indexes loaded from an image (tests and metrics read it)."""
        self.images = 0
        """Images written by this process."""

    def cached(self, user_id: str) -> UserIndex | None:
        return self._entries.get(user_id)

    async def get(self, user_id: str) -> UserIndex:
        """The user's index, current as of this call (see the module docstring)."""
        version = await self._store.version(user_id)
        entry = self._entries.get(user_id)
        if entry is not None and entry.version == version:
            self._entries.move_to_end(user_id)
            return entry
        task = self._loading.get(user_id)
        if task is None:
            task = asyncio.get_running_loop().create_task(self._load(user_id, images=True))
            self._loading[user_id] = task
            task.add_done_callback(lambda _: self._loading.pop(user_id, None))
        entry = await asyncio.shield(task)
        if entry.version < version:  # that load began before the write we were told about
            return await self.get(user_id)
        return entry

    async def rebuild(self, user_id: str) -> UserIndex:
        """The user's index built afresh from the store (no image read, the stored one erased;
        the memories without a vector of this model embedded), then imaged when large
        enough (:meth:`settled` waits for it)."""
        while (task := self._loading.get(user_id)) is not None:
            await asyncio.shield(task)
        self.forget(user_id)
        await self._store.drop_image(user_id)
        task = asyncio.get_running_loop().create_task(self._load(user_id, images=False))
        self._loading[user_id] = task
        task.add_done_callback(lambda _: self._loading.pop(user_id, None))
        return await asyncio.shield(task)

    async def _load(self, user_id: str, *, images: bool) -> UserIndex:
        entry = self._entries.get(user_id)
        if entry is None:
            entry = await self._restored(user_id) if images and self._image_min else None
            if entry is None:
                entry = await self._build(user_id)
            else:
                await self._catch_up(user_id, entry)
            self._entries[user_id] = entry
        else:
            await self._catch_up(user_id, entry)
        self.loads += 1
        self._entries.move_to_end(user_id)
        self._evict(keep=user_id)
        self._offer_image(user_id, entry)
        return entry

    async def _build(self, user_id: str) -> UserIndex:
        snapshot = await self._store.snapshot(user_id)
        entry = UserIndex(
            snapshot.version, VectorIndex(self._embedder.dim), LexicalIndex(self._analyzer)
        )
        rows = snapshot.rows
        async with entry.lock:
            for start in range(0, len(rows), BUILD_BATCH):
                links = snapshot.links if start == 0 else ()
                await self._put(user_id, entry, rows[start : start + BUILD_BATCH], links)
                await asyncio.sleep(0)  # the entry is no one else's yet: let chats go on
        return entry

    async def _restored(self, user_id: str) -> UserIndex | None:
        stored = await self._store.image(user_id)
        if stored is None:
            return None
        model, dim = vector_model(self._embedder), self._embedder.dim
        try:  # no one else's yet; ~0.3 s at 100k memories: off the event loop
            entry = await asyncio.to_thread(_load, stored.parts, model, dim, self._analyzer)
        except Exception:  # whatever it holds, a damaged image costs a build, never a recall
            logger.exception("an index image that does not load: building from the memories")
            entry = None
        if entry is None:  # of another model or version, or damaged: it would keep a new one out
            await self._store.drop_image(user_id)
            return None
        self.restores += 1
        self._imaged_at[user_id] = time.monotonic()
        # Recalls count without a new version, so the counts in an image lag: the profile's
        # order reads them (a few standing memories: one small read).
        records = await self._store.get_many(user_id, sorted(entry.standing))
        for key, record in records.items():
            if key in entry.briefs:
                entry.briefs[key] = entry.briefs[key]._replace(recall_count=record.recall_count)
        return entry

    async def _catch_up(self, user_id: str, entry: UserIndex) -> None:
        """Bring an index up to the store: the rows written since its version, and the
        deletions when the count says there were some."""
        async with entry.lock:
            snapshot = await self._store.snapshot(user_id, since=entry.version)
            await self._put(user_id, entry, snapshot.rows, snapshot.links)
            if len(entry) != snapshot.total:  # deletions (or rows newer than the snapshot)
                keys = await self._store.keys(user_id)
                entry.drop([k for k in entry.briefs if k not in keys])
                missing = [k for k in keys if k not in entry.briefs]
                rows = await self._store.rows(user_id, missing)
                episodes = [r.key for r in rows if r.type == MemoryType.EPISODE.value]
                links = await self._store.links(user_id, episodes)
                await self._put(user_id, entry, rows, links)
            entry.version = snapshot.version

    def _offer_image(self, user_id: str, entry: UserIndex) -> None:
        """Write the index's image in the background if it has changed enough since its last."""
        size = len(entry)
        if not self._image_min or size < self._image_min or user_id in self._imaging:
            return
        if entry.changed < max(IMAGE_MIN_CHANGES, size // IMAGE_SHARE):
            return
        if (
            time.monotonic() - self._imaged_at.get(user_id, -IMAGE_EVERY_SECONDS)
            < IMAGE_EVERY_SECONDS
        ):
            return
        task = asyncio.get_running_loop().create_task(self._write_image(user_id, entry))
        self._imaging[user_id] = task
        task.add_done_callback(lambda _: self._imaging.pop(user_id, None))

    async def _write_image(self, user_id: str, entry: UserIndex) -> None:
        self._imaged_at[user_id] = time.monotonic()
        try:
            stored = await self._store.image_version(user_id)
            if stored is not None and stored >= entry.version:
                entry.changed = 0  # another process's image is as new
                return
            # Under the lock, nothing changes the index (a catch-up waits for it, a write in
            # place leaves the change to the next catch-up), so a thread may read it: ~0.5 s at
            # 100k memories that the event loop does not stall for.
            async with self._one_image, entry.lock:  # one image at a time: ~3x its size
                started = time.perf_counter()
                changed, version = entry.changed, entry.version
                data = await asyncio.to_thread(image.dump, entry, vector_model(self._embedder))
                took = time.perf_counter() - started
            if await self._store.keep_image(user_id, version, data):
                self.images += 1
                logger.info(
                    "index image of a user: %d memories at version %d, %.0f MB (%.2f s to make)",
                    len(entry),
                    version,
                    len(data) / 1e6,
                    took,
                )
            entry.changed -= changed
        except Exception:  # a cache: the next load builds from the memories
            logger.exception("index image not written")

    async def settled(self) -> None:
        """Return once the image writes under way are done (benches and tests)."""
        while self._imaging:
            await asyncio.gather(*self._imaging.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop the image writes under way (a cache: nothing is lost)."""
        tasks = list(self._imaging.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _put(
        self,
        user_id: str,
        entry: UserIndex,
        rows: Sequence[IndexRow],
        links: Sequence[tuple[int, int]] = (),
    ) -> None:
        if rows:
            entry.put(rows, await self.vectors_for(user_id, rows), links)

    async def vectors_for(self, user_id: str, rows: Sequence[IndexRow]) -> list[np.ndarray]:
        """The rows' vectors: stored ones when of this model, the rest embedded and saved."""
        model = vector_model(self._embedder)
        out: list[np.ndarray | None] = [
            decode(r.embedding, self._embedder.dim)
            if r.embedding is not None and r.embedding_model == model
            else None
            for r in rows
        ]
        todo = [i for i, vectors in enumerate(out) if vectors is None]
        for start in range(0, len(todo), STORE_BATCH):
            chunk = todo[start : start + STORE_BATCH]
            embedded = await embed_for_store(self._embedder, [rows[i].key_text for i in chunk])
            for i, e in zip(chunk, embedded, strict=True):
                out[i] = e.vectors
            await self._store.set_embeddings(
                user_id,
                [(rows[i].key, e.embedding, e.model) for i, e in zip(chunk, embedded, strict=True)],
            )
        if todo:
            logger.info("embedded %d memories of a user with %s", len(todo), model)
        return [v for v in out if v is not None]

    def written(self, user_id: str, written: Written, vectors: Sequence[np.ndarray]) -> None:
        """This process wrote these rows (their (parts, dim) vectors given, in order)."""
        entry = self._current_before(user_id, written.version)
        if entry is not None:
            rows = [
                IndexRow(r.key, r.type, r.content, r.created_at, None, None,
                         r.pinned, r.profile, r.observed_at, r.recall_count, r.index_text)
                for r in written.records
            ]  # fmt: skip
            entry.put(rows, vectors, written.links)
            entry.version = written.version
            self._offer_image(user_id, entry)

    def deleted(self, user_id: str, deleted: Removed) -> None:
        entry = self._current_before(user_id, deleted.version)
        if entry is not None:
            entry.drop(deleted.keys)
            entry.version = deleted.version
            self._offer_image(user_id, entry)

    def _current_before(self, user_id: str, version: int) -> UserIndex | None:
        """The entry, if a write at `version` can be applied to it in place right now."""
        entry = self._entries.get(user_id)
        if entry is None or entry.lock.locked() or entry.version != version - 1:
            return None  # the next get() catches up from the store
        return entry

    def _evict(self, keep: str) -> None:
        total = sum(len(e) for e in self._entries.values())
        for user_id in list(self._entries):
            if total <= self._max_memories:
                break
            if user_id == keep:
                continue
            total -= len(self._entries.pop(user_id))

    def forget(self, user_id: str | None = None) -> None:
        """Drop one user's index (or all): the next recall rebuilds it from the store."""
        if user_id is None:
            self._entries.clear()
        else:
            self._entries.pop(user_id, None)
            self._imaged_at.pop(user_id, None)

    @property
    def memories_cached(self) -> int:
        return sum(len(e) for e in self._entries.values())
