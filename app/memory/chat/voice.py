"""A question that names the user, read as the user asking about themselves.

Every memory of a user is about them, and their episodes are their own words ("I went to a
support group yesterday"): their name in a question ("When did Caroline go to the support
group?") matches nothing they said, and being rare in their memories, it pulls in the odd
one that holds it (someone's greeting: "Glad you agree, Caroline") over the ones that answer.
When the client says what the user is called (:mod:`app.proxy.user_name`), recall searches with
the question in the user's voice: "Caroline's" becomes "my", "Caroline" "I" where it is the
subject ("When did I go...") and "me" elsewhere ("Who supports me?"), a verb beside it agreeing
("has Caroline" -> "have I", "Caroline is" -> "I am"). The pronouns are English whatever the
question's language: in another language the name simply leaves the query (both are stop words
to BM25).

Measured with bench/pipeline_eval.py (LoCoMo's questions name the speaker 97 % of the time;
the dev file, rules Manager, "both"): evidence recall .818 with the name, .860 in the user's
voice (docs/performance.md).

What is matched, in a question with a capital initial ("caroline" in lower case is left alone):
the whole name and the given name alone (its first word of two letters or more that is not a
title or a particle: "Caroline" of "Dr. Caroline van Berg"), the given name only when the word
after it is not capitalised ("Caroline Jones" is someone else). A name that is also a common word
("Will", "May", "Grace") is matched only in its possessive ("Will's car"), as a sentence may
start with the word; a name with combining marks (Devanagari vowel signs, where a regular
expression's word boundaries fall inside words) is not matched at all. The work is linear in the
question: each match looks back at most :data:`LOOK_BACK` characters.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache

from app.memory.search.lexical import QUESTION_WORDS, STOP_WORDS

LOOK_BACK = 40
"""Characters before a match read to find the word before it."""
_SUBJECT_BEFORE = frozenset(
    """did does do is was has have had would will can could should might may must are were
    and or but when where why how what which that""".split()
)
"""Words after which the user is the subject ("When did Caroline go" -> "When did I go")."""
_COMMON = (
    frozenset(
        """will may june april august march mark bill rose grace hope joy faith pat sue art
    ray dawn summer iris ivy lily jack frank max sky chase hunter miles forest river angel
    drew lee penny brook cliff dale glen reed carol sunny amber ruby pearl""".split()
    )
    | STOP_WORDS
    | QUESTION_WORDS
)
"""Names that are words too: only their possessive is read as the user."""
_NOT_GIVEN = frozenset(
    """mr mrs ms miss mx dr prof sir madam dame lord lady rev fr st van von der den de da di
    du del della la le bin ibn al el""".split()
)
"""Titles and particles: never the given name ("Dr. Smith" is not "Dr")."""
_AGREE = {"has": "have", "is": "am", "does": "do"}
_WORD = re.compile(r"[^\W\d_](?:[\w'’-]*[^\W_])?")
_PREVIOUS = re.compile(r"(\w+)\W*$")


def in_own_voice(text: str, name: str | None) -> str:
    """`text` with the user's `name` read as the user (see the module docstring); `text`
    itself when there is no name or it does not occur."""
    if not name:
        return text
    pattern = _pattern(unicodedata.normalize("NFC", name))
    if pattern is None:
        return text
    if not text.isascii():
        text = unicodedata.normalize("NFC", text)
    return pattern.sub(_replace, text)


def _replace(match: re.Match[str]) -> str:
    said = match.group("name")
    if not said[:1].isupper():
        return match.group(0)  # "will's", "caroline": not written as a name
    verb, after = match.group("verb") or "", match.group("after") or ""
    if match.group("possessive"):
        return f"{verb}my{after}"
    before = match.string[max(0, match.start() - LOOK_BACK) : match.start()].rstrip()
    previous = _PREVIOUS.search(before)
    subject = (
        bool(verb)
        or not before
        or before[-1] in ".!?;:,"
        or (previous is not None and previous.group(1).lower() in _SUBJECT_BEFORE)
    )
    if not subject:
        return f"{verb}me{after}"
    if verb:
        word = verb.strip()
        verb = _agreed(word) + verb[len(word) :]
    if after:
        word = after.strip()
        after = after[: len(after) - len(word)] + _agreed(word)
    return f"{verb}I{after}"


def _agreed(verb: str) -> str:
    agreed = _AGREE.get(verb.lower(), verb.lower())
    return agreed.capitalize() if verb[:1].isupper() else agreed


@lru_cache(maxsize=1024)
def _pattern(name: str) -> re.Pattern[str] | None:
    """What matches `name` in a question (None: nothing can, e.g. a name of symbols)."""
    if any(unicodedata.category(c).startswith("M") for c in name):
        return None
    words = _WORD.findall(name)
    if not words:
        return None
    whole = " ".join(words)
    given = next((w for w in words if len(w) > 1 and w.lower() not in _NOT_GIVEN), None)
    # longest first: "Caroline Smith" before "Caroline"
    owned = sorted({whole, *([given] if given else [])}, key=len, reverse=True)
    plain = [f for f in owned if f.lower() not in _COMMON]
    alternatives = [rf"(?P<possessive>{_either(owned)}(?:['’]s\b|['’](?!\w)))"]
    if plain:
        # the given name alone, not followed by another capitalised word: someone else's surname
        alone = r"(?![ \t]+(?-i:[A-Z]))" if given and given != whole else ""
        whole_first = [_escaped(f) + (alone if f == given and f != whole else "") for f in plain]
        alternatives.append(rf"(?:{'|'.join(whole_first)})(?![\w'’-])")
    verbs = "|".join(_AGREE)
    return re.compile(
        rf"(?P<verb>\b(?:{verbs})[ \t]+)?(?<![\w'’-])(?P<name>{'|'.join(alternatives)})"
        rf"(?P<after>[ \t]+(?:{verbs})\b)?",
        re.IGNORECASE,
    )


def _either(forms: list[str]) -> str:
    return "(?:" + "|".join(_escaped(f) for f in forms) + ")"


def _escaped(form: str) -> str:
    """`form` as a pattern, its apostrophes either kind, its spaces any run of blanks."""
    escaped = re.escape(form.replace("’", "'")).replace("'", "['’]")
    return escaped.replace(r"\ ", r"[ \t]+")
