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
from collections.abc import Mapping
from typing import Any

import numpy as np

from app.memory.search.dense import VectorIndex
from app.memory.search.lexical import STOP_WORDS, Analyzer, LexicalIndex
from app.memory.search.user_index import Briefs, UserIndex

logger = logging.getLogger("memproxy.memory")

MAGIC = b"memproxy-index\n"
FORMAT = 1
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
    head = json.dumps(header).encode()
    start = MAGIC + len(head).to_bytes(4, "little") + head
    return b"".join([start, bytes(-len(start) % _ALIGN), *pieces])


def version_of(data: bytes) -> int | None:
    """The version an image was recorded at (None: not an image)."""
    header = _header(data)
    return None if header is None else int(header[0]["version"])


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
        arrays = _arrays(data, header, start)
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
    except (KeyError, ValueError, TypeError, IndexError, RuntimeError) as exc:
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
    except ValueError:
        return None
    if not isinstance(header, dict):
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
        count = int(np.prod(shape)) if shape else 1
        if start + offset + count * kind.itemsize > len(data):
            raise ValueError("it ends early")
        array = np.frombuffer(data, dtype=kind, count=count, offset=start + offset)
        out[name] = array.reshape(shape) if name == "vectors.faiss" else array.reshape(shape).copy()
    return out


def _part(arrays: Mapping[str, np.ndarray], part: str) -> dict[str, np.ndarray]:
    prefix = f"{part}."
    return {name[len(prefix) :]: a for name, a in arrays.items() if name.startswith(prefix)}
