"""The two-step Manager, for small models: choose the sentences, then write one memory each.

A 1.5B model asked for every operation at once copies the user's sentences in the first person,
stores greetings, and writes few of the facts a person would (gold@.6 0.21 on LoCoMo). Asked
simple things in turn, it does what it does well:

1. **choose** (:mod:`app.memory.learning.choosing`): the user's sentences of the new turns, the
   small talk left out by rule, each labelled by the model with a fixed choice (nothing, an
   identity fact, a preference, an event, a plan, a relationship, a correction, an instruction,
   a request to forget), in calls of at most :data:`CHOOSE_BATCH` sentences; the label gives
   the memory's type and profile mark;
2. **write** (:mod:`app.memory.learning.writing`): for each chosen sentence, the few memories of
   the user most like it (:class:`Lookup`), and one memory in the third person that may replace
   one of them (an UPDATE), or, for a request to forget, the one to DELETE;
3. **a second look** (optional, :mod:`app.memory.learning.second_look`): the facts of the user
   the memories written still miss.

The answers become the same :class:`~app.memory.learning.decisions.Operation`\\ s the one-call
Manager gives, numbered as the memories were shown, and go through the same rules and applier.
Bounds: every call counts against the job's time and output tokens; once either would run out
(:class:`Budget`), no further call starts and what was written so far is the answer (sentences
are chosen and written ten at a time, so a long job keeps its first batches). A batch whose
answer does not fit is passed over once another has given operations (the user's words stay as
episodes); a first failure fails the answer, as the one-call Manager's would.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol, TypeVar

from pydantic import BaseModel
from pydantic_ai.messages import ModelMessage

from app.memory.learning import choosing, second_look, writing
from app.memory.learning.choosing import Sentence, kind_of, labels_for, labels_of, sentences_of
from app.memory.learning.decisions import Operation
from app.memory.learning.failures import ManagerAnswerUnusable
from app.memory.learning.prompt import Shown
from app.memory.learning.signals import (
    label_by_words,
    said_label,
    says_nothing_of_the_user,
    tells_of_the_user,
)
from app.memory.learning.writing import BATCH, SIMILAR, Chosen, answer_for, operations_of
from app.memory.search.lexical import Analyzer

logger = logging.getLogger("memproxy.manager")

CHOOSE_BATCH = 10
"""Sentences labelled in one call: given 18 at once, the 1.5B labelled the first three and
"nothing" for every one after (the instructions, the same in every call, are read once: the
server caches them)."""

Ask = Callable[[type[BaseModel], str, str], Awaitable[BaseModel]]
"""One call of the model: (the answer's schema, instructions, prompt) -> the answer; raises
:class:`ManagerAnswerUnusable` when nothing it said fits."""
Budget = Callable[[], str | None]
"""Why no further call should start (the job's time or tokens would run out), or None."""
T = TypeVar("T")


class Lookup(Protocol):
    """The user's memories most like a text, numbered for the Manager (a memory keeps its
    number within a job)."""

    async def like(self, text: str, limit: int) -> list[Shown]: ...


class Listed:
    """A :class:`Lookup` among a fixed list of memories, by the words they share (stemmed):
    what a caller that has no search gives."""

    def __init__(self, memories: Sequence[Shown]) -> None:
        self._analyzer = Analyzer()
        self._memories = [(m, set(self._analyzer.terms(m.content))) for m in memories]

    async def like(self, text: str, limit: int) -> list[Shown]:
        words = set(self._analyzer.terms(text))
        scored = [(len(words & w), m) for m, w in self._memories if words & w]
        scored.sort(key=lambda pair: -pair[0])
        return [m for _, m in scored[:limit]]


async def decide(
    ask: Ask,
    lookup: Lookup,
    *,
    context: Sequence[ModelMessage],
    new: Sequence[ModelMessage],
    budget: Budget,
    look_again: bool = False,
) -> list[Operation]:
    """The operations for the `new` turns, by the two steps (and the second look): the
    sentences are chosen and written :data:`CHOOSE_BATCH` at a time, so that a job whose bounds
    run out keeps what its first batches wrote."""
    sentences, dropped = sentences_of(context, new)
    if dropped:
        logger.debug("small talk left out by rule: %s", dict(dropped))
    operations: list[Operation] = []
    answered = False  # some call's answer was read: a later batch that fails is passed over
    for start in range(0, len(sentences), CHOOSE_BATCH):
        if (why := budget()) is not None and answered:
            logger.info("two-step manager: %d sentence(s) left unread: %s",
                        len(sentences) - start, why)  # fmt: skip
            break
        batch = sentences[start : start + CHOOSE_BATCH]
        try:
            chosen = await _choose(ask, lookup, batch)
            answered = True
            for part in _batches(chosen, BATCH):
                if (why := budget()) is not None:
                    logger.info("two-step manager: %d chosen sentence(s) left unwritten: %s",
                                len(chosen) - chosen.index(part[0]), why)  # fmt: skip
                    break
                answer = await ask(answer_for(part), writing.INSTRUCTIONS, writing.prompt(part))
                operations += operations_of(answer, part)
        except ManagerAnswerUnusable as exc:
            if not answered or not operations:
                raise
            logger.info("two-step manager: a batch passed over: %s", exc)
    if look_again and sentences and budget() is None:
        try:
            operations += await second_look.missed(ask, sentences, operations)
        except ManagerAnswerUnusable as exc:  # an extra: the first look's answer stands
            logger.info("two-step manager: the second look's answer was unusable: %s", exc)
    return operations


async def _choose(ask: Ask, lookup: Lookup, sentences: list[Sentence]) -> list[Chosen]:
    """Step (a) for a batch: each sentence labelled; those that give a memory (or forget one),
    each with the memories most like it."""
    answer = await ask(labels_for(len(sentences)), choosing.INSTRUCTIONS,
                       choosing.prompt(sentences))  # fmt: skip
    chosen = []
    for sentence, said in zip(sentences, labels_of(answer, len(sentences)), strict=True):
        label = _held_to_words(said, sentence)
        if label == "nothing":
            continue
        similar = await lookup.like(sentence.text, SIMILAR)
        kind = kind_of(label, sentence.text)
        if kind is None and not similar:
            continue  # a request to forget, and nothing like it to forget
        chosen.append(Chosen(sentence, label, kind, similar))
    return chosen


_ABOUT_THEM = frozenset(
    {"identity", "event", "plan", "preference", "relationship", "feeling", "fact"}
)


def _held_to_words(label: str, sentence: Sentence) -> str:
    """The model's label, unless the words say otherwise (:mod:`app.memory.learning.signals`):
    a sentence that tells of the user's life is kept, a remark about life in general is not,
    and only a sentence that asks to forget deletes."""
    answering = sentence.asked is not None
    said = said_label(sentence.text)
    if label == "forget" and said != "forget":
        # only the words ask to forget: "I keep forgetting to water my plants" deletes nothing
        label = "nothing"
    if label not in ("forget", "instruction") and said is not None:
        return said
    if label == "nothing" and tells_of_the_user(sentence.text, answering=answering):
        return label_by_words(sentence.text)
    if label in _ABOUT_THEM and says_nothing_of_the_user(sentence.text, answering=answering):
        return "nothing"
    return label


def _batches(items: Sequence[T], size: int) -> list[list[T]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
