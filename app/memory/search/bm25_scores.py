"""One query's BM25 scores over a user's :class:`~app.memory.search.lexical.LexicalIndex`: a
dense array by document slot, read by key, as its best keys, or as every match."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:  # the index makes its scores
    from app.memory.search.lexical import LexicalIndex


FEW_POSTINGS = 512
"""A query's postings are sorted, rather than marked in a mask of every slot, when they are
fewer than one slot in this many."""


class Scores:
    """One query's scores over a :class:`LexicalIndex` (valid until the index changes)."""

    def __init__(
        self, index: LexicalIndex, by_slot: np.ndarray, touched: Sequence[np.ndarray] = ()
    ) -> None:
        """`touched`: the slots each term scored (none: no slot scores)."""
        self._index = index
        self._by_slot = by_slot
        self._touched = touched

    def _matched(self) -> np.ndarray:
        """The slots scoring above 0, ascending: those a term's postings hold (a posting scores
        above 0: its idf is, and its count at least 1)."""
        held = sum(len(slots) for slots in self._touched)
        if not held:
            return np.zeros(0, np.int64)
        # Sorting the postings costs ~0.13 us a posting; marking them in a mask of one byte a
        # slot, then reading it, 0.1-1.4 ms at 1,000,000 slots (1,000-100,000 postings); the
        # pass over every slot's score it replaces, 2-5 ms there (measured): the sort when
        # they are very few.
        if held * FEW_POSTINGS < len(self._by_slot):
            return np.unique(np.concatenate(self._touched))
        mask = np.zeros(len(self._by_slot), dtype=bool)
        for slots in self._touched:
            mask[slots] = True
        return np.flatnonzero(mask)

    def of(self, keys: np.ndarray) -> np.ndarray:
        """The scores of these keys (0 for keys the index does not hold)."""
        get = self._index._slots.get
        slots = np.fromiter((get(k, -1) for k in keys.tolist()), np.int64, len(keys))
        found = slots >= 0
        out = np.zeros(len(keys), dtype=np.float32)
        out[found] = self._by_slot[slots[found]]
        return out

    def top(self, k: int) -> np.ndarray:
        """Keys of (up to) the `k` best-scoring documents with a score above 0, unordered."""
        matched = self._matched()
        if len(matched) > k:
            matched = matched[np.argpartition(self._by_slot[matched], -k)[-k:]]
        keys: np.ndarray = self._index._keys[matched]
        return keys

    def items(self) -> dict[int, float]:
        """Every matching key and its score."""
        matched = self._matched()
        keys = self._index._keys[matched].tolist()
        return dict(zip(keys, self._by_slot[matched].tolist(), strict=True))
