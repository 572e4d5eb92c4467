"""What a Manager job is (:class:`Job`, as claimed), and its three kinds, told by how their id
begins, in the order they are claimed (:meth:`app.memory.learning.leases.Leases.claim`):

- a chat's (a UUID): learns from a chat's new turns; first;
- a past conversation's (:data:`HISTORY_JOB`, :mod:`app.memory.learning.history`): only when no
  chat's job is due, never merged with a chat's, never dropped for the queue's limit;
- an idle job (:data:`IDLE_JOB`, :mod:`app.memory.learning.idle_jobs`): the idle-time upkeep of
  a quiet user's memories; last, and only while the user has no other job waiting, but that a
  worker of two slots or more gives one slot to idle work while chats' jobs wait (else a
  Manager busy for hours would never keep a store within its capacity).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from pydantic_ai.messages import ModelMessage
from sqlalchemy import ColumnElement, case

from app.memory.learning.turns import load
from app.memory.store.records import aware
from app.memory.store.tables import ManagerJob


@dataclass(frozen=True, slots=True)
class Job:
    id: str
    user_id: str
    explicit: bool
    attempts: int
    payload: dict[str, Any]
    """As stored: the chat's ``model``, its ``context`` and ``new`` turns (:func:`dump`), and the
    ``fingerprints`` the job took."""
    created_at: datetime
    """When the user said what it learns from (its memories' `observed_at`, the Manager's
    "today"): when it was queued, or a past conversation's date (:func:`said_at`)."""

    @property
    def model(self) -> str:
        """The chat request's model (the Manager's, unless one is configured)."""
        return str(self.payload["model"])

    def turns(self) -> tuple[list[ModelMessage], list[ModelMessage]]:
        """The turns before the new ones (context only), and the new ones."""
        return load(self.payload["context"]), load(self.payload["new"])


def said_at(payload: dict[str, Any], queued_at: datetime) -> datetime:
    """When the user said what a job learns from: a past conversation's date (its payload's
    ``said_at``), else when the job was queued (a chat's)."""
    said = payload.get("said_at")
    return datetime.fromisoformat(said) if isinstance(said, str) else aware(queued_at)


HISTORY_JOB = "learn-"
IDLE_JOB = "idle-"
OVER_JOB = "-over"
"""How the id of an idle job queued for a user past a capacity ends: it runs without waiting for
the user's chats' jobs (:mod:`app.memory.learning.idle`)."""

JobKind = Literal["chat", "history", "idle"]


def from_history() -> ColumnElement[bool]:
    """The condition a job was made from a past conversation (:data:`HISTORY_JOB`)."""
    return ManagerJob.id.like(HISTORY_JOB + "%")


def idle() -> ColumnElement[bool]:
    """The condition a job is an idle job (:data:`IDLE_JOB`)."""
    return ManagerJob.id.like(IDLE_JOB + "%")


def lane() -> ColumnElement[int]:
    """0 for a chat's job, 1 for a past conversation's, 2 for an idle job: the claim order."""
    return case((from_history(), 1), (idle(), 2), else_=0)


def kind_of(job_id: str) -> JobKind:
    if job_id.startswith(HISTORY_JOB):
        return "history"
    return "idle" if job_id.startswith(IDLE_JOB) else "chat"
