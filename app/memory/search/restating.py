"""Which of a user's memories say what a fact says: what goes with the fact when it is forgotten.

A memory *restates* a fact when one of its sentences says it: :func:`says` holds (a check on the
words, which the embedder cannot make) and the sentence's cosine with the fact is at least
:data:`SAME_AT` (the bundled embedder, fp32). Cosine alone cannot tell a statement from another
on the same subject: the pairs that must stay score as high as those that must go ("I am
vegetarian." 0.81 and "I'm vegetarian, so please no meat in the recipes." 0.63 for "Is
vegetarian" against "Is vegan" 0.76, "My sister is vegetarian." 0.77; "Plays tennis on
Mondays" 0.89 for "... on Sundays", "Drinks coffee with sugar" 0.91 for "... without sugar",
"Is not allergic to peanuts" 0.92, "Used to live in Lyon" 0.89, "Loves Lyon" 0.71 for "Lives
in Lyon", "Allergic to cats" 0.59 for "Allergic to peanuts").

So :func:`says` decides what cosine cannot: every content word of the fact is in the sentence
(stemmed; a stem of 5 letters or more also meets its longer forms: "allergic" / "allergy"), not
negated there ("not", "no longer", "never", "no" before one of them), not put in the past or a
wish ("used to", "was", "lived", "wants to", "would like", "thinking about"...), not said of
someone else (a person named before them: "my son", "her husband"; a sentence without "I", "my",
"we" or "user" begins with a verb or the fact's words, as the Manager writes facts, not "The
nurse works weekends"), not asked ("Are peanuts a common allergy?"), and the fact's last word
not made to qualify another ("vegetarian restaurant", "hiking books").

Measured with ``bench/restating_eval.py`` on 192 pairs (``bench/restating_pairs.txt``: facts as
the Manager writes them against facts and the user's own words; 72 must go, 120 must stay), at
:data:`SAME_AT` = 0.5: 54 of the 72 go, and 11 of the 120 (cosine alone at its best threshold,
0.79: 37 and 26). The sentences that pass the words and must stay score 0.40 at most when they
do not contain the fact ("I eat a lot of vegetables."), while those that must go score 0.51 and
up ("I'm vegetarian by the way, what's a good pasta recipe?"). What stays that should go says it
in other words ("Based in Lyon", "Does not eat meat", "Enjoys hiking", "Follows a vegetarian
diet": delete it too); what goes that should stay contains the fact and says more ("Has two cats
and a dog", "Speaks a little Japanese", "I work in Lyon but live in Villeurbanne.") or uses its
words of another subject ("Paris loves tourists." for "Loves Paris"). A memory that restates a
fact and says more goes whole: it holds what was to be forgotten (its text stays in its history).
"""

from __future__ import annotations

import re

import numpy as np

from app.memory.search.beside import in_thread
from app.memory.search.embedder import TextEmbedder
from app.memory.search.lexical import STOP_WORDS, Analyzer
from app.memory.search.user_index import UserIndex

SAME_AT = 0.5
"""The least cosine of a sentence with a fact for the sentence to restate it (see the module's
docstring for the figures)."""
CANDIDATES = 200
"""Memories looked at per fact: the best by the fact's words (BM25) and as many by meaning."""
SENTENCES = 8
"""Sentences looked at per memory (an episode has at most 3; a long memory's first 8)."""

_SENTENCE_END = re.compile(r"(?<=[.!?…])\s+|\n+")
_WORD = re.compile(r"[^\W_]+")
_NEAR = 4
"""How many words after a negation or a marker it bears on."""
_NEGATION = re.compile(
    r"\b(?:not|never|nor|neither|no\s+longer|no|without|nothing|none|dont|doesnt|isnt|cant|"
    r"wont|didnt|arent)\b|\w+n[’']t\b",
    re.I,
)
_MARKER = re.compile(
    r"\b(?:used\s+to|was|were|had|former(?:ly)?|previously|once|(?:wants?|wanted)\s+to|would|"
    r"i'd|wish(?:es)?|(?:plans?|planning|hopes?|hoping|going|trying|tries)\s+to|will|i'll|"
    r"might|may|maybe|perhaps|considering|thinking\s+(?:of|about)|dreams?\s+of|if|stopped|quit)\b",
    re.I,
)
_PEOPLE = re.compile(
    r"\b(?:he|she|they|his|her|him|them|their|wife|husband|partner|spouse|son|daughter|child|"
    r"children|kids?|baby|mother|mom|mum|father|dad|parents?|brother|sister|siblings?|"
    r"friends?|colleagues?|coworkers?|boss|neighbou?rs?|cousin|aunt|uncle|grand\w+|"
    r"girlfriend|boyfriend|fianc[ée]e?|roommate|flatmate)\b",
    re.I,
)
_ASKING = re.compile(
    r"(?:what|when|where|which|who|whom|whose|why|how|is|are|am|was|were|do|does|did|can|could|"
    r"should|would|will|shall|may|might|have|has|had)\b",
    re.I,
)
_FIRST_PERSON = re.compile(r"\b(?:i|i'm|i've|i'd|me|my|mine|myself|we|our|us|user)\b", re.I)
_VERBS = frozenset("is are am was were be been being has have had does do did".split())
_FOLLOWERS = frozenset(
    """since now too also already every each today lately anymore again yet still though
    actually either anyway ago one two three four five six seven eight nine ten twelve twenty
    thirty forty fifty hundred called named""".split()
)
"""Words that may follow a fact's last word without it qualifying them ("vegetarian since")."""


async def restatements(
    index: UserIndex, embedder: TextEmbedder, key: int, text: str
) -> dict[int, float]:
    """The memories of `index` other than `key` that restate the fact `text` (module docstring):
    key -> the cosine of the sentence that does."""
    analyzer = index.lexical.analyzer
    words = set(analyzer.terms(text))
    if not words:
        return {}
    (vector,) = await embedder.embed([text])
    async with index.lock:  # the index is read in a thread: nothing may change it meanwhile
        # (kept till that thread is done, also when cancelled: app.memory.search.beside)
        lexical = index.lexical.score_terms(sorted(words)).top(CANDIDATES)
        dense, _ = index.vectors.search(vector, CANDIDATES // 4)
        candidates = list(dict.fromkeys([*lexical.tolist(), *dense.tolist()]))
        # the word checks take ~170 ms over 250 candidates: off the event loop
        checks = await in_thread(lambda: _checks(index, candidates, key, text))
    if not checks:
        return {}
    cosines = await embedder.embed([sentence for _, sentence in checks]) @ vector
    found: dict[int, float] = {}
    for (candidate, _), cosine in zip(checks, np.asarray(cosines).tolist(), strict=True):
        if cosine >= SAME_AT:
            found[candidate] = max(found.get(candidate, 0.0), float(cosine))
    return found


def _checks(index: UserIndex, candidates: list[int], key: int, text: str) -> list[tuple[int, str]]:
    """The sentences of the candidates (not `key`) whose words say the fact `text`."""
    analyzer = index.lexical.analyzer
    checks: list[tuple[int, str]] = []
    for candidate in candidates:
        brief = index.briefs.get(candidate)
        if brief is None or candidate == key:
            continue
        for sentence in sentences(brief.content)[:SENTENCES]:
            if says(text, sentence, analyzer):
                checks.append((candidate, sentence))
    return checks


def sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]


def says(fact: str, sentence: str, analyzer: Analyzer) -> bool:
    """Whether the words of `sentence` say what `fact` says, as far as words tell (the module
    docstring): the cosine decides the rest."""
    wanted = set(analyzer.terms(fact))
    if not wanted or _asks(sentence):
        return False
    tokens = _tokens(sentence, analyzer)
    if not all(any(_meets(w, stem) for _, _, stem in tokens) for w in wanted):
        return False
    mine = _tokens(fact, analyzer)
    for pattern in (_NEGATION, _MARKER):
        if _bears(pattern, fact, mine, wanted) != _bears(pattern, sentence, tokens, wanted):
            return False
    if _past(fact, wanted, analyzer) != _past(sentence, wanted, analyzer):
        return False
    if not _about_the_user(sentence, tokens, wanted):
        return False
    first = next(start for start, _, stem in tokens if any(_meets(w, stem) for w in wanted))
    others = {m.group().lower() for m in _PEOPLE.finditer(sentence) if m.start() < first}
    if others - {m.group().lower() for m in _PEOPLE.finditer(fact)}:
        return False
    return not _qualifies(mine, sentence, tokens, wanted)


def _meets(stem: str, other: str) -> bool:
    """The same stem, or one of 5 letters or more and a longer form of it."""
    short, long = sorted((stem, other), key=len)
    return stem == other or (len(short) >= 5 and long.startswith(short))


def _tokens(text: str, analyzer: Analyzer) -> list[tuple[int, int, str]]:
    """Every word of `text`: (start, end, its stem), stop words included (stemmed as they are)."""
    return [(m.start(), m.end(), analyzer.terms(m.group())[0] if m.group().lower() not in
             STOP_WORDS else m.group().lower()) for m in _WORD.finditer(text)]  # fmt: skip


def _bears(
    pattern: re.Pattern[str], text: str, tokens: list[tuple[int, int, str]], wanted: set[str]
) -> bool:
    """Whether a match of `pattern` in `text` bears on one of the `wanted` words (one of the
    :data:`_NEAR` words after it)."""
    for match in pattern.finditer(text):
        after = [stem for start, _, stem in tokens if start >= match.end()][:_NEAR]
        if any(_meets(w, stem) for w in wanted for stem in after):
            return True
    return False


def _past(text: str, wanted: set[str], analyzer: Analyzer) -> bool:
    """Whether one of the `wanted` words is in `text` in a past form ("lived", "worked")."""
    for word in _WORD.findall(text):
        stems = analyzer.terms(word)
        if word.lower().endswith("ed") and len(word) > 4 and stems and stems[0] in wanted:
            return True
    return False


def _about_the_user(sentence: str, tokens: list[tuple[int, int, str]], wanted: set[str]) -> bool:
    """Whether `sentence` is about the user: it says "I", "my", "we" or "the user", or it is
    written as the Manager writes facts, from a verb or from the fact's words ("Lives in Lyon",
    "Vegetarian here!"), not from another subject ("The nurse works weekends")."""
    if _FIRST_PERSON.search(sentence) or not tokens:
        return True
    first = tokens[0][2]
    return first in _VERBS or any(_meets(w, first) for w in wanted)


def _asks(sentence: str) -> bool:
    """A question that begins as one: it asks, it does not state ("Since I'm vegetarian, what
    should I order?" states)."""
    stripped = sentence.strip()
    return stripped.endswith("?") and _ASKING.match(stripped) is not None


def _qualifies(
    mine: list[tuple[int, int, str]],
    sentence: str,
    tokens: list[tuple[int, int, str]],
    wanted: set[str],
) -> bool:
    """Whether the fact's last word is, in `sentence`, followed at once by a word of another
    subject that it qualifies ("vegetarian restaurant" for "Is vegetarian")."""
    last = next((stem for _, _, stem in reversed(mine) if stem in wanted), None)
    if last is None:
        return False
    for i, (_, end, stem) in enumerate(tokens[:-1]):
        if not _meets(last, stem):
            continue
        start, _, following = tokens[i + 1]
        word = sentence[start : tokens[i + 1][1]].lower()
        if sentence[end:start].strip():  # punctuation between them
            continue
        if word in STOP_WORDS or word in _FOLLOWERS or word.isdigit() or word.endswith("ly"):
            continue
        if not any(_meets(w, following) for w in wanted):
            return True
    return False
