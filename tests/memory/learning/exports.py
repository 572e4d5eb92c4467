"""Chat exports made by the tests, in each format's shape as its source or documentation shows it.

- Open WebUI: "Export chat (.json)" and "Export All Chats" write a JSON list of chats as its API
  returns them (``ChatResponse``, backend/open_webui/models/chats.py). The messages are made as
  src/lib/components/chat/Chat.svelte makes them: a user message ``{id, parentId, childrenIds,
  role, content, files, timestamp (seconds), models}``, an answer ``{parentId, id, childrenIds,
  role, content, done, model, modelName, modelIdx, timestamp}``; ``history.currentId`` is the
  shown branch's last message, ``chat.messages`` that branch as a list, ``chat.timestamp`` in
  milliseconds.
- ChatGPT: ``conversations.json`` from Export data, a list of conversations ``{title,
  create_time, update_time, mapping, moderation_results, current_node, plugin_ids,
  conversation_id, conversation_template_id, gizmo_id, is_archived, safe_urls,
  default_model_slug, id}``, the mapping a tree of nodes ``{id, message, parent, children}``,
  each message ``{id, author {role, name, metadata}, create_time, update_time, content
  {content_type, parts}, status, end_turn, weight, metadata, recipient}``; the root node has no
  message, and a hidden system message comes first (as the format's documentation describes it:
  github.com/mitkury/chatgpt-export-parser, docs/chatgpt-data-export-format.md).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson

MAY_1 = int(datetime(2024, 5, 1, 9, 30, tzinfo=UTC).timestamp())
"""Wednesday 1 May 2024, 09:30 UTC."""


def owui_message(
    id: str, parent: str | None, role: str, content: Any, timestamp: int | None
) -> dict[str, Any]:
    message: dict[str, Any] = {"id": id, "parentId": parent, "childrenIds": [], "role": role,
                               "content": content, "timestamp": timestamp}  # fmt: skip
    if role == "user":
        message["models"] = ["llama3"]
    elif role == "assistant":
        message |= {"done": True, "model": "llama3", "modelName": "Llama 3", "modelIdx": 0}
    return message


def owui_chat(
    title: str, messages: list[dict[str, Any]], current: str | None, *, created: int = MAY_1
) -> dict[str, Any]:
    """A chat as Open WebUI exports it; children are linked from the messages' parents."""
    by_id = {m["id"]: m for m in messages}
    for message in messages:
        if message["parentId"] in by_id:
            by_id[message["parentId"]]["childrenIds"].append(message["id"])
    branch = []
    at = current
    while at in by_id:
        branch.append(by_id[at])
        at = by_id[at]["parentId"]
    return {
        "id": f"chat-{title.lower().replace(' ', '-')}", "user_id": "owui-user-1",
        "title": title,
        "chat": {"id": "", "title": title, "models": ["llama3"], "params": {},
                 "history": {"messages": by_id, "currentId": current},
                 "messages": branch[::-1], "tags": [], "timestamp": created * 1000, "files": []},
        "updated_at": created + 3600, "created_at": created, "share_id": None,
        "archived": False, "pinned": False, "meta": {}, "folder_id": None,
    }  # fmt: skip


def owui_linear(
    title: str, said: list[tuple[str, Any]], *, start: int = MAY_1, step: int = 60
) -> dict[str, Any]:
    """A chat without edits: `said` as (role, content), a message every `step` seconds."""
    messages = []
    parent = None
    for i, (role, content) in enumerate(said):
        messages.append(owui_message(f"m{i}", parent, role, content, start + i * step))
        parent = f"m{i}"
    return owui_chat(title, messages, parent, created=start)


def gpt_message(
    role: str, parts: list[Any], create_time: float | None, *, content_type: str = "text",
    hidden: bool = False, recipient: str = "all", name: str | None = None,
) -> dict[str, Any]:  # fmt: skip
    metadata: dict[str, Any] = {"is_visually_hidden_from_conversation": True} if hidden else {}
    if role == "assistant":
        metadata |= {"model_slug": "gpt-4o", "finish_details": {"type": "stop"}}
    return {
        "id": "", "author": {"role": role, "name": name, "metadata": {}},
        "create_time": create_time, "update_time": None,
        "content": {"content_type": content_type, "parts": parts}, "status": "finished_successfully",
        "end_turn": True if role == "assistant" else None, "weight": 1.0, "metadata": metadata,
        "recipient": recipient,
    }  # fmt: skip


def gpt_conversation(
    title: str,
    nodes: list[tuple[str, str | None, dict[str, Any] | None]],
    current: str | None,
    *,
    created: float = MAY_1,
) -> dict[str, Any]:
    """A conversation as ChatGPT exports it: `nodes` as (id, parent, message or None)."""
    mapping: dict[str, Any] = {}
    for node_id, parent, message in nodes:
        if message is not None:
            message = {**message, "id": node_id}
        mapping[node_id] = {"id": node_id, "message": message, "parent": parent, "children": []}
    for node_id, parent, _ in nodes:
        if parent in mapping:
            mapping[parent]["children"].append(node_id)
    conversation_id = f"conv-{title.lower().replace(' ', '-')}"
    return {
        "title": title, "create_time": created, "update_time": created + 3600,
        "mapping": mapping, "moderation_results": [], "current_node": current,
        "plugin_ids": None, "conversation_id": conversation_id,
        "conversation_template_id": None, "gizmo_id": None, "is_archived": False,
        "safe_urls": [], "default_model_slug": "gpt-4o", "id": conversation_id,
    }  # fmt: skip


def gpt_linear(
    title: str, said: list[tuple[str, Any]], *, start: float = MAY_1, step: int = 60
) -> dict[str, Any]:
    """A conversation without edits, after the root and the hidden system message."""
    nodes: list[tuple[str, str | None, dict[str, Any] | None]] = [
        ("root", None, None),
        ("sys", "root", gpt_message("system", [""], None, hidden=True)),
    ]
    parent = "sys"
    for i, (role, text) in enumerate(said):
        nodes.append((f"n{i}", parent, gpt_message(role, [text], start + i * step)))
        parent = f"n{i}"
    return gpt_conversation(title, nodes, parent, created=start)


def dumped(*conversations: dict[str, Any]) -> bytes:
    """The export file: its conversations as a JSON list."""
    return orjson.dumps(list(conversations))
