"""The three kinds of Manager job, told by how their id begins, and the order they are claimed
in (:meth:`app.memory.learning.leases.Leases.claim`):

- a chat's (a UUID): learns from a chat's new turns; first;
- a past conversation's (:data:`HISTORY_JOB`, :mod:`app.memory.learning.history`): only when no
  chat's job is due, never merged with a chat's, never dropped for the queue's limit;
- an idle job (:data:`IDLE_JOB`, :mod:`app.memory.learning.idle_jobs`): the idle-time upkeep of
  a quiet user's memories; last, and only while the user has no other job waiting.
"""

from __future__ import annotations

from typing import Literal

from sqlalchemy import ColumnElement, case

from app.memory.store.tables import ManagerJob

HISTORY_JOB = "learn-"
IDLE_JOB = "idle-"

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
