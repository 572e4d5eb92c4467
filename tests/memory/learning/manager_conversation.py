"""The conversation the Manager tests show it: a chat with a system prompt, a tool call and its
result around the user's words, as the worker would give it to :meth:`Manager.decide`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic_ai.messages import ModelMessage

from app.memory.learning.prompt import Shown, build_prompt
from app.memory.learning.turns import turns_of
from app.proxy.history import convert
from app.schemas.openai import ChatCompletionRequest

NOW = datetime(2026, 11, 22, 15, 4, tzinfo=UTC)
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant. SECRET-SYSTEM-PROMPT"},
    {"role": "user", "content": "I moved to Bergen last month."},
    {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "TOOL-OUTPUT: rain in Bergen"},
    {"role": "assistant", "content": "Welcome to Bergen! Bring an umbrella."},
    {"role": "user", "content": "Thanks. Also, I no longer eat meat."},
]  # fmt: skip


def turns() -> list[ModelMessage]:
    history = convert(
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES}).messages
    )
    return turns_of(history, "Noted, vegetarian dishes from now on.")


def conversation() -> dict[str, Any]:
    """What the worker gives :meth:`Manager.decide` for the turns above."""
    everything = turns()
    return {
        "now": NOW,
        "memories": [
            Shown(1, "Lives in Oslo", "fact", NOW),
            Shown(2, "Loves steak", "preference", NOW),
        ],
        "context": everything[:-2],
        "new": everything[-2:],
    }


def prompt(role_aware: bool = True) -> str:
    return build_prompt(role_aware=role_aware, **conversation())
