"""A cap on what the Manager's HTTP client reads of an answer: at most
``MEMPROXY_MANAGER_MAX_ANSWER_BYTES``.

A Manager's answer is a few KB of JSON; a server that sends megabytes (a model looping past its
``max_tokens``, a proxy's error page, a misbehaving server) would otherwise be read whole into
memory, and the process keeps what it once took. So:

- every request asks for ``Accept-Encoding: identity``: the bytes counted are the bytes the SDK
  gets (a compressed answer could grow far past the cap as it is decoded);
- an answer whose ``Content-Length`` is over the cap fails before any of its body is read;
- any other fails as soon as the bytes read pass the cap (at most one network chunk beyond it).

The failure is :class:`AnswerTooLarge`, which no SDK retries (it is no transport error): the job
fails as a Manager failure does (retried later, parked after ``MEMPROXY_MANAGER_JOB_ATTEMPTS``),
its reason naming the cap.
"""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx2

SETTING = "MEMPROXY_MANAGER_MAX_ANSWER_BYTES"


class AnswerTooLarge(Exception):
    """The Manager's server answered more than the cap allows."""

    def __init__(self, cap: int) -> None:
        super().__init__(f"answer larger than {cap} bytes ({SETTING})")


def capped_hooks(cap: int) -> dict[str, list[Callable[..., Any]]]:
    """Event hooks for an ``httpx2.AsyncClient`` that hold every answer to `cap` bytes."""

    async def ask_identity(request: httpx2.Request) -> None:
        request.headers["accept-encoding"] = "identity"

    async def cap_answer(response: httpx2.Response) -> None:
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > cap:
            raise AnswerTooLarge(cap)
        assert isinstance(response.stream, httpx2.AsyncByteStream)  # an async client's
        response.stream = _CappedStream(response.stream, cap)

    return {"request": [ask_identity], "response": [cap_answer]}


class _CappedStream(httpx2.AsyncByteStream):
    """`stream` that raises :class:`AnswerTooLarge` once more than `cap` bytes came."""

    def __init__(self, stream: httpx2.AsyncByteStream, cap: int) -> None:
        self._stream = stream
        self._cap = cap

    async def __aiter__(self) -> AsyncIterator[bytes]:
        size = 0
        async for chunk in self._stream:
            size += len(chunk)
            if size > self._cap:
                raise AnswerTooLarge(self._cap)
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()

    @property
    def elapsed(self) -> datetime.timedelta | None:
        """The wrapped stream's (httpx2's `Response.elapsed` reads it from the stream)."""
        elapsed: datetime.timedelta | None = getattr(self._stream, "elapsed", None)
        return elapsed
