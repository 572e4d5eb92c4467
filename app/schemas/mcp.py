"""What the MCP server's tools answer (:mod:`app.api.mcp`): short, structured, ids in full."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class _Memory(BaseModel):
    id: str
    content: str
    type: str
    profile: bool = Field(description="A standing fact about the user, shown in every chat.")
    observed_at: datetime = Field(description="When the user said it.")
    created_at: datetime


class Item(_Memory):
    pinned: bool


class Remembered(Item):
    already_existed: bool = Field(description="True: the user already had this memory.")


class Forgotten(Item):
    also_deleted: int = Field(
        description="How many other memories went with it: the user's words it was learned "
        "from, and memories that said the same."
    )


class Hit(_Memory):
    score: float = Field(description="Relevance, 0-1.")


class Recalled(BaseModel):
    memories: list[Hit]


class Page(BaseModel):
    memories: list[Item]
    total: int = Field(description="How many memories (of that type) the user has in all.")


class Stats(BaseModel):
    total: int
    by_type: dict[str, int]
    pinned: int
    profile: int
    recall_count: int
    oldest: datetime | None
    newest: datetime | None
    jobs: dict[str, int] = Field(description="Learning from chats: counts by state.")
