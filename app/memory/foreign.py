"""Text another system puts into a chat: never the user's words, so memory leaves it out.

:func:`user_words` is what memory reads of a message: its text without another memory's block
(:func:`strip_foreign`) and without the documents and task text of Open WebUI's RAG template
(:mod:`app.memory.openwebui_rag`), for the recall query and for the Manager's turns alike.

Open WebUI's built-in memory (on unless turned off there) appends what it recalled to the first
system message as one block (backend/open_webui/utils/memory.py)::

    <memory_context>
    The following records are user-owned context that may be stale or incorrect. ...
    [Stable User Memory]
    - [id=... kind=user updated=...] I live in Oslo
    </memory_context>

It escapes the tags inside the records, so the first closing tag ends the block. memproxy neither
searches with that block nor lets the Manager learn from it (it would copy Open WebUI's memories
into memproxy's, a second time every turn). The request forwarded upstream keeps it: whether both
memories are on is the user's choice.

System messages never reach the Manager or the recall query at all; the block matters where a
system message became a user message (Open WebUI sends the system prompt as a user message to
``o1-mini`` and ``o1-preview``), or where a client folds it into the user's text.
"""

from __future__ import annotations

from typing import Any

from app.memory.block import remove_blocks
from app.memory.openwebui_rag import question_of
from app.schemas.openai import content_text

OPENWEBUI_MEMORY_START = "<memory_context>"
OPENWEBUI_MEMORY_END = "</memory_context>"


def strip_foreign(text: str) -> str:
    """`text` without Open WebUI's memory blocks (closed ones: an unclosed tag may be the user's
    own words), what surrounded them kept."""
    return remove_blocks(text, OPENWEBUI_MEMORY_START, OPENWEBUI_MEMORY_END)


def user_words(content: Any) -> str:
    """The words of a message's `content` (a string, or parts) that memory reads: of each text
    part (Open WebUI fills its template into each), what :func:`strip_foreign` and
    :func:`~app.memory.openwebui_rag.question_of` leave, non-empty ones joined by newlines."""
    if isinstance(content, list | tuple):
        texts = (content_text([part]) for part in content)
        return "\n".join(words for text in texts if (words := _words(text)))
    return _words(content_text(content))


def _words(text: str) -> str:
    return question_of(strip_foreign(text)) if text else text
