"""A conversation's turns as the Manager sees them: PydanticAI messages, and their fingerprints.

A leaf of the learning package. The Manager consumes the history the proxy converted
(:mod:`app.proxy.history`) as PydanticAI messages, narrowed to the words of the two sides
(:func:`turns_of`). A *turn* is one message:

- the user's: a ``ModelRequest`` with one ``UserPromptPart`` holding text;
- the assistant's: a ``ModelResponse`` with one ``TextPart``.

Everything else in the history (system prompts, tool calls and returns, images and files, another
memory system's block, the documents and task text of Open WebUI's RAG template around the
question: :func:`app.memory.foreign.user_words`) is left out: none of it is the user speaking. A
job keeps its turns in PydanticAI's own JSON (:func:`dump`, :func:`load`), so the queue, the
worker and the agent pass one type from the chat to the Manager.

A turn's fingerprint is its identity across the client's resends of the whole conversation: a
hash of it and the turn before it, whitespace-normalised (never the text itself), recorded when a
job takes the turn. It is the hash of the turn's words as above: Open WebUI fills its template
into the last message only, and resends the plain question the next time, the same turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal, overload

from pydantic_ai.messages import (
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    TextPart,
    UserPromptPart,
)

from app.memory.foreign import user_words
from app.proxy.history import ConvertedHistory
from app.proxy.offload import text_pieces
from app.schemas.openai import content_text

Role = Literal["user", "assistant"]


def turn(role: Role, text: str, at: datetime | None = None) -> ModelMessage:
    """One turn as a PydanticAI message, made `at` (now by default)."""
    at = at or datetime.now(UTC)
    if role == "user":
        return ModelRequest(parts=[UserPromptPart(text, timestamp=at)], timestamp=at)
    return ModelResponse(parts=[TextPart(text)], timestamp=at)


def role_of(message: ModelMessage) -> Role:
    return "user" if isinstance(message, ModelRequest) else "assistant"


def text_of(message: ModelMessage) -> str:
    """The message's words: its user prompts' text, or its text parts."""
    if isinstance(message, ModelRequest):
        return "\n".join(
            content_text(p.content) for p in message.parts if isinstance(p, UserPromptPart)
        )
    return "".join(p.content for p in message.parts if isinstance(p, TextPart))


class Turns(Sequence[ModelMessage]):
    """A conversation's turns, built as PydanticAI messages only when read.

    A job keeps at most ~100 turns of a conversation, but every user turn is fingerprinted:
    holding the words and making a message on demand spares a 100,000-message chat a second of
    building messages it never uses (:func:`fingerprints_of` reads the words directly). A turn
    read twice is two equal messages: all are timestamped when the conversation was read.
    """

    __slots__ = ("at", "said")

    def __init__(self, said: Sequence[tuple[Role, str]]) -> None:
        self.said = list(said)
        self.at = datetime.now(UTC)

    def __len__(self) -> int:
        return len(self.said)

    @overload
    def __getitem__(self, index: int) -> ModelMessage: ...
    @overload
    def __getitem__(self, index: slice) -> list[ModelMessage]: ...
    def __getitem__(self, index: int | slice) -> ModelMessage | list[ModelMessage]:
        if isinstance(index, slice):
            return [turn(role, text, self.at) for role, text in self.said[index]]
        return turn(*self.said[index], self.at)


def turns_of(history: ConvertedHistory, reply: str | None) -> Turns:
    """The user's and the assistant's turns of a conversation, oldest first; the assistant's
    `reply` to the last user message ends it. Consecutive user messages (one ``ModelRequest`` in
    the history) stay separate turns; empty ones are left out."""
    found: list[tuple[Role, str]] = []
    for message in history.history:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    found.append(("user", user_words(part.content)))
        elif isinstance(message, ModelResponse):
            found.append(("assistant", text_of(message)))
    if history.prompt is not None:
        found.append(("user", user_words(history.prompt)))
    if reply is not None:
        found.append(("assistant", reply))
    # Not text.strip(): it copies a long text (a 50 MB turn: ~25 ms with the GIL held).
    return Turns([(role, text) for role, text in found if text and not text.isspace()])


def dump(messages: Sequence[ModelMessage]) -> list[Any]:
    """Turns as a job stores them: PydanticAI's JSON form of messages."""
    return ModelMessagesTypeAdapter.dump_python(list(messages), mode="json")  # type: ignore[no-any-return]


def load(stored: Sequence[Any]) -> list[ModelMessage]:
    """Turns a job stored (:func:`dump`). A job queued before turns were messages holds
    ``[role, text]`` pairs: those are read as turns too, so an upgrade loses no queued job."""
    if all(isinstance(item, dict) for item in stored):
        return ModelMessagesTypeAdapter.validate_python(stored)
    return [
        turn(item[0], item[1]) if isinstance(item, list) else load([item])[0] for item in stored
    ]


def fingerprint(previous: str, text: str) -> str:
    """A turn's identity: it and the turn before it, whitespace-normalised, hashed."""
    digest = hashlib.sha256()
    _add_words(digest, previous)
    digest.update(b"\x00")
    _add_words(digest, text)
    return digest.hexdigest()


def _add_words(digest: Any, text: str) -> None:
    """Hash ``" ".join(text.split())`` a piece at a time (:func:`text_pieces`): splitting 50 MB
    at once held the GIL for a second."""
    first = True
    for piece in text_pieces(text):
        words = piece.split()
        if words:
            digest.update((" ".join(words) if first else " " + " ".join(words)).encode())
            first = False


def fingerprints_of(turns: Sequence[ModelMessage]) -> list[tuple[int, str]]:
    """(index, fingerprint) of each user turn."""
    said = turns.said if isinstance(turns, Turns) else [(role_of(t), text_of(t)) for t in turns]
    return [
        (i, fingerprint(said[i - 1][1] if i else "", text))
        for i, (role, text) in enumerate(said)
        if role == "user"
    ]
