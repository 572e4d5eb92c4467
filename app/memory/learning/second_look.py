"""A second look (``MEMPROXY_MANAGER_SECOND_LOOK``, off by default): one more short call of the
two-step Manager that lists facts of the user the memories written so far miss.

Zep runs such a pass for what its first extraction missed. The model is shown the user's
sentences (the small talk already left out) and the memories written from them, and answers at
most :data:`MISSED` more, each a NEW fact that goes through the same rules and grounding as the
rest (a fact of the model's own making is refused there).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from pydantic import BaseModel, ConfigDict, Field

from app.memory.learning.choosing import Sentence
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.writing import Memory
from app.memory.store.tables import FactType

MISSED = 5

INSTRUCTIONS = f"""You check the long-term memory of an assistant about one user.
Below are sentences the USER said and the memories already written from them. List the facts
about the user that the sentences give and the memories miss: what they did, have, like, plan,
who is in their life, with names, numbers and dates. At most {MISSED}, each one short
statement in the third person, starting with a verb, without "I", "my" or "the user". Nothing
the memories already say; none at all when they miss nothing.
Answer with JSON only: {{"missed": ["<statement>", ...]}}
"""


class Missed(BaseModel):
    """The second look's answer."""

    model_config = ConfigDict(extra="forbid")
    missed: list[Memory] = Field(max_length=MISSED)


def prompt(sentences: Sequence[Sentence], written: Sequence[str]) -> str:
    lines = ["Sentences of the USER:"]
    lines += [f"- {s.text}" for s in sentences]
    lines.append("Memories written:" if written else "Memories written: none.")
    lines += [f"- {w}" for w in written]
    return "\n".join(lines)


async def missed(
    ask: Callable[[type[BaseModel], str, str], Awaitable[BaseModel]],
    sentences: Sequence[Sentence],
    operations: Sequence[Operation],
) -> list[Operation]:
    """NEW operations for the facts the second look finds missing (none when it finds none)."""
    written = [o.content for o in operations if o.content]
    answer = await ask(Missed, INSTRUCTIONS, prompt(sentences, written))
    assert isinstance(answer, Missed)
    return [Operation(op=Op.NEW, content=text, type=FactType.FACT) for text in answer.missed]
