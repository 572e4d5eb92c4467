"""The memory schema (owned by Alembic: `migrations/`; change both together).

A memory has a public id (a UUID string, what the API and exports use) and an internal integer
``key``, the int64 id its vector has in the FAISS indexes (which hold ids only). ``user_state``
keeps one change sequence per user, bumped by every write, so that a process can tell that its
caches of that user are stale when another process wrote (several workers share one database);
each memory carries the sequence of its last write (``seq``), so catching up reads only what
changed.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    false,
    func,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only auto-increments an INTEGER PRIMARY KEY; elsewhere the key is a 64-bit integer.
Key = BigInteger().with_variant(Integer(), "sqlite")


class MemoryType(StrEnum):
    """What a memory is: a fact of one of six kinds, or an episode (the user's own words). The
    API accepts only these."""

    FACT = "fact"
    """Something true about the user: where they live, their job, their family."""
    PREFERENCE = "preference"
    """What the user likes, dislikes or wants: tastes, style, how they like answers."""
    KNOWLEDGE = "knowledge"
    """Something the user knows or works with, useful context for answers."""
    EVENT = "event"
    """Something that happened or will happen, with its date when known."""
    CORRECTION = "correction"
    """The user corrected a wrong belief or answer: what is right instead."""
    FEEDBACK = "feedback"
    """How the user judged the assistant's behaviour."""
    EPISODE = "episode"
    """The user's own words in a turn (a passage of it), kept beside the facts drawn from it."""


# The kinds of a fact: every MemoryType but `episode`, the kinds the Manager and the MCP tool
# `remember` may write (episodes are kept from the turns themselves). Its docstring is the
# description the Manager's answer schema gives the model: it names no other kind.
class FactType(StrEnum):
    """What a memory is about."""

    FACT = MemoryType.FACT.value
    PREFERENCE = MemoryType.PREFERENCE.value
    KNOWLEDGE = MemoryType.KNOWLEDGE.value
    EVENT = MemoryType.EVENT.value
    CORRECTION = MemoryType.CORRECTION.value
    FEEDBACK = MemoryType.FEEDBACK.value


class MemorySource(StrEnum):
    """Who wrote: also the `actor` of audit events."""

    MANAGER = "manager"
    API = "api"
    IMPORT = "import"
    CLI = "cli"
    """``memproxy memories ...`` on the server's machine."""
    UPKEEP = "upkeep"
    """The idle-time work on a user's memories (:mod:`app.memory.aging`): forgetting over a
    capacity."""


class EventAction(StrEnum):
    CREATED = "created"
    UPDATED = "updated"
    DELETED = "deleted"
    MOVED = "moved"
    """Given to another user (`memproxy memories move`, ``POST /v1/memories/move``)."""
    FORGOTTEN = "forgotten"
    """Left the memories for the archive (:class:`ForgottenMemory`), with the reason: it can be
    put back from there (then ``created`` again, same id, saying so)."""
    MERGED = "merged"
    """Consolidation merged it into another fact (named in the detail), which says what it
    said; archived as a forgotten memory is."""
    SUPERSEDED = "superseded"
    """Stopped being true (a newer fact, named in the detail, says what is): archived with the
    date it ended, never recalled again."""


class Base(DeclarativeBase):
    pass


class Memory(Base):
    __tablename__ = "memories"

    key: Mapped[int] = mapped_column(Key, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(36), unique=True)
    user_id: Mapped[str] = mapped_column(String(256))
    content: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(32), default=MemoryType.FACT.value)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    source: Mapped[str] = mapped_column(String(16), default=MemorySource.API.value)
    pinned: Mapped[bool] = mapped_column(Boolean, default=False)
    profile: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    """A standing fact about the person (who they are, household, health, lasting preferences),
    to be shown in every chat."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    observed_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), server_default=func.current_timestamp()
    )
    """When what the memory says was said (the request's time; the API and imports may set it):
    not when it was written, which may be long after (a history learned later). The server
    defaults (here and on `profile`) are for writers that do not know the column: a replica of
    the version before, still running while another upgrades the database."""
    recall_count: Mapped[int] = mapped_column(Integer, default=0)
    last_recalled_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    embedding: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """float32 vector, little-endian bytes."""
    embedding_model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """The model that produced `embedding`; another model configured means re-embedding."""
    index_text: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    """What the memory is found by, when not its content: an episode's words and the facts
    written from them (:mod:`app.memory.learning.episodes`). Never shown."""
    seq: Mapped[int] = mapped_column(BigInteger, default=0)
    """The user's change sequence at this memory's last write: a cache at version N reloads
    exactly the memories with ``seq > N``."""

    __table_args__ = (
        Index("ix_memories_user_created", "user_id", "created_at"),
        Index("ix_memories_user_seq", "user_id", "seq"),
        Index("ix_memories_user_observed", "user_id", "observed_at"),
    )


class MemoryLink(Base):
    """Provenance: a fact was written from an episode (both memories of the same user). Deleted
    with either memory, in the same transaction; moved with their user."""

    __tablename__ = "memory_links"

    user_id: Mapped[str] = mapped_column(String(256))
    fact_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    episode_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_memory_links_user_episode", "user_id", "episode_id"),)


class ForgottenMemory(Base):
    """A memory that left the user's memories by forgetting (over a capacity), kept whole so
    that it can be put back (same id) until the archive's keep time runs out. Never recalled,
    never searched; erased with its user, moved with its user."""

    __tablename__ = "forgotten_memories"

    key: Mapped[int] = mapped_column(Key, primary_key=True, autoincrement=True)
    id: Mapped[str] = mapped_column(String(36), unique=True)
    """The id the memory had, and has again once restored."""
    user_id: Mapped[str] = mapped_column(String(256))
    content: Mapped[str] = mapped_column(Text)
    type: Mapped[str] = mapped_column(String(32))
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSON, default=dict)
    source: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    observed_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recall_count: Mapped[int] = mapped_column(Integer, default=0)
    last_recalled_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True
    )
    index_text: Mapped[str | None] = mapped_column(Text, nullable=True, default=None)
    links: Mapped[list[str]] = mapped_column(JSON, default=list)
    """The ids of the memories it was linked to (episodes of a fact, facts of an episode),
    linked again on restore where they still exist."""
    reason: Mapped[str] = mapped_column(Text)
    forgotten_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    cause: Mapped[str] = mapped_column(String(16), default="forgotten", server_default="forgotten")
    """Why it left: ``forgotten`` (over a capacity), ``merged`` or ``superseded``
    (consolidation, :mod:`app.memory.learning.consolidation`)."""
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    """For a superseded fact: when it stopped being true (the newer fact's saying)."""

    __table_args__ = (Index("ix_forgotten_memories_user_when", "user_id", "forgotten_at"),)


class UserState(Base):
    __tablename__ = "user_state"

    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    version: Mapped[int] = mapped_column(BigInteger, default=0)
    """Bumped by every write to the user's memories, in the same transaction."""


class IndexImage(Base):
    """One part of a user's index image (:mod:`app.memory.search.image`): a cache of the search
    index at `version`, so a restart or another replica loads it instead of reading and
    analysing every memory. Written whole (all its parts in one transaction) by
    :mod:`app.memory.store.images`, erased with its user; never served before caught up."""

    __tablename__ = "index_images"

    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    part: Mapped[int] = mapped_column(Integer, primary_key=True)
    parts: Mapped[int] = mapped_column(Integer)
    version: Mapped[int] = mapped_column(BigInteger)
    data: Mapped[bytes] = mapped_column(LargeBinary)
    written_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class MemoryEvent(Base):
    """One write to one memory, kept after the memory is gone: why a memory exists, or not."""

    __tablename__ = "memory_events"

    key: Mapped[int] = mapped_column(Key, primary_key=True, autoincrement=True)
    user_id: Mapped[str] = mapped_column(String(256))
    memory_id: Mapped[str] = mapped_column(String(36))
    action: Mapped[str] = mapped_column(String(16))
    actor: Mapped[str] = mapped_column(String(16))
    """`api`, `import` or `manager`."""
    job_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    """The Manager job that made the change, if one did."""
    before: Mapped[str | None] = mapped_column(Text, nullable=True)
    after: Mapped[str | None] = mapped_column(Text, nullable=True)
    detail: Mapped[str | None] = mapped_column(Text, nullable=True)
    """Why, when it is not plain: e.g. an UPDATE of an unknown memory that created one."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))

    __table_args__ = (Index("ix_memory_events_user_memory", "user_id", "memory_id"),)


class JobStatus(StrEnum):
    AWAITING = "awaiting"
    """Written while the answer is still on its way; due once the response completes."""
    QUEUED = "queued"
    RUNNING = "running"
    FAILED = "failed"
    """Out of retries, or the Manager's answer was unusable; kept with its error (and that
    answer) until `memproxy jobs retry`."""


RUNNING = "status = 'running'"


class ManagerJob(Base):
    """One exchange waiting for the Manager. Deleted in the transaction that applies it, so a job
    is applied once or not at all; its payload (conversation text) goes with it."""

    __tablename__ = "manager_jobs"

    key: Mapped[int] = mapped_column(Key, primary_key=True, autoincrement=True)
    """Order of arrival: a user's jobs run in this order, one at a time."""
    id: Mapped[str] = mapped_column(String(36), unique=True)
    user_id: Mapped[str] = mapped_column(String(256))
    explicit: Mapped[bool] = mapped_column(Boolean)
    """The user asked to remember or forget something: never dropped, never held back."""
    status: Mapped[str] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    payload: Mapped[dict[str, Any]] = mapped_column(JSON)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    answer: Mapped[str | None] = mapped_column(Text, nullable=True)
    """The Manager's last answer, as it came, when it could not be used (kept for inspection)."""
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    owner: Mapped[str | None] = mapped_column(String(128), nullable=True)
    """The process running the job, or waiting for its chat's answer (awaiting); None when
    queued or failed."""
    lease_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    """The owner renews it while it lives; once past, any process takes the job up again."""

    __table_args__ = (
        Index("ix_manager_jobs_status_user", "status", "user_id", "key"),
        # One running job per user across every process sharing the database.
        Index("ux_manager_jobs_running_user", "user_id", unique=True,
              sqlite_where=text(RUNNING), postgresql_where=text(RUNNING)),
    )  # fmt: skip


class ProcessedTurn(Base):
    """A user turn already given to the Manager, by fingerprint (a hash, never the text):
    clients resend whole conversations, and no turn is extracted twice."""

    __tablename__ = "processed_turns"
    __table_args__ = (Index("ix_processed_turns_job", "job_id"),)

    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    job_id: Mapped[str | None] = mapped_column(String(36), nullable=True)
    """The chat job that took the turn, which gives it back if withdrawn (NULL: marked by
    another kind of job, or before migration 0012). Kept once the job is applied or merged
    into another (an id no job has then): clearing it would rewrite every turn of the job."""


class ManagerState(Base):
    __tablename__ = "manager_state"

    user_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    last_job_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    """When a job was last queued for the user (MEMPROXY_PROCESSING_INTERVAL counts from it)."""
    idle_version: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    """The user's version (:class:`UserState`) when their idle-time work last finished: more
    work is due once the version has moved past it (:mod:`app.memory.learning.idle_jobs`)."""
    model: Mapped[str | None] = mapped_column(String(256), nullable=True)
    """The model of the user's last chat with a job: the idle work's, unless
    MEMPROXY_MANAGER_MODEL names one."""
    idle_after: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    """No idle job before this (the last one stopped at its bound, or could not reach the
    model: the next goes on from `idle_version` after the user's quiet time)."""
