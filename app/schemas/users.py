"""The wire format of the routes that span users (admin) and of the Manager's jobs as the memory
page shows them. Unknown fields are refused, as in :mod:`app.schemas.memories`."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict

Role = Literal["admin", "user", "open"]
"""Who a memory API key is: ``admin`` (an admin key: names any user with ``?user=``), ``user``
(acts for the one user resolved as chat resolves it), ``open`` (a server with no keys and no
signed Open WebUI tokens: anyone may name any user)."""


class UserPublic(BaseModel):
    object: Literal["user"] = "user"
    id: str
    memories: int
    """How many memories the user has now."""
    last_activity: datetime | None
    """The latest write to their memories, recall of one, or Manager job queued for them."""


class UserList(BaseModel):
    object: Literal["list"] = "list"
    data: list[UserPublic]
    total: int
    limit: int
    offset: int
    has_more: bool


class Identity(BaseModel):
    """Who the caller is, for the memory page: what it may show and whom it may pick."""

    object: Literal["identity"] = "identity"
    role: Role
    """``admin``: any user, by ``?user=``; ``user``: only `user_id`; ``open``: a server with no
    keys, where any user may be named."""
    user_id: str | None
    """The user the caller's requests act for without ``?user=`` (None for an admin key)."""


class MemoryMove(BaseModel):
    model_config = ConfigDict(extra="forbid")

    from_user: str
    """Whose memories to move (e.g. ``anonymous``, before Open WebUI forwarded user headers)."""
    to_user: str


class MemoryMoved(BaseModel):
    object: Literal["memory.moved"] = "memory.moved"
    from_user: str
    to_user: str
    moved: int
    """Memories given to `to_user`: same ids, history kept."""
    jobs: int
    """Manager jobs not yet running that went along."""


class JobPublic(BaseModel):
    object: Literal["manager.job"] = "manager.job"
    id: str
    status: str
    """``awaiting`` (the chat's answer on its way), ``queued``, ``running`` or ``failed``."""
    explicit: bool
    """The user asked to remember or forget something."""
    attempts: int
    messages: int
    """The conversation's new messages it holds (the user's and the answers)."""
    error: str | None
    """Why it failed, or why it waits for another attempt."""
    answer: str | None
    """The Manager's answer when it was unusable."""
    created_at: datetime
    next_attempt_at: datetime
    kind: Literal["chat", "history", "idle"] = "chat"
    """Whose: a chat's, a past conversation's (``/v1/memories/learn``), or the idle-time upkeep
    of the user's memories (forgetting over a capacity)."""


class JobList(BaseModel):
    object: Literal["list"] = "list"
    data: list[JobPublic]


class JobRetry(BaseModel):
    model_config = ConfigDict(extra="forbid")

    job_id: str | None = None
    """Only this failed job; all the user's failed jobs when left out."""


class JobsRequeued(BaseModel):
    object: Literal["manager.requeued"] = "manager.requeued"
    requeued: int
