"""The fake upstream's Manager: deterministic, honest decisions from a few sentence shapes.

Not a model: it lets memproxy's learning be tried without one. It answers a request whose last
user message is the Manager's prompt (:func:`app.memory.learning.prompt.build_prompt`), reading
only the USER lines of the new exchange and the numbered existing memories:

- "remember that X" (also "don't forget that X", "remember my/I ...") -> NEW, X in the third person;
- a statement "I am / I'm / I live / I play / I like / I love ..." or "My ... is/are ..." -> NEW;
- "forget (that|about) X" -> DELETE of the memory sharing the most words with X;
- a NEW whose text is already a memory (or already in this answer) -> nothing; else nothing.

The third person is a word swap (I -> the user, my -> the user's, me -> them, am -> is, the verb
after "I" gets its -s), not grammar: "I play chess" becomes "The user plays chess".
"""

from __future__ import annotations

import re
from typing import Any

EXCHANGE = "The new exchange (decide from this):"
_MEMORY = re.compile(r"^(\d+)\. (.*)$")
_REMEMBER = re.compile(
    r"\b(?:remember|don'?t\s+forget|do\s+not\s+forget)\s+(?:that\s+(.+)|((?:i|i'm|my)\b.*))", re.I
)
_FORGET = re.compile(r"\bforget\s+(?:that\s+|about\s+)?(.+)", re.I)
_STATEMENT = re.compile(r"^(?:i\s+(?:am|live|play|like|love)\b|i'm\b|my\s.+\s(?:is|are)\b)", re.I)
_SWAP = {"i'm": "the user is", "i've": "the user has", "i'll": "the user will",
         "i'd": "the user would", "my": "the user's", "mine": "the user's", "me": "them",
         "myself": "themselves", "am": "is"}  # fmt: skip
_AFTER_I = {"am": "is", "have": "has", "do": "does", "don't": "doesn't", "go": "goes"}
_KEEP = {"was", "can", "could", "will", "would", "should", "may", "might", "must", "had", "did"}
_ADVERBS = {"also", "really", "still", "usually", "often", "always", "never", "just", "no", "not",
            "longer"}  # fmt: skip
_UNIMPORTANT = {"the", "user", "user's", "a", "an", "is", "are", "to", "of", "and", "in", "them"}


def decisions(messages: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The Manager's answer ``{"operations": [...]}``, or None when this is no Manager request."""
    last = messages[-1] if messages else {}
    prompt = last.get("content")
    if last.get("role") != "user" or not isinstance(prompt, str) or EXCHANGE not in prompt:
        return None
    memories, said = _read(prompt)
    known = {_norm(text) for text in memories.values()}
    operations: list[dict[str, Any]] = []
    for sentence in (s for line in said for s in re.split(r"(?<=[.!?;])\s+", line)):
        remember = _REMEMBER.search(sentence)
        forget = None if remember else _FORGET.search(sentence)
        if forget:
            alias = _best_match(third_person(forget.group(1)), memories)
            if alias is not None and {"op": "DELETE", "id": alias} not in operations:
                operations.append({"op": "DELETE", "id": alias})
            continue
        if remember:
            fact = remember.group(1) or remember.group(2)
        elif _STATEMENT.match(sentence) and not sentence.rstrip().endswith("?"):
            fact = sentence
        else:
            continue
        content = third_person(fact)
        if content and _norm(content) not in known:
            known.add(_norm(content))
            kind = "preference" if re.search(r"\b(?:likes?|loves?)\b", content) else "fact"
            operations.append({"op": "NEW", "content": content, "type": kind})
    return {"operations": operations}


def third_person(text: str) -> str:
    """`text` about "I" rewritten about "the user", capitalised, without closing punctuation."""
    after_i = False

    def swap(match: re.Match[str]) -> str:
        nonlocal after_i
        word, lower = match.group(0), match.group(0).lower()
        if lower == "i":
            after_i = True
            return "the user"
        if after_i and lower in _ADVERBS:
            return word
        if after_i:
            after_i = False
            if lower in _AFTER_I:
                return _AFTER_I[lower]
            if lower in _KEEP or lower.endswith("ed") or not lower.isalpha():
                return word
            if re.search(r"(?:s|sh|ch|x|z|o)$", lower):
                return word + "es"
            return word[:-1] + "ies" if re.search(r"[^aeiou]y$", lower) else word + "s"
        return _SWAP.get(lower, word)

    out = re.sub(r"[A-Za-z']+", swap, " ".join(text.split())).rstrip(" .!?;,")
    return out[:1].upper() + out[1:]


def _read(prompt: str) -> tuple[dict[int, str], list[str]]:
    """The numbered memories and the user's lines of the new exchange."""
    memories: dict[int, str] = {}
    said: list[str] = []
    section = ""
    for line in prompt.splitlines():
        if line.startswith(("Existing memories", "Earlier in the conversation", EXCHANGE)):
            section = line[:8]
        elif section == "Existing" and (found := _MEMORY.match(line)):
            memories[int(found.group(1))] = found.group(2)
        elif section == EXCHANGE[:8] and line.startswith("USER: "):
            said.append(line.removeprefix("USER: "))
    return memories, said


def _best_match(text: str, memories: dict[int, str]) -> int | None:
    """The alias of the memory sharing the most words with `text` (the first on a tie)."""
    wanted = _words(text)
    scored = [(len(wanted & _words(content)), alias) for alias, content in memories.items()]
    best = max(scored, key=lambda pair: (pair[0], -pair[1]), default=(0, 0))
    return best[1] if best[0] else None


def _words(text: str) -> set[str]:
    # a trailing -s dropped on both sides, so "play" meets "plays"
    words = {w.removesuffix("s") for w in re.findall(r"[\w']+", text.lower())}
    return words - {w.removesuffix("s") for w in _UNIMPORTANT}


def _norm(text: str) -> str:
    return " ".join(text.lower().split()).rstrip(" .!?;,")
