"""A search's candidates as ranked: arrays, best first, made into :class:`Hit` values only as
they are read.

A search ranks ~300 candidates (the dense and BM25 top 100 each, and the feedback's) and shows
ten or so; making a :class:`Hit` for every one (its memory's brief looked up, eight fields set)
cost ~0.4 ms of a search at 1,000 memories and ~0.7 ms at 100,000 (docs/performance.md), most
of them for candidates below the threshold or past the limit.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from app.memory.search.user_index import UserIndex


@dataclass(slots=True)
class Hit:
    """A candidate as ranked; nothing changes one once made. Not a frozen dataclass: a frozen
    one costs 7x as much to make (1.7 µs, not 0.24: each field set through
    ``object.__setattr__``)."""

    key: int
    score: float
    """The fused score (:mod:`app.memory.search.ranking`)."""
    dense: float
    lexical: float
    content: str
    created_at: datetime
    observed_at: datetime
    type: str


class Ranked:
    """The candidates best first: `keys`, and each one's fused `scores`, cosine and lexical
    score, in that order."""

    def __init__(
        self,
        entry: UserIndex,
        keys: np.ndarray,
        scores: np.ndarray,
        dense: np.ndarray,
        lexical: np.ndarray,
    ) -> None:
        self._entry = entry
        self.keys = keys
        self.scores = scores
        self._dense = dense
        self._lexical = lexical

    def positions(self, shown: Collection[int], types: Sequence[str]) -> np.ndarray:
        """The positions of the candidates neither in `shown` nor (when `types` are given) of
        another type, best first."""
        keep = np.ones(len(self.keys), dtype=bool)
        if shown:
            keep &= ~np.isin(self.keys, np.fromiter(shown, np.int64, len(shown)))
        if types:
            allowed, briefs = set(types), self._entry.briefs
            keep &= np.fromiter(
                (briefs[k].type in allowed for k in self.keys.tolist()), bool, len(self.keys)
            )
        return np.flatnonzero(keep)

    def hits(self, positions: np.ndarray) -> list[Hit]:
        """The hits at these positions, in their order."""
        briefs, keys = self._entry.briefs, self.keys
        scores, dense, lexical = self.scores, self._dense, self._lexical
        found = []
        for at in positions.tolist():
            key = int(keys[at])
            brief = briefs[key]
            found.append(Hit(key, float(scores[at]), float(dense[at]), float(lexical[at]),
                             brief.content, brief.created_at, brief.observed_at,
                             brief.type))  # fmt: skip
        return found
