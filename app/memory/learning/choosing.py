"""Step (a) of the two-step Manager: which of the user's sentences say something lasting.

The user's sentences of a job's new turns (:func:`sentences_of`: their own words, split, the
small talk left out by rule, :mod:`app.memory.learning.small_talk`) are shown numbered, each with
the question of the assistant it answers, and the model gives each one label of
:data:`LABELS`: a fixed choice per sentence, the kind of answer a small model gives well (strict
schemas hurt small models' reasoning, not their classification: arXiv 2408.02442). The label
also carries the memory's type and its profile mark (:class:`Kind`), so the writing step does
not choose them.

The answer's schema names every sentence's number as a required key whose value is one of the
labels: a server that enforces it (``json_schema``) can answer nothing else, one label per
sentence, in order.
"""

from __future__ import annotations

import functools
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, WithJsonSchema, create_model
from pydantic_ai.messages import ModelMessage, ModelRequest

from app.memory.learning.own_words import own_words
from app.memory.learning.signals import LASTING
from app.memory.learning.small_talk import small_talk
from app.memory.learning.turns import role_of, text_of
from app.memory.store.tables import FactType

SENTENCE_CHARS = 400
"""A longer sentence is cut here: a memory is one statement, and a run-on sentence of a
pasted text is no one's news."""
QUESTION_CHARS = 200


@dataclass(frozen=True, slots=True)
class Kind:
    """What a label makes of a sentence: the memory's type, and whether it is a profile fact."""

    type: FactType
    profile: bool


LABELS: dict[str, Kind | None] = {
    "identity": Kind(FactType.FACT, True),
    "event": Kind(FactType.EVENT, False),
    "plan": Kind(FactType.EVENT, False),
    "preference": Kind(FactType.PREFERENCE, False),
    "relationship": Kind(FactType.FACT, False),
    "feeling": Kind(FactType.FACT, False),
    "correction": Kind(FactType.CORRECTION, False),
    "instruction": Kind(FactType.FEEDBACK, True),
    "forget": None,
    "nothing": None,
    "fact": Kind(FactType.FACT, False),
}
"""The choices, and what each makes: ``forget`` asks to delete, ``nothing`` gives no memory.
The profile mark of ``identity`` and ``instruction`` holds only where the sentence says so
(:func:`kind_of`)."""


def _known(value: object) -> object:
    """A label as given, or ``fact`` for one the schema does not name: in ``prompted`` mode
    nothing holds the model to the list, and the 1.5B answered "location" for "I live in
    Lyon"."""
    if isinstance(value, str) and value.strip().lower() not in LABELS:
        return "fact"
    return value.strip().lower() if isinstance(value, str) else value


Label = Annotated[
    Literal["identity", "event", "plan", "preference", "relationship", "feeling", "correction",
            "instruction", "forget", "nothing", "fact"],
    BeforeValidator(_known),
    WithJsonSchema({"enum": ["identity", "event", "plan", "preference", "relationship",
                             "feeling", "correction", "instruction", "forget", "nothing"],
                    "type": "string"}),
]  # fmt: skip
"""One label; the schema the model sees names :data:`LABELS`' (``fact`` is this side's word for
a label the model made up)."""

INSTRUCTIONS = """You help an assistant remember what matters about one user.
Below are sentences the USER said in a chat, numbered. Say what each sentence tells about the
USER, with one word:
- identity: who they are: job, studies, home, age, family, pets, health, diet, beliefs, background
- event: something they did, went to, made or got, or that happened to them
- plan: something they will do, are working on, hope or dream to do
- preference: something they like, love, enjoy, dislike, or chose and why
- relationship: a person in their life, and what about them (family, friend, partner)
- feeling: how they feel about their life, their plans or the people in it
- correction: they correct something they said before
- forget: they ask the assistant to forget something
- instruction: how they want the assistant to answer them
- nothing: only about the other person or the moment (praise, thanks, jokes, remarks)
Most sentences tell something about the user: "nothing" only for a sentence that says nothing
of the user's own life.

Example (made up, never a memory):
1. I just adopted a puppy named Rex! 2. That's so sweet of you. 3. I'm a nurse, so I work
nights. 4. Can you keep your answers short? 5. My brother Tom is getting married in June.
6. Honestly, moving here was the best decision I ever made.
Answer: {"1": "event", "2": "nothing", "3": "identity", "4": "instruction", "5": "relationship",
"6": "feeling"}
Answer with JSON only: every number, one label each.
"""

_TO_ASSISTANT = re.compile(
    r"\b(?:you|your)\b.*\b(?:answer|answers|reply|replies|respond|explain|write|call\s+me|"
    r"speak|talk|keep|use|avoid|stop|always|never|be\s+more|be\s+less|short|shorter|brief)\b"
    r"|^(?:please\s+)?(?:always|never|don't|do\s+not|stop|call\s+me|answer|reply|respond|keep|"
    r"use|avoid|explain|write)\b",
    re.IGNORECASE,
)
"""How a request of the assistant sounds: only such a sentence is an ``instruction``."""


def kind_of(label: str, sentence: str) -> Kind | None:
    """What a sentence's label makes of it, its profile mark checked against its words: an
    ``identity`` is a profile fact when it sounds lasting (:data:`LASTING`), an
    ``instruction`` only when it asks the assistant something (:data:`_TO_ASSISTANT`; else a
    plain fact)."""
    kind = LABELS[label]
    if kind is None:
        return None
    if label == "identity" and not LASTING.search(sentence):
        return Kind(FactType.FACT, False)
    if label == "instruction" and not _TO_ASSISTANT.search(sentence):
        return Kind(FactType.FACT, False)
    return kind


@dataclass(frozen=True, slots=True)
class Sentence:
    """A sentence of the user's that the model is asked about."""

    text: str
    asked: str | None
    """The assistant's question this sentence's turn answers, if it asked one."""


def sentences_of(
    context: Sequence[ModelMessage], new: Sequence[ModelMessage]
) -> tuple[list[Sentence], Counter[str]]:
    """The user's own sentences in the `new` turns that may say something lasting, in order and
    each once, and how many the rules left out, by reason (``greeting``, ``filler``...)."""
    out: list[Sentence] = []
    seen: set[str] = set()
    dropped: Counter[str] = Counter()
    before = context[-1] if context else None
    for turn in new:
        if isinstance(turn, ModelRequest):
            asked = _question(text_of(before)) if before is not None and \
                role_of(before) == "assistant" else None  # fmt: skip
            for sentence in _split(own_words(text_of(turn))):
                if (why := small_talk(sentence)) is not None:
                    dropped[why] += 1
                    continue
                key = " ".join(sentence.lower().split())
                if key in seen:
                    dropped["repeated"] += 1
                    continue
                seen.add(key)
                out.append(Sentence(sentence[:SENTENCE_CHARS], asked))
                asked = None  # shown once, beside the turn's first sentence shown
        before = turn
    return out, dropped


_SPLIT = re.compile(
    r"(?<!\bDr\.)(?<!\bMr\.)(?<!\bMs\.)(?<!\bMrs\.)(?<!\bSt\.)(?<!\bProf\.)(?<!\bInc\.)"
    r"(?<!\bLtd\.)(?<!\bCo\.)(?<!\bJr\.)(?<!\bSr\.)(?<!\bvs\.)(?<!\be\.g\.)(?<!\bi\.e\.)"
    r"(?<=[.!?])[\"'”)]*\s+(?=[\"'“(]*[A-Z0-9])|\n+"
)


_CLAUSE = re.compile(r",?\s+(?:and|but|plus|also)\s+(?=(?:I|I'm|I've|I'd|I'll|my)\b)")
_SUBJECT = re.compile(r"\b(?:I|I'm|I've|I'd|I'll)\b")


def split_sentences(text: str) -> list[str]:
    """`text`'s sentences, whitespace collapsed ("Dr. Smith", "St. Louis" and "Inc. in" split
    nothing: a sentence begins with a capital or a digit)."""
    return [s for part in _SPLIT.split(text) if (s := " ".join(part.split()))]


def _split(text: str) -> list[str]:
    """Sentences, and a sentence's clauses that each say something of the user on their own
    ("I am vegetarian and I live in Lyon": two facts, one memory each; not "My mom and I
    ski")."""
    out = []
    for part in _SPLIT.split(text):
        if not (sentence := " ".join(part.split())):
            continue
        start = 0
        for match in _CLAUSE.finditer(sentence):
            if _SUBJECT.search(sentence, start, match.start()):
                out.append(sentence[start : match.start()])
                start = match.end()
        out.append(sentence[start:])
    return out


def _question(text: str) -> str | None:
    """The question the assistant's message ends with, or None when it asks nothing."""
    parts = _split(text.rstrip())
    if not parts or not parts[-1].endswith("?"):
        return None
    return parts[-1][-QUESTION_CHARS:]


def prompt(sentences: Sequence[Sentence]) -> str:
    """The numbered sentences, each with the question it answers."""
    lines = []
    for number, sentence in enumerate(sentences, start=1):
        asked = f' (answering "{sentence.asked}")' if sentence.asked else ""
        lines.append(f"{number}.{asked} {sentence.text}")
    return "Sentences of the USER:\n" + "\n".join(lines)


class _Strict(BaseModel):
    """Strict in the schema a server enforces (no other key), lenient in what is read: in
    ``prompted`` mode the 1.5B added ``"forget": "2"`` beside a memory, which is ignored."""

    model_config = ConfigDict(
        extra="ignore", populate_by_name=True, json_schema_extra={"additionalProperties": False}
    )


@functools.cache
def labels_for(count: int) -> type[BaseModel]:
    """The answer's schema for `count` sentences: keys "1".."count", each one label."""
    fields: dict[str, Any] = {f"s{n}": (Label, Field(alias=str(n))) for n in range(1, count + 1)}
    return create_model(f"Labels{count}", __base__=_Strict, **fields)


def labels_of(answer: BaseModel, count: int) -> list[str]:
    """The label of each sentence, in order, from an answer of :func:`labels_for` ``(count)``."""
    return [str(getattr(answer, f"s{n}")) for n in range(1, count + 1)]
