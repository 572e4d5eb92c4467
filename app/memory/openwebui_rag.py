"""Open WebUI's retrieval template around a user's question: found, so that memory searches and
learns with the question alone, never with the documents or the template's task text.

When a chat has files, a knowledge base, notes or web search on, Open WebUI (read at its 0.12
source: ``apply_source_context_to_messages`` in ``backend/open_webui/utils/middleware.py``,
``rag_template`` in ``utils/task.py``, ``DEFAULT_RAG_TEMPLATE`` in ``config.py``) writes each
retrieved piece as a ``<source>`` block, one after the other::

    <source id="1" name="report.pdf" resource-type="file" resource-id="...">the text</source>

fills its RAG template with them (``{{CONTEXT}}``; the question goes where ``{{QUERY}}`` is, if
anywhere) and puts the result

- by default, before the user's text in the last user message (``template + "\\n" + question``,
  each text part of a multimodal message alike). The default template is task text ("### Task:
  Respond to the user query using the provided context, ...") ending in
  ``<context>\\n{{CONTEXT}}\\n</context>``: the question follows it;
- with ``RAG_SYSTEM_CONTEXT=true``, at the end of the first system message (or in a new one); the
  user's message is then the question alone, and system messages are never searched with nor
  learned from: nothing to find here.

Earlier releases put the template after the question and repeated the question inside it as
``<user_query>{{QUERY}}</user_query>``; a custom ``RAG_TEMPLATE`` may keep either tag. Nothing is
taken out of the request forwarded upstream: the model needs the documents.

:func:`added_spans` finds what Open WebUI added, only where its ``<source>`` blocks are (a
message without one is the user's as it stands):

- a ``<user_query>...</user_query>`` after the last block: everything but its content;
- else a ``</context>`` after the last block: everything up to it (task text and documents);
- else (a custom template that wraps neither in a tag): the ``<source>`` blocks alone. The
  template's own words, before or after them, stay with the question: nothing tells them apart.

Blocks and tags are found with `str.find` (linear in the text; documents can be megabytes), a
piece at a time (:func:`app.proxy.offload.find`): one call over 50 MB holds the GIL ~40 ms.
"""

from __future__ import annotations

from app.proxy.offload import find, rfind

SOURCE_OPEN = "<source"
SOURCE_CLOSE = "</source>"
CONTEXT_CLOSE = "</context>"
QUERY_OPEN = "<user_query>"
QUERY_CLOSE = "</user_query>"
_AFTER_NAME = frozenset(" \t\r\n>")
"""What follows ``<source`` in a tag of that name (not ``<sources>``, ``<source_id>``)."""


def source_blocks(text: str) -> list[tuple[int, int]]:
    """The spans of the closed ``<source ...>...</source>`` blocks in `text`, in order. A tag
    that text names (the default template's "the <source> tag", "e.g., <source id="1">") opens
    no block: a block opens at the last opening tag before its closing one."""
    spans: list[tuple[int, int]] = []
    at = 0
    while (closed := find(text, SOURCE_CLOSE, at)) >= 0:
        opened = _last_opening(text, at, closed)
        at = closed + len(SOURCE_CLOSE)
        if opened is not None:
            spans.append((opened, at))
    return spans


def _last_opening(text: str, start: int, end: int) -> int | None:
    """Where the last ``<source`` tag (not ``<sources``, ``<source_id``) in `text[start:end]`
    begins, or None."""
    while (opened := rfind(text, SOURCE_OPEN, start, end)) >= 0:
        after = opened + len(SOURCE_OPEN)
        if after < len(text) and text[after] in _AFTER_NAME:
            return opened
        end = opened
    return None


def added_spans(text: str) -> list[tuple[int, int]]:
    """The spans of `text` that Open WebUI's RAG template added around the user's question (the
    module's docstring says how they are told): none when `text` holds no ``<source>`` block."""
    blocks = source_blocks(text)
    if not blocks:
        return []
    documents_end = blocks[-1][1]
    opened = rfind(text, QUERY_OPEN, documents_end)
    if opened >= 0:
        start = opened + len(QUERY_OPEN)
        closed = find(text, QUERY_CLOSE, start)
        if closed >= 0:
            return [(0, start), (closed, len(text))]
    context_closed = find(text, CONTEXT_CLOSE, documents_end)
    if context_closed >= 0:
        return [(0, context_closed + len(CONTEXT_CLOSE))]
    return blocks


def question_of(text: str) -> str:
    """`text` without what Open WebUI's RAG template added (:func:`added_spans`), stripped;
    `text` itself when it holds no ``<source>`` block."""
    spans = added_spans(text)
    if not spans:
        return text
    kept: list[str] = []
    done = 0
    for start, end in spans:  # in order, never overlapping
        kept.append(text[done:start])
        done = end
    kept.append(text[done:])
    return "\n".join(piece.strip() for piece in kept if piece.strip())
