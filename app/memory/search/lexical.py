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
from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import chain

import numpy as np

from app.memory.search.analysis import QUESTION_WORDS as QUESTION_WORDS
from app.memory.search.analysis import STOP_WORDS as STOP_WORDS
from app.memory.search.analysis import Analyzer as Analyzer
from app.memory.search.bm25_scores import Scores

K1 = 1.2
B = 0.75


class LexicalIndex:
    """BM25 over a set of documents identified by int64 keys; add, remove and search in place.

    Each document has a slot (a small integer, reused after removal) so that a query's scores
    accumulate in one dense array, with no sorting: ~1 ms at 100k documents. Postings are kept
    per term as dicts (cheap to change) and turned into arrays the first time a query needs them
    (cheap to score); a change to a term drops its arrays.

    An index restored from an image (:meth:`restore`, :mod:`app.memory.search.image`) holds its
    postings and its documents' terms as arrays only: a term's dict, or a document's tuple of
    terms, is made the first time a change needs it, so a restore costs no work per document.
    """

    def __init__(self, analyzer: Analyzer) -> None:
        self.analyzer = analyzer
        self._slots: dict[int, int] = {}
        """key -> its slot."""
        self._terms: dict[int, tuple[str, ...]] = {}
        """slot -> its document's distinct terms (for a restored slot: once changed)."""
        self._base: _BaseTerms | None = None
        """The restored documents' terms, by slot, until :attr:`_terms` holds the slot's."""
        self._keys = np.full(64, -1, dtype=np.int64)
        """slot -> key (-1: free)."""
        self._lengths = np.zeros(64, dtype=np.float64)
        """slot -> length in terms."""
        self._free: list[int] = []
        self._postings: dict[str, dict[int, int]] = {}
        """term -> {slot: term frequency}: what a term's postings are, when it has a dict."""
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        """term -> (slots, frequencies): a dict's arrays, or a restored term's postings."""
        self._total_length = 0

    def __len__(self) -> int:
        return len(self._slots)

    def add(self, key: int, text: str) -> None:
        """Index `text` under `key`, replacing what the key held."""
        if key in self._slots:
            self.remove(key)
        terms = Counter(self.analyzer.terms(text))
        length = sum(terms.values())
        slot = self._free.pop() if self._free else len(self._slots)
        if slot >= len(self._keys):
            grow = len(self._keys)
            self._keys = np.concatenate([self._keys, np.full(grow, -1, dtype=np.int64)])
            self._lengths = np.concatenate([self._lengths, np.zeros(grow)])
        self._keys[slot] = key
        self._lengths[slot] = length
        self._slots[key] = slot
        self._terms[slot] = tuple(terms)
        self._total_length += length
        for term, count in terms.items():
            self._changing(term)[slot] = count

    def remove(self, key: int) -> None:
        slot = self._slots.pop(key, None)
        if slot is None:
            return
        terms = self._terms_of(slot)
        self._terms.pop(slot, None)
        self._total_length -= int(self._lengths[slot])
        self._keys[slot] = -1
        self._lengths[slot] = 0
        self._free.append(slot)
        for term in terms:
            postings = self._changing(term)
            del postings[slot]
            if not postings:
                del self._postings[term]

    def _changing(self, term: str) -> dict[int, int]:
        """The term's postings as a dict, to be changed (its arrays dropped)."""
        postings = self._postings.get(term)
        if postings is None:
            restored = self._arrays.get(term)
            postings = (
                {} if restored is None else dict(zip(*(a.tolist() for a in restored), strict=True))
            )
            self._postings[term] = postings
        self._arrays.pop(term, None)
        return postings

    def _terms_of(self, slot: int) -> tuple[str, ...]:
        terms = self._terms.get(slot)
        if terms is None:
            assert self._base is not None, "a slot with no terms"
            terms = self._base.terms(slot)
        return terms

    def _holds(self, term: str) -> bool:
        return term in self._postings or term in self._arrays

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
            slot = self._slots.get(key)
            if slot is not None:
                counts.update(self._terms_of(slot))
        skip = set(exclude)
        ranked = sorted(
            (t for t, n in counts.items() if n >= min_docs and t not in skip),
            key=lambda t: -counts[t],
        )
        return ranked[:limit]

    def score_terms(self, query_terms: Sequence[str], *, held_only: bool = False) -> Scores:
        """:meth:`scores` for terms already analysed; `held_only`: the ceiling over the words
        the memories hold only (the words no memory holds left out of it)."""
        terms = [t for t in query_terms if self._holds(t)]
        scores = np.zeros(len(self._keys), dtype=np.float64)
        if not terms or not self._slots:
            return Scores(self, scores)
        count = len(self._slots)
        average = max(self._total_length / count, 1e-9)
        ceiling = rarest = 0.0
        touched = []
        for term in terms:
            slots, tf = self._postings_array(term)
            touched.append(slots)
            df = len(slots)
            idf = math.log(1.0 + (count - df + 0.5) / (df + 0.5))
            ceiling += idf * (K1 + 1.0)
            rarest = max(rarest, idf)
            norm = K1 * (1.0 - B + B * self._lengths[slots] / average)
            scores[slots] += idf * tf * (K1 + 1.0) / (tf + norm)  # slots are distinct per term
        unknown = 0 if held_only else len(set(query_terms).difference(terms))
        ceiling += unknown * rarest * (K1 + 1.0)
        return Scores(self, scores / ceiling, touched)

    def _postings_array(self, term: str) -> tuple[np.ndarray, np.ndarray]:
        arrays = self._arrays.get(term)
        if arrays is None:
            postings = self._postings[term]
            slots = np.fromiter(postings.keys(), dtype=np.int64, count=len(postings))
            tf = np.fromiter(postings.values(), dtype=np.float64, count=len(postings))
            arrays = self._arrays[term] = (slots, tf)
        return arrays

    # --- images (app/memory/search/image.py) ------------------------------------------------

    def export(self) -> dict[str, np.ndarray]:
        """The index as arrays, for :meth:`restore` (postings by term, terms by slot)."""
        vocabulary = sorted(set(self._postings).union(self._arrays))
        ids = {term: i for i, term in enumerate(vocabulary)}
        postings = [self._postings_array(term) for term in vocabulary]
        used = len(self._slots) + len(self._free)
        doc_terms = [self._terms_of(slot) if self._keys[slot] >= 0 else () for slot in range(used)]
        lengths = list(map(len, doc_terms))
        return {
            "vocabulary": pack_words(vocabulary),
            "term_ptr": offsets([len(p[0]) for p in postings]),
            "slots": _joined([p[0] for p in postings], np.int32),
            "tf": _joined([p[1] for p in postings], np.float64),
            "doc_ptr": offsets(lengths),
            "doc_terms": np.fromiter(
                map(ids.__getitem__, chain.from_iterable(doc_terms)), np.int32, sum(lengths)
            ),
            "keys": self._keys[:used].copy(),
            "lengths": self._lengths[:used].copy(),
        }

    @classmethod
    def restore(cls, analyzer: Analyzer, arrays: Mapping[str, np.ndarray]) -> LexicalIndex:
        """The index :meth:`export` gave these arrays of; no work per document."""
        index = cls(analyzer)
        vocabulary = unpack_words(arrays["vocabulary"])
        ptr = arrays["term_ptr"].tolist()
        slots, tf = arrays["slots"], arrays["tf"]
        index._arrays = {
            term: (slots[a:b], tf[a:b])
            for term, a, b in zip(vocabulary, ptr[:-1], ptr[1:], strict=True)
        }
        keys = arrays["keys"]
        used = len(keys)
        capacity = max(64, used)
        index._keys = np.full(capacity, -1, dtype=np.int64)
        index._keys[:used] = keys
        index._lengths = np.zeros(capacity, dtype=np.float64)
        index._lengths[:used] = arrays["lengths"]
        live = np.flatnonzero(keys >= 0)
        index._slots = dict(zip(keys[live].tolist(), live.tolist(), strict=True))
        index._free = np.flatnonzero(keys < 0).tolist()
        index._total_length = int(index._lengths.sum())
        index._base = _BaseTerms(vocabulary, arrays["doc_ptr"], arrays["doc_terms"])
        return index


class _BaseTerms:
    """A restored index's documents' terms: term ids by slot."""

    def __init__(self, vocabulary: list[str], ptr: np.ndarray, ids: np.ndarray) -> None:
        self._vocabulary = vocabulary
        self._ptr = ptr
        self._ids = ids

    def terms(self, slot: int) -> tuple[str, ...]:
        ids = self._ids[int(self._ptr[slot]) : int(self._ptr[slot + 1])].tolist()
        return tuple(self._vocabulary[i] for i in ids)


def pack_words(words: Sequence[str]) -> np.ndarray:
    """Words (no NUL in them: analysed terms, type names) as one array of UTF-8 bytes."""
    return np.frombuffer("\0".join(words).encode(), dtype=np.uint8)


def unpack_words(packed: np.ndarray) -> list[str]:
    return packed.tobytes().decode().split("\0") if len(packed) else []


def offsets(lengths: Sequence[int] | np.ndarray) -> np.ndarray:
    """Where each of these runs begins and the last ends (CSR pointers: one more than runs)."""
    out = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=out[1:])
    return out


def _joined(parts: Sequence[np.ndarray], dtype: type[np.generic]) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)
