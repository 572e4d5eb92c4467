"""Planning the Manager's operations before they are applied (:mod:`app.memory.learning.applier`):
which memory each names, the final text of each write (NUL removed, relative dates made
absolute), and the rules that compare a write with the memory it updates."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from app.memory.learning.dates import absolute_dates
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.prompt import EXCHANGE
from app.memory.search.parts import Embedded, decode
from app.memory.store.tables import Memory


@dataclass(slots=True)
class Planned:
    """An operation to apply: the memory it changes or deletes (None: it creates), and its
    text embedded once it is to be written (None: not written, e.g. a duplicate)."""

    operation: Operation
    memory_id: str | None  # the memory to change or delete; None: create
    embedded: Embedded | None = None


def plan_operation(
    operation: Operation, aliases: dict[int, str], planned: list[Planned], said: datetime
) -> str | None:
    """Add the operation to `planned` by the rules of :mod:`app.memory.learning.applier`'s
    docstring, or say why it fails. Its text is final here: relative dates are written from
    `said`."""
    if operation.op is not Op.NEW:  # UPDATE and DELETE name a memory the Manager was shown
        known = aliases.get(operation.id) if operation.id is not None else None
        if known is None:
            return f"{operation.op} needs the number of a memory shown" + (
                f" (got {operation.id})" if operation.id is not None else ""
            )
    else:
        known = None  # NEW creates, whatever id came with it
    if operation.op is Op.DELETE:
        planned.append(Planned(operation, known))
        return None
    # NUL: PostgreSQL's text refuses it (a request to remember is written without the model)
    operation.content = (operation.content or "").replace("\x00", "").strip()
    # after the grounds (they weigh the words the Manager wrote), before the duplicate check
    operation.content = absolute_dates(operation.content, said)
    if not operation.content:
        return f"{operation.op} without content"
    if operation.content.startswith(PROMPT_ECHOES):
        return f"{operation.op} copies the prompt ({operation.content[:40]!r})"
    planned.append(Planned(operation, known))
    return None


PROMPT_ECHOES = ("USER:", "ASSISTANT:", "Current date and time:", EXCHANGE, "Existing memories")
"""How a memory that is a line of the Manager's prompt begins: a 1.5B model on LoCoMo wrote the
transcript's lines back as memories ("ASSISTANT: Hey Caroline! ..."). Never a memory."""

UNRELATED_BELOW = 0.2
"""An UPDATE whose new text has a cosine below this with the memory it names creates a memory
instead, and the named one stays: small models answer "UPDATE 2" for a new fact ("Daughter Mia
turns 7 on 3 May" over "Lives in Lyon": 0.11), and that overwrote a true memory. Measured with
the bundled embedder: a real change of the same fact scores 0.44 ("Lives in Grenoble" /
"Lives in Lyon"), 0.68, 0.84; "Moved to Grenoble in 2026" / "Lives in Lyon" scores 0.16 and so
is kept beside it: a stale memory is cheaper than a lost one."""


def unrelated_cosine(row: Memory, embedded: Embedded, dim: int) -> float | None:
    """The cosine of an UPDATE's text with the memory it names, when below
    :data:`UNRELATED_BELOW`; None when related (or not comparable: another model's vectors)."""
    if row.embedding is None or row.embedding_model != embedded.model:
        return None
    similarity = float(decode(row.embedding, dim)[0] @ embedded.vectors[0])
    return similarity if similarity < UNRELATED_BELOW else None


def same_words(text: str, other: str) -> bool:
    """The same words (case, spacing and punctuation aside): small models restate the memories
    they were shown as UPDATEs, often with another type."""
    return words_of(text) == words_of(other)


def words_of(text: str) -> list[str]:
    return re.findall(r"\w+", text.casefold())
