"""Rules applied to what the Manager wrote, before it is checked and applied: the same for the
one-call and the two-step Manager.

- the chat's opening ("Hey Caroline,", "By the way,") off, then first person -> third person
  (:func:`~app.memory.learning.third_person.third_person`): "I
  love my new running shoes" is stored as "Loves their new running shoes";
- a comment the model added after a comma is cut ("Plans to study counseling, which is a great
  opportunity for them" -> "Plans to study counseling"): a "which ..." or "-ing" clause that
  only praises (:data:`_COMMENT`);
- greetings, thanks and filler are dropped (:func:`~app.memory.learning.small_talk.idle_memory`):
  "Hey Mel!", "Says hi to Mel", "Is doing great"; and taken out of a memory that says more
  (:func:`tidied`): "Hey Caroline, since they last
  chatted, a lot happened" -> "Since they last chatted, a lot happened"; a sentence said twice
  in one memory is kept once, a question not at all, a word alone ("Feeling") is no memory, and
  what a model copied of the prompt ("(answering", "[event]") goes;
- a write that only restates a memory shown is dropped: every word of it (stemmed, stop words
  left out) is in one memory the job showed ("Likes hiking" beside "Likes hiking in the Alps"),
  both say "not" alike, and it adds nothing; an UPDATE is weighed against the memory it
  rewrites only (shrunk to its own words, it goes).

Relative dates are made absolute later, from the day the turns were said
(:mod:`app.memory.learning.planning`); the grounding check reads the rewritten text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from app.memory.learning.choosing import split_sentences
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.grounding import Grounds
from app.memory.learning.small_talk import asks, idle_memory, without_opening
from app.memory.learning.third_person import third_person

logger = logging.getLogger("memproxy.manager")


_PRAISE = (
    r"(?:great|exciting|excited|significant|positive|wonderful|amazing|inspiring|"
    r"motivating|rewarding|meaningful|fulfilling|awesome|fantastic|incredible|lovely|"
    r"step\s+forward|opportunity|achievement|testament)"
)
_COMMENT = re.compile(
    r",\s*(?:which|this|that|and\s+(?:this|that|it))\s+(?:is|was|will\s+be|has\s+been|"
    r"makes|made|shows|showed|must\s+be|seems)\b[^.;!?]*\b" + _PRAISE + r"\b[^.;!?]*"
    r"|,\s*(?:showing|demonstrating|highlighting|reflecting|making\s+it)\b[^.;!?]*\b"
    + _PRAISE
    + r"\b[^.;!?]*",
    re.IGNORECASE,
)
"""A clause a model adds to praise what the user said, not to say more of it."""


_PROMPT_BITS = re.compile(
    r"\(answering\b[^)]*\)?\s*|\[(?:a request to forget|about them|event|"
    r"plan|preference|relationship|feeling|correction|instruction)\]\s*"
)
"""Pieces of the two-step prompt a small model copies into a memory ("Feeling (answering)
they're truly grateful...", the 0.5B)."""


CUT_CHARS = 280
"""A write this long that does not end a sentence was cut at the answer's bound (the writer's
memories are at most 300 characters): its last, unfinished sentence goes."""


@dataclass(frozen=True, slots=True)
class Dropped:
    """A write the rules left out, and why."""

    operation: Operation
    reason: str


def after_model(
    operations: Sequence[Operation], grounds: Grounds
) -> tuple[list[Operation], list[Dropped]]:
    """The operations as the rules leave them (writes rewritten in the third person), and those
    they dropped, with the reason."""
    kept: list[Operation] = []
    dropped: list[Dropped] = []
    for operation in operations:
        if operation.op is Op.DELETE or not operation.content:
            kept.append(operation)
            continue
        content, why = tidied(operation.content)
        if why is not None:
            dropped.append(Dropped(operation, f"small talk ({why})"))
            continue
        if (number := _restates(operation, content, grounds)) is not None:
            dropped.append(Dropped(operation, f"restates memory {number}"))
            continue
        kept.append(operation.model_copy(update={"content": content}))
    for item in dropped:
        logger.info("manager's %s dropped by rule: %s (%r)", item.operation.op.value,
                    item.reason, (item.operation.content or "")[:80])  # fmt: skip
    return kept, dropped


def tidied(content: str) -> tuple[str, str | None]:
    """A written memory as the rules leave it, or ("", why) when nothing of it is a memory: the
    prompt's pieces, the chat's opening and closing name off, in the third person, the praise
    cut, its small-talk sentences, questions and repeated sentences (a small model loops: the
    0.5B wrote one five times in a memory) left out."""
    text = third_person(without_opening(_PROMPT_BITS.sub("", content)))
    text = _COMMENT.sub("", text).strip() or text
    sentences: list[str] = []
    reasons: list[str] = []
    for sentence in split_sentences(text):
        # a memory states: a question was the chat's ("Is there anything I can do to help?"),
        # and one after a statement goes ("Moved to Oslo, what about the fjord?")
        if sentence.rstrip().endswith("?") and "," in sentence and not asks(sentence):
            sentence = sentence[: sentence.rindex(",")]
        why = "question" if sentence.rstrip().endswith("?") else idle_memory(sentence)
        key = " ".join(sentence.lower().split())
        if why is not None:
            reasons.append(why)
        elif key and key not in (" ".join(s.lower().split()) for s in sentences):
            sentences.append(sentence)
    cut = len(content) >= CUT_CHARS and not content.rstrip().endswith((".", "!", "?", '"'))
    if len(sentences) > 1 and cut:
        sentences.pop()  # cut where the answer's length ran out
    text = " ".join(sentences).strip().rstrip(" ,;:-\u2013\u2014").strip()
    if len(text.split()) < 2:  # "Feeling": no statement
        return "", reasons[0] if reasons else "a word alone" if text else "nothing left"
    return text[:1].upper() + text[1:], None


_NEGATION = re.compile(r"\b(?:not|no|never|nor|none|nothing|without)\b|n't\b", re.IGNORECASE)


def _restates(operation: Operation, content: str, grounds: Grounds) -> int | None:
    """The number of a memory shown that `content` only restates: every word of it (stemmed)
    is in that memory, and both say "not" alike ("Does not eat meat" restates no "Eats meat",
    whose words it shares: stop words hold no "not"). An UPDATE is weighed against the memory
    it updates only: "Lives in Paris" over "Lives in Lyon" goes through beside "Lived in Paris
    from 2010 to 2015"."""
    words = set(grounds.analyzer.terms(content))
    if not words:
        return None
    negated = _NEGATION.search(content) is not None
    candidates = grounds.shown.items() if operation.op is Op.NEW else (
        [(operation.id, grounds.shown[operation.id])] if operation.id in grounds.shown else []
    )  # fmt: skip
    texts = grounds.texts
    for number, shown in candidates:
        if words <= shown and negated == (_NEGATION.search(texts.get(number, "")) is not None):
            return number
    return None
