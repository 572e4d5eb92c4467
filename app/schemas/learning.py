"""The wire format of learning from past conversations: ``POST /v1/memories/learn`` (its body is
the export itself, not a schema of memproxy's) and ``GET /v1/memories/learn/{id}``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from app.memory.learning.history.queue import Learned

LearnFormat = Literal["auto", "openwebui", "chatgpt"]


class LearnProgress(BaseModel):
    """A learn run's jobs not yet applied: once `pending` is 0, the Manager has learned from
    everything of it that it could (`failed` jobs wait for ``POST /v1/memories/jobs/retry``)."""

    object: Literal["memory.learn.progress"] = "memory.learn.progress"
    id: str
    """The run: the same export learned again by the same user is the same run."""
    user_id: str
    pending: int
    """Jobs queued or running."""
    queued: int
    running: int
    failed: int


class LearnResult(LearnProgress):
    """What one learn queued, and the run's progress."""

    object: Literal["memory.learn"] = "memory.learn"  # type: ignore[assignment]
    format: Literal["openwebui", "chatgpt"]
    conversations: int
    """In the export."""
    messages: int
    """User and assistant messages read, of each conversation's current branch."""
    queued_conversations: int
    """Conversations with something new: jobs queued for them now."""
    jobs: int
    """Jobs queued now."""
    already_learned: int
    """Conversations with nothing new: learned (or queued) before, from a chat or an export."""
    skipped: int
    """Conversations with no word of the user's to learn from."""

    @classmethod
    def of(cls, learned: Learned, user_id: str, progress: Mapping[str, int]) -> LearnResult:
        """What `learned` did, with the run's `progress` (its jobs by status, and pending)."""
        return cls(
            id=learned.run, user_id=user_id, format=learned.format,
            conversations=learned.conversations, messages=learned.messages,
            queued_conversations=learned.queued, jobs=learned.jobs,
            already_learned=learned.already, skipped=learned.skipped, **progress,
        )  # fmt: skip
