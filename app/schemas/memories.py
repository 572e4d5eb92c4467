"""The memory API's wire format: Create / Update / Public triplets, search, listing and import.

Unknown fields are refused (``extra="forbid"``): this API is memproxy's own, and a misspelt
``pinned`` silently ignored would be worse than a 422 naming it. Content length is checked
against ``MEMPROXY_MEMORY_MAX_CHARS`` by the router (a setting, not a constant). Content and
metadata must be storable (:mod:`app.schemas.checks`): valid Unicode, integers within 64 bits,
metadata nested at most 32 levels and at most 16 KiB as JSON; else a 422 naming the place.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from app.errors import InvalidRequest, ValidationFailed
from app.memory.store.records import MemoryRecord, NewMemory, in_utc
from app.memory.store.tables import MemorySource, MemoryType
from app.schemas.checks import json_problem, lone_surrogate, lone_surrogate_in, shown

MAX_BATCH = 1000
MAX_IMPORT_LINES = 10 * MAX_BATCH
MAX_METADATA_BYTES = 16_384
MAX_METADATA_DEPTH = 32
"""Deepest nesting of `metadata` (the object itself is level 1)."""
ID_PATTERN = r"^[A-Za-z0-9_-]{1,36}$"
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
FUTURE_SLACK = timedelta(days=1)
"""An imported memory may be dated at most this far ahead of now (clocks differ; no more)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _content(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("content must not be empty")
    if (why := lone_surrogate(value)) is not None:  # a "\ud800" escape: SQLite cannot store it
        raise ValueError(f"content {why}")
    return value


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    # Checked before it is written as JSON: orjson refuses what Python's parser let through.
    problem = json_problem(value, "metadata", max_depth=MAX_METADATA_DEPTH)
    if problem is not None:
        raise ValueError(" ".join(problem))
    if len(orjson.dumps(value)) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return value


class MemoryCreate(_Strict):
    content: str
    """What to remember, one self-contained statement (surrounding whitespace is trimmed)."""
    type: MemoryType = MemoryType.FACT
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON object, kept as given."""
    pinned: bool = False
    """Pinned memories are never forgotten or deleted automatically."""

    _check_content = field_validator("content")(_content)
    _check_metadata = field_validator("metadata")(_metadata)


class MemoryBatchCreate(_Strict):
    memories: Annotated[list[MemoryCreate], Field(min_length=1, max_length=MAX_BATCH)]


class MemoryUpdate(_Strict):
    """Fields to change; those left out stay as they are."""

    content: str | None = None
    type: MemoryType | None = None
    metadata: dict[str, Any] | None = None
    pinned: bool | None = None

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: str | None) -> str | None:
        return _content(value) if value is not None else None

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _metadata(value) if value is not None else None


def imported_date(value: datetime | None) -> datetime | None:
    """`value` as the same instant in UTC (:func:`~app.memory.store.records.in_utc`, as the
    store writes it), between 1970 and a day from now; a ValueError naming the range otherwise."""
    if value is None:
        return None
    try:
        instant = in_utc(value)
    except OverflowError:  # 9999-12-31T23:59:59-14:00 is in the year 10000 in UTC
        instant = None
    latest = datetime.now(UTC) + FUTURE_SLACK
    if instant is None or not EARLIEST <= instant <= latest:
        raise ValueError(
            f"created_at must be between {EARLIEST:%Y-%m-%d} and a day from now "
            f"({latest:%Y-%m-%dT%H:%MZ})"
        )
    return instant


class MemoryImport(MemoryCreate):
    """One line of an export, read back. Importing the same id twice keeps the first; a line
    without an id is a new memory (so is every line of an import with new ids). `created_at`
    is kept as the instant it names, in UTC (:func:`imported_date`)."""

    id: Annotated[str, Field(pattern=ID_PATTERN)] | None = None
    created_at: datetime | None = None
    source: str | None = None
    """Kept when the import keeps ids and it is one memproxy writes (``manager``, ``api``,
    ``cli``, ``import``); the source `import` otherwise. The history says `import` wrote it."""
    object: Literal["memory"] | None = None
    user_id: str | None = None
    """Ignored: memories are imported for the user the request acts for."""
    updated_at: datetime | None = None
    recall_count: Annotated[int, Field(ge=0)] | None = None
    """Kept, with `last_recalled_at`, when the import keeps ids; 0 (never) with new ids. Shown
    only: recall ranks by neither, so a forged count boosts nothing."""
    last_recalled_at: datetime | None = None

    _check_created_at = field_validator("created_at")(imported_date)

    @field_validator("last_recalled_at")
    @classmethod
    def _check_last_recalled_at(cls, value: datetime | None) -> datetime | None:
        try:
            return imported_date(value)
        except ValueError as exc:
            raise ValueError(str(exc).replace("created_at", "last_recalled_at")) from None


class MemoryPublic(BaseModel):
    id: str
    object: Literal["memory"] = "memory"
    user_id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    pinned: bool
    created_at: datetime
    updated_at: datetime
    recall_count: int
    last_recalled_at: datetime | None

    @classmethod
    def of(cls, record: MemoryRecord) -> MemoryPublic:
        return cls.model_validate(record, from_attributes=True)  # the record's own fields


class MemoryEventPublic(BaseModel):
    """One write to a memory: what changed, who changed it, and in which Manager job."""

    object: Literal["memory.event"] = "memory.event"
    memory_id: str
    action: str
    """`created`, `updated` or `deleted`."""
    actor: str
    """`api`, `import` or `manager`."""
    job_id: str | None
    before: str | None
    after: str | None
    detail: str | None
    created_at: datetime


class MemoryHistory(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryEventPublic]


class MemoryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryPublic]
    total: int
    limit: int
    offset: int
    has_more: bool


class MemorySearch(_Strict):
    query: Annotated[str, Field(min_length=1, max_length=8000)]
    limit: Annotated[int, Field(ge=1, le=100)] = 10
    types: list[MemoryType] | None = None
    min_score: Annotated[float, Field(ge=0.0, le=1.0)] | None = None
    """Least fused score (see app/memory/search/ranking.py); by default
    MEMPROXY_RELEVANCE_THRESHOLD."""

    _check_query = field_validator("query")(_content)


class MemoryHit(MemoryPublic):
    score: float
    """The fused relevance score chat recall ranks by, 0-1."""


class SearchResults(BaseModel):
    object: Literal["list"] = "list"
    data: list[MemoryHit]


class Deleted(BaseModel):
    id: str | None = None
    object: Literal["memory.deleted"] = "memory.deleted"
    deleted: int
    """How many memories were deleted."""


class ImportResult(BaseModel):
    imported: int
    """Memories created."""
    skipped: int
    """Lines whose id already existed for this user (imports are idempotent on id)."""


def check_length(content: str, limit: int, param: str) -> None:
    """422 when `content` is longer than `MEMPROXY_MEMORY_MAX_CHARS` (`limit`)."""
    if len(content) > limit:
        raise ValidationFailed(
            f"content is {len(content)} characters; at most {limit} are accepted "
            "(MEMPROXY_MEMORY_MAX_CHARS)",
            param=param,
            code="content_too_long",
        )


def export_line(record: MemoryRecord) -> bytes:
    """One memory as a line of an export (JSON Lines)."""
    return orjson.dumps(MemoryPublic.of(record).model_dump(mode="json")) + b"\n"


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
        items.append(
            NewMemory(
                content=item.content, type=item.type, metadata=item.metadata, pinned=item.pinned,
                source=MemorySource.IMPORT, id=None if new_ids else item.id,
                created_at=item.created_at,
                detail=f"imported as a copy of memory {item.id}" if copied else None,
                **({} if new_ids else _kept(item)),
            )
        )  # fmt: skip
    if not items:
        raise InvalidRequest("nothing to import: send JSON Lines, one memory each", code="empty")
    return items
