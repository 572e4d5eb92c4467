"""ChatGPT's ``conversations.json`` (Settings > Data controls > Export data: a zip holding it):
a JSON list of conversations, each a tree of message nodes::

    [{"id": "...", "title": "Trip", "create_time": 1714555800.5, "update_time": ...,
      "current_node": "n4", "default_model_slug": "gpt-4o",
      "mapping": {
        "root": {"id": "root", "message": null, "parent": null, "children": ["n1"]},
        "n1": {"id": "n1", "parent": "root", "children": ["n2"], "message": {
            "id": "n1", "author": {"role": "system", "name": null, "metadata": {}},
            "create_time": null, "content": {"content_type": "text", "parts": [""]},
            "metadata": {"is_visually_hidden_from_conversation": true}, "recipient": "all"}},
        "n2": {..., "message": {"author": {"role": "user"}, "create_time": 1714555801.2,
            "content": {"content_type": "text", "parts": ["..."]}, ...}}, ...}}, ...]

The branch read is the one ChatGPT shows: from ``current_node`` up through ``parent`` to the root
(a ``current_node`` missing or unknown: the newest leaf; a ``parent`` unknown ends the branch);
other children of a node are edits and regenerations left aside. Of it, user and assistant
messages: not system ones (the hidden first one, custom instructions) nor tool output, not those
hidden from the conversation, not an assistant's call of a tool (``recipient`` other than
``all``); of their content, ``text`` and ``multimodal_text`` (its strings, and the transcript of
what was said aloud), not code, its output, reasoning or browsing. Consecutive assistant
messages (one answer around its tool calls) are one turn. ChatGPT's model is not memproxy's
upstream's: the Manager's model is named (``MEMPROXY_MANAGER_MODEL``, or ``model``).
"""

from __future__ import annotations

from typing import Any

from app.memory.learning.history.export import (
    ROLES,
    Conversation,
    Message,
    Place,
    Tree,
    branch,
    conversation,
    kind,
    moment,
    words,
)

TEXT_TYPES = ("text", "multimodal_text")
SPOKEN = "audio_transcription"
"""A part of a voice conversation: its ``text`` is what was said aloud."""
TREE = Tree(
    at="",
    nodes="mapping",
    current="current_node",
    parent="parent",
    children="children",
    message="message",
    time="create_time",
)


def looks_like(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("mapping"), dict)


def read(place: Place, item: dict[str, Any]) -> Conversation:
    title = item.get("title")
    if title is not None and not isinstance(title, str):
        raise place.bad("title", f"must be a string, not {kind(title)}")
    place = Place(place.index, title or "")
    chain = branch(place, item, TREE, _message)
    fallbacks = [
        moment(place, "create_time", item.get("create_time")),
        moment(place, "update_time", item.get("update_time")),
    ]
    return conversation(place, None, _joined(chain), fallbacks)


def _message(place: Place, path: str, message: dict[str, Any]) -> Message | None:
    """The message as said, or None when memory does not read it (module docstring)."""
    author = message.get("author")
    if not isinstance(author, dict) or not isinstance(author.get("role"), str):
        found = author.get("role") if isinstance(author, dict) else author
        raise place.bad(f"{path}.author.role", f"must be a string, not {kind(found)}")
    role = ROLES.get(author["role"])
    at = moment(place, f"{path}.create_time", message.get("create_time"))
    content = message.get("content")
    if not isinstance(content, dict):
        raise place.bad(f"{path}.content", f"must be an object, not {kind(content)}")
    metadata = message.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise place.bad(f"{path}.metadata", f"must be an object, not {kind(metadata)}")
    if (
        role is None
        or metadata.get("is_visually_hidden_from_conversation")
        or message.get("recipient") not in (None, "all")
        or content.get("content_type") not in TEXT_TYPES
    ):
        return None
    parts = content.get("parts") or []
    if not isinstance(parts, list):
        raise place.bad(f"{path}.content.parts", f"must be a list, not {kind(parts)}")
    texts = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
        elif (
            isinstance(part, dict)
            and part.get("content_type") == SPOKEN
            and isinstance(part.get("text"), str)
        ):
            texts.append(part["text"])
    return Message(role, words(role, "\n".join(t for t in texts if t.strip())), at)


def _joined(chain: list[Message]) -> list[Message]:
    """Consecutive assistant messages as one (dated by the first); user messages as they are."""
    out: list[Message] = []
    for message in chain:
        if not message.text:
            continue
        if out and message.role == "assistant" and out[-1].role == "assistant":
            out[-1] = Message(
                "assistant", f"{out[-1].text}\n\n{message.text}", out[-1].at or message.at
            )
        else:
            out.append(message)
    return out
