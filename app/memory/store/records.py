"""The values the store hands out and takes in: plain frozen dataclasses, no ORM state."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypedDict

from app.memory.store.tables import Memory, MemorySource, MemoryType


@dataclass(frozen=True, slots=True)
class MemoryRecord:
    key: int
    """Internal int64 id (the FAISS id); never shown to clients."""
    id: str
    user_id: str
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    pinned: bool
    profile: bool
    """A standing fact about the person, shown in every chat."""
    created_at: datetime
    updated_at: datetime
    observed_at: datetime
    """When what it says was said (``created_at`` is when it was written)."""
    recall_count: int
    last_recalled_at: datetime | None
    embedding: bytes | None = field(repr=False)
    embedding_model: str | None
    index_text: str | None = field(default=None, repr=False)
    """What it is found by when not its content (an episode's words and facts); read from ORM
    rows only (:func:`record_of`), for the index's in-place updates. Never shown."""


@dataclass(frozen=True, slots=True)
class NewMemory:
    content: str
    type: MemoryType = MemoryType.FACT
    metadata: dict[str, Any] = field(default_factory=dict)
    pinned: bool = False
    source: MemorySource = MemorySource.API
    id: str | None = None
    """Given on import (idempotent on id); otherwise a new UUID."""
    created_at: datetime | None = None
    embedding: bytes | None = None
    embedding_model: str | None = None
    detail: str | None = None
    """Said in its ``created`` event (e.g. the memory an import with new ids copied)."""
    kept_source: MemorySource | None = None
    """The source an import puts back (its line's), while the history says `source` wrote it."""
    recall_count: int = 0
    last_recalled_at: datetime | None = None
    """Put back by an import that keeps ids (search ranks by neither; the count orders the
    profile past its budget)."""
    profile: bool = False
    observed_at: datetime | None = None
    """When what it says was said; None: when it is written."""
    index_text: str | None = None
    """What it is found by when not its content (an imported episode's words and facts)."""
    linked: tuple[str, ...] = ()
    """The ids its import line names as linked to it (the service puts back those it can)."""


class Changes(TypedDict, total=False):
    """What a write may change of a memory (its id, owner, source, and the dates it was
    written, changed and recalled, are never changed)."""

    content: str
    type: MemoryType | str
    metadata: Mapping[str, Any]
    pinned: bool
    profile: bool
    observed_at: datetime
    """Written in UTC (:func:`in_utc`)."""
    embedding: bytes | None
    """Set with `embedding_model` when `content` changes (the service embeds it again)."""
    embedding_model: str | None


@dataclass(frozen=True, slots=True)
class Written:
    """What a write left: the records, and the user's version it committed."""

    records: list[MemoryRecord]
    version: int
    created: list[bool]
    """Per record: True when this write created it (False: it existed, e.g. a re-import)."""
    links: list[tuple[int, int]] = field(default_factory=list)
    """(fact key, episode key) of the provenance links the write put (back), for the index."""


@dataclass(frozen=True, slots=True)
class Removed:
    """What a delete removed (its memories' keys), as :class:`Written` says what a write wrote;
    the API's own answer is :class:`app.schemas.memories.Deleted`."""

    keys: list[int]
    version: int
    """The version the delete committed (the current one when nothing was deleted)."""
    ids: list[str] = field(default_factory=list)
    """The ids asked for that were deleted (when the delete named ids)."""
    also: list[MemoryRecord] = field(default_factory=list)
    """The memories that went with them (:meth:`app.memory.store.unit.Writer.delete`: the
    episodes a fact was written from, the memories that say the same), as they were."""
    linked: dict[str, list[str]] = field(default_factory=dict)
    """By id of a memory deleted: the ids it was linked to, read before the delete."""

    @property
    def count(self) -> int:
        return len(self.keys)


@dataclass(frozen=True, slots=True)
class Moved:
    """What a move gave from one user to another."""

    keys: list[int]
    """The memories' keys (they keep their ids, keys and history)."""
    source_version: int
    target_version: int
    jobs: int
    """Manager jobs not yet running that went along (their turns are the target's now)."""


@dataclass(frozen=True, slots=True)
class UserSummary:
    """One user as the admin's list shows them."""

    user_id: str
    memories: int
    last_activity: datetime | None
    """The latest write to their memories, recall of one, or Manager job queued."""


@dataclass(frozen=True, slots=True)
class IndexRow:
    """What the search indexes need of one memory."""

    key: int
    type: str
    content: str
    created_at: datetime
    embedding: bytes | None
    embedding_model: str | None
    pinned: bool
    profile: bool
    observed_at: datetime
    recall_count: int
    """As read or written; recalls do not bump the version, so an index's copy may lag."""
    index_text: str | None = None
    """What it is found by when not its content (an episode's words and its facts)."""

    @property
    def key_text(self) -> str:
        """The text the indexes hold for it: :attr:`index_text`, else the content."""
        return self.index_text or self.content


@dataclass(frozen=True, slots=True)
class Snapshot:
    version: int
    rows: list[IndexRow]
    total: int
    """How many memories the user has (to notice deletions without listing every key)."""
    links: list[tuple[int, int]] = field(default_factory=list)
    """(fact key, episode key) of the provenance links among `rows`' episodes."""


def now() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime) -> datetime:
    # SQLite keeps no time zone: what went in as UTC comes back naive.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def in_utc(value: datetime) -> datetime:
    """The same instant in UTC (naive: taken as UTC). What is written: SQLite drops the offset
    without converting, so 10:00+02:00 would read back as 10:00Z."""
    return aware(value).astimezone(UTC)


def new_row(user_id: str, item: NewMemory, stamp: datetime) -> Memory:
    """The row a new memory is inserted as: a new UUID unless the item has an id, its dates in
    UTC (:func:`in_utc`; `stamp` for those it has not)."""
    return Memory(
        id=item.id or str(uuid.uuid4()),
        user_id=user_id,
        content=item.content,
        type=item.type.value,
        meta=dict(item.metadata),
        source=(item.kept_source or item.source).value,
        pinned=item.pinned,
        profile=item.profile,
        created_at=in_utc(item.created_at) if item.created_at else stamp,
        updated_at=stamp,
        observed_at=in_utc(item.observed_at) if item.observed_at else stamp,
        recall_count=item.recall_count,
        last_recalled_at=in_utc(item.last_recalled_at) if item.last_recalled_at else None,
        embedding=item.embedding,
        embedding_model=item.embedding_model,
        index_text=item.index_text,
    )


def record_of(row: Memory, *, embedding: bool = True) -> MemoryRecord:
    """A record from an ORM row."""
    return _record(row, row.meta, row.embedding if embedding else None)


def record_of_row(row: Any) -> MemoryRecord:
    """A record from a Core row of ``RECORD_COLUMNS`` (no ORM object: ~1 ms less per read)."""
    return _record(row, row.metadata, None)


def _record(row: Any, metadata: dict[str, Any] | None, embedding: bytes | None) -> MemoryRecord:
    return MemoryRecord(
        key=row.key,
        id=row.id,
        user_id=row.user_id,
        content=row.content,
        type=row.type,
        metadata=dict(metadata or {}),
        source=row.source,
        pinned=row.pinned,
        profile=row.profile,
        created_at=aware(row.created_at),
        updated_at=aware(row.updated_at),
        observed_at=aware(row.observed_at),
        recall_count=row.recall_count,
        last_recalled_at=aware(row.last_recalled_at) if row.last_recalled_at else None,
        embedding=embedding,
        embedding_model=row.embedding_model,
        index_text=row.index_text if isinstance(row, Memory) else None,
    )


RECORD_COLUMNS = (
    Memory.key,
    Memory.id,
    Memory.user_id,
    Memory.content,
    Memory.type,
    Memory.meta.label("metadata"),
    Memory.source,
    Memory.pinned,
    Memory.profile,
    Memory.created_at,
    Memory.updated_at,
    Memory.observed_at,
    Memory.recall_count,
    Memory.last_recalled_at,
    Memory.embedding_model,
)
"""Every column but the embedding."""


def describe_changes(row: Memory, changes: Changes) -> str | None:
    """What a change does besides the text, in words, for the history: ``pinned``, ``profile``,
    ``type fact -> preference``, ``observed 2024-05-01 10:00Z -> 2023-05-01 09:30Z``,
    ``metadata``."""
    said = []
    if "pinned" in changes and changes["pinned"] != row.pinned:
        said.append("pinned" if changes["pinned"] else "unpinned")
    if "profile" in changes and changes["profile"] != row.profile:
        said.append("profile" if changes["profile"] else "not profile")
    if "type" in changes and MemoryType(changes["type"]).value != row.type:
        said.append(f"type {row.type} -> {MemoryType(changes['type']).value}")
    if "observed_at" in changes and in_utc(changes["observed_at"]) != aware(row.observed_at):
        said.append(f"observed {_minute(row.observed_at)} -> {_minute(changes['observed_at'])}")
    if "metadata" in changes and dict(changes["metadata"]) != row.meta:
        said.append("metadata")
    return ", ".join(said) or None


def _minute(value: datetime) -> str:
    """An instant as the history says it: to the minute, in UTC."""
    return in_utc(value).strftime("%Y-%m-%d %H:%MZ")
