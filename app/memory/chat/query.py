"""Between a chat and recall: which text of the conversation to search the memories with.

The query is the last user message: its own words (:func:`app.memory.foreign.user_words`), not
the documents and task text Open WebUI's RAG template puts around the question. A message too
short to mean anything on its own ("yes", "why?", "do it") is searched together with the turn
before it (the assistant's last words and the user's message before them, up to
:data:`CONTEXT_CHARS`). A question naming the user, when the client says their name, is read
in the user's voice (:mod:`app.memory.chat.voice`). How the memories found are shown to the
model is :mod:`app.memory.block`'s.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from app.memory.block import strip_block
from app.memory.chat.voice import in_own_voice
from app.memory.foreign import user_words
from app.proxy.offload import PIECE_CHARS

MIN_QUERY_WORDS = 4
"""A last message with fewer words than this is searched with the turn before it."""
CONTEXT_CHARS = 400
"""How much of the turn before is added to a short message (its end, nearest the message)."""
MAX_QUERY_CHARS = 2000
"""Longer messages (pasted documents) are searched by their start and end."""

_WORDS = re.compile(r"\w+")
# _stripped keeps a long turn's last MAX_QUERY_CHARS // 2 characters: the context taken from it
# must lie within them for the query to be the one the whole text gives.
assert CONTEXT_CHARS <= MAX_QUERY_CHARS // 2


def message_text(message: Any) -> str:
    """The text of a chat message as a query reads it: its string content or its text parts;
    memory blocks (ours and Open WebUI's) and Open WebUI's RAG template around the question
    removed (:func:`app.memory.foreign.user_words`); stripped, and a long one (over
    ``2 * PIECE_CHARS``) only by its first and last ``MAX_QUERY_CHARS // 2`` characters
    (:func:`_stripped`): not the whole text of a long message."""
    return _stripped(_words_of(message))


def _words_of(message: Any) -> str:
    """:func:`message_text` before it is stripped."""
    if not isinstance(message, dict):
        return ""
    return strip_block(user_words(message.get("content")))


def _stripped(text: str) -> str:
    """`text.strip()`; when `text` is long (a pasted document), what :func:`recall_query` keeps
    of that, made from `text`'s two ends: its first and last ``MAX_QUERY_CHARS // 2``
    characters, joined by a space (a copy of 50 MB holds the GIL ~25 ms). The query made from
    either is the same: a query longer than ``MAX_QUERY_CHARS`` is cut so, and cutting this
    gives it back unchanged; the context a short message takes from the turn before is its
    last ``CONTEXT_CHARS``, within the tail kept (``CONTEXT_CHARS <= MAX_QUERY_CHARS // 2``,
    checked where they are set)."""
    if len(text) <= 2 * PIECE_CHARS:
        return text.strip()
    half = MAX_QUERY_CHARS // 2
    head, tail = text[:PIECE_CHARS].lstrip(), text[-PIECE_CHARS:].rstrip()
    if len(head) < half or len(tail) < half:  # a megabyte of spaces at an end: the plain way
        return text.strip()
    # The stripped text is longer than MAX_QUERY_CHARS: what it loses at each end is less than
    # PIECE_CHARS - half, and text is longer than 2 * PIECE_CHARS.
    return f"{head[:half]} {tail[-half:]}"


def recall_query(messages: Sequence[Any], user_name: str | None = None) -> str | None:
    """The text to search memories with, or None when the chat has no user text to go on; the
    user's name in it read as the user (:func:`app.memory.chat.voice.in_own_voice`)."""
    last = None
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if isinstance(message, dict) and message.get("role") == "user":
            last = index
            break
    if last is None:
        return None
    words = _words_of(messages[last])
    text = _stripped(words)
    # Counted in the whole message (stripping takes no word away): its ends may hold none.
    if count_words(words, MIN_QUERY_WORDS) < MIN_QUERY_WORDS:
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
    return in_own_voice(text, user_name) or None


def count_words(text: str, enough: int) -> int:
    """The words in `text`, counted up to `enough`: a pasted document is not scanned to its end
    (listing every word of 50 MB took 4 s, the GIL held throughout), and is scanned
    :data:`PIECE_CHARS` characters at a time, even where it has no space to cut at."""
    if enough <= 0:
        return 0
    count = 0
    edge = -1  # where the last window ended inside a word: the match starting there goes on it
    for start in range(0, len(text), PIECE_CHARS):
        end = min(start + PIECE_CHARS, len(text))
        last = -1
        for match in _WORDS.finditer(text, start, end):
            if match.start() != edge:
                count += 1
                if count >= enough:
                    return count
            last = match.end()
        edge = end if last == end else -1
    return count
