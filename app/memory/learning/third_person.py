"""A memory a model wrote in the first person, rewritten in the third person by rule.

Memories are written as the Manager's instructions ask: without a subject, a verb first ("Lives
in Lyon", "Went hiking on 3 May 2023"), and "their" for the user's ("Their sister Ana has two
cats"). Small models copy the user's sentence instead: "I'm going to continue my edu and check
out career options" (the 1.5B on LoCoMo), "I love my new running shoes" (the 0.5B).
:func:`third_person` rewrites such a text:

- "I" that begins a sentence, or a clause after ", and" / "but", is dropped and its verb takes the
  third person: "I'm" / "I am" -> "Is", "I was" -> "Was", "I've" / "I have" -> "Has", "I'll" ->
  "Will", "I'd love" -> "Would love", "I'd been" -> "Had been", "I don't" -> "Does not", "I
  love" -> "Loves", "I went" -> "Went" (a past tense or a modal stays), across an adverb ("I
  really love" -> "Really loves");
- any other "I" becomes "they" ("Thinks I should go" -> "Thinks they should go", "My mom and I
  went" -> "Their mom and they went"; "I was" -> "they were", "I am" -> "they are");
- my / mine / me / myself -> their / theirs / them / themselves; we / our / ours / us /
  ourselves -> they / their / theirs / them / themselves (a memory is about the user, and "we"
  is them with others).

Words inside double quotes (a title, a saying) are left as they are. A text with no
first-person word comes back unchanged.
"""

from __future__ import annotations

import functools
import re

_PAST = frozenset(
    """
    ate became began bought brought broke built came caught chose could cut did drew drove fell
    felt flew forgot found gave got grew had heard held hit hurt kept knew led learnt left let
    lost made meant met might must ought paid put quit ran read rode rose said sang sat saw
    sent set shall should sold spent spoke stood swam taught thought threw told took understood
    used was went were woke won wore would wrote can will may slept drank sank rang stung swung
    fed fled bled bent lent dealt dreamt knelt leapt crept swept wept shot shut split spread
    struck stuck hid bit lit fought sought bore tore swore forgave overcame shook stole froze
    arose dove hung once
    """.split()
)
"""Verbs that stay as they are after a dropped "I": past tenses (and those that read as one)
and modals ("I went" -> "Went", "I can swim" -> "Can swim")."""
_ADVERBS = frozenset(
    """
    also really just always never still recently finally usually often sometimes actually
    absolutely totally truly mostly mainly currently now already even only definitely
    """.split()
)
_LY = r"(?!(?:re|ap|sup|multip|com|im)ply\b|rely\b|fly\b|ally\b)[a-z]{3,}ly"
"""An adverb in -ly ("I probably will move"), not a verb that ends so ("I reply")."""
_CONTRACTED = {
    "i'm": "is", "i've": "has", "i'll": "will", "i'd": "would", "i am": "is", "i have": "has",
    "i was": "was", "i will": "will", "i would": "would", "i had": "had",
    "i don't": "does not", "i do not": "does not", "i didn't": "did not", "i can't": "cannot",
    "i cannot": "cannot", "i won't": "will not", "i haven't": "has not", "i wasn't": "was not",
    "i'm not": "is not", "i am not": "is not", "i do": "does", "i couldn't": "could not",
    "i wouldn't": "would not", "i shouldn't": "should not", "i hadn't": "had not",
}  # fmt: skip
_LEAD = re.compile(
    r"(?P<lead>^|(?<=[.!?;:])\s+|\s+but\s+|,\s*(?:and|but)\s+)"
    r"(?P<i>I(?:'m\s+not|\s+am\s+not|'m|'ve|'ll|'d|\s+am|\s+have|\s+was|\s+will|\s+would"
    r"|\s+had|\s+don't|\s+do\s+not|\s+didn't|\s+can't|\s+cannot|\s+won't|\s+haven't|\s+wasn't"
    r"|\s+couldn't|\s+wouldn't|\s+shouldn't|\s+hadn't"
    r"|\s+do(?=\s+not\b|\s+\w))?)(?![\w'])"
    r"(?P<adverb>(?:\s+(?:" + "|".join(sorted(_ADVERBS)) + r"|once|" + _LY + r"))*)"
    r"(?:\s+(?P<verb>[a-z]+)(?![\w'’]))?",
    re.IGNORECASE,
)
_OTHERS = [
    (re.compile(r"\bI\s+am\b"), "they are"),
    (re.compile(r"\bI'm\b"), "they're"),
    (re.compile(r"\bI\s+was\b"), "they were"),
    (re.compile(r"\bI've\b"), "they've"),
    (re.compile(r"\bI'll\b"), "they'll"),
    (re.compile(r"\bI'd\b"), "they'd"),
    (re.compile(r"\bI\b"), "they"),
    (re.compile(r"\b(?:my|our)\b", re.I), "their"),
    (re.compile(r"\b(?:mine|ours)\b", re.I), "theirs"),
    (re.compile(r"\b(?:myself|ourselves)\b", re.I), "themselves"),
    (re.compile(r"\bme\b(?!-)", re.I), "them"),  # not "me-time"
    (re.compile(r"\bus\b"), "them"),  # "US" (the country) is in capitals
    (re.compile(r"\bwe're\b", re.I), "they're"),
    (re.compile(r"\bwe've\b", re.I), "they've"),
    (re.compile(r"\bwe'll\b", re.I), "they'll"),
    (re.compile(r"\bwe'd\b", re.I), "they'd"),
    (re.compile(r"\bwe\b", re.I), "they"),
]
FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|we'll|we'd|our|ours|ourselves|us)\b",
    re.IGNORECASE,
)
"""A word of the first person ("us" only in lower case below: "US" is a country)."""
_NUMBERED = frozenset(
    "Type War Part Chapter Phase Level Class Stage Act Volume Grade Season Episode Book".split()
)
"""Words a roman "I" follows: "Type I diabetes", "World War I"."""
_QUOTED = re.compile(r"(\"[^\"]*\"|“[^”]*”)")


def third_person(text: str) -> str:
    """`text` in the third person, as the module says; unchanged when it has no first person."""
    if FIRST_PERSON.search(text.replace("’", "'")) is None:
        return text
    pieces = _QUOTED.split(text.replace("’", "'"))
    out = [p if i % 2 else _rewrite(p, first=i == 0) for i, p in enumerate(pieces)]
    result = "".join(out).strip()
    return result[:1].upper() + result[1:] if result else text


def _rewrite(text: str, *, first: bool) -> str:
    def lead(match: re.Match[str]) -> str:
        said = " ".join(match.group("i").lower().split())
        adverb = match.group("adverb") or ""
        verb = match.group("verb")
        if said == "i'd" and verb in ("been", "had", "gone", "done", "seen", "never"):
            said = "i had"
        head = _CONTRACTED.get(said)
        tail = f" {verb}" if verb else ""
        if head is None:  # a plain "I" and its verb
            if verb is None:
                return match.group(0)
            head, tail = adverb.strip(), " " + _third(verb)
            words = " ".join(w for w in (head, tail.strip()) if w)
            return match.group("lead") + _capital(words, match)
        words = " ".join(w for w in (head, adverb.strip(), (verb or "")) if w)
        return match.group("lead") + _capital(words, match)

    text = _LEAD.sub(lead, text)
    for pattern, replacement in _OTHERS:
        text = pattern.sub(functools.partial(_same_case, replacement), text)
    return text


def _capital(words: str, match: re.Match[str]) -> str:
    """Capitalised where a sentence begins, lower-case after "and" / "but"."""
    lead = match.group("lead")
    if lead.strip().lower() in ("and", "but", ", and", ", but") or "," in lead:
        return words
    if lead.strip() and lead.strip()[0] not in ".!?;:":
        return words
    return words[:1].upper() + words[1:]


def _same_case(replacement: str, match: re.Match[str]) -> str:
    """Capitalised where the word was, or, for "I" (always a capital), where a sentence
    begins."""
    found = match.group(0)
    before = match.string[: match.start()].rstrip()
    starts = not before or before[-1] in ".!?;:"
    if not starts and found[:1].isupper():
        numeral = before.rsplit(None, 1)[-1] in _NUMBERED
        if found[:1] != "I" or numeral:
            return found  # a title or a numeral: "My Little Pony", "Type I diabetes"
    return replacement[:1].upper() + replacement[1:] if starts else replacement


def _third(verb: str) -> str:
    """`verb` as said of him or her: "love" -> "loves", "go" -> "goes", "study" -> "studies";
    a past tense or a modal as it is."""
    low = verb.lower()
    if low in _PAST or low.endswith("ed"):
        return verb
    if low == "have":
        return "has"
    if low == "be":
        return "is"
    if low.endswith(("s", "sh", "ch", "x", "z", "o")):
        return verb + "es"
    if low.endswith("y") and len(low) > 1 and low[-2] not in "aeiou":
        return verb[:-1] + "ies"
    return verb + "s"
