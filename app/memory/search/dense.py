"""The dense side of recall: one FAISS index of one user's memory vectors, ids only.

The index holds int64 ids and vectors, nothing else: it is a cache, rebuilt from the store
whenever it is missing or stale. A memory has one vector per part
(:mod:`app.memory.search.parts`), with ids derived from its key, and scores as its best part: a
cosine similarity in [-1, 1] (vectors are L2-normalised).

This index's search is exhaustive (it never misses a memory) over vectors stored in half precision
(``IndexScalarQuantizer``, fp16): measured at 100k vectors on one core, 7.0 ms per query against
11.4 for float32 (``IndexFlatIP``) with the same top 10 and scores within 4e-5, in half the
memory. A user with many memories gets an approximate index instead (:mod:`.ivf`, adopted by
:meth:`VectorIndex.adopt`), with the same vectors and the same interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

import faiss
import numpy as np
from threadpoolctl import threadpool_limits

from app.memory.search.parts import MAX_PARTS, key_of, parts_ids

P = ParamSpec("P")
R = TypeVar("R")

_threads = 1
"""FAISS's OpenMP threads, as :func:`configure_threads` last set them."""


def configure_threads(threads: int) -> None:
    """FAISS's OpenMP threads (on the calling thread, and on worker threads running FAISS:
    :func:`on_faiss_threads`) and BLAS's (process-wide). One: on small machines a pool of
    spinning threads costs the server's other core and makes latency erratic (measured at 100k
    vectors: p99 26 ms with one BLAS thread, 35-44 ms with two)."""
    global _threads
    _threads = max(1, threads)
    faiss.omp_set_num_threads(_threads)
    threadpool_limits(_threads, user_api="blas")


def on_faiss_threads(call: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
    """`call(*args, **kwargs)`, this thread's FAISS calls first set to :func:`configure_threads`'
    count: what a worker thread running FAISS does. OpenMP keeps the count per thread, and a
    thread that did not set it runs FAISS on every core (measured: a new thread of a 2-core
    machine gets 2 after the main thread set 1)."""
    faiss.omp_set_num_threads(_threads)
    return call(*args, **kwargs)


class VectorIndex:
    """Memories' vectors by key. Adding a key that is present replaces its vectors."""

    def __init__(self, dim: int) -> None:
        self.dim = dim
        storage = faiss.IndexScalarQuantizer(
            dim, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_INNER_PRODUCT
        )
        self._index: faiss.Index = faiss.IndexIDMap2(storage)
        self._parts: dict[int, int] = {}
        self._touched: set[int] | None = None
        """The keys added or removed since :meth:`snapshot` (None: no snapshot out)."""
        self.trained_at = 0
        """How many vectors the approximate index's lists were trained on (0: exhaustive)."""

    @property
    def approximate(self) -> bool:
        return isinstance(self._index, faiss.IndexIVF)

    def __len__(self) -> int:
        """How many memories (not vectors) the index holds."""
        return len(self._parts)

    @property
    def vectors(self) -> int:
        return int(self._index.ntotal)

    def add(self, keys: Sequence[int], vectors: Sequence[np.ndarray]) -> None:
        """Index each key's (parts, dim) vectors."""
        if not keys:
            return
        self.remove(keys)
        ids = parts_ids(np.asarray(keys, dtype=np.int64), np.array([len(v) for v in vectors]))
        stacked = np.ascontiguousarray(np.concatenate(vectors), dtype=np.float32)
        self._index.add_with_ids(stacked, ids)
        self._parts.update((k, len(v)) for k, v in zip(keys, vectors, strict=True))
        if self._touched is not None:
            self._touched.update(keys)

    def remove(self, keys: Sequence[int]) -> None:
        present = [(k, self._parts.pop(k)) for k in keys if k in self._parts]
        if present:
            held, parts = np.array(present, dtype=np.int64).T
            _remove_ids(self._index, parts_ids(held, parts))
            if self._touched is not None:
                self._touched.update(int(k) for k in held)

    def search(self, vector: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Up to `k` nearest memories and their best part's cosine, best first."""
        total = self.vectors
        if k <= 0 or not total:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
        # enough vectors that `k` distinct memories are very likely among them
        wanted = min(total, k * max(1, round(total / len(self._parts))) + k)
        scores, ids = self._index.search(vector.reshape(1, -1).astype(np.float32), wanted)
        found = ids[0] >= 0
        keys, first = np.unique(key_of(ids[0][found]), return_index=True)  # first = best part
        order = np.argsort(first)[:k]
        return keys[order], scores[0][found][first[order]]

    def similarity(self, vector: np.ndarray, keys: np.ndarray) -> np.ndarray:
        """Best-part cosine of `vector` with each key's vectors (keys must be present)."""
        if not len(keys):
            return np.zeros(0, dtype=np.float32)
        counts = np.fromiter(map(self._parts.__getitem__, keys.tolist()), np.int64, len(keys))
        cosines = self._index.reconstruct_batch(parts_ids(keys, counts)) @ vector.reshape(-1)
        best: np.ndarray = np.maximum.reduceat(cosines, np.cumsum(counts) - counts)
        return best.astype(np.float32)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """Every vector's id and the vector (a copy, in half precision: the exhaustive index's
        own codes), for an index made from them elsewhere; the changes from now on are
        remembered for :meth:`adopt`. Read only: a thread may take it while nothing changes
        the index."""
        self._touched = set()
        return self._every_vector()

    def _every_vector(self) -> tuple[np.ndarray, np.ndarray]:
        if self.approximate:
            ids = parts_ids(
                np.fromiter(self._parts.keys(), np.int64, len(self._parts)),
                np.fromiter(self._parts.values(), np.int64, len(self._parts)),
            )
            return ids, self._index.reconstruct_batch(ids).astype(np.float16)
        mapped: Any = self._index
        storage: Any = faiss.downcast_index(mapped.index)
        ids = faiss.vector_to_array(mapped.id_map).copy()
        codes = faiss.vector_to_array(storage.codes)  # fp16 codes: IEEE half floats, as stored
        return ids, codes.view(np.float16).reshape(-1, self.dim)

    def exhaustive(self) -> None:
        """Search every vector again (an approximate index no longer wanted), in place."""
        if self.approximate:
            ids, matrix = self._every_vector()
            flat = VectorIndex(self.dim)
            flat._index.add_with_ids(matrix.astype(np.float32), ids)
            self._index, self.trained_at = flat._index, 0

    def abandon(self) -> None:
        """No index made from the snapshot will be adopted: stop remembering changes."""
        self._touched = None

    def adopt(self, index: faiss.Index, trained_at: int) -> None:
        """Search `index` from now on: made from :meth:`snapshot`'s vectors, then given the
        changes made here since (each key touched removed, and added again with its vectors as
        they are now), so it holds what this index holds."""
        touched = sorted(self._touched or ())
        self._touched = None
        if touched:
            keys = np.array(touched, dtype=np.int64)
            # its parts as they were, however many (ids not held are skipped)
            _remove_ids(index, parts_ids(keys, np.full(len(keys), MAX_PARTS, dtype=np.int64)))
            present = [k for k in touched if k in self._parts]
            if present:
                counts = np.array([self._parts[k] for k in present], dtype=np.int64)
                ids = parts_ids(np.array(present, dtype=np.int64), counts)
                index.add_with_ids(self._index.reconstruct_batch(ids), ids)
        self._index = index
        self.trained_at = trained_at

    def export(self) -> dict[str, np.ndarray]:
        """The index as arrays, for :meth:`restore` (FAISS's own serialisation of its vectors)."""
        keys = np.fromiter(self._parts.keys(), np.int64, len(self._parts))
        parts = np.fromiter(self._parts.values(), np.int64, len(self._parts))
        return {
            "faiss": faiss.serialize_index(self._index), "keys": keys, "parts": parts,
            "trained_at": np.array([self.trained_at], dtype=np.int64),
        }  # fmt: skip

    @classmethod
    def restore(cls, dim: int, arrays: Mapping[str, np.ndarray]) -> VectorIndex:
        index = cls(dim)
        restored = faiss.deserialize_index(np.ascontiguousarray(arrays["faiss"]))
        if not isinstance(restored, faiss.IndexIDMap2 | faiss.IndexIVF) or restored.d != dim:
            raise ValueError("not an index of this dimension")
        index._index = restored
        index.trained_at = int(arrays["trained_at"][0]) if index.approximate else 0
        index._parts = dict(zip(arrays["keys"].tolist(), arrays["parts"].tolist(), strict=True))
        if sum(index._parts.values()) != restored.ntotal:
            raise ValueError("the parts do not match the vectors")
        return index


def _remove_ids(index: faiss.Index, ids: np.ndarray) -> None:
    """Remove these vector ids from either kind of index."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    if isinstance(index, faiss.IndexIVF):  # by its id -> list table: only the lists holding them
        index.remove_ids(faiss.IDSelectorArray(len(ids), faiss.swig_ptr(ids)))
    else:
        index.remove_ids(faiss.IDSelectorBatch(ids))


class Cosines:
    """Dense scores of candidates: from the search, or computed for those it did not return."""

    def __init__(
        self, index: VectorIndex, vector: np.ndarray, dense: tuple[np.ndarray, np.ndarray]
    ) -> None:
        self._index = index
        self._vector = vector
        self._known = dict(zip(dense[0].tolist(), dense[1].tolist(), strict=True))

    def of(self, keys: np.ndarray) -> np.ndarray:
        missing = np.array([k for k in keys.tolist() if k not in self._known], dtype=np.int64)
        if len(missing):
            extra = self._index.similarity(self._vector, missing)
            self._known.update(zip(missing.tolist(), extra.tolist(), strict=True))
        return np.array([self._known[k] for k in keys.tolist()], dtype=np.float32)
