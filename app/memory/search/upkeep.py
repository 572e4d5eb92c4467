"""What keeps large users' indexes quick, in the background of
:class:`~app.memory.search.cache.IndexCache`: their images (:mod:`.image`, in the store), and
their approximate vector index (:mod:`.ivf`).

Promises:

- a user of at least ``image_min_memories`` memories is restored from their image (then caught
  up by the cache, as any stale index is); an image that cannot be used is erased (it would keep
  a new one out), and a failure to load one costs a build, never a recall;
- an index that has changed enough since its image (:data:`IMAGE_SHARE`) offers a new one; an
  index of at least ``ivf_min_vectors`` vectors is given an approximate one, trained on a
  snapshot, adopted with the changes made meanwhile, and imaged;
- one heavy job at a time (an image is ~3 times its size in memory while made, a training
  reads every vector), each in a worker thread while the index is frozen (no change; searches
  go on), so neither the event loop nor the user's chats wait for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Coroutine
from typing import Any

from app.memory.search import image
from app.memory.search.dense import on_faiss_threads
from app.memory.search.embedder import TextEmbedder
from app.memory.search.ivf import FLOOR, GROWTH_TO_RETRAIN, build_ivf
from app.memory.search.lexical import Analyzer
from app.memory.search.parts import vector_model
from app.memory.search.user_index import UserIndex
from app.memory.store.images import kept_over
from app.memory.store.memories import MemoryStore

logger = logging.getLogger("memproxy.memory")

IMAGE_SHARE = 50
"""An index offers a new image once a 50th of its memories (and at least
:data:`IMAGE_MIN_CHANGES`) were put or dropped since its last: the catch-up of a restore then
reads at most that many rows."""
IMAGE_MIN_CHANGES = 200
IMAGE_EVERY_SECONDS = 60.0
"""The least time between two images of a user from this process (a large import changes many
memories in a row: one image at its end, not one per batch)."""
TRAIN_RETRY_SECONDS = 600.0
"""The least time between two trainings of a user's approximate index from this process."""


def _load(
    parts: list[bytes], model: str, dim: int, analyzer: Analyzer, ivf_min: int
) -> UserIndex | None:
    entry = image.load(b"".join(parts), model=model, dim=dim, analyzer=analyzer)
    if entry is not None and entry.vectors.approximate and not _approximate(entry, ivf_min):
        entry.vectors.exhaustive()  # the setting changed since: as the operator wants it now
    return entry


def _approximate(entry: UserIndex, ivf_min: int) -> bool:
    """Whether the setting wants the index approximate."""
    return bool(ivf_min) and entry.vectors.vectors >= max(ivf_min, FLOOR)


class Upkeep:
    def __init__(
        self,
        store: MemoryStore,
        embedder: TextEmbedder,
        analyzer: Analyzer,
        *,
        image_min_memories: int = 0,
        ivf_min_vectors: int = 0,
    ) -> None:
        self._store = store
        self._embedder = embedder
        self._analyzer = analyzer
        self.image_min = image_min_memories
        """Users with at least this many memories have an image (0: no images)."""
        self.ivf_min = ivf_min_vectors
        """Indexes of at least this many vectors search an IVF (0: never)."""
        self._imaging: dict[str, asyncio.Task[None]] = {}
        self._training: dict[str, asyncio.Task[None]] = {}
        self._imaged_at: dict[str, float] = {}
        self._trained_tried: dict[str, float] = {}
        self._one_job = asyncio.Lock()
        self.restores = 0
        """Indexes loaded from an image (tests and benches read these three)."""
        self.images = 0
        self.trainings = 0

    async def restored(self, user_id: str) -> UserIndex | None:
        """The user's index from their image, at the image's version (None: no usable one)."""
        if not self.image_min:
            return None
        stored = await self._store.image(user_id)
        if stored is None:
            return None
        model, dim = vector_model(self._embedder), self._embedder.dim
        try:  # no one else's yet; ~0.3 s at 100k memories: off the event loop
            entry = await asyncio.to_thread(
                on_faiss_threads, _load, stored.parts, model, dim, self._analyzer, self.ivf_min
            )
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

    def offer(self, user_id: str, entry: UserIndex) -> None:
        """Start what the index is due for: an approximate index, a new image."""
        vectors = entry.vectors
        due = _approximate(entry, self.ivf_min)
        if due and vectors.approximate:
            due = vectors.vectors >= vectors.trained_at * GROWTH_TO_RETRAIN
        if due and self._rested(self._trained_tried, user_id, TRAIN_RETRY_SECONDS):
            self._start(self._training, user_id, self._train(user_id, entry))
        size = len(entry)
        if not self.image_min or size < self.image_min or user_id in self._training:
            return  # (a training ends with an image)
        if entry.changed < max(IMAGE_MIN_CHANGES, size // IMAGE_SHARE):
            return
        if self._rested(self._imaged_at, user_id, IMAGE_EVERY_SECONDS):
            self._start(self._imaging, user_id, self._write_image(user_id, entry))

    def forget(self, user_id: str) -> None:
        """The user's index was dropped: what it is due for is weighed afresh when loaded."""
        self._imaged_at.pop(user_id, None)
        self._trained_tried.pop(user_id, None)

    @staticmethod
    def _rested(last: dict[str, float], user_id: str, seconds: float) -> bool:
        return time.monotonic() - last.get(user_id, -seconds) >= seconds

    @staticmethod
    def _start(
        tasks: dict[str, asyncio.Task[None]],
        user_id: str,
        work: Coroutine[Any, Any, None],
    ) -> None:
        if user_id in tasks:
            work.close()
            return
        task = asyncio.get_running_loop().create_task(work)
        tasks[user_id] = task

        def done(_: object) -> None:
            tasks.pop(user_id, None)

        task.add_done_callback(done)

    async def _write_image(self, user_id: str, entry: UserIndex, *, better: bool = False) -> None:
        """`better`: the index is searched better than its stored image at the same version
        (its approximate index was just trained)."""
        self._imaged_at[user_id] = time.monotonic()
        try:
            # the store's own rule, asked before the dump: an image not kept costs no dump
            if kept_over(
                await self._store.image_version(user_id), entry.version, replace_same=better
            ):
                entry.changed = 0  # another process's image is as new
                return
            async with self._one_job, entry.frozen:
                started = time.perf_counter()
                changed, version = entry.changed, entry.version
                data = await asyncio.to_thread(
                    on_faiss_threads, image.dump, entry, vector_model(self._embedder)
                )
                took = time.perf_counter() - started
            if await self._store.keep_image(user_id, version, data, replace_same=better):
                self.images += 1
                logger.info(
                    "index image of a user: %d memories at version %d, %.0f MB (%.2f s to make)",
                    len(entry), version, len(data) / 1e6, took,
                )  # fmt: skip
            entry.changed -= changed
        except Exception:  # a cache: the next load builds from the memories
            logger.exception("index image not written")

    async def _train(self, user_id: str, entry: UserIndex) -> None:
        self._trained_tried[user_id] = time.monotonic()
        vectors = entry.vectors
        try:
            async with self._one_job:
                started = time.perf_counter()
                async with entry.frozen:
                    ids, matrix = await asyncio.to_thread(on_faiss_threads, vectors.snapshot)
                index = await asyncio.to_thread(
                    on_faiss_threads, build_ivf, vectors.dim, ids, matrix
                )
                del matrix
                async with entry.frozen:  # the changes made meanwhile given to it, off the loop
                    await asyncio.to_thread(on_faiss_threads, vectors.adopt, index, len(ids))
            self.trainings += 1
            logger.info(
                "approximate index of a user: %d vectors in %d lists (%.1f s to train)",
                len(ids), index.nlist, time.perf_counter() - started,
            )  # fmt: skip
        except Exception:  # the exhaustive index goes on serving
            logger.exception("approximate index not trained")
            return
        finally:
            vectors.abandon()
        entry.changed += len(entry)  # its image holds the exhaustive index: a new one
        self._imaged_at.pop(user_id, None)
        if self.image_min and len(entry) >= self.image_min:
            self._start(self._imaging, user_id, self._write_image(user_id, entry, better=True))

    async def settled(self) -> None:
        """Return once the image writes and trainings under way are done (benches, tests)."""
        while self._imaging or self._training:
            tasks = [*self._imaging.values(), *self._training.values()]
            await asyncio.gather(*tasks, return_exceptions=True)

    async def close(self) -> None:
        """Stop the image writes and trainings under way (a cache: nothing is lost)."""
        tasks = [*self._imaging.values(), *self._training.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
