"""Open WebUI's chat export: "Export chat (.json)" in a chat's menu, "Export All Chats" in
Settings > Chats. Both write a JSON list of chats as its API returns them (``ChatResponse``,
backend/open_webui/models/chats.py; the menu's is a list of one)::

    [{"id": "...", "user_id": "...", "title": "Trip", "created_at": 1714555800, "updated_at": ...,
      "chat": {"title": "Trip", "models": ["llama3"], "timestamp": 1714555800123,
               "history": {"currentId": "m4", "messages": {
                   "m1": {"id": "m1", "parentId": null, "childrenIds": ["m2"], "role": "user",
                          "content": "...", "timestamp": 1714555800, "models": ["llama3"]},
                   "m2": {"id": "m2", "parentId": "m1", "childrenIds": [...], "role": "assistant",
                          "content": "...", "model": "llama3", "timestamp": 1714555805}, ...}},
               "messages": [...the current branch, as a list...]}}, ...]

The history is a tree (an edited question or a regenerated answer is a sibling); the branch read
is the one Open WebUI shows, from ``currentId`` up through ``parentId`` to the root (a
``currentId`` missing or unknown: the newest leaf, as Open WebUI repairs it; a ``parentId``
unknown ends the branch, as Open WebUI renders it). A chat saved before the history existed has
its ``messages`` list only: that is its branch. Times are seconds (the chat's own ``timestamp``
in milliseconds). An answer's reasoning and tool calls, which Open WebUI keeps in its text as
``<details type="reasoning">`` blocks, are not what it said: left out.
"""

from __future__ import annotations

import re
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
from app.schemas.openai import content_text

_DETAILS = re.compile(
    r'<details\s+type="(?:reasoning|tool_calls|code_interpreter)"[^>]*>.*?</details>\s*', re.S
)
TREE = Tree(
    at="chat.history",
    nodes="messages",
    current="currentId",
    parent="parentId",
    children="childrenIds",
    message=None,
    time="timestamp",
)
"""The history: a message is its node (Open WebUI repairs a lost ``currentId`` as
:func:`~.export.branch` does)."""


def looks_like(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("chat"), dict)


def read(place: Place, item: dict[str, Any]) -> Conversation:
    chat: dict[str, Any] = item["chat"]
    title = item.get("title", chat.get("title"))
    if title is not None and not isinstance(title, str):
        raise place.bad("title", f"must be a string, not {kind(title)}")
    place = Place(place.index, title or "")
    history = chat.get("history")
    if history is not None:
        if not isinstance(history, dict):
            raise place.bad("chat.history", f"must be an object, not {kind(history)}")
        chain = branch(place, history, TREE, _message)
    else:
        chain = _listed(place, chat.get("messages"))
    fallbacks = [
        moment(place, "created_at", item.get("created_at")),
        moment(place, "chat.timestamp", chat.get("timestamp")),
        moment(place, "updated_at", item.get("updated_at")),
    ]
    return conversation(place, _model(chat), chain, fallbacks)


def _listed(place: Place, messages: Any) -> list[Message]:
    if messages is None:
        return []
    if not isinstance(messages, list):
        raise place.bad("chat.messages", f"must be a list, not {kind(messages)}")
    chain = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise place.bad(f"chat.messages[{i}]", f"must be an object, not {kind(message)}")
        found = _message(place, f"chat.messages[{i}]", message)
        if found is not None:
            chain.append(found)
    return chain


def _message(place: Place, path: str, message: dict[str, Any]) -> Message | None:
    """The message as said, or None for a role memory does not read (system, tool)."""
    given = message.get("role")
    if not isinstance(given, str):
        raise place.bad(f"{path}.role", f"must be a string, not {kind(given)}")
    at = moment(place, f"{path}.timestamp", message.get("timestamp"))
    role = ROLES.get(given)
    if role is None:
        return None
    content = message.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):  # OpenAI's parts: the text ones
        text = content_text(content)
    else:
        raise place.bad(f"{path}.content", f"must be a string, not {kind(content)}")
    if role == "assistant":
        text = _DETAILS.sub("", text)
    return Message(role, words(role, text), at)


def _model(chat: dict[str, Any]) -> str | None:
    """The chat's first model: Open WebUI's model id, served by memproxy's upstream when
    Open WebUI talks to memproxy."""
    models = chat.get("models")
    if isinstance(models, list) and models and isinstance(models[0], str) and models[0]:
        return models[0]
    return None
