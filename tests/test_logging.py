"""Logs: one access line per request (text or JSON) with id, user, kind, status and timings;
no message content, memory text or key at INFO; warnings and library lines in the log's format;
one warning naming the upstream when it fails. Escaping and secrets: test_log_safety.py; start-up:
test_startup_log.py."""

from __future__ import annotations

import asyncio
import io
import logging
import warnings
from collections.abc import AsyncIterator

import httpx
import orjson
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo, FunctionModel

from app.config import Settings
from app.main import create_app
from app.proxy.hooks import RequestContext
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder, decided
from tests.helpers import RecordingHooks, chat_body, completion_json, free_port, running, sse
from tests.log_capture import build, capture, log_fixture  # noqa: F401 (the `log` fixture)

SECRET = "BLUEBERRY-TANGO-42"
"""A word that appears only in message content: no log line at INFO may contain it."""
MEMORY = "Keeps bees on the roof in Oslo"
KEY = "sk-very-secret-client-key"


async def chat_with_memory(client: httpx.AsyncClient, headers: dict[str, str]) -> httpx.Response:
    await client.post("/v1/memories", json={"content": MEMORY}, headers=headers)
    body = {
        "model": "m",
        "messages": [{"role": "user", "content": f"Do my bees like the roof in Oslo? {SECRET}"}],
    }
    return await client.post("/v1/chat/completions", json=body, headers=headers)


async def test_json_access_lines_carry_ids_timings_and_no_content(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json(f"Yes. {SECRET}"))
    app = build(upstream, log_format="json", api_keys=[f"{KEY}:ann"])
    capture(log, monkeypatch)
    async with running(app) as client:
        headers = {"Authorization": f"Bearer {KEY}"}
        response = await chat_with_memory(client, headers)
        assert response.status_code == 200 and response.headers["x-memories-injected"] == "1"
        bad = {"model": "m", "messages": [{"role": "wizard", "content": SECRET}]}
        assert (
            await client.post("/v1/chat/completions", json=bad, headers=headers)
        ).status_code == 422
        assert (
            await client.post("/v1/chat/completions", content=SECRET.encode(), headers=headers)
        ).status_code == 400
        await client.get("/healthz")
    output = log.getvalue()
    lines = [orjson.loads(line) for line in output.splitlines()]  # every line is JSON
    access = [line for line in lines if line["logger"] == "memproxy.access"]
    assert [(a["method"], a["path"], a["status"]) for a in access] == [
        ("POST", "/v1/memories", 201),
        ("POST", "/v1/chat/completions", 200),
        ("POST", "/v1/chat/completions", 422),
        ("POST", "/v1/chat/completions", 400),
    ]  # probes (/healthz...) are logged at DEBUG
    chat = access[1]
    assert chat["request_id"] == response.headers["x-request-id"]
    assert (chat["user"], chat["kind"], chat["injected"]) == ("ann", "chat", 1)
    assert chat["duration_ms"] >= chat["upstream_ms"] >= 0 and chat["memory_ms"] >= 0
    assert all(line["level"] and line["time"] for line in lines)
    for forbidden in (SECRET, "bees", KEY):
        assert forbidden not in output, forbidden


async def test_debug_shows_the_injected_memories(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    app = build(upstream, log_level="DEBUG")
    capture(log, monkeypatch)
    async with running(app) as client:
        await chat_with_memory(client, {"X-User-Id": "ann"})
    debug = [line for line in log.getvalue().splitlines() if " DEBUG " in line]
    assert any(MEMORY in line and "injected for ann" in line for line in debug)


async def test_manager_lines_at_info_carry_no_content(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", False)
    applied: list[str] = []

    def manager(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        applied.append("called")
        ops = [{"op": "NEW", "content": f"Has a password hint {SECRET}", "type": "fact"}]
        return decided(info, {"operations": ops})

    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    app = create_app(
        make_settings(manager_enabled=True, processing_interval=0, conversation_threshold=1),
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        embedder=FakeEmbedder(),
        manager_model=FunctionModel(manager),
    )
    capture(log, monkeypatch)
    async with running(app) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": f"Remember {SECRET}"}]}
        await client.post("/v1/chat/completions", json=body, headers={"X-User-Id": "ann"})
        for _ in range(500):
            if "applied: created" in log.getvalue():
                break
            await asyncio.sleep(0.01)
    assert applied and "applied: created" in log.getvalue()
    assert SECRET not in log.getvalue()


async def test_json_mode_logs_warnings_and_library_lines_as_json(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `warnings.warn` (a deprecation in a library, say) and a library's own log record, both
    emitted while a chat is handled: in json mode they are JSON lines like every other."""

    def prepare(ctx: RequestContext) -> None:
        warnings.warn("an old API was used", UserWarning, stacklevel=1)
        logging.getLogger("some.library").warning("a library speaks up")

    upstream.post("/chat/completions").respond(json=completion_json())
    app = create_app(
        make_settings(log_format="json"),
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        hooks=RecordingHooks(prepare),
        embedder=FakeEmbedder(),
    )
    capture(log, monkeypatch)
    async with running(app) as client:
        response = await client.post("/v1/chat/completions", json=chat_body())
        assert response.status_code == 200
    lines = [orjson.loads(line) for line in log.getvalue().splitlines()]  # every line is JSON
    (warned,) = [line for line in lines if line["logger"] == "py.warnings"]
    assert warned["level"] == "WARNING" and "UserWarning: an old API was used" in warned["message"]
    assert warned["request_id"] == response.headers["x-request-id"]
    (library,) = [line for line in lines if line["logger"] == "some.library"]
    assert library["message"] == "a library speaks up"


def upstream_warnings(log: io.StringIO) -> list[str]:
    return [line for line in log.getvalue().splitlines() if " WARNING memproxy.upstream " in line]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_chat_answered_502_is_one_warning_naming_the_upstream(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    """A closed loopback port; the password in the upstream URL is masked."""
    port = free_port()
    app = create_app(
        Settings(
            upstream_base_url=f"http://proxyuser:hunter2@127.0.0.1:{port}/v1",
            manager_enabled=False,
        ),
        embedder=FakeEmbedder(),
    )
    capture(log, monkeypatch)
    async with running(app) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
    assert response.status_code == 502
    (line,) = upstream_warnings(log)
    url = f"http://proxyuser:***@127.0.0.1:{port}/v1/chat/completions"
    assert f"upstream POST {url} failed: unreachable (answered 502)" in line
    assert "hunter2" not in log.getvalue()


async def test_a_chat_answered_504_is_one_warning_naming_the_upstream(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loopback server that accepts and never answers, and a tiny read timeout."""
    opened: list[asyncio.StreamWriter] = []

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        opened.append(writer)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    app = create_app(
        Settings(
            upstream_base_url=f"http://127.0.0.1:{port}/v1",
            upstream_read_timeout_seconds=0.2,
            manager_enabled=False,
            upstream_check_at_start=False,  # its GET /models would wait out its own timeout
        ),
        embedder=FakeEmbedder(),
    )
    capture(log, monkeypatch)
    try:
        async with running(app) as client:
            response = await client.post("/v1/chat/completions", json=chat_body())
    finally:
        for writer in opened:
            writer.close()
        server.close()
        await server.wait_closed()
    assert response.status_code == 504
    (line,) = upstream_warnings(log)
    assert (
        f"upstream POST http://127.0.0.1:{port}/v1/chat/completions failed: timeout (answered 504)"
        in line
    )


async def test_an_upstream_5xx_is_a_warning_and_a_4xx_is_not(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    route = upstream.post("/chat/completions")
    app = build(upstream, log_format="json")
    capture(log, monkeypatch)
    async with running(app) as client:
        route.respond(503, json={"error": "model is loading"})
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 503
        route.respond(404, json={"error": "model 'llama9' not found"})
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 404
    lines = [orjson.loads(line) for line in log.getvalue().splitlines()]
    (warned,) = [line for line in lines if line["logger"] == "memproxy.upstream"]
    assert warned["level"] == "WARNING" and "model is loading" in warned["message"]
    assert (warned["upstream_url"], warned["status"], warned["cause"]) == (
        "http://upstream.test/v1/chat/completions",
        503,
        "upstream status 503",
    )


class BreaksOff(httpx.AsyncByteStream):
    """An SSE body that stops with a network error after its first event."""

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield sse({"role": "assistant", "content": "Hel"}, done=False)
        raise httpx.ReadError("connection reset")


async def test_a_stream_broken_off_mid_body_is_one_warning(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    headers = {"content-type": "text/event-stream"}
    upstream.post("/chat/completions").respond(200, headers=headers, stream=BreaksOff())
    app = build(upstream)
    capture(log, monkeypatch)
    async with running(app) as client:
        # The answer is left unfinished on purpose (a server drops the connection), which
        # httpx's in-process transport reports with an assertion.
        with pytest.raises(AssertionError):
            await client.post("/v1/chat/completions", json=chat_body(stream=True))
    (line,) = upstream_warnings(log)
    assert (
        "upstream POST http://upstream.test/v1/chat/completions failed: broken off mid-body "
        "(answered 200): ReadError: connection reset" in line
    )
