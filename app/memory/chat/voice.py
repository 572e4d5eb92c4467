"""A question that names the user, read as the user asking about themselves.

Every memory of a user is about them, and their episodes are their own words ("I went to a
support group yesterday"): their name in a question ("When did Caroline go to the support
group?") matches nothing they said, and being rare in their memories, it pulls in the odd
one that holds it (someone's greeting: "Glad you agree, Caroline") over the ones that answer.
When the client says what the user is called (:mod:`app.proxy.user_name`), recall searches with
the question in the user's voice: "Caroline's" becomes "my", "Caroline" "I" where it is the
subject ("When did I go...") and "me" elsewhere ("Who supports me?"), with the verb that follows
agreeing ("I have", "I am").

Measured with bench/pipeline_eval.py (LoCoMo's questions name the speaker 97 % of the time;
the dev file, rules Manager, "both"): evidence recall .818 with the name, .860 in the user's
voice (docs/performance.md).

The given name is matched alone as well as the whole name ("Caroline" for "Caroline Smith"),
as written, with a capital (a question says "Caroline", a sentence "will" and "may"); a
name that is also a common word ("Will", "May", "Grace") only in its possessive ("Will's
car"), as a sentence may start with the word.
"""

from __future__ import annotations

import re
from functools import lru_cache

from app.memory.search.lexical import QUESTION_WORDS, STOP_WORDS

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
_AGREE = {"has": "have", "is": "am", "does": "do", "was": "was", "Has": "Have", "Is": "Am",
          "Does": "Do"}  # fmt: skip


def in_own_voice(text: str, name: str | None) -> str:
    """`text` with the user's `name` read as the user (see the module docstring); `text`
    itself when there is no name or it does not occur."""
    if not name:
        return text
    pattern = _pattern(name)
    if pattern is None or not pattern.search(text):
        return text
    return _agree(pattern.sub(_replace, text))


def _replace(match: re.Match[str]) -> str:
    if match.group("possessive"):
        return "my"
    before = match.string[: match.start()].rstrip()
    previous = re.search(r"(\w+)\W*$", before)
    subject = (
        not before
        or before[-1] in ".!?;:,"
        or (previous is not None and previous.group(1).lower() in _SUBJECT_BEFORE)
    )
    return "I" if subject else "me"


_AGREEMENT = re.compile(
    r"\b(?:(?P<verb_before>[Hh]as|[Ii]s|[Dd]oes) I\b|I (?P<verb_after>has|is|does)\b)"
)


def _agree(text: str) -> str:
    def fix(match: re.Match[str]) -> str:
        if match.group("verb_before"):
            return f"{_AGREE[match.group('verb_before')]} I"
        return f"I {_AGREE[match.group('verb_after')]}"

    return _AGREEMENT.sub(fix, text)


@lru_cache(maxsize=1024)
def _pattern(name: str) -> re.Pattern[str] | None:
    """What matches `name` in a question (None: nothing can, e.g. a name of symbols)."""
    words = re.findall(r"[^\W\d_][\w'’-]*", name)
    if not words:
        return None
    forms = {" ".join(words), words[0]}
    plain = [re.escape(f[:1].upper() + f[1:]) for f in forms if f.lower() not in _COMMON]
    owned = [re.escape(f[:1].upper() + f[1:]) for f in forms]
    alternatives = []
    owned_names = "|".join(sorted(owned, key=len, reverse=True))
    alternatives.append(rf"(?P<possessive>\b(?:{owned_names})(?:['’]s\b|['’](?!\w)))")
    if plain:
        alternatives.append(rf"\b(?:{'|'.join(sorted(plain, key=len, reverse=True))})\b(?!['’])")
    return re.compile("|".join(alternatives))
