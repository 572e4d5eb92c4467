"""The memory API's wire format: Create / Update / Public triplets, search and listing (an
export's lines, and reading them back: :mod:`app.schemas.memory_lines`).

Unknown fields are refused (``extra="forbid"``): this API is memproxy's own, and a misspelt
``pinned`` silently ignored would be worse than a 422 naming it. Content length is checked
against ``MEMPROXY_MEMORY_MAX_CHARS`` by the router (a setting, not a constant). Content and
metadata must be storable (:mod:`app.schemas.checks`): valid Unicode, integers within 64 bits,
metadata nested at most 32 levels and at most 16 KiB as JSON; else a 422 naming the place.
A memory's `observed_at` (when what it says was said) names its time zone and lies between 1970
and a day from now; `profile` is a JSON boolean (``"yes"`` or ``1`` is refused).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

import orjson
from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, field_validator

from app.errors import ValidationFailed
from app.memory.store.records import MemoryRecord, in_utc
from app.memory.store.tables import MemoryType
from app.schemas.checks import json_problem, lone_surrogate

MAX_BATCH = 1000
MAX_METADATA_BYTES = 16_384
MAX_METADATA_DEPTH = 32
"""Deepest nesting of `metadata` (the object itself is level 1)."""
ID_PATTERN = r"^[A-Za-z0-9_-]{1,36}$"
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
FUTURE_SLACK = timedelta(days=1)
"""A memory may be dated at most this far ahead of now (clocks differ; no more)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _content(value: str) -> str:
    value = value.strip()
    if not value:
        raise ValueError("content must not be empty")
    if (why := lone_surrogate(value)) is not None:  # a "\ud800" escape: SQLite cannot store it
        raise ValueError(f"content {why}")
    if "\x00" in value:  # PostgreSQL's text cannot hold it
        raise ValueError("content must not contain the NUL character (\\u0000)")
    return value


def _metadata(value: dict[str, Any]) -> dict[str, Any]:
    # Checked before it is written as JSON: orjson refuses what Python's parser let through.
    problem = json_problem(value, "metadata", max_depth=MAX_METADATA_DEPTH)
    if problem is not None:
        raise ValueError(" ".join(problem))
    if len(orjson.dumps(value)) > MAX_METADATA_BYTES:
        raise ValueError(f"metadata must be at most {MAX_METADATA_BYTES} bytes as JSON")
    return value


def instant(value: datetime | None, name: str) -> datetime | None:
    """`value` as the same instant in UTC (:func:`~app.memory.store.records.in_utc`, as the
    store writes it), between 1970 and a day from now; a ValueError naming the field (`name`)
    and the range otherwise."""
    if value is None:
        return None
    try:
        when = in_utc(value)
    except OverflowError:  # 9999-12-31T23:59:59-14:00 is in the year 10000 in UTC
        when = None
    latest = datetime.now(UTC) + FUTURE_SLACK
    if when is None or not EARLIEST <= when <= latest:
        raise ValueError(
            f"{name} must be between {EARLIEST:%Y-%m-%d} and a day from now "
            f"({latest:%Y-%m-%dT%H:%MZ})"
        )
    return when


def _observed(value: datetime | None) -> datetime | None:
    return instant(value, "observed_at")


Observed = Annotated[
    AwareDatetime,
    Field(description="When what the memory says was said: ISO 8601 with its time zone."),
]


class MemoryCreate(_Strict):
    content: str
    """What to remember, one self-contained statement (surrounding whitespace is trimmed)."""
    type: MemoryType = MemoryType.FACT
    metadata: dict[str, Any] = Field(default_factory=dict)
    """Free-form JSON object, kept as given."""
    pinned: bool = False
    """Pinned memories are shown in every chat (with the profile) and never forgotten or deleted
    automatically."""
    profile: StrictBool = False
    """A standing fact about the person (who they are, household, health and diet, lasting
    preferences, how they want answers): shown in every chat."""
    observed_at: Observed | None = None
    """When what it says was said (by default: now); kept in UTC."""

    _check_content = field_validator("content")(_content)
    _check_metadata = field_validator("metadata")(_metadata)
    _check_observed_at = field_validator("observed_at")(_observed)


class MemoryBatchCreate(_Strict):
    memories: Annotated[list[MemoryCreate], Field(min_length=1, max_length=MAX_BATCH)]


class MemoryUpdate(_Strict):
    """Fields to change; those left out stay as they are."""

    content: str | None = None
    type: MemoryType | None = None
    metadata: dict[str, Any] | None = None
    pinned: bool | None = None
    profile: StrictBool | None = None
    observed_at: Observed | None = None

    _check_observed_at = field_validator("observed_at")(_observed)

    @field_validator("content")
    @classmethod
    def _check_content(cls, value: str | None) -> str | None:
        return _content(value) if value is not None else None

    @field_validator("metadata")
    @classmethod
    def _check_metadata(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        return _metadata(value) if value is not None else None


class MemoryPublic(BaseModel):
    id: str
    object: Literal["memory"] = "memory"
    user_id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    pinned: bool
    profile: bool
    created_at: datetime
    """When memproxy wrote it."""
    updated_at: datetime
    observed_at: datetime
    """When what it says was said."""
    recall_count: int
    last_recalled_at: datetime | None
    linked: list[str] = Field(
        default_factory=list,
        description="Provenance: the ids of the memories linked to this one. A fact's are the "
        "episodes (the user's words) it was written from; an episode's, the facts written from "
        "it. An import puts back those whose other memory is in the import or is the user's.",
    )

    @classmethod
    def of(cls, record: MemoryRecord, linked: Sequence[str] = ()) -> MemoryPublic:
        public = cls.model_validate(record, from_attributes=True)  # the record's own fields
        public.linked = list(linked)
        return public


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
    """How many memories were deleted (with those that went with it)."""
    also_deleted: list[MemoryPublic] = []
    """Deleting a fact deletes what would say it again: the episodes it was written from and
    the memories that say the same. Those, as they were (to show, or to put back by import)."""


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
