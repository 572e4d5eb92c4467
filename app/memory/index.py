"""The dense side of recall: one FAISS index of one user's memory vectors, ids only.

The index holds int64 keys (``memories.key``) and vectors, nothing else: it is a cache, rebuilt
from the store whenever it is missing or stale. Exact inner-product search (``IndexFlatIP``) over
L2-normalised vectors, so a score is the cosine similarity in [-1, 1]. Exact search is fast enough
at the sizes one user has (~5 ms at 100k memories on one core) and never misses a memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import faiss
import numpy as np


def configure_threads(threads: int) -> None:
    """FAISS's OpenMP threads, process-wide. One by default: the search runs on the event loop's
    thread beside the web server, and a thread pool spinning up per query costs more than it
    saves at these sizes on small machines."""
    faiss.omp_set_num_threads(max(1, threads))


class VectorIndex:
    """Vectors by key. Adding a key that is present replaces its vector."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        self._index = faiss.IndexIDMap2(faiss.IndexFlatIP(dim))

    def __len__(self) -> int:
        return int(self._index.ntotal)

    def add(self, keys: Sequence[int] | np.ndarray, vectors: np.ndarray) -> None:
        ids = np.asarray(keys, dtype=np.int64)
        if not len(ids):
            return
        self.remove(ids)  # IndexIDMap would keep both copies of a key otherwise
        self._index.add_with_ids(np.ascontiguousarray(vectors, dtype=np.float32), ids)

    def remove(self, keys: Sequence[int] | np.ndarray) -> None:
        ids = np.asarray(keys, dtype=np.int64)
        if len(ids) and self._index.ntotal:
            self._index.remove_ids(faiss.IDSelectorBatch(ids))

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """The `k` nearest keys and their cosine scores, best first."""
        k = min(k, len(self))
        if k <= 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        scores, ids = self._index.search(vector.reshape(1, -1).astype(np.float32), k)
        found = ids[0] >= 0
        return ids[0][found], scores[0][found]

    def similarity(self, vector: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Cosine of `vector` with each key's vector (keys must be present)."""
        if not len(keys):
            return np.zeros(0, dtype=np.float32)
        stacked = np.stack([self._index.reconstruct(int(k)) for k in keys])
        scores: np.ndarray = (stacked @ vector.reshape(-1)).astype(np.float32)
        return scores

    def memory_bytes(self) -> int:
        return len(self) * (self.dim * 4 + 8)
