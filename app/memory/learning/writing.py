"""Step (b) of the two-step Manager: one memory for each sentence chosen in step (a).

Each chosen sentence is shown with the question it answers and the few memories of the user
most like it (lettered a, b, c: their numbers stay out of the model's way), and the model
writes one self-contained statement in the third person, and says which of those memories it
replaces, if any. A sentence labelled ``forget`` asks only which memory to forget. A batch of
sentences goes in one call (:data:`BATCH`), its schema built for it (:func:`answer_for`): each
sentence's number is a required key, its memory a string of at most :data:`MEMORY_CHARS`
(a small model that loops inside a string stops there), its letter one of those shown or
``none``. An event never replaces: "Went hiking on 3 May" and "... on 9 June" are both true.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, create_model

from app.memory.learning.choosing import Kind, Sentence
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.grounding import CALENDAR
from app.memory.learning.prompt import Shown
from app.memory.search.lexical import Analyzer
from app.memory.store.tables import FactType

BATCH = 6
"""Sentences written in one call: a batch's answer stays well within one call's max_tokens."""
SIMILAR = 3
"""Memories shown beside a sentence, the most like it."""
MEMORY_CHARS = 300
LETTERS = "abcdefgh"

INSTRUCTIONS = """You keep the long-term memory of an assistant about one user.
For each numbered sentence the USER said, write one memory: a short, self-contained statement
about the user, in the third person, that a reader understands months later without the chat.
- Start with a verb, without "I", "my", "me", "the user" or the user's name: "I moved to Lyon
  with my wife" -> "Moved to Lyon with their wife".
- Say only what the sentence says: keep its names, numbers and places, and its tense (a plan
  stays a plan: "Plans to ..."). No praise, no comment, nothing you add.
- Say what "it", "this" or "there" stands for, from the question the sentence answers.
- Keep dates as the user said them ("yesterday", "last year", "on 3 May"): they are dated later.
- "replaces": the letter of the similar memory that this one corrects or makes out of date (the
  same thing with a new value: "Lives in Madrid" replaces "Lives in Rome"), otherwise "none".
  Never copy a similar memory into the memory you write.
- "forget": for a request to forget, the letter of the memory to forget, otherwise "none".

Example (made up, never a memory):
1. [event] (answering "How was your weekend?") I finally ran my first 10k with my sister Ana
yesterday, so proud!
2. [correction] Actually I moved to Madrid last month.
   (similar memories: a. Lives in Rome; b. Likes Rome)
3. [plan] I'm going to learn Spanish, it'll be great.
Answer: {"1": {"memory": "Ran their first 10k race with their sister Ana yesterday"},
"2": {"memory": "Moved to Madrid last month", "replaces": "a"},
"3": {"memory": "Plans to learn Spanish"}}
Answer with JSON only.
"""

HINTS = {
    "identity": "about them", "preference": "preference", "event": "event", "plan": "plan",
    "relationship": "relationship", "feeling": "feeling", "correction": "correction",
    "instruction": "instruction",
}  # fmt: skip
"""What the writer is told of each sentence's label: a plan is written as one."""


@dataclass(frozen=True, slots=True)
class Chosen:
    """A sentence to write a memory of: its label, its kind (None: a request to forget), and the
    memories most like it."""

    sentence: Sentence
    label: str
    kind: Kind | None
    similar: list[Shown]

    @property
    def may_replace(self) -> bool:
        return bool(self.similar) and (self.kind is None or self.kind.type is not FactType.EVENT)


def prompt(batch: Sequence[Chosen]) -> str:
    """The batch's sentences, numbered from 1, each with what it answers and its similar
    memories (when it may replace one)."""
    # No date: given the day it was said, the 1.5B wrote that day for "yesterday" (and copied
    # the line); the words' own dates are made absolute by rule after it.
    lines = ["Sentences of the USER to write memories of:"]
    for number, chosen in enumerate(batch, start=1):
        hint = HINTS.get(chosen.label, "a request to forget")
        asked = f' (answering "{chosen.sentence.asked}")' if chosen.sentence.asked else ""
        lines.append(f"{number}. [{hint}]{asked} {chosen.sentence.text}")
        if chosen.may_replace:
            shown = "; ".join(
                f"{LETTERS[i]}. {' '.join(m.content.split())}" for i, m in enumerate(chosen.similar)
            )
            lines.append(f"   (similar memories: {shown})")
    return "\n".join(lines)


class _Strict(BaseModel):
    """Strict in the schema a server enforces (no other key), lenient in what is read: in
    ``prompted`` mode the 1.5B added ``"forget": "2"`` beside a memory, which is ignored."""

    model_config = ConfigDict(
        extra="ignore", populate_by_name=True, json_schema_extra={"additionalProperties": False}
    )


Memory = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1,
                                          max_length=MEMORY_CHARS)]  # fmt: skip


def _item(chosen: Chosen, number: int) -> type[BaseModel]:
    letters: Any = Literal[("none", *LETTERS[: len(chosen.similar)])]
    fields: dict[str, Any] = {}
    if chosen.kind is None:
        fields["forget"] = (letters, ...)
    else:
        fields["memory"] = (Memory, ...)
        if chosen.may_replace:
            fields["replaces"] = (letters, "none")
    return create_model(f"Sentence{number}", __base__=_Strict, **fields)


def answer_for(batch: Sequence[Chosen]) -> type[BaseModel]:
    """The answer's schema for a batch: keys "1".."n", each the sentence's item."""
    fields: dict[str, Any] = {
        f"s{n}": (_item(c, n), Field(alias=str(n))) for n, c in enumerate(batch, start=1)
    }
    return create_model("Memories", __base__=_Strict, **fields)


def operations_of(answer: BaseModel, batch: Sequence[Chosen]) -> list[Operation]:
    """The operations an answer for `batch` stands for: NEW, or UPDATE of the memory it
    replaces; DELETE for a request to forget (by the numbers the memories were shown with). A
    memory that is not of its own sentence is replaced by the sentence itself (the rules put it
    in the third person): one word ("Vegetarian") is no statement, and the 1.5B wrote
    "Lives in Lyon" for "I am vegetarian" and "Vegetarian" for "I live in Lyon" (the items
    swapped)."""
    out: list[Operation] = []
    for n, chosen in enumerate(batch, start=1):
        item = getattr(answer, f"s{n}")
        if chosen.kind is None:
            target = _shown(chosen, item.forget)
            if target is not None:
                out.append(Operation(op=Op.DELETE, id=target.alias))
            continue
        kind = chosen.kind
        memory = item.memory if _of_its_sentence(item.memory, chosen) else chosen.sentence.text
        target = _shown(chosen, getattr(item, "replaces", "none"))
        if target is not None and not _same_subject(memory, target.content):
            target = None  # small models name a memory it does not replace: written beside it
        if target is None:
            out.append(Operation(op=Op.NEW, content=memory, type=kind.type,
                                 profile=kind.profile))  # fmt: skip
        else:  # an update keeps a profile mark unless the label gives one
            profile = True if kind.profile else None
            out.append(Operation(op=Op.UPDATE, id=target.alias, content=memory,
                                 type=kind.type, profile=profile))  # fmt: skip
    return out


_ANALYZER = Analyzer()


def _same_subject(memory: str, replaced: str) -> bool:
    """Whether a memory may replace another: it holds half or more of the other's words
    (stemmed, stop words left out). "Lives in Paris now, not in Lyon" replaces "Lives in Lyon";
    "Built a strong community of hope" does not replace "Went to a support group on 7 May"
    (the 1.5B named it; 4 of its 4 replacements on LoCoMo were so)."""
    theirs = set(_ANALYZER.terms(replaced))
    return bool(theirs) and 2 * len(theirs & set(_ANALYZER.terms(memory))) >= len(theirs)


def _of_its_sentence(memory: str, chosen: Chosen) -> bool:
    """Whether a memory says its sentence's thing: more than one word, half or more of them
    (stemmed) the sentence's or the question's it answers, and no name they do not give (in
    ``prompted`` mode the 1.5B wrote "I live in Madrid", the instructions' example, for "I live
    in Lyon.")."""
    said = f"{chosen.sentence.text} {chosen.sentence.asked or ''}"
    words, source = set(_ANALYZER.terms(memory)), set(_ANALYZER.terms(said))
    names = {n.lower() for n in _NAME.findall(memory)} - CALENDAR
    return (
        len(memory.split()) > 1
        and 2 * len(words & source) >= len(words)
        and names <= {w.lower() for w in re.findall(r"[\w'-]+", said)}
    )


_NAME = re.compile(r"(?<=\w[ ,])[A-Z][\w'-]*")


def _shown(chosen: Chosen, letter: str) -> Shown | None:
    index = LETTERS.find(letter) if letter != "none" else -1
    return chosen.similar[index] if 0 <= index < len(chosen.similar) else None
