"""Putting a block of text (the user's memories) into the system message of a chat body.

The block is wrapped in markers so it can be found again: inserting into a body that already has
one (a client that echoes the system prompt back, or two memproxies in a row) replaces it rather
than adding a second copy. The block goes at the end of the first system message, or into a new
first system message when there is none. The client's body is never mutated.

Blocks are found with `str.find`, never a regex: the obvious pattern (newlines, start tag,
anything, end tag, newlines) takes time quadratic in the text when a start tag has no end tag
or follows a long run of newlines (300 KB of start tags kept the GIL for 30 s).
"""

from __future__ import annotations

import re
from typing import Any

BLOCK_START = "<memproxy-memories>"
BLOCK_END = "</memproxy-memories>"
_NEWLINES = re.compile(r"\n*")


def wrap_block(text: str) -> str:
    return f"{BLOCK_START}\n{text.strip()}\n{BLOCK_END}"


def strip_block(text: str) -> str:
    """Remove any memory block from a text, keeping what surrounds it."""
    return remove_blocks(text, BLOCK_START, BLOCK_END)


def remove_blocks(text: str, start: str, end: str) -> str:
    """`text` without its closed `start`...`end` blocks, each replaced (with the newlines around
    it) by a blank line, and stripped of newlines at both ends; `text` itself when it holds no
    `start`. An unclosed `start` is kept: it may be the user's own words. Linear in the text."""
    if start not in text:
        return text
    kept: list[str] = []
    done = 0  # everything before this is in `kept` or removed
    while (opened := text.find(start, done)) >= 0:
        closed = text.find(end, opened + len(start))
        if closed < 0:
            break
        before = text[done:opened]
        kept += [before.rstrip("\n"), "\n\n"]
        done = closed + len(end)
        newlines = _NEWLINES.match(text, done)  # always matches, maybe nothing
        done = newlines.end() if newlines else done
    kept.append(text[done:])
    return "".join(kept).strip("\n")


def insert_memory_block(body: dict[str, Any], text: str) -> dict[str, Any]:
    """A copy of `body` whose first system message ends with `text` in a memory block.

    Empty `text` only removes existing blocks. Earlier blocks anywhere in system messages are
    removed, so there is exactly one block at most.
    """
    messages: list[Any] = list(body["messages"])
    first_system: int | None = None
    for index, message in enumerate(messages):
        if isinstance(message, dict) and message.get("role") in ("system", "developer"):
            messages[index] = _without_block(message)
            if first_system is None and message.get("role") == "system":
                first_system = index
    if text.strip():
        block = wrap_block(text)
        if first_system is None:
            messages.insert(0, {"role": "system", "content": block})
        else:
            messages[first_system] = _append(messages[first_system], block)
    return {**body, "messages": messages}


def _without_block(message: dict[str, Any]) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, str) and BLOCK_START in content:
        return {**message, "content": strip_block(content)}
    if isinstance(content, list) and any(_part_has_block(p) for p in content):
        parts = [
            {**p, "text": strip_block(p["text"])} if _part_has_block(p) else p for p in content
        ]
        return {**message, "content": [p for p in parts if not _empty_text_part(p)]}
    return message


def _append(message: dict[str, Any], block: str) -> dict[str, Any]:
    content = message.get("content")
    if isinstance(content, list):
        return {**message, "content": [*content, {"type": "text", "text": block}]}
    text = content if isinstance(content, str) else ""
    return {**message, "content": f"{text.rstrip()}\n\n{block}" if text.strip() else block}


def _part_has_block(part: Any) -> bool:
    return (
        isinstance(part, dict) and isinstance(part.get("text"), str) and BLOCK_START in part["text"]
    )


def _empty_text_part(part: Any) -> bool:
    return isinstance(part, dict) and part.get("type") == "text" and not part.get("text")
