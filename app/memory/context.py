"""Between a chat and recall: which text to search with, and how memories are shown to the model.

- The query is the last user message. A message too short to mean anything on its own ("yes",
  "why?", "do it") is searched together with the turn before it (the assistant's last words and
  the user's message before them, up to :data:`CONTEXT_CHARS`).
- Memories go into the system message as a block: one line each, ``- [YYYY-MM-DD] content``, the
  date being when the memory was made, most relevant first, after one sentence telling the
  model what they are. Whatever exceeds the token budget (which counts the memory lines, not the
  fixed sentence) is left out, lowest score first.
- Tokens are estimated at four characters each (plus a few per line): no tokenizer of the
  upstream's model is at hand, and the estimate errs on the generous side for English.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime
from itertools import islice
from typing import Any, Protocol, TypeVar

from app.proxy.foreign import strip_foreign
from app.proxy.injection import strip_block
from app.proxy.offload import text_pieces

MIN_QUERY_WORDS = 4
"""A last message with fewer words than this is searched with the turn before it."""
CONTEXT_CHARS = 400
"""How much of the turn before is added to a short message (its end, nearest the message)."""
MAX_QUERY_CHARS = 2000
"""Longer messages (pasted documents) are searched by their start and end."""

HEADER = (
    "Things you remember about the user from earlier conversations (date noted first). "
    "Use them when they are relevant; do not mention this list unless asked about it."
)
_WORDS = re.compile(r"\w+")


def message_text(message: Any) -> str:
    """The text of a chat message: its string content or its text parts; memory blocks (ours and
    Open WebUI's, :mod:`app.proxy.foreign`) removed."""
    if not isinstance(message, dict):
        return ""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "\n".join(
            p["text"]
            for p in content
            if isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        )
    else:
        return ""
    return strip_foreign(strip_block(text)).strip()


def recall_query(messages: Sequence[Any]) -> str | None:
    """The text to search memories with, or None when the chat has no user text to go on."""
    last = None
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            last = index
            break
    if last is None:
        return None
    text = message_text(messages[last])
    if count_words(text, MIN_QUERY_WORDS) < MIN_QUERY_WORDS:
        before = [
            message_text(m)
            for m in messages[:last]
            if isinstance(m, dict) and m.get("role") in ("user", "assistant")
        ][-2:]
        context = " ".join(t for t in before if t)[-CONTEXT_CHARS:]
        text = f"{context} {text}".strip()
    if len(text) > MAX_QUERY_CHARS:
        half = MAX_QUERY_CHARS // 2
        text = f"{text[:half]} {text[-half:]}"
    return text or None


def count_words(text: str, enough: int) -> int:
    """The words in `text`, counted up to `enough`: a pasted document is not scanned to its end
    (listing every word of 50 MB took 4 s, the GIL held throughout)."""
    count = 0
    for piece in text_pieces(text):
        count += sum(1 for _ in islice(_WORDS.finditer(piece), enough - count))
        if count >= enough:
            break
    return count


def estimate_tokens(text: str) -> int:
    return len(text) // 4 + 4


class Dated(Protocol):
    """What a memory line shows: a search hit or a stored record."""

    @property
    def content(self) -> str: ...

    @property
    def created_at(self) -> datetime: ...


D = TypeVar("D", bound=Dated)


def memory_line(memory: Dated) -> str:
    content = " ".join(memory.content.split())  # one line each, whatever the memory holds
    return f"- [{memory.created_at.date().isoformat()}] {content}"


def fit_budget(memories: Sequence[D], budget_tokens: int) -> list[D]:
    """The memories, in order, whose lines fit in `budget_tokens`; a memory that does not fit is
    skipped and shorter ones after it may still go in. The fixed :data:`HEADER` (~45 tokens) is
    not counted: the budget is what the memories themselves may take, so a small budget still
    holds a short memory."""
    used = 0
    kept = []
    for memory in memories:
        cost = estimate_tokens(memory_line(memory))
        if used + cost <= budget_tokens:
            kept.append(memory)
            used += cost
    return kept


def memory_block(memories: Sequence[Dated]) -> str:
    """The text injected into the system message ('' when there is nothing to say)."""
    if not memories:
        return ""
    return "\n".join([HEADER, *(memory_line(m) for m in memories)])
