"""Hybrid search over one user's memories: the one pipeline behind chat recall and the search API.

Score convention (what ``MEMPROXY_RELEVANCE_THRESHOLD`` and the API's ``min_score`` compare with):
``score = w * max(cosine, 0) + (1 - w) * lexical``, where ``cosine`` is the dense similarity of
query and memory (:mod:`app.memory.index`), ``lexical`` the normalised BM25 score
(:mod:`app.memory.lexical`), and ``w`` is ``MEMPROXY_DENSE_WEIGHT`` (0.5). Both parts are on
absolute scales (not rescaled per query), so the score is comparable across queries and a fixed
threshold means the same thing for every user: 0 is unrelated; an exact restatement of the
memory scores about 0.8; typical useful matches score 0.25-0.6.

Fusing the scores themselves rather than ranks (reciprocal rank fusion) keeps how much better one
candidate is than the next: measured on the LoCoMo dev conversations (``bench/recall_eval.py``),
RRF with k=60 ranks below BM25 alone, the weighted sum above both.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from app.memory.cache import IndexCache, UserIndex
from app.memory.embedder import TextEmbedder

OFFLOAD_ABOVE = 20_000
"""Dense searches over more vectors than this run in a thread (~2 ms and up), not on the loop."""


@dataclass(frozen=True, slots=True)
class Hit:
    key: int
    score: float
    """The fused score (module docstring)."""
    dense: float
    lexical: float


class Searcher:
    def __init__(
        self,
        cache: IndexCache,
        embedder: TextEmbedder,
        *,
        dense_weight: float = 0.5,
        candidates: int = 100,
    ) -> None:
        self._cache = cache
        self._embedder = embedder
        self._weight = dense_weight
        self._candidates = candidates

    async def search(
        self,
        user_id: str,
        query: str,
        *,
        limit: int,
        min_score: float = 0.0,
        types: Sequence[str] = (),
    ) -> list[Hit]:
        """The user's best memories for `query`, best first, at most `limit`, none below
        `min_score`, only of `types` when given."""
        entry, vectors = await asyncio.gather(
            self._cache.get(user_id), self._embedder.embed([query])
        )
        if not len(entry):
            return []
        async with entry.lock:
            return await self._rank(entry, query, vectors[0], limit, min_score, set(types))

    async def _rank(
        self,
        entry: UserIndex,
        query: str,
        vector: np.ndarray,
        limit: int,
        min_score: float,
        types: set[str],
    ) -> list[Hit]:
        wanted = max(self._candidates, limit * 4) if types else max(self._candidates, limit)
        if len(entry.vectors) > OFFLOAD_ABOVE:
            dense_keys, dense = await asyncio.to_thread(entry.vectors.search, vector, wanted)
        else:
            dense_keys, dense = entry.vectors.search(vector, wanted)
        lexical_keys, lexical = entry.lexical.scores(query)
        if len(lexical_keys) > wanted:
            top = np.argpartition(lexical, -wanted)[-wanted:]
            top_keys = lexical_keys[top]
        else:
            top_keys = lexical_keys
        keys = np.union1d(dense_keys, top_keys)

        dense_of = dict(zip(dense_keys.tolist(), dense.tolist(), strict=True))
        missing = np.array([k for k in keys.tolist() if k not in dense_of], dtype=np.int64)
        extra = entry.vectors.similarity(vector, missing)
        dense_of.update(zip(missing.tolist(), extra.tolist(), strict=True))
        order = np.argsort(lexical_keys)
        sorted_keys, sorted_scores = lexical_keys[order], lexical[order]
        where = np.searchsorted(sorted_keys, keys)
        where = np.minimum(where, max(len(sorted_keys) - 1, 0))
        found = (sorted_keys[where] == keys) if len(sorted_keys) else np.zeros(len(keys), bool)
        lexical_of = np.where(found, sorted_scores[where] if len(sorted_keys) else 0.0, 0.0)

        hits = []
        w = self._weight
        for key, lex in zip(keys.tolist(), lexical_of.tolist(), strict=True):
            if types and entry.types.get(key) not in types:
                continue
            cosine = dense_of[key]
            score = w * max(cosine, 0.0) + (1.0 - w) * lex
            if score >= min_score:
                hits.append(Hit(key, score, cosine, lex))
        hits.sort(key=lambda h: (-h.score, -h.key))
        return hits[:limit]
