"""Forgetting over a capacity, as the API shows it: what would leave (the dry run), what left,
and the forgotten memories that can be put back (``/v1/memories/forget``,
``/v1/memories/forgotten``)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from app.memory.aging.forgetting import Leaving
from app.memory.store.archive import Forgotten


class ForgetRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    dry_run: bool = False
    """Only say what would leave; change nothing."""


class LeavingPublic(BaseModel):
    id: str
    type: str
    content: str
    value: float
    """What it was worth keeping (0-1: its retention by use, halved for an episode a fact was
    written from); the least worth leave first."""
    reason: str

    @classmethod
    def of(cls, m: Leaving) -> LeavingPublic:
        return cls(id=m.id, type=m.type, content=m.content, value=round(m.value, 6),
                   reason=m.reason)  # fmt: skip


class ForgetResult(BaseModel):
    object: Literal["memory.forgetting"] = "memory.forgetting"
    user_id: str
    dry_run: bool
    max_facts: int
    """MEMPROXY_MAX_FACTS (0: no limit)."""
    max_episodes: int
    """MEMPROXY_MAX_EPISODES (0: no limit)."""
    forgotten: list[LeavingPublic]
    """What left (or, in a dry run, would leave), least worth first per kind."""


class ForgottenPublic(BaseModel):
    id: str
    object: Literal["memory.forgotten"] = "memory.forgotten"
    content: str
    type: str
    metadata: dict[str, Any]
    source: str
    created_at: datetime
    observed_at: datetime
    recall_count: int
    last_recalled_at: datetime | None
    reason: str
    cause: str
    """Why it left: ``forgotten`` (over a capacity), ``merged`` (into another fact) or
    ``superseded`` (no longer true)."""
    ended_at: datetime | None
    """For a superseded fact: when it stopped being true."""
    forgotten_at: datetime
    erased_after: datetime
    """When it is erased for good unless put back (MEMPROXY_FORGOTTEN_KEEP_DAYS)."""

    @classmethod
    def of(cls, m: Forgotten, erased_after: datetime) -> ForgottenPublic:
        return cls(
            id=m.id, content=m.content, type=m.type, metadata=m.metadata, source=m.source,
            created_at=m.created_at, observed_at=m.observed_at, recall_count=m.recall_count,
            last_recalled_at=m.last_recalled_at, reason=m.reason, forgotten_at=m.forgotten_at,
            cause=m.cause, ended_at=m.ended_at, erased_after=erased_after,
        )  # fmt: skip


class ForgottenList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ForgottenPublic]
    total: int
    limit: int
    offset: int
    has_more: bool
