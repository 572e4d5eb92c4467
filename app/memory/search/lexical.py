"""The lexical side of recall: BM25 over one user's memories, in memory, updated in place.

Words are lower-cased, split on anything that is not a letter or digit, English stop words
dropped, and stemmed (Snowball, so "painting" finds "painted"). Queries also drop the words that
make a question a question ("what", "when", "did", "tell"...): they say nothing about which
memory answers it, and memories rarely contain them in the same sense.

Score convention (:meth:`LexicalIndex.scores`): BM25 (Lucene's IDF, k1=1.2, b=0.75) divided by the
query's ceiling, the sum over the query's words of ``idf * (k1 + 1)``, the limit a memory reaches
by containing each of them very often. A query word that no memory of the user holds counts in the
ceiling as much as the query's rarest word that some memory holds (the IDF of a word in no memory
would depend on how many memories the user has, and drown every word of a small store): "What is
the difference between TCP and UDP?" is not answered by every memory that says "difference"
(bench/pipeline_eval.py's 40 coding and science chats, sent to the four LoCoMo users of the
dev file: with the ceiling over the words the memories hold, 63 % were shown memories; this
way, 16 %; of 20 held-out chats written afterwards, 58 % and 16 %: docs/performance.md).
So a score is in [0, 1): 0 shares no word with the query; near 1 holds all its rare words.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Sequence

import numpy as np
import Stemmer  # type: ignore[import-not-found]

K1 = 1.2
B = 0.75
_WORD = re.compile(r"[^\W_]+", re.UNICODE)

STOP_WORDS = frozenset(
    """a about above after again against all am an and any are as at be because been before being
    below between both but by can could did do does doing down during each few for from further had
    has have having he her here hers herself him himself his how i if in into is it its itself just
    me more most my myself no nor not now of off on once only or other our ours ourselves out over
    own same she should so some such than that the their theirs them themselves then there these
    they this those through to too under until up very was we were what when where which while who
    whom why will with would you your yours yourself yourselves s t d ll m re ve don didn doesn
    isn wasn weren won wouldn couldn shouldn""".split()
)
QUESTION_WORDS = frozenset(
    """what when where which who whom whose why how did does do is was were are has have had
    can could would should will ever kind sort type tell say said know think remember much many
    long likely""".split()
)
"""Dropped from queries only: they shape the question, not what the answer is about."""


class Analyzer:
    """Text to index terms. Stems are cached: the vocabulary of one household is small."""

    def __init__(self) -> None:
        self._stemmer = Stemmer.Stemmer("english")
        self._stems: dict[str, str] = {}

    def terms(self, text: str) -> list[str]:
        words = [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]
        return [self._stem(w) for w in words]

    def query_terms(self, text: str) -> list[str]:
        """The distinct terms of a query, question words dropped, in order of appearance."""
        words = [w for w in _WORD.findall(text.lower()) if w not in STOP_WORDS]
        words = [w for w in words if w not in QUESTION_WORDS]
        return list(dict.fromkeys(self._stem(w) for w in words))

    def _stem(self, word: str) -> str:
        stem = self._stems.get(word)
        if stem is None:
            stem = self._stemmer.stemWord(word)
            if len(self._stems) < 200_000:
                self._stems[word] = stem
        return stem


class LexicalIndex:
    """BM25 over a set of documents identified by int64 keys; add, remove and search in place.

    Each document has a slot (a small integer, reused after removal) so that a query's scores
    accumulate in one dense array, with no sorting: ~1 ms at 100k documents. Postings are kept
    per term as dicts (cheap to change) and turned into arrays the first time a query needs them
    (cheap to score); a change to a term drops its arrays.
    """

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self._docs: dict[int, tuple[tuple[str, ...], int]] = {}
        """key -> (its distinct terms, its slot)."""
        self._keys = np.full(64, -1, dtype=np.int64)
        """slot -> key (-1: free)."""
        self._lengths = np.zeros(64, dtype=np.float64)
        """slot -> length in terms."""
        self._free: list[int] = []
        self._postings: dict[str, dict[int, int]] = {}
        """term -> {slot: term frequency}."""
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._docs)

    def add(self, key: int, text: str) -> None:
        """Index `text` under `key`, replacing what the key held."""
        if key in self._docs:
            self.remove(key)
        terms = Counter(self.analyzer.terms(text))
        length = sum(terms.values())
        slot = self._free.pop() if self._free else len(self._docs)
        if slot >= len(self._keys):
            grow = len(self._keys)
            self._keys = np.concatenate([self._keys, np.full(grow, -1, dtype=np.int64)])
            self._lengths = np.concatenate([self._lengths, np.zeros(grow)])
        self._keys[slot] = key
        self._lengths[slot] = length
        self._docs[key] = (tuple(terms), slot)
        self._total_length += length
        for term, count in terms.items():
            self._postings.setdefault(term, {})[slot] = count
            self._arrays.pop(term, None)

    def remove(self, key: int) -> None:
        entry = self._docs.pop(key, None)
        if entry is None:
            return
        terms, slot = entry
        self._total_length -= int(self._lengths[slot])
        self._keys[slot] = -1
        self._lengths[slot] = 0
        self._free.append(slot)
        for term in terms:
            postings = self._postings[term]
            del postings[slot]
            if not postings:
                del self._postings[term]
            self._arrays.pop(term, None)

    def scores(self, query: str) -> Scores:
        """Every document's score for the query, normalised as the module docstring says."""
        return self.score_terms(self.analyzer.query_terms(query))

    def feedback_terms(
        self, keys: Sequence[int], exclude: Sequence[str], *, limit: int, min_docs: int = 2
    ) -> list[str]:
        """Terms shared by at least `min_docs` of these documents (the best matches of a first
        search, best first): pseudo-relevance feedback. Most shared first; among equals, those
        of the better-ranked document first (measured: better than rarest first)."""
        counts: Counter[str] = Counter()  # keeps first-seen order for the stable sort below
        for key in keys:
            entry = self._docs.get(key)
            if entry is not None:
                counts.update(entry[0])
        skip = set(exclude)
        ranked = sorted(
            (t for t, n in counts.items() if n >= min_docs and t not in skip),
            key=lambda t: -counts[t],
        )
        return ranked[:limit]

    def score_terms(self, query_terms: Sequence[str], *, held_only: bool = False) -> Scores:
        """:meth:`scores` for terms already analysed; `held_only`: the ceiling over the words
        the memories hold only (the words no memory holds left out of it)."""
        terms = [t for t in query_terms if t in self._postings]
        scores = np.zeros(len(self._keys), dtype=np.float64)
        if not terms or not self._docs:
            return Scores(self, scores)
        count = len(self._docs)
        average = max(self._total_length / count, 1e-9)
        ceiling = rarest = 0.0
        for term in terms:
            slots, tf = self._postings_array(term)
            df = len(slots)
            idf = math.log(1.0 + (count - df + 0.5) / (df + 0.5))
            ceiling += idf * (K1 + 1.0)
            rarest = max(rarest, idf)
            norm = K1 * (1.0 - B + B * self._lengths[slots] / average)
            scores[slots] += idf * tf * (K1 + 1.0) / (tf + norm)  # slots are distinct per term
        unknown = 0 if held_only else len(set(query_terms).difference(terms))
        ceiling += unknown * rarest * (K1 + 1.0)
        return Scores(self, scores / ceiling)

    def _postings_array(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        arrays = self._arrays.get(term)
        if arrays is None:
            postings = self._postings[term]
            slots = np.fromiter(postings.keys(), dtype=np.int64, count=len(postings))
            tf = np.fromiter(postings.values(), dtype=np.float64, count=len(postings))
            arrays = self._arrays[term] = (slots, tf)
        return arrays


class Scores:
    """One query's scores over a :class:`LexicalIndex` (valid until the index changes)."""

    def __init__(self, index: LexicalIndex, by_slot: np.ndarray) -> None:
        self._index = index
        self._by_slot = by_slot

    def of(self, keys: np.ndarray) -> np.ndarray:
        """The scores of these keys (0 for keys the index does not hold)."""
        docs = self._index._docs
        slots = np.array([docs[k][1] if k in docs else -1 for k in keys.tolist()], dtype=np.int64)
        found = slots >= 0
        out = np.zeros(len(keys), dtype=np.float32)
        out[found] = self._by_slot[slots[found]]
        return out

    def top(self, k: int) -> np.ndarray:
        """Keys of (up to) the `k` best-scoring documents with a score above 0, unordered."""
        matched = np.flatnonzero(self._by_slot)
        if len(matched) > k:
            matched = matched[np.argpartition(self._by_slot[matched], -k)[-k:]]
        keys: np.ndarray = self._index._keys[matched]
        return keys

    def items(self) -> dict[int, float]:
        """Every matching key and its score."""
        matched = np.flatnonzero(self._by_slot)
        keys = self._index._keys[matched].tolist()
        return dict(zip(keys, self._by_slot[matched].tolist(), strict=True))
