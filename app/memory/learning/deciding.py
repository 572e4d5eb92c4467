"""From a job's turns to the operations to apply: the user's memories related to its new turns
numbered for the Manager (:class:`~app.memory.learning.shown.ShownMemories`), the Manager's
decision on the day the turns were said, the rules after the model, and the texts of the job's
episodes. The worker runs it for every chat's and past conversation's job; the idle work for the
episodes of a conversation that gave no fact (:mod:`app.memory.learning.distilling`)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_ai.messages import ModelMessage, ModelRequest

from app.memory.learning.after_model import after_model
from app.memory.learning.decisions import Operation
from app.memory.learning.episodes import episode_texts
from app.memory.learning.extraction import CONTEXT_TURNS
from app.memory.learning.grounding import Grounds, with_requests
from app.memory.learning.leases import Job
from app.memory.learning.manager import Manager
from app.memory.learning.parking import KEPT
from app.memory.learning.shown import ShownMemories
from app.memory.learning.turns import text_of
from app.memory.service import MemoryService


@dataclass(frozen=True, slots=True)
class Decided:
    operations: list[Operation]
    """The Manager's operations as the rules leave them."""
    aliases: dict[int, str]
    """The numbers the memories were shown by -> their ids."""
    grounds: Grounds
    """What the writes are checked on."""
    episodes: list[str]
    """The texts of the job's episodes (none when they are off, or were written as it parked)."""


async def decide(
    manager: Manager, service: MemoryService, job: Job, *, episodes: bool = True
) -> Decided:
    """The Manager's decision on `job`; raises as :meth:`Manager.decide` does."""
    context, new = job.turns()
    context = context[-CONTEXT_TURNS:]
    book = ShownMemories(service, job.user_id, job.created_at)
    related = await book.related([text_of(t) for t in new if isinstance(t, ModelRequest)])
    # The day the user said it, not today: "tomorrow" in a job that waited is that day's.
    operations = await manager.decide(
        job.model, memories=related, context=context, new=new, now=job.created_at, lookup=book
    )
    # Up to ~100 turns of 8,000 characters: stemming and searching them would hold the loop.
    grounds = await asyncio.to_thread(Grounds.of, [*context, *new], book.shown, new, job.created_at)
    operations = await asyncio.to_thread(_ruled, operations, new, grounds)
    # A job parked before wrote its episodes then (parking.py): they are not written twice.
    write = episodes and KEPT not in job.payload
    texts = await asyncio.to_thread(episode_texts, context, new) if write else []
    return Decided(operations, book.aliases, grounds, texts)


def _ruled(
    operations: list[Operation], new: Sequence[ModelMessage], grounds: Grounds
) -> list[Operation]:
    """The rules after the model (:mod:`app.memory.learning.after_model`), then what the user
    explicitly asked to remember if what is left leaves it out, itself through the rules (a
    request is stored in the third person too; the rules leave what they kept as it is)."""
    kept, _ = after_model(operations, grounds)
    final, _ = after_model(with_requests(kept, new, grounds), grounds)
    return final
