"""Text to index terms, for BM25 (:mod:`.lexical`): lower-cased, split on anything that is not a
letter or digit, English stop words dropped, stemmed (Snowball, so "painting" finds "painted").
Queries also drop the words that make a question a question ("what", "when", "did", "tell"...):
they say nothing about which memory answers it."""

from __future__ import annotations

import re

import Stemmer  # type: ignore[import-not-found]

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
