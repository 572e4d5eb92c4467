"""The seams where memory attaches to the proxy.

A chat request passes two hooks (:class:`MemoryHooks`):

- ``before_forward(ctx)`` runs on the hot path, only when ``ctx.recall_allowed`` (a ``chat``
  request, ``X-Memory`` not ``off``). It may return a :class:`Preparation` with a new body (the
  memory block inserted with :func:`app.memory.block.insert_memory_block`) and response
  headers; ``None`` forwards the client's bytes untouched.
- ``after_response(ctx, completion)`` runs once the whole response has reached the client (or the
  exchange ended otherwise: see :class:`Outcome`), in a background task, never delaying the
  response. It is called for every request; the hook checks ``ctx.write_allowed``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any, Generic, Protocol, TypeVar

from app.proxy.completion import Reply, read_reply
from app.proxy.history import ConvertedHistory, convert
from app.proxy.kinds import MemoryMode, RequestKind
from app.proxy.offload import empty, off_loop
from app.schemas.openai import ChatCompletionRequest

T = TypeVar("T")


@dataclass(frozen=True, eq=False)
class Note(Generic[T]):
    """A typed key for a hook's own note on a request (:meth:`RequestContext.note`): each hook
    module owns its keys, so the proxy knows none of them and every value keeps its type."""

    name: str


@dataclass(slots=False)
class RequestContext:
    """One chat request, as the hooks see it. Holds no state beyond the request itself."""

    request_id: str
    user_id: str
    kind: RequestKind
    task: str | None
    memory_mode: MemoryMode
    body: dict[str, Any]
    """The parsed client body (do not mutate: return a new one from `before_forward`). In a
    large body an image's, audio clip's or file's long data is a stand-in, the data URI's head
    (:data:`app.proxy.body.DATA_KEYS`): never read, it goes upstream as the client sent it
    from any body `before_forward` returns."""
    request: ChatCompletionRequest
    """The validated view of `body` (its stand-ins as plain strings: never written upstream)."""
    body_bytes: int = 0
    """The client body's size: a large one is worked on off the event loop
    (:func:`app.proxy.offload.off_loop`)."""
    user_name: str | None = None
    """What the client says the user is called (:mod:`app.proxy.user_name`), or None."""
    _notes: dict[Note[Any], Any] = field(default_factory=dict, repr=False)

    def note(self, key: Note[T], value: T) -> None:
        """Keep the hook's own `value` from `before_forward` to `after_response` (e.g. a
        queued job), under a key of the hook's."""
        self._notes[key] = value

    def noted(self, key: Note[T]) -> T | None:
        """What was kept under `key`, or None."""
        value: T | None = self._notes.get(key)
        return value

    @property
    def model(self) -> str:
        return self.request.model

    @property
    def stream(self) -> bool:
        return bool(self.request.stream)

    @property
    def messages(self) -> list[dict[str, Any]]:
        messages: list[dict[str, Any]] = self.body["messages"]
        return messages

    @property
    def recall_allowed(self) -> bool:
        return self.kind is RequestKind.CHAT and self.memory_mode is not MemoryMode.OFF

    @property
    def write_allowed(self) -> bool:
        return self.kind is RequestKind.CHAT and self.memory_mode is MemoryMode.ON

    @cached_property
    def history(self) -> ConvertedHistory:
        """The conversation as PydanticAI messages; converted on first use, off the hot path.
        Its words are the client's; a large body's images, audio and files are empty stand-ins
        (`body`), which memory, reading words only, never misses."""
        return convert(self.request.messages)

    def drop_parsed(self) -> None:
        """Let go of the parsed body, its validated messages and their history: for a large
        body, hundreds of thousands of objects (:class:`app.proxy.offload.CollectorPause`),
        freed a slice at a time (:func:`app.proxy.offload.empty`; freeing a whole list is one
        call into C). Called off the loop once the hooks are done with them; the notes and the
        request's other fields stay."""
        converted: ConvertedHistory | None = self.__dict__.pop("history", None)
        lists = [self.body.get("messages"), self.request.messages]
        lists.append(converted.history if converted is not None else None)
        self.body = {}
        self.request = self.request.model_copy(update={"messages": []})
        for items in lists:
            if isinstance(items, list):
                empty(items)


class Outcome(StrEnum):
    COMPLETED = "completed"
    """The upstream's whole response reached the client."""
    UPSTREAM_FAILED = "upstream_failed"
    """The upstream answered an error status or broke off mid-stream."""
    CLIENT_DISCONNECTED = "client_disconnected"
    """The client went away before the end (e.g. Open WebUI's stop button)."""
    REFUSED = "refused"
    """A hook's `on_first_byte` refused the answer (e.g. its Manager job could not be written):
    the client got an error and none of the answer."""
    SHUTDOWN = "shutdown"
    """memproxy was stopped and the answer did not end within its grace: the client got an
    error (a stream's last event, or a 503 in place of the answer)."""


class Completion:
    """How the exchange ended, and what the upstream answered.

    The answer is read from a copy of the relayed bytes on first access (`reply` and the
    properties below, or :meth:`read`), never before: hooks that do not look at it cost nothing.
    """

    def __init__(self, outcome: Outcome, status_code: int, captured: list[bytes], *, sse: bool):
        self.outcome = outcome
        self.status_code = status_code
        self._captured = captured
        self._sse = sse
        self._reading: asyncio.Future[Reply] | None = None

    @cached_property
    def reply(self) -> Reply:
        return read_reply(self._captured, status=self.status_code, sse=self._sse)

    async def read(self) -> Reply:
        """`reply`, read in a worker thread when the answer is large (:mod:`app.proxy.offload`:
        an answer of tens of megabytes, an echo of a pasted document, took ~60 ms to read on
        the event loop); read once, whoever asks meanwhile."""
        if "reply" in self.__dict__:  # cached_property keeps it there
            return self.reply
        if self._reading is None:
            size = sum(len(piece) for piece in self._captured)
            self._reading = asyncio.ensure_future(
                off_loop(size, read_reply, self._captured, status=self.status_code, sse=self._sse)
            )
        reply = await asyncio.shield(self._reading)
        self.__dict__.setdefault("reply", reply)
        return self.reply

    @property
    def assistant_text(self) -> str:
        return self.reply.assistant_text

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return self.reply.tool_calls

    @property
    def finish_reason(self) -> str | None:
        return self.reply.finish_reason

    @property
    def usage(self) -> dict[str, Any] | None:
        return self.reply.usage

    def __repr__(self) -> str:
        return f"Completion(outcome={self.outcome.value}, status_code={self.status_code})"


@dataclass(slots=True)
class Preparation:
    body: dict[str, Any] | None = None
    """A replacement body to forward, or None to forward the client's bytes unchanged."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers (e.g. how many memories were injected)."""
    injected: int | None = None
    """Memories put into the request, for the access log (None: the hook injects none)."""
    on_first_byte: Callable[[], Awaitable[None]] | None = None
    """Awaited just before the answer's first byte is sent to the client: work that must be
    done by the time the client has any of the answer (e.g. the Manager's job, durably). It
    holds that byte back for as long as it takes: keep it short, and bound it. Raising a
    :class:`app.errors.MemproxyError` answers the client that error in place of the answer
    (:attr:`Outcome.REFUSED`)."""
    reading_body: Awaitable[object] | None = None
    """Work the hook began that still reads the parsed request (e.g. writing the Manager's job
    from its turns): a large body's parsed objects are let go once it is done
    (:meth:`RequestContext.drop_parsed`)."""


class MemoryHooks(Protocol):
    async def before_forward(self, ctx: RequestContext) -> Preparation | None: ...

    async def after_response(self, ctx: RequestContext, completion: Completion) -> None: ...
