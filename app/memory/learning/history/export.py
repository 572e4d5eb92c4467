"""What a chat export's conversations are once read, whatever the format (read.py reads one).

Promises:

- a problem is a :class:`BadExport` naming the place, as a JSON path
  (``[3].mapping.n2.message.content``) and in words with the conversation's title
  (:meth:`Place.bad`);
- a conversation is its current branch (the one its client shows: edits and regenerations left
  aside), user and assistant messages only, their text only (system and tool messages, hidden
  messages, images and other parts left out), oldest first; a message without a time of its own
  takes the one before it, else the one after it, else the conversation's;
- a branch is read from a tree of messages the same way in every format (:func:`branch`): from
  the current node up through the parents, its first problem named by its format's paths.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from app.memory.foreign import strip_foreign
from app.memory.learning.turns import Role
from app.schemas.checks import shown

Format = Literal["openwebui", "chatgpt"]
ROLES: dict[str, Role] = {"user": "user", "assistant": "assistant"}
"""The roles memory reads; a system or tool message is nobody's words."""
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
MILLISECONDS_FROM = 1e11
"""A time above this is in milliseconds (1e11 seconds is the year 5138): Open WebUI keeps a
chat's own ``timestamp`` in milliseconds, its messages' in seconds."""


class BadExport(ValueError):
    """The file is no export memproxy reads, or a conversation in it is malformed. `param` is the
    place as a JSON path (empty: the file itself); `code` says which: ``invalid_json``,
    ``unknown_format``, ``empty`` or ``invalid_export``."""

    def __init__(self, message: str, param: str = "", code: str = "invalid_export") -> None:
        super().__init__(message)
        self.param = param
        self.code = code


@dataclass(frozen=True, slots=True)
class Said:
    role: Role
    text: str
    at: datetime


@dataclass(frozen=True, slots=True)
class Conversation:
    index: int
    """Its place in the file (from 0)."""
    title: str
    model: str | None
    """The model it was held with, when the export says and it may serve the Manager."""
    said: tuple[Said, ...]

    @property
    def user_turns(self) -> int:
        return sum(1 for s in self.said if s.role == "user")


@dataclass(frozen=True, slots=True)
class Export:
    format: Format
    conversations: list[Conversation]


@dataclass(frozen=True, slots=True)
class Place:
    """A conversation of the file, for naming where a problem is."""

    index: int
    title: str = ""

    def bad(self, path: str, why: str) -> BadExport:
        where = shown(path)
        name = f"conversations[{self.index}]" + (
            f' ("{shown(self.title)[:60]}")' if self.title else ""
        )
        message = f"{name}: {where} {why}" if where else f"{name}: {why}"
        return BadExport(message, f"[{self.index}]" + (f".{where}" if where else ""))


@dataclass(frozen=True, slots=True)
class Message:
    """A message of a branch as a format reads it, before its time is settled."""

    role: Role
    text: str
    at: datetime | None


def kind(value: Any) -> str:
    """What a JSON value is, for a message: "a string", "a number", "null", "a list"..."""
    names = {str: "a string", int: "a number", float: "a number", bool: "a boolean",
             list: "a list", dict: "an object"}  # fmt: skip
    return "null" if value is None else names.get(type(value), type(value).__name__)


def moment(place: Place, path: str, value: Any) -> datetime | None:
    """A time as exports write it: seconds since 1970 (milliseconds above
    :data:`MILLISECONDS_FROM`), or an ISO 8601 string (UTC without an offset); None for none
    (0 too: no one chatted at the epoch, an export writes it for "unknown"). Between 1970 and a
    day from now."""
    if value is None or (value == 0 and not isinstance(value, bool)):
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise place.bad(path, f"must be a time (seconds since 1970), not {kind(value)}")
    try:
        if isinstance(value, str):
            when = datetime.fromisoformat(value)
            when = when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)
        elif not math.isfinite(value):
            raise ValueError
        else:
            seconds = value / 1000 if value > MILLISECONDS_FROM else value
            when = datetime.fromtimestamp(seconds, UTC)
    except (ValueError, OverflowError, OSError):
        raise place.bad(path, f"is not a time: {str(value)[:40]!r}") from None
    if not EARLIEST <= when <= datetime.now(UTC) + timedelta(days=1):
        raise place.bad(path, f"must lie between 1970 and a day from now, not {when:%Y-%m-%d}")
    return when


def words(role: Role, text: str) -> str:
    """A message's text as memory keeps it: without NUL characters (PostgreSQL's text refuses
    them), a user's without another memory's block (:func:`strip_foreign`, as chats)."""
    text = text.replace("\x00", "")
    return (strip_foreign(text) if role == "user" else text).strip()


def conversation(
    place: Place, model: str | None, branch: list[Message], fallbacks: Sequence[datetime | None]
) -> Conversation:
    """The conversation from its branch: empty messages left out, a message without a time
    given the one before it, else the one after it, else the first of `fallbacks` (the
    conversation's own times); refused when nothing gives one."""
    kept = [m for m in branch if m.text]
    times: list[datetime | None] = [m.at for m in kept]
    last = None
    for i, at in enumerate(times):  # forward: the time before
        times[i] = last = at or last
    following = None
    for i in range(len(times) - 1, -1, -1):  # backward: the time after
        times[i] = following = times[i] or following
    default = next((t for t in fallbacks if t is not None), None)
    filled = [t or default for t in times]
    if any(t is None for t in filled):
        raise place.bad("", "has no time: neither its messages nor the conversation say when")
    said = tuple(
        Said(m.role, m.text, t) for m, t in zip(kept, filled, strict=True) if t is not None
    )
    return Conversation(place.index, place.title, model, said)


@dataclass(frozen=True, slots=True)
class Tree:
    """Where a format keeps a conversation's tree of messages, by JSON field names."""

    at: str
    """The path of the object holding the tree ("" for the conversation itself)."""
    nodes: str
    """Its field holding the nodes, an object by id."""
    current: str
    """Its field naming the current node, the last of the branch shown."""
    parent: str
    children: str
    """A node's fields naming its parent and listing its children."""
    message: str | None
    """A node's field holding its message (null: a node without one); None: the node is it."""
    time: str
    """A message's field saying when it was said."""

    def path(self, field: str) -> str:
        return f"{self.at}.{field}" if self.at else field


def branch(
    place: Place,
    holder: dict[str, Any],
    tree: Tree,
    read: Callable[[Place, str, dict[str, Any]], Message | None],
) -> list[Message]:
    """The branch the client shows, oldest first, each message as `read` (given its path) reads
    it: from the current node up through the parents to the root (a current node missing or
    unknown: the newest leaf; a parent unknown ends the branch; a parent already on the branch
    is refused)."""
    nodes = holder.get(tree.nodes, {})
    where = tree.path(tree.nodes)
    if not isinstance(nodes, dict):
        raise place.bad(where, f"must be an object, not {kind(nodes)}")
    for key, node in nodes.items():
        if not isinstance(node, dict):
            raise place.bad(f"{where}.{key}", f"must be an object, not {kind(node)}")
        message = node.get(tree.message) if tree.message else node
        if message is not None and not isinstance(message, dict):
            raise place.bad(_message_path(tree, key), f"must be an object, not {kind(message)}")
    current = holder.get(tree.current)
    if current is not None and not isinstance(current, str):
        raise place.bad(tree.path(tree.current), f"must be a string, not {kind(current)}")
    if current not in nodes:
        current = _newest_leaf(place, nodes, tree)
    chain: list[Message] = []
    seen: set[str] = set()
    while current is not None and current in nodes:
        seen.add(current)
        node = nodes[current]
        message = node.get(tree.message) if tree.message else node
        if message is not None:
            found = read(place, _message_path(tree, current), message)
            if found is not None:
                chain.append(found)
        parent = node.get(tree.parent)
        if parent is not None and not isinstance(parent, str):
            raise place.bad(
                f"{where}.{current}.{tree.parent}", f"must be a string, not {kind(parent)}"
            )
        if parent in seen:
            raise place.bad(
                f"{where}.{current}.{tree.parent}",
                f"makes a cycle: {shown(parent)} comes after it in the branch",
            )
        current = parent
    chain.reverse()
    return chain


def _newest_leaf(place: Place, nodes: dict[str, Any], tree: Tree) -> str | None:
    """The node without children said last (how the clients repair a lost current node)."""
    best, newest = None, None
    for key, node in nodes.items():
        if node.get(tree.children):
            continue
        message = (node.get(tree.message) or {}) if tree.message else node
        at = moment(place, f"{_message_path(tree, key)}.{tree.time}", message.get(tree.time))
        if best is None or (at is not None and (newest is None or at >= newest)):
            best, newest = key, at
    return best


def _message_path(tree: Tree, key: str) -> str:
    node = f"{tree.path(tree.nodes)}.{key}"
    return f"{node}.{tree.message}" if tree.message else node
