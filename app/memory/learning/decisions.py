"""What the Manager decides: operations on a user's memories, by the numbers they were shown with.

A leaf: the agent (:mod:`app.memory.learning.manager`) asks for these, the applier
(:mod:`app.memory.learning.applier`) carries them out; neither imports the other for them.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from app.memory.store.tables import MemoryType


class Op(StrEnum):
    NEW = "NEW"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


class Operation(BaseModel):
    """One decision of the Manager about the user's memories."""

    op: Op
    id: int | None = None
    """For UPDATE and DELETE: the number the memory was shown with."""
    content: str | None = Field(default=None, max_length=4000)
    """For NEW and UPDATE: the memory, one self-contained statement about the user."""
    type: MemoryType | None = None
