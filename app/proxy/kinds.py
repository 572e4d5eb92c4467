"""What kind of request this is, and what memory may do with it.

Open WebUI sends its background jobs (chat title, tags, follow-ups, search queries, autocomplete,
emoji, image prompt, its own memory's review, context compaction) through the same
`/chat/completions` endpoint as the chat itself. Memory must not recall into them or learn from
them, so each request gets a :class:`RequestKind`:

1. the task header (``X-OpenWebUI-Task``, configurable) with a non-empty value: ``task``;
2. the last message is a tool (or legacy function) result: ``tool_continuation``;
3. a system prompt that is one of Open WebUI's task prompts (its memory reviewer's): ``task``;
4. a lone user message that is one of Open WebUI's task templates: ``task``. Open WebUI's RAG
   template also starts with ``### Task:`` but is the user's own chat: it stays ``chat``;
5. anything else: ``chat``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from app.errors import InvalidRequest
from app.schemas.openai import content_text


class RequestKind(StrEnum):
    CHAT = "chat"
    TASK = "task"
    TOOL_CONTINUATION = "tool_continuation"


class MemoryMode(StrEnum):
    """The client's choice in the ``X-Memory`` header."""

    ON = "on"
    """Recall memories and learn from the exchange (the default)."""
    READ_ONLY = "read-only"
    """Recall, but never write memories from this request."""
    OFF = "off"
    """Neither recall nor learn."""


_MODE_WORDS = {
    "": MemoryMode.ON,
    "on": MemoryMode.ON,
    "true": MemoryMode.ON,
    "1": MemoryMode.ON,
    "yes": MemoryMode.ON,
    "off": MemoryMode.OFF,
    "false": MemoryMode.OFF,
    "0": MemoryMode.OFF,
    "no": MemoryMode.OFF,
    "read-only": MemoryMode.READ_ONLY,
    "readonly": MemoryMode.READ_ONLY,
    "read_only": MemoryMode.READ_ONLY,
}


def parse_memory_mode(value: str | None) -> MemoryMode:
    """Read the ``X-Memory`` header; an unknown word is a 400, not a silent default."""
    if value is None:
        return MemoryMode.ON
    mode = _MODE_WORDS.get(value.strip().lower())
    if mode is None:
        raise InvalidRequest(
            f"X-Memory must be one of on, off, read-only (got {value!r})",
            param="X-Memory",
            code="invalid_header",
        )
    return mode


@dataclass(frozen=True, slots=True)
class Classification:
    kind: RequestKind
    task: str | None = None
    """Which Open WebUI task (`title_generation`...), when `kind` is `task`."""


# The opening words of Open WebUI's default task templates (backend/open_webui/config.py), old
# and new. Matched at the start of the lone user message, after an optional "### Task:" line.
_TASK_TEMPLATES: tuple[tuple[str, re.Pattern[str]], ...] = tuple(
    (name, re.compile(r"\A\s*(?:###\s*Task:\s*)?" + opening, re.IGNORECASE))
    for name, opening in (
        ("title_generation", r"(?:Generate|Create) a concise,? (?:3-5 word )?(?:title|phrase)"),
        ("tags_generation", r"Generate 1-3 broad tags"),
        ("follow_up_generation", r"Suggest 3-5 relevant follow-up"),
        ("query_generation", r"Analyze the chat history to determine the necessity of generating"),
        ("autocomplete_generation", r"You are an autocompletion system"),
        ("image_prompt_generation", r"Generate a detailed prompt for an? image generation task"),
        ("image_prompt_generation", r"Generate a detailed prompt for am image generation task"),
        ("emoji_generation", r"Your task is to reflect the speaker's likely facial expression"),
        ("moa_response_generation", r"You have been provided with a set of responses from various"),
        # Its built-in memory's periodic review (backend/open_webui/utils/memory.py) and the
        # summary that replaces old turns of a long chat (utils/context_compaction.py).
        ("memory_review", r"Review the completed conversation turn and decide whether long-term"),
        ("context_compaction", r"Summarize the conversation history that will be compacted"),
    )
)
# System prompts that only Open WebUI's own background requests use.
_SYSTEM_TASKS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("memory_review", re.compile(r"\A\s*You are Open WebUI['’]s private memory reviewer", re.I)),
)
_RAG_TEMPLATE = re.compile(r"\A\s*###\s*Task:\s*Respond to the user query", re.IGNORECASE)
_CUSTOM_TASK = re.compile(r"\A\s*###\s*Task:", re.IGNORECASE)
_TOOLS_PROMPT = re.compile(r"\A\s*Available Tools:", re.IGNORECASE)
_NOT_A_TASK = frozenset({"", "none", "null", "chat", "{{task}}"})


def _template_task(text: str) -> str | None:
    for name, pattern in _TASK_TEMPLATES:
        if pattern.match(text):
            return name
    if _RAG_TEMPLATE.match(text):
        return None
    # A customised task template still embeds the chat as <chat_history>; a user asking a
    # question in a "### Task:" style does not.
    if _CUSTOM_TASK.match(text) and "<chat_history>" in text:
        return "custom_task"
    return None


def classify(messages: list[dict[str, Any]], task_header: str | None) -> Classification:
    """Decide the request kind from the (already validated) messages and the task header."""
    if task_header is not None and task_header.strip().lower() not in _NOT_A_TASK:
        return Classification(RequestKind.TASK, task_header.strip())
    last_role = messages[-1].get("role")
    if last_role in ("tool", "function"):
        return Classification(RequestKind.TOOL_CONTINUATION)
    for message in messages:
        if message.get("role") in ("system", "developer"):
            text = content_text(message.get("content"))
            for name, pattern in _SYSTEM_TASKS:
                if pattern.match(text):
                    return Classification(RequestKind.TASK, name)
    conversation = [m for m in messages if m.get("role") not in ("system", "developer")]
    if len(conversation) == 1 and conversation[0].get("role") == "user":
        task = _template_task(content_text(conversation[0].get("content")))
        if task is not None:
            return Classification(RequestKind.TASK, task)
        # Open WebUI's native tool-selection call: a "Available Tools: ..." system prompt.
        system = [m for m in messages if m.get("role") == "system"]
        if system and _TOOLS_PROMPT.match(content_text(system[0].get("content"))):
            return Classification(RequestKind.TASK, "function_calling")
    return Classification(RequestKind.CHAT)
