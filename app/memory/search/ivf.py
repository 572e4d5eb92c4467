"""An approximate vector index for users with many memories: FAISS's inverted file (IVF) over
the same fp16 vectors, so a search scans the lists of the few centroids nearest the query rather
than every vector.

The exhaustive scan grows with the user (measured at 100,000 vectors: ~7 ms of a ~16 ms search;
at 1,000,000 ten times that). With ``sqrt(n)`` lists, each searched query probes
:func:`nprobe_for` of them (a quarter, at least 8): ~25 % of the vectors. The lists are trained
(k-means over a sample) once, when a user's index reaches ``MEMPROXY_INDEX_IVF_MIN_VECTORS``,
in a worker thread, and again when it has grown four times since; until then the exhaustive
index serves. Measured quality (docs/performance.md): the dev LoCoMo set searched through an IVF
probing the same share of its lists ranks within 0.005 of the exhaustive search.

Removing memories stays cheap: the index keeps a hash table from id to list (``DirectMap``), so
a removal touches only the lists of the removed ids, and a candidate found by BM25 alone gets its
cosine by id, as in the exhaustive index.
"""

from __future__ import annotations

import math
from typing import Any

import faiss
import numpy as np

LISTS_PER_ROOT = 1.0
"""Lists per square root of the vectors trained on."""
LISTS_MIN = 8
PROBED_SHARE = 4
"""A search probes a quarter of the lists (at least :data:`PROBE_MIN`): measured on the dev
LoCoMo set with every user's index an IVF (``bench/recall_eval.py --approximate``), a quarter
ranks within 0.005 of the exhaustive search at every k; an eighth lost 0.014 of recall@10, a
16th 0.025 (with four times the lists: 0.008 and 0.017)."""
PROBE_MIN = 8
TRAIN_PER_LIST = 40
"""Vectors k-means is trained on, per list (FAISS warns below 39)."""
TRAIN_ITERATIONS = 10
ADD_CHUNK = 65536
FLOOR = 256
"""An index of fewer vectors is never approximate, whatever the setting (k-means needs more
points than lists; so small an index is scanned in microseconds)."""
GROWTH_TO_RETRAIN = 4
"""An IVF trained at n vectors is trained again once it holds this many times n."""


def nprobe_for(lists: int) -> int:
    return min(lists, max(PROBE_MIN, math.ceil(lists / PROBED_SHARE)))


def build_ivf(dim: int, ids: np.ndarray, vectors: np.ndarray, *, seed: int = 1) -> faiss.IndexIVF:
    """An IVF index of these (id, vector) pairs (`vectors` in half precision, converted a chunk at
    a time: a million vectors are not copied whole again), its lists trained on a sample of
    them. Pure (no shared state): run it in a worker thread."""
    lists = max(LISTS_MIN, round(LISTS_PER_ROOT * math.sqrt(len(vectors))))
    index: Any = faiss.index_factory(dim, f"IVF{lists},SQfp16", faiss.METRIC_INNER_PRODUCT)
    index.by_residual = False  # the fp16 codes hold the vectors themselves, as the flat index's
    index.cp.niter = TRAIN_ITERATIONS
    index.cp.seed = seed
    sample = len(vectors)
    if sample > lists * TRAIN_PER_LIST:
        sample = lists * TRAIN_PER_LIST
        picked = np.random.default_rng(seed).choice(len(vectors), sample, replace=False)
        index.train(vectors[np.sort(picked)].astype(np.float32))
    else:
        index.train(vectors.astype(np.float32))
    index.set_direct_map_type(faiss.DirectMap.Hashtable)  # type: ignore[attr-defined]
    for start in range(0, len(vectors), ADD_CHUNK):
        chunk = slice(start, start + ADD_CHUNK)
        index.add_with_ids(vectors[chunk].astype(np.float32), np.ascontiguousarray(ids[chunk]))
    index.nprobe = nprobe_for(lists)
    built: faiss.IndexIVF = index
    return built
