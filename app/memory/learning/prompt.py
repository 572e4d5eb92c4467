"""What the Manager's model reads: its instructions and the prompt of one job.

The prompt (:func:`build_prompt`) holds:

- the current date and time;
- the user's existing memories most related to the exchange, each as ``N. content`` with N = 1,
  2, 3... (the real ids never reach the model: models invent UUIDs;
  :mod:`app.memory.learning.applier` maps back). Nothing else goes on a memory's line: small
  models copy whatever stands beside a memory into the memories they write (a ``[fact, noted
  2026-11-23]`` suffix was copied, and accumulated, turn after turn);
- the conversation, as the PydanticAI messages of its turns (:mod:`app.memory.learning.turns`):
  the earlier turns as context, the new exchange to extract from, written out as a transcript,
  not handed over as the agent's own message history (a model given a chat as its history goes
  on with the chat instead of reading it). Role-aware (the default), both sides are shown,
  marked USER and ASSISTANT, and only what the user says about themselves is a memory; not
  role-aware, the user's messages only. System prompts, documents and tool output are not turns.

The instructions end with three worked examples (:data:`EXAMPLES`). Without them a 1.5B model
kept "I am vegetarian and I live in Lyon" whole in the first person and answered a new fact as
an UPDATE of memory 1; with them it wrote "Is a vegetarian", "Lives in Lyon" and "Daughter Mia
turns 7 on 3 May" as NEWs. Small models do store examples as the user's facts (earlier
instructions' "Moved to Oslo in May 2025"; "Lives in Paris" on LoCoMo), so they are marked as
made up, and the applier refuses a memory whose words are mostly not the user's
(:mod:`app.memory.learning.grounding`): a leaked example is stored only if the user happened to
say half its words ("I have two cats" lets "Sister Ana has two cats" through).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic_ai.messages import ModelMessage, ModelRequest

from app.memory.learning.turns import role_of, text_of
from app.memory.store.tables import FactType

EXCHANGE = "The new exchange (decide from this):"
MEMORIES = "Existing memories (already saved: do not repeat them):"

INSTRUCTIONS = f"""You keep the long-term memory of an assistant about one user.
Read the new exchange and decide which memories to add, change or remove.

What is a memory:
- Only what the USER says about themselves: facts about their life, people, plans, preferences,
  work and knowledge, events with their dates, corrections, feedback on the assistant.
- Never what the ASSISTANT says, general knowledge, or anything the user only asks about. A
  question is not a fact. Small talk and greetings give no memory at all.

How to write one:
- One fact per memory: a message with two facts gives two NEW operations.
- Short, in the third person, without "I", "my" or "the user": a statement "I <do something>"
  becomes "<Does something>", "my <relative> is <something>" becomes "<Relative> is
  <something>".
- Your own words only: never copy a line of the conversation or of these instructions.
- Absolute dates (a day, month or year), never "yesterday" or "next week".

Which operation:
- NEW: a fact that no listed memory holds.
- UPDATE id: the user changes or corrects the very fact memory `id` holds (a new city replaces
  the old city). A different fact is never an UPDATE of an unrelated memory: it is NEW.
- DELETE id: the user says memory `id` is no longer true, or asks to forget it.
- Use only the numbers of the memories listed. Never repeat a listed memory: an UPDATE must
  change what it says, and a memory the exchange does not change needs no operation.
- Nothing new to remember: an empty list of operations.
- type is one of: {", ".join(t.value for t in FactType)}.
- "profile": true on a NEW or UPDATE for a lasting fact about who the user is: identity, household,
  health and diet constraints, lasting preferences, how they want answers. Leave it out otherwise.
"""

EXAMPLES = """
Three examples. Their people and facts are made up: never write them as memories.
- Existing memories: none. USER: I'm a nurse, I live in Oslo and my sister Ana has two cats.
  ASSISTANT: Lovely!
  Answer: {"operations": [{"op": "NEW", "content": "Is a nurse", "type": "fact", "profile": true},
  {"op": "NEW", "content": "Lives in Oslo", "type": "fact"},
  {"op": "NEW", "content": "Sister Ana has two cats", "type": "fact"}]}
- Existing memories: 1. Lives in Rome 2. Plays tennis 3. Is a nurse. USER: I moved to Madrid,
  and forget the tennis. Remember my son Leo starts school on 2 September.
  ASSISTANT: Noted, and good luck to Leo!
  Answer: {"operations": [{"op": "UPDATE", "id": 1, "content": "Lives in Madrid"},
  {"op": "DELETE", "id": 2}, {"op": "NEW", "content": "Son Leo starts school on 2 September",
  "type": "event"}]}
- Existing memories: 1. Is a nurse. USER: Thanks, bye! ASSISTANT: Bye!
  Answer: {"operations": []}
"""
"""Worked examples, after the instructions in every output mode (the module docstring says why
they are there and why they are safe)."""

ANSWER_SHAPE = """
Answer with JSON only, of this shape (<...> are placeholders, not memories):
{"operations": [{"op": "NEW", "content": "<statement>", "type": "<type>"},
{"op": "UPDATE", "id": <number>, "content": "<statement>"}, {"op": "DELETE", "id": <number>}]}
"""
"""Added to the instructions when the answer is JSON in the text (``json_schema``, ``prompted``):
a small model keeps a shape shown this way better than the schema alone."""


def instructions(*, shape: bool) -> str:
    """The Manager's instructions; with `shape`, the answer's JSON shape too (answers given as
    text: ``json_schema``, ``prompted``; a tool call has its schema)."""
    return INSTRUCTIONS + (ANSWER_SHAPE if shape else "") + EXAMPLES


@dataclass(frozen=True, slots=True)
class Shown:
    """An existing memory as the Manager sees it."""

    alias: int
    content: str
    type: str
    created_at: datetime


def build_prompt(
    *,
    now: datetime,
    memories: Sequence[Shown],
    context: Sequence[ModelMessage],
    new: Sequence[ModelMessage],
    role_aware: bool,
) -> str:
    """The Manager's user prompt (the module docstring says what goes in and why)."""
    if not role_aware:
        context = [t for t in context if isinstance(t, ModelRequest)]
        new = [t for t in new if isinstance(t, ModelRequest)]
    lines = [f"Current date and time: {now.strftime('%A %d %B %Y, %H:%M %Z').strip()}", ""]
    lines.append(MEMORIES if memories else "Existing memories: none yet.")
    lines += [f"{m.alias}. {' '.join(m.content.split())}" for m in memories]
    if context:
        lines += ["", "Earlier in the conversation (context only, already processed):"]
        lines += [_line(t) for t in context]
    lines += ["", EXCHANGE]
    lines += [_line(t) for t in new]
    return "\n".join(lines)


def _line(turn: ModelMessage) -> str:
    return f"{role_of(turn).upper()}: {' '.join(text_of(turn).split())}"
