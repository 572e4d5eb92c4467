"""What consolidation (:mod:`.consolidation`) takes of the model's answer, and what it does not.

A 1.5B model asked about a group of facts calls nearly any two of them "the same", writes a
merged memory that drops what one of them said ("Researching adoption agencies, a dream to give
kids a loving home" and "Their goal is to give kids a loving home" -> the second alone), and says
of any older fact that a newer one ended it (measured: "yes" for all of 13 pairs, "Likes hiking"
and "Plays the violin" included). So its answer is a proposal, kept only where the facts bear
it out:

- a merge: the merged memory says nothing the facts do not (:func:`grounded`), keeps most of
  what each fact merged said (:func:`covers`), and each fact merged is alike the one it goes
  into (:data:`SAME_COSINE`);
- a near copy merged with no model at all (a cosine above the dedup threshold): the two name
  the same numbers and names (:func:`same_details`: "keeps thing 0" and "keeps thing 1", or
  two appointments on different days, are two facts however alike their vectors);
- a supersession: the newer fact says that something changed (:func:`tells_a_change`: moved,
  quit, no longer, a new job...), and the two are alike (``MEMPROXY_CONSOLIDATION_COSINE``);
  which fact ended is told by the dates, not by the model.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from app.memory.search.lexical import Analyzer

SAME_COSINE = 0.6
"""A fact the model calls the same as another is merged only this like it: measured with
MiniLM, "Lives in Lyon" / "Moved to Paris" 0.58 (a fact ended, not the same), "Has a dog named
Max" / "Their dog Max is a beagle" 0.75, "Likes hiking" / "Enjoys hiking in the mountains on
weekends" 0.70."""
NEW_WORDS = 1
"""Words of a merged memory that none of its facts has, at most (a joining word)."""
COVER = 0.6
"""Share of each merged fact's words (stemmed, no stop words) the merged memory keeps, at least:
"Has a dog named Max" in "Their dog Max is a beagle" 2 of 3."""

CHANGE = re.compile(
    r"\b(?:moved|moving|relocated|quit|quitting|stopped|gave up|no longer|not anymore|anymore|"
    r"used to|switched|retired|divorced|broke up|separated|sold|"
    r"lost (?:their|his|her|the) job|new (?:job|home|house|apartment|flat|city|partner|role|"
    r"position)|now (?:lives?|works?))\b",
    re.IGNORECASE,
)
"""Words by which a fact says that something changed: only strong ones ("finished recording an
album with the band" ends nothing)."""

_ANALYZER = Analyzer()
_NUMBER = re.compile(r"\d+")
_SENTENCES = re.compile(r"(?<=[.!?])\s+")


def same_details(a: str, b: str) -> bool:
    """Whether two facts name the same numbers and names (capitalised words but a sentence's
    first): what near copies must, since MiniLM puts facts that differ in one of them very
    close."""
    return _details(a) == _details(b)


def _details(text: str) -> set[str]:
    names = {w.strip(".,;:!?\"'()").lower() for s in _SENTENCES.split(text.strip())
             for w in s.split()[1:] if w[:1].isupper()}  # fmt: skip
    return names | set(_NUMBER.findall(text))


def grounded(text: str, contents: Sequence[str], *, allowed: int = NEW_WORDS) -> bool:
    """Whether `text` says nothing `contents` do not (but for `allowed` words: joining ones)."""
    said = {t for content in contents for t in _ANALYZER.terms(content)}
    return len([t for t in set(_ANALYZER.terms(text)) if t not in said]) <= allowed


def covers(text: str, content: str) -> bool:
    """Whether a merged memory keeps most of what a fact merged into it said."""
    words = set(_ANALYZER.terms(content))
    return not words or len(words & set(_ANALYZER.terms(text))) >= COVER * len(words)


def tells_a_change(content: str) -> bool:
    """Whether a fact says that something changed (what may end an older fact)."""
    return CHANGE.search(content) is not None
