"""An index image: one user's :class:`~app.memory.search.user_index.UserIndex` as bytes, so that a
restart or another replica loads it rather than reading and analysing every memory again.

Measured (bench/recall_bench.py, 100,000 memories on PostgreSQL): building an index from the
rows takes ~6 s, two of them reading the rows; restoring an image and catching it up is the
figure docs/performance.md gives.

Promises:

- :func:`load` gives back an index that searches exactly as the one :func:`dump` was given
  (the same keys, scores and briefs), at the version recorded with it: the caller catches it up
  from the store before it serves (an image is a cache like any other, never served stale);
- an image of another embedding model, dimension, analyzer or layout, or one that does not
  read whole, loads as None (the caller builds from the rows);
- the bytes are arrays and JSON, never pickles: a database's contents are not code.

Layout: :data:`MAGIC`, the header's length (4 bytes, little-endian), the header (JSON: format,
model, dim, analyzer, version, and each array's name, dtype, shape and offset), then the arrays,
each at an offset that is a multiple of 64.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.memory.search.dense import VectorIndex
from app.memory.search.lexical import STOP_WORDS, Analyzer, LexicalIndex, unpack_words
from app.memory.search.user_index import Briefs, UserIndex

logger = logging.getLogger("memproxy.memory")

MAGIC = b"memproxy-index\n"
FORMAT = 2
"""Bump when the layout or what an index holds changes: older images are then rebuilt."""
ANALYZER = (
    "snowball-english/" + hashlib.sha256(" ".join(sorted(STOP_WORDS)).encode()).hexdigest()[:12]
)
"""How the words were analysed: another analyzer's terms would not match this one's queries."""
_ALIGN = 64


def dump(entry: UserIndex, model: str) -> bytes:
    """The index as an image, recorded at its version (hold its lock: no change meanwhile)."""
    arrays: dict[str, np.ndarray] = {}
    for part, exported in (
        ("vectors", entry.vectors.export()),
        ("lexical", entry.lexical.export()),
        ("briefs", entry.briefs.export()),
    ):
        arrays.update((f"{part}.{name}", array) for name, array in exported.items())
    arrays["standing"] = np.fromiter(entry.standing, np.int64, len(entry.standing))
    pairs = [(a, b) for a, partners in entry.links.items() for b in partners if a < b]
    arrays["links"] = np.array(pairs, dtype=np.int64).reshape(-1, 2)
    header: dict[str, Any] = {
        "format": FORMAT,
        "model": model,
        "dim": entry.vectors.dim,
        "analyzer": ANALYZER,
        "version": entry.version,
        "arrays": [],
    }
    pieces: list[Any] = []
    offset = 0
    for name, array in arrays.items():
        header["arrays"].append([name, array.dtype.str, list(array.shape), offset])
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        pieces += [data, bytes(-data.nbytes % _ALIGN)]
        offset += data.nbytes + len(pieces[-1])
    header["crc32"] = _crc(pieces)
    head = json.dumps(header).encode()
    start = MAGIC + len(head).to_bytes(4, "little") + head
    return b"".join([start, bytes(-len(start) % _ALIGN), *pieces])


def load(data: bytes, *, model: str, dim: int, analyzer: Analyzer) -> UserIndex | None:
    """The index of this image, or None when it is of another model, dimension, analyzer or
    format, or does not read whole (logged)."""
    read = _header(data)
    if read is None:
        logger.warning("an index image that is not one: building from the memories")
        return None
    header, start = read
    if (header.get("format"), header.get("model"), header.get("dim"), header.get("analyzer")) != (
        FORMAT,
        model,
        dim,
        ANALYZER,
    ):
        return None  # another model or version of memproxy made it: quietly rebuilt
    try:
        if header.get("crc32") != _crc([memoryview(data)[start:]]):
            raise ValueError("its checksum differs")
        arrays = _arrays(data, header, start)
        _check(arrays)
        entry = UserIndex(
            int(header["version"]),
            VectorIndex.restore(dim, _part(arrays, "vectors")),
            LexicalIndex.restore(analyzer, _part(arrays, "lexical")),
            Briefs.restore(_part(arrays, "briefs")),
            set(arrays["standing"].tolist()),
        )
        for fact, episode in arrays["links"].tolist():
            entry.links.setdefault(fact, set()).add(episode)
            entry.links.setdefault(episode, set()).add(fact)
        if not len(entry.briefs) == len(entry.lexical) == len(entry.vectors):
            raise ValueError("its parts hold different memories")
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError, RecursionError) as exc:
        logger.warning("an index image that does not read (%s): building from the memories", exc)
        return None
    return entry


def _header(data: bytes) -> tuple[dict[str, Any], int] | None:
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + 4:
        return None
    size = int.from_bytes(data[len(MAGIC) : len(MAGIC) + 4], "little")
    end = len(MAGIC) + 4 + size
    try:
        header = json.loads(data[len(MAGIC) + 4 : end])
    except (ValueError, RecursionError):
        return None
    if not isinstance(header, dict) or not isinstance(header.get("arrays"), list):
        return None
    return header, end + (-end % _ALIGN)


def _arrays(data: bytes, header: Mapping[str, Any], start: int) -> dict[str, np.ndarray]:
    """Each array, copied out of `data` (so it can be freed), except FAISS's bytes, which the
    restore copies itself."""
    out = {}
    for name, dtype, shape, offset in header["arrays"]:
        kind = np.dtype(dtype)
        if kind.hasobject:
            raise ValueError("an array of objects")
        if any(not isinstance(n, int) or n < 0 for n in shape) or not isinstance(offset, int):
            raise ValueError("a shape or an offset that is not one")
        count = int(np.prod(shape)) if shape else 1
        if offset < 0 or start + offset + count * kind.itemsize > len(data):
            raise ValueError("it ends early")
        array = np.frombuffer(data, dtype=kind, count=count, offset=start + offset)
        out[name] = array.reshape(shape) if name == "vectors.faiss" else array.reshape(shape).copy()
    return out


_KINDS = {
    "vectors.faiss": "|u1", "vectors.keys": "<i8", "vectors.parts": "<i8",
    "vectors.trained_at": "<i8",
    "lexical.vocabulary": "|u1", "lexical.term_ptr": "<i8", "lexical.slots": "<i4",
    "lexical.tf": "<f8", "lexical.doc_ptr": "<i8", "lexical.doc_terms": "<i4",
    "lexical.keys": "<i8", "lexical.lengths": "<f8",
    "briefs.keys": "<i8", "briefs.types": "|u1", "briefs.type": "|u1", "briefs.content": "|u1",
    "briefs.content_ptr": "<i8", "briefs.created_us": "<i8", "briefs.observed_us": "<i8",
    "briefs.recall_count": "<i8", "standing": "<i8", "links": "<i8",
}  # fmt: skip
"""Each array's exact dtype: an image is read only as this layout."""


def _crc(pieces: list[Any]) -> int:
    crc = 0
    for piece in pieces:
        crc = zlib.crc32(piece, crc)
    return crc


def _check(a: Mapping[str, np.ndarray]) -> None:
    """Raise ValueError unless the arrays are this layout and consistent: every pointer in
    bounds and in order, every id of something that exists, one set of keys throughout."""
    if sorted(a) != sorted(_KINDS) or any(a[n].dtype.str != k for n, k in _KINDS.items()):
        raise ValueError("not this layout")

    def pointers(ptr: np.ndarray, length: int) -> None:
        if len(ptr) < 1 or ptr[0] != 0 or ptr[-1] != length or np.any(np.diff(ptr) < 0):
            raise ValueError("pointers out of order or bounds")

    used = len(a["lexical.keys"])
    pointers(a["lexical.term_ptr"], len(a["lexical.slots"]))
    pointers(a["lexical.doc_ptr"], len(a["lexical.doc_terms"]))
    pointers(a["briefs.content_ptr"], len(a["briefs.content"]))
    terms = len(a["lexical.term_ptr"]) - 1
    slots, doc_terms = a["lexical.slots"], a["lexical.doc_terms"]
    if len(a["lexical.doc_ptr"]) != used + 1 or len(a["lexical.lengths"]) != used:
        raise ValueError("documents and slots differ")
    if len(slots) and (
        slots.min() < 0 or slots.max() >= used or (a["lexical.keys"][slots] < 0).any()
    ):
        raise ValueError("a posting of no document")
    if not (a["lexical.tf"] >= 1).all():  # (NaN too) a posting's count: it scores above 0
        raise ValueError("a posting counted less than once")
    if len(doc_terms) and (doc_terms.min() < 0 or doc_terms.max() >= terms):
        raise ValueError("a term of no vocabulary")
    if len(a["briefs.type"]) and int(a["briefs.type"].max()) >= len(
        unpack_words(a["briefs.types"])
    ):
        raise ValueError("a type of no name")
    live = np.sort(a["lexical.keys"][a["lexical.keys"] >= 0])
    for other in (a["briefs.keys"], a["vectors.keys"]):
        if not np.array_equal(np.sort(other), live):
            raise ValueError("its parts hold different memories")
    if len(a["vectors.parts"]) != len(live) or (a["vectors.parts"] < 1).any():
        raise ValueError("parts of no memory")
    counts = [len(a[f"briefs.{n}"]) for n in ("type", "created_us", "observed_us", "recall_count")]
    if set(counts) != {len(live)} or len(a["briefs.content_ptr"]) != len(live) + 1:
        raise ValueError("briefs of different lengths")
    if a["links"].ndim != 2 or a["links"].shape[1] != 2 or len(np.setdiff1d(a["links"], live)):
        raise ValueError("a link to no memory")
    if len(np.setdiff1d(a["standing"], live)):
        raise ValueError("a standing memory that is not one")


def _part(arrays: Mapping[str, np.ndarray], part: str) -> dict[str, np.ndarray]:
    prefix = f"{part}."
    return {name[len(prefix) :]: a for name, a in arrays.items() if name.startswith(prefix)}
