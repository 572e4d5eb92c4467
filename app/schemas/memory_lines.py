"""A memory as a line of an export (JSON Lines), and an export's lines read back as an import.

A line is what the API shows of a memory (:class:`~app.schemas.memories.MemoryPublic`). Read
back, its dates are kept as the instants they name, in UTC (an offset-less date is UTC), between
1970 and a day from now; a line of an export made before memories had an `observed_at` is taken
as said when it was written (its `created_at`, else now), and as no profile fact.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime
from typing import Annotated, Any, Literal

import orjson
from pydantic import Field, ValidationError, field_validator

from app.errors import InvalidRequest, ValidationFailed
from app.memory.store.records import MemoryRecord, NewMemory
from app.memory.store.tables import MemorySource
from app.schemas.checks import lone_surrogate_in, shown
from app.schemas.memories import (
    ID_PATTERN,
    MAX_BATCH,
    MemoryCreate,
    MemoryPublic,
    check_length,
    instant,
)

MAX_IMPORT_LINES = 10 * MAX_BATCH
MemoryId = Annotated[str, Field(pattern=ID_PATTERN)]


def imported_date(value: datetime | None) -> datetime | None:
    """`created_at` as :func:`~app.schemas.memories.instant` takes it."""
    return instant(value, "created_at")


class MemoryImport(MemoryCreate):
    """One line of an export, read back. Importing the same id twice keeps the first; a line
    without an id is a new memory (so is every line of an import with new ids). `created_at`,
    `observed_at` and `last_recalled_at` are kept as the instants they name, in UTC."""

    id: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    created_at: datetime | None = None
    observed_at: datetime | None = None  # offset-less: UTC, as the other dates of a line
    """When what it says was said; by default its `created_at`."""
    source: str | None = None
    """Kept when the import keeps ids and it is one memproxy writes (``manager``, ``api``,
    ``cli``, ``import``); the source `import` otherwise. The history says `import` wrote it."""
    object: Literal["memory"] | None = None
    user_id: str | None = None
    """Ignored: memories are imported for the user the request acts for."""
    updated_at: datetime | None = None
    recall_count: Annotated[int, Field(ge=0)] | None = None
    """Kept, with `last_recalled_at`, when the import keeps ids; 0 (never) with new ids. Search
    ranks by neither; the count only orders the user's own profile past its budget, so a forged
    count boosts nothing over what the user already has."""
    last_recalled_at: datetime | None = None
    linked: Annotated[list[MemoryId], Field(max_length=MAX_BATCH)] = Field(default_factory=list)
    """The ids of the memories linked to it (provenance): each link is put back when its other
    memory is in the import or is the user's already (the others are dropped); with new ids,
    those within the import only."""

    _check_created_at = field_validator("created_at")(imported_date)

    @field_validator("last_recalled_at")
    @classmethod
    def _check_last_recalled_at(cls, value: datetime | None) -> datetime | None:
        return instant(value, "last_recalled_at")


def export_line(record: MemoryRecord, linked: Sequence[str] = ()) -> bytes:
    """One memory as a line of an export (JSON Lines), with the ids linked to it."""
    return orjson.dumps(MemoryPublic.of(record, linked).model_dump(mode="json")) + b"\n"


def _kept(item: MemoryImport) -> dict[str, Any]:
    """What an import that keeps ids puts back of a line: its source (one memproxy writes),
    its recall count and date."""
    known = {source.value: source for source in MemorySource}
    return {
        "kept_source": known.get(item.source or ""),
        "recall_count": item.recall_count or 0,
        "last_recalled_at": item.last_recalled_at,
    }


def read_import(
    raw: bytes, max_chars: int, *, new_ids: bool = False, max_lines: int | None = MAX_IMPORT_LINES
) -> list[NewMemory]:
    """An export's lines (JSON Lines, blank lines skipped) as memories to import; the first bad
    line is a 422 naming it (``param`` = ``line N.field``). With `new_ids` every memory gets a
    new id (its created event names the id it copies): to import another user's export. More
    than `max_lines` memories (None: no limit) is a 400."""
    items: list[NewMemory] = []
    copies: dict[str, str] = {}  # with new_ids: a line's id -> its copy's (named twice: the last)
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        if max_lines is not None and len(items) >= max_lines:
            raise InvalidRequest(f"at most {max_lines} memories per import", code="too_many")
        try:
            item = MemoryImport.model_validate_json(line)
        except ValidationError as exc:
            first = exc.errors()[0]
            found = lone_surrogate_in(line) if first["type"] == "json_invalid" else None
            if found is not None:  # pydantic's "unexpected end of hex escape" names no field
                where, why = found
                raise ValidationFailed(
                    f"line {number}: {where} {why}", param=f"line {number}.{where}"
                ) from None
            where = shown(".".join([f"line {number}", *(str(p) for p in first["loc"])]))
            reason = first["msg"].removeprefix("Value error, ")
            raise ValidationFailed(f"line {number}: {reason}", param=where) from None
        check_length(item.content, max_chars, f"line {number}.content")
        copied = new_ids and item.id is not None
        memory_id = str(uuid.uuid4()) if new_ids else item.id
        if copied:
            copies[str(item.id)] = str(memory_id)
        items.append(
            NewMemory(
                content=item.content, type=item.type, metadata=item.metadata, pinned=item.pinned,
                source=MemorySource.IMPORT, id=memory_id,
                created_at=item.created_at, profile=item.profile,
                observed_at=item.observed_at or item.created_at,
                detail=f"imported as a copy of memory {item.id}" if copied else None,
                linked=tuple(item.linked), **({} if new_ids else _kept(item)),
            )
        )  # fmt: skip
    if not items:
        raise InvalidRequest("nothing to import: send JSON Lines, one memory each", code="empty")
    if new_ids:  # a copy links to copies, by their new ids, whichever batch writes them (the
        # CLI's); never to an id the file does not hold, which may be the user's original
        items = [replace(i, linked=tuple(copies[o] for o in i.linked if o in copies))
                 for i in items]  # fmt: skip
    return items
