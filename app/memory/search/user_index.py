"""One user's memories as search structures (:class:`UserIndex`), and what recall shows of each
memory without a database read (:class:`Brief`, kept in :class:`Briefs`).

An index is built from the store's rows (:class:`~app.memory.search.cache.IndexCache`) or
restored from an image of an earlier one (:mod:`app.memory.search.image`); either way it is then
kept current by the same catch-up from the store.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from itertools import chain
from typing import NamedTuple

import numpy as np

from app.memory.search.dense import VectorIndex
from app.memory.search.lexical import LexicalIndex, offsets, pack_words, unpack_words
from app.memory.store.records import IndexRow

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class Brief(NamedTuple):
    type: str
    content: str
    created_at: datetime
    observed_at: datetime
    recall_count: int
    """When the row was last read or written here: recalls do not bump the user's version (they
    are bookkeeping), so this may lag the store until the memory or the index is rewritten. The
    profile's order (:mod:`app.memory.search.profile`) can live with a slightly stale count; a
    database read per chat to refresh it could not be afforded."""


class Briefs(MutableMapping[int, Brief]):
    """Briefs by key. Those restored from an image stay packed in arrays (a brief is made when
    it is read: recall reads a few per chat), the others are kept as they are given."""

    def __init__(self) -> None:
        self._given: dict[int, Brief] = {}
        self._packed: dict[int, int] = {}
        """key -> its row in the packed arrays (a restored brief not replaced or deleted)."""
        self._arrays: Mapping[str, np.ndarray] = {}
        self._types: list[str] = []

    def __getitem__(self, key: int) -> Brief:
        brief = self._given.get(key)
        if brief is not None:
            return brief
        return self._unpack(self._packed[key])

    def __setitem__(self, key: int, brief: Brief) -> None:
        self._packed.pop(key, None)
        self._given[key] = brief

    def __delitem__(self, key: int) -> None:
        if self._given.pop(key, None) is None:
            del self._packed[key]

    def __contains__(self, key: object) -> bool:
        return key in self._given or key in self._packed

    def __iter__(self) -> Iterator[int]:
        return chain(self._given, self._packed)

    def __len__(self) -> int:
        return len(self._given) + len(self._packed)

    def _unpack(self, row: int) -> Brief:
        a = self._arrays
        start, end = int(a["content_ptr"][row]), int(a["content_ptr"][row + 1])
        return Brief(
            self._types[int(a["type"][row])],
            a["content"][start:end].tobytes().decode(),
            EPOCH + timedelta(microseconds=int(a["created_us"][row])),
            EPOCH + timedelta(microseconds=int(a["observed_us"][row])),
            int(a["recall_count"][row]),
        )

    def export(self) -> dict[str, np.ndarray]:
        """The briefs as arrays, for :meth:`restore`: the packed ones copied as arrays, the
        given ones packed (no brief is made)."""
        given = list(self._given.values())
        types = sorted({b.type for b in given}.union(self._types))
        code = {t: i for i, t in enumerate(types)}
        rows = np.fromiter(self._packed.values(), np.int64, len(self._packed))
        a = self._arrays if len(rows) else _NO_ARRAYS
        lengths = a["content_ptr"][rows + 1] - a["content_ptr"][rows]
        starts = np.repeat(a["content_ptr"][rows] - (np.cumsum(lengths) - lengths), lengths)
        packed_content = a["content"][starts + np.arange(int(lengths.sum()))]
        recode = np.array([code[t] for t in self._types] or [0], dtype=np.uint8)
        contents = [b.content.encode() for b in given]
        ptr = offsets(np.concatenate([lengths, [len(c) for c in contents]]).astype(np.int64))
        return {
            "keys": np.concatenate(
                [np.fromiter(self._packed, np.int64, len(rows)), np.array(list(self._given))]
            ).astype(np.int64),
            "types": pack_words(types),
            "type": np.concatenate([recode[a["type"][rows]], [code[b.type] for b in given]]).astype(
                np.uint8
            ),
            "content": np.concatenate(
                [packed_content, np.frombuffer(b"".join(contents), dtype=np.uint8)]
            ),
            "content_ptr": ptr,
            **{
                name: np.concatenate([a[name][rows], read(given)]).astype(np.int64)
                for name, read in _NUMBERS.items()
            },
        }

    @classmethod
    def restore(cls, arrays: Mapping[str, np.ndarray]) -> Briefs:
        briefs = cls()
        keys = arrays["keys"].tolist()
        briefs._packed = dict(zip(keys, range(len(keys)), strict=True))
        briefs._arrays = arrays
        briefs._types = unpack_words(arrays["types"])
        return briefs


def _micros(moments: list[datetime]) -> np.ndarray:
    """Microseconds since the epoch, exactly."""
    unit = timedelta(microseconds=1)
    return np.array([(m - EPOCH) // unit for m in moments], dtype=np.int64)


_NUMBERS: dict[str, Callable[[list[Brief]], np.ndarray]] = {
    "created_us": lambda given: _micros([b.created_at for b in given]),
    "observed_us": lambda given: _micros([b.observed_at for b in given]),
    "recall_count": lambda given: np.array([b.recall_count for b in given], dtype=np.int64),
}
_NO_ARRAYS: dict[str, np.ndarray] = {
    "content_ptr": np.zeros(1, dtype=np.int64),
    "content": np.zeros(0, dtype=np.uint8),
    "type": np.zeros(0, dtype=np.uint8),
    **{name: np.zeros(0, dtype=np.int64) for name in ("created_us", "observed_us", "recall_count")},
}


@dataclass(eq=False)
class UserIndex:
    """One user's memories as search structures. Mutate only while holding `lock`, or
    synchronously when it is free (see :meth:`IndexCache.written`)."""

    version: int
    vectors: VectorIndex
    lexical: LexicalIndex
    briefs: Briefs = field(default_factory=Briefs)
    """What chat recall shows of each memory, so it needs no database read."""
    standing: set[int] = field(default_factory=set)
    """The keys of pinned and profile memories: shown in every chat, so kept apart rather than
    found by scanning every brief on each recall."""
    links: dict[int, set[int]] = field(default_factory=dict)
    """Provenance, both ways: a fact's key -> its episodes' keys, an episode's -> its facts'
    (recall never shows a fact beside the episode it came from)."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    frozen: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while a thread reads the whole index (its image being made): nothing changes it
    meanwhile (a catch-up waits, a write in place is left to the next catch-up), and searches,
    which only read, go on."""
    changed: int = 0
    """Memories put or dropped since the index was built, restored or imaged: how far an image
    of it has fallen behind (:class:`~app.memory.search.cache.IndexCache` writes a new one)."""

    def __len__(self) -> int:
        return len(self.briefs)

    def put(
        self,
        rows: Sequence[IndexRow],
        vectors: Sequence[np.ndarray],
        links: Sequence[tuple[int, int]] = (),
    ) -> None:
        """Index rows, each with its (parts, dim) vectors, and the (fact, episode) links among
        them and the memories indexed before."""
        self.vectors.add([r.key for r in rows], vectors)
        for row in rows:
            self.lexical.add(row.key, row.key_text)
            self.briefs[row.key] = Brief(
                row.type, row.content, row.created_at, row.observed_at, row.recall_count
            )
            if row.pinned or row.profile:
                self.standing.add(row.key)
            else:
                self.standing.discard(row.key)  # unpinned or unmarked since
        for fact, episode in links:
            self.links.setdefault(fact, set()).add(episode)
            self.links.setdefault(episode, set()).add(fact)
        self.changed += len(rows)

    def drop(self, keys: Sequence[int]) -> None:
        present = [k for k in keys if k in self.briefs]
        self.vectors.remove(present)
        for key in present:
            self.lexical.remove(key)
            del self.briefs[key]
            self.standing.discard(key)
            for other in self.links.pop(key, ()):
                partners = self.links.get(other)
                if partners is not None:
                    partners.discard(key)
                    if not partners:
                        del self.links[other]
        self.changed += len(present)
