"""What the Manager decides: operations on a user's memories, by the numbers they were shown with.

A leaf: the agent (:mod:`app.memory.learning.manager`) asks for :class:`Decisions`, the applier
(:mod:`app.memory.learning.applier`) carries out :class:`Operation`\\ s; neither imports the other.

The answer's schema says exactly what each operation needs, so that a server enforcing it (a
grammar for ``json_schema``) can only produce usable answers, and an answer that does not fit is
a failure to retry, never an empty list by default:

- ``{"op": "NEW", "content": ..., "type"?: ..., "profile"?: ...}`` creates (no ``id``: NEW never
  touches an existing memory); a type is a fact's (:class:`~app.memory.store.tables.FactType`):
  episodes are kept from the turns themselves, never written by the model; ``profile`` true marks
  a standing fact about the person, shown in every chat (absent: false);
- ``{"op": "UPDATE", "id": N, "content": ..., "type"?: ..., "profile"?: ...}`` rewrites memory N
  (``profile`` absent: its mark stays as it is);
- ``{"op": "DELETE", "id": N}`` removes memory N;
- ``operations`` is required (``[]`` when there is nothing to remember) and no other key is
  accepted anywhere: ``{"properties": {"operations": [...]}}`` (a schema echoed back) is refused.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any, Literal

import pydantic_core
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationError,
    create_model,
    model_validator,
)

from app.memory.store.tables import FactType


class Op(StrEnum):
    NEW = "NEW"
    UPDATE = "UPDATE"
    DELETE = "DELETE"


class Operation(BaseModel):
    """One decision of the Manager about the user's memories, as the applier takes it."""

    op: Op
    id: int | None = None
    """For UPDATE and DELETE: the number the memory was shown with."""
    content: str | None = Field(default=None, max_length=4000)
    """For NEW and UPDATE: the memory, one self-contained statement about the user."""
    type: FactType | None = None
    profile: bool | None = None
    """For NEW and UPDATE: a standing fact about the person (None: NEW false, UPDATE unchanged)."""


def _without_nul(text: str) -> str:
    """A model's text without NUL characters, which PostgreSQL's text cannot hold."""
    if "\x00" in text and not (text := text.replace("\x00", "").strip()):
        raise ValueError("content is empty once its NUL characters are taken out")
    return text


Content = Annotated[
    str,
    StringConstraints(strip_whitespace=True, min_length=1, max_length=4000),
    AfterValidator(_without_nul),
]
Alias = Annotated[int, Field(ge=1)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class New(_Strict):
    """Remember something not among the memories shown."""

    op: Literal[Op.NEW]
    content: Content
    """One short statement about the user, in the third person."""
    type: FactType = FactType.FACT
    profile: bool = False
    """A standing fact about who the user is, shown in every chat."""

    @model_validator(mode="before")
    @classmethod
    def _no_id(cls, data: Any) -> Any:
        # Small models often write "id": null on every operation: harmless, so dropped. A real
        # id on a NEW is refused (it used to overwrite that memory).
        if isinstance(data, dict) and "id" in data and data["id"] is None:
            return {k: v for k, v in data.items() if k != "id"}
        return data

    def operation(self) -> Operation:
        return Operation(op=Op.NEW, content=self.content, type=self.type, profile=self.profile)


class Update(_Strict):
    """Rewrite the memory shown with number `id` (the user corrected or refined it)."""

    op: Literal[Op.UPDATE]
    id: Alias
    content: Content
    type: FactType | None = None
    profile: bool | None = None
    """Omitted: the memory's mark stays as it is."""

    def operation(self) -> Operation:
        return Operation(
            op=Op.UPDATE, id=self.id, content=self.content, type=self.type, profile=self.profile
        )


class Delete(_Strict):
    """Remove the memory shown with number `id` (no longer true, or the user asked)."""

    op: Literal[Op.DELETE]
    id: Alias

    def operation(self) -> Operation:
        return Operation(op=Op.DELETE, id=self.id)


class Decisions(_Strict):
    """The Manager's answer: every operation on the user's memories; ``[]`` for none."""

    operations: Sequence[Annotated[New | Update | Delete, Field(discriminator="op")]]

    def normalized(self) -> list[Operation]:
        """The operations, each once: small models repeat an operation until the token limit."""
        return _once([o.operation() for o in self.operations])


class NewOnly(Decisions):
    """The Manager's answer when no memory was shown: only NEW is possible."""

    operations: Sequence[New]


@functools.cache
def decisions_for(shown: int) -> type[Decisions]:
    """The answer's schema for a job that showed `shown` memories: UPDATE and DELETE may only
    name 1..`shown`, and with none shown there is no UPDATE or DELETE at all. A server that
    enforces the schema (``json_schema``) then cannot produce an id it was not shown: a 1.5B
    model answered "UPDATE 1" with no memory listed, even for small talk."""
    if shown <= 0:
        return NewOnly
    numbers = Annotated[int, Field(ge=1, le=shown)]
    update = create_model("Update", __base__=Update, id=(numbers, ...))
    delete = create_model("Delete", __base__=Delete, id=(numbers, ...))
    operation = Annotated[New | update | delete, Field(discriminator="op")]
    return create_model("Decisions", __base__=Decisions, operations=(list[operation], ...))


_FENCE = re.compile(r"^\s*(?:```(?:json)?\s*)?")


def complete_operations(answer: str, schema: type[Decisions]) -> list[Operation]:
    """The complete operations an answer cut short (at the token limit) holds before the cut,
    each valid by `schema`, each once; [] when it holds none. The last operation before the cut
    is left out: it may be whole and still not be what the model meant (``"id": 1`` of 12)."""
    text = _FENCE.sub("", answer, count=1)
    try:
        data = pydantic_core.from_json(text, allow_partial=True)
    except ValueError:
        return []
    started = data.get("operations") if isinstance(data, dict) else None
    if not isinstance(started, list):
        return []
    kept: list[Operation] = []
    for item in started[:-1]:
        try:
            kept += schema.model_validate({"operations": [item]}).normalized()
        except ValidationError:
            continue
    return _once(kept)


def _once(operations: list[Operation]) -> list[Operation]:
    """Each operation once, in the order first given."""
    return [o for i, o in enumerate(operations) if o not in operations[:i]]
