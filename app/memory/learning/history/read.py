"""Reading an export's bytes: every conversation in it, checked, before anything is queued.

Promises:

- :func:`read_export` reads the whole file first; its first problem is a
  :class:`~.export.BadExport` naming the place, so a bad file is refused whole;
- the format is Open WebUI's chat export (a list of chats, "Export chat (.json)" or "Export All
  Chats": :mod:`.openwebui`) or ChatGPT's ``conversations.json`` (a list of conversations:
  :mod:`.chatgpt`), told apart by the first conversation unless named, and every conversation
  must be of it; a lone conversation object is read as a list of one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal

import orjson

from app.memory.learning.history import chatgpt, openwebui
from app.memory.learning.history.export import BadExport, Conversation, Export, Format, Place, kind
from app.proxy import json_pieces
from app.proxy.offload import is_large


def read_json(raw: bytes) -> Any:
    """The file's JSON: a large one a piece at a time (:mod:`app.proxy.json_pieces`)."""
    if not raw.strip():
        raise BadExport("the file is empty: expected a chat export (a JSON list)", code="empty")
    try:
        return json_pieces.loads(raw) if is_large(len(raw)) else orjson.loads(raw)
    except RecursionError:
        raise BadExport("not valid JSON: nested too deeply", code="invalid_json") from None
    except json_pieces.LoneSurrogate as exc:
        raise BadExport(str(exc), exc.where) from None
    except ValueError as exc:  # orjson's and the standard library's errors, bad UTF-8
        raise BadExport(f"not valid JSON: {exc}", code="invalid_json") from None


Reader = Callable[[Place, dict[str, Any]], Conversation]
READERS: dict[Format, tuple[Callable[[Any], bool], Reader, str]] = {
    "openwebui": (openwebui.looks_like, openwebui.read,
                  "an Open WebUI chat (an object with a `chat` object)"),
    "chatgpt": (chatgpt.looks_like, chatgpt.read,
                "a ChatGPT conversation (an object with a `mapping` object)"),
}  # fmt: skip
"""Each format: whether a conversation is of it, how it is read, what it is."""


def read_export(raw: bytes, format: Format | Literal["auto"] = "auto") -> Export:
    """Every conversation of the export, checked (module docstring); a :class:`BadExport`
    for the first problem."""
    data = read_json(raw)
    items: Sequence[Any] = [data] if isinstance(data, dict) else data
    if not isinstance(items, list):
        raise BadExport(
            "an export is a JSON list of conversations (Open WebUI: Export chat or Export All "
            f"Chats; ChatGPT: conversations.json), not {kind(data)}",
            code="unknown_format",
        )
    if not items:
        raise BadExport("the export holds no conversation", code="empty")
    chosen = format if format != "auto" else _detect(items[0])
    looks_like, read, what = READERS[chosen]
    conversations = []
    for index, item in enumerate(items):
        if not looks_like(item):
            raise BadExport(f"conversations[{index}] is not {what}", f"[{index}]", "unknown_format")
        conversations.append(read(Place(index), item))
    return Export(chosen, conversations)


def _detect(first: Any) -> Format:
    for name, (looks_like, _, _) in READERS.items():
        if looks_like(first):
            return name
    raise BadExport(
        "conversations[0] is neither " + " nor ".join(what for _, _, what in READERS.values()),
        "[0]",
        "unknown_format",
    )
