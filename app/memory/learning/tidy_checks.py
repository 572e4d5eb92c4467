"""The question consolidation (:mod:`.consolidation`) asks the model about a group of facts
(:data:`INSTRUCTIONS`, :func:`question`, answered as :class:`Tidy`), and what it takes of the
answer, and what it does not.

A 1.5B model asked about a group of facts calls nearly any two of them "the same", writes a
merged memory that drops what one of them said ("Researching adoption agencies, a dream to give
kids a loving home" and "Their goal is to give kids a loving home" -> the second alone), and says
of any older fact that a newer one ended it (measured: "yes" for all of 13 pairs, "Likes hiking"
and "Plays the violin" included). So its answer is a proposal, kept only where the facts bear
it out:

- a merge: the merged memory says nothing the facts do not (:func:`grounded`), keeps most of
  what each fact merged said (:func:`covers`), and each fact merged is alike the one it goes
  into (:data:`SAME_COSINE`);
- a merge also keeps every number and name of each fact merged (:func:`keeps_details`);
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
from dataclasses import dataclass
from datetime import datetime

from pydantic import BaseModel, Field

from app.memory.search.lexical import STOP_WORDS, Analyzer

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

ANSWER_TOKENS = 300
"""An answer's length at most: two short lists and one memory, in JSON."""
INSTRUCTIONS = """You keep a person's memory tidy. You are shown a few memories about the \
user, numbered, oldest first, each with the day it was said. Answer with:
- "same": the numbers of the memories that say the same thing, or where one says part of what \
another says (two or more numbers), else an empty list;
- "memory": when "same" has numbers, one short memory that says everything they say, in the \
third person; where they differ, the newest is true. Else "";
- "outdated": the numbers of memories that a newer memory in the list shows are no longer \
true (the user moved, changed jobs, stopped doing something, changed their mind), else an \
empty list.
Memories about different things, or that can all be true at once, are neither the same nor \
outdated: answer empty lists."""


class Tidy(BaseModel):
    """The model's answer about one group of facts."""

    same: list[int] = Field(default_factory=list)
    memory: str = ""
    outdated: list[int] = Field(default_factory=list)


def question(group: Sequence[tuple[datetime, str]]) -> str:
    """What the model is shown of a group of facts: (day said, words), oldest said first."""
    return "\n".join(
        f"[{n}] ({day.strftime('%d %B %Y')}) {' '.join(content.split())}"
        for n, (day, content) in enumerate(group, 1)
    )


_ANALYZER = Analyzer()
_TOKEN = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
_ORDINAL = re.compile(r"^(\d+)(?:st|nd|rd|th)?$")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_NUMBER_WORDS = {
    w: str(n)
    for n, words in enumerate(
        ["zero", "one first once", "two second twice", "three third", "four fourth",
         "five fifth", "six sixth", "seven seventh", "eight eighth", "nine ninth", "ten tenth",
         "eleven eleventh", "twelve twelfth dozen"]
    )
    for w in words.split()
}  # fmt: skip


@dataclass(frozen=True, slots=True)
class Details:
    """What a fact names: its numbers (digits, ordinals and number words alike) and its names
    (capitalised words, stop words aside), and all its words (lower-cased, no possessive)."""

    numbers: frozenset[str]
    names: frozenset[str]
    words: frozenset[str]
    first: str
    """The fact's first word when it is not a name by anything but its capital ("Likes...")."""


def details(text: str) -> Details:
    tokens = _TOKEN.findall(_THOUSANDS.sub("", text.replace("\u2019", "'")))
    numbers, names, words = set(), set(), set()
    for token in tokens:
        word = token.lower().removesuffix("'s")
        words.add(word)
        number = _ORDINAL.match(word)
        if number or word in _NUMBER_WORDS:
            numbers.add(str(int(number.group(1))) if number else _NUMBER_WORDS[word])
        elif token[:1].isupper() and word not in STOP_WORDS and word != "user":
            names.add(word)
    first = tokens[0].lower() if tokens and "'" not in tokens[0] else ""
    return Details(frozenset(numbers), frozenset(names), frozenset(words), first)


def same_details(a: str, b: str) -> bool:
    """Whether two facts name the same numbers and names, each of one's names being a word of
    the other (in any case): what near copies must, since MiniLM puts facts that differ in one
    of them very close ("keeps thing 0" / "keeps thing 1", "Anna's birthday" / "Bob's")."""
    x, y = details(a), details(b)
    return x.numbers == y.numbers and x.names <= y.words and y.names <= x.words


def keeps_details(text: str, content: str) -> bool:
    """Whether a merged memory `text` still names every number and name of a fact merged into
    it (its first word aside: "Enjoys hiking" into "Likes hiking in the mountains")."""
    x, y = details(text), details(content)
    return y.numbers <= x.numbers and y.names - {y.first} <= x.words


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
