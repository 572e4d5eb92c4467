"""Logs and start-up: one access line per request (text or JSON) with id, user, kind, status and
timings; no message content, memory text or key at INFO; what start-up says and warns about."""

from __future__ import annotations

import asyncio
import io
import logging
import shlex
import warnings
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import orjson
import pytest
import respx
from pydantic_ai import models
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from app import startup
from app.config import Settings
from app.log import (
    RequestIdFilter,
    TextFormatter,
    configure_logging,
    mask_url,
    memproxy_handler,
)
from app.main import create_app
from app.proxy.hooks import RequestContext
from app.startup import redact
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.helpers import RecordingHooks, chat_body, completion_json, free_port, running, sse

SECRET = "BLUEBERRY-TANGO-42"
"""A word that appears only in message content: no log line at INFO may contain it."""
MEMORY = "Keeps bees on the roof in Oslo"
KEY = "sk-very-secret-client-key"


@pytest.fixture
def log() -> Iterator[io.StringIO]:
    """What memproxy's handler writes, from the moment an app configures it (see `capture`)."""
    yield io.StringIO()
    logging.getLogger("memproxy").setLevel(logging.INFO)


def capture(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    handler = memproxy_handler()
    assert handler is not None
    monkeypatch.setattr(handler, "stream", stream)


def build(upstream: respx.Router, **settings: Any) -> Any:
    return create_app(
        make_settings(**settings),
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        embedder=FakeEmbedder(),
    )


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
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, {"operations": ops})])

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


async def test_start_up_says_where_what_and_warns_of_an_open_server(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.get("/models").respond(json={"object": "list", "data": [{"id": "llama3.2"}]})
    app = build(upstream, upstream_check_at_start=True, host="0.0.0.0", port=8123)
    capture(log, monkeypatch)
    async with running(app) as client:
        await app.state.services.runner.drain(5)  # the upstream check runs in the background
        assert (await client.get("/healthz")).status_code == 200
    text = log.getvalue()
    assert "listening on http://0.0.0.0:8123 (OpenAI base URL: http://0.0.0.0:8123/v1)" in text
    assert "upstream: http://upstream.test/v1" in text
    assert (
        "database: sqlite+aiosqlite:///" in text
        and "embedding model: all-MiniLM-L6-v2 (bundled) (vectors fake-bow-64" in text
    )
    assert "WARNING" in text and "MEMPROXY_API_KEYS is empty" in text
    assert "upstream http://upstream.test/v1 answered: 1 model(s): llama3.2" in text


@pytest.mark.parametrize(
    ("answer", "warning"),
    [
        (httpx.ConnectError("connection refused"), "upstream not reachable at start"),
        (httpx.Response(401, json={"error": "bad key"}), "refused the model list (401)"),
        (httpx.Response(500, text="boom"), "answered 500 to GET /models"),
    ],
    ids=["unreachable", "refused", "broken"],
)
async def test_a_bad_upstream_is_a_warning_and_memproxy_serves_anyway(
    upstream: respx.Router,
    log: io.StringIO,
    monkeypatch: pytest.MonkeyPatch,
    answer: Any,
    warning: str,
) -> None:
    route = upstream.get("/models")
    if isinstance(answer, Exception):
        route.side_effect = answer
    else:
        route.return_value = answer
    upstream.post("/chat/completions").respond(json=completion_json())
    app = build(upstream, upstream_check_at_start=True, api_keys=["k1"])
    capture(log, monkeypatch)
    async with running(app) as client:
        await app.state.services.runner.drain(5)
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        response = await client.post(
            "/v1/chat/completions", json=chat, headers={"Authorization": "Bearer k1"}
        )
        assert response.status_code == 200  # started and serving
    text = log.getvalue()
    assert warning in text and "MEMPROXY_API_KEYS is empty" not in text
    assert "k1" not in text.replace("client keys: 1", "")


def test_database_passwords_are_never_shown() -> None:
    shown = redact("postgresql+asyncpg://memproxy:hunter2@db:5432/memproxy")
    assert "hunter2" not in shown and shown.startswith("postgresql+asyncpg://memproxy:***@db")
    assert (
        redact("sqlite+aiosqlite:///./data/memproxy.db") == "sqlite+aiosqlite:///./data/memproxy.db"
    )


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:PASS@host:8080/v1", "http://user:***@host:8080/v1"),
    ("https://sk-TOKEN@api.example/v1", "https://***@api.example/v1"),  # a lone name: a key
    ("http://host/v1", "http://host/v1"),
])  # fmt: skip
def test_upstream_urls_are_masked_for_logs_and_errors(url: str, shown: str) -> None:
    assert mask_url(url) == shown


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


FORGED = "2026-11-23 12:00:00,000 INFO memproxy.access [forged] GET /v1/admin 200 1.0ms user=root"


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_client_input_cannot_forge_a_log_line(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    """A path with %0d%0a and a forged access line after it, a user id with C1 line breaks (NEL,
    U+2028; a UTF-8 header and a body `user`): each request is exactly one line, the controls
    escaped (text) or JSON-escaped (json), and `splitlines()`, which breaks at NEL too, agrees."""
    upstream.post("/chat/completions").respond(json=completion_json())
    app = build(upstream, log_format=log_format)
    capture(log, monkeypatch)
    nel_user = "ann\u0085" + FORGED
    async with running(app) as client:
        path = "/nothing%0d%0a" + FORGED.replace(" ", "%20") + "%0a%1b[2J%7f%c2%85"
        assert (await client.get(path)).status_code == 404
        headers = {"X-User-Id": nel_user.encode()}
        assert (
            await client.post("/v1/memories", json={"content": "x"}, headers=headers)
        ).status_code == 201
        body = chat_body(user="bob\u2028" + FORGED)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 200
    lines = log.getvalue().splitlines()
    access = [line for line in lines if "memproxy.access" in line]
    assert len(access) == 3, lines
    assert all(FORGED not in line.split(" memproxy.access ")[0] for line in lines)
    if log_format == "json":
        records = [orjson.loads(line) for line in lines]  # every line is a whole record
        paths = [r["path"] for r in records if r["logger"] == "memproxy.access"]
        assert paths[0] == "/nothing\r\n" + FORGED + "\n\x1b[2J\x7f\x85"
        users = [r["user"] for r in records if r["logger"] == "memproxy.access"]
        assert users[1:] == [nel_user, "bob\u2028" + FORGED]
    else:  # the path as sent (encoded: a decoded space would fake a field), users quoted
        assert f" GET {path} 404 " in access[0]
        assert f'user="ann\\x85{FORGED}" kind=-' in access[1]
        assert f'user="bob\\u2028{FORGED}" kind=chat' in access[2]


def test_the_text_format_keeps_the_traceback_and_escapes_the_rest() -> None:
    """Every field is escaped (the message, a logger name, the request id); the exception's
    traceback, appended after the line, is memproxy's own and keeps its lines."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(TextFormatter())
    handler.addFilter(RequestIdFilter())
    record_logger = logging.getLogger("memproxy.test-escape\n")
    record_logger.addHandler(handler)
    record_logger.propagate = False
    try:
        try:
            raise ValueError("boom")
        except ValueError:
            record_logger.exception("failed on %s", "/a\r\nforged\tline\x00")
    finally:
        record_logger.removeHandler(handler)
    first, *traceback = stream.getvalue().splitlines()
    assert first.endswith(r"memproxy.test-escape\n [-] failed on /a\r\nforged\x09line\x00")
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[-1] == "ValueError: boom"


def test_start_up_lines_never_show_url_passwords(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The upstream's and the Manager's base URLs may carry credentials: no start-up line shows
    them (the database URL's are tested above)."""
    settings = Settings(
        upstream_base_url="http://proxyuser:PASS-UPSTREAM@upstream.example:8080/v1",
        manager_enabled=True,
        manager_base_url="https://mgr:PASS-MANAGER@manager.example/v1",
        database_url="postgresql+asyncpg://memproxy:PASS-DB@db:5432/memproxy",
        api_keys=["PASS-KEY-1", "PASS-KEY-2:ann"],
    )
    configure_logging("INFO", "text")
    capture(log, monkeypatch)
    startup.report(settings, embedding_model="fake-bow-64", keys=2)
    text = log.getvalue()
    assert "upstream: http://proxyuser:***@upstream.example:8080/v1" in text
    assert "at https://mgr:***@manager.example/v1" in text
    assert "PASS" not in text, text


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_a_whole_start_with_credentials_in_urls_never_shows_them(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    """The real start: summary, warnings and the upstream check against a closed loopback port
    (its failure names the upstream), with passwords in the upstream's and the Manager's URLs."""
    port = free_port()
    app = create_app(
        Settings(
            upstream_base_url=f"http://proxyuser:PASS-UPSTREAM@127.0.0.1:{port}/v1",
            manager_enabled=True,
            manager_base_url=f"http://mgr:PASS-MANAGER@127.0.0.1:{port}/v1",
            manager_api_key="PASS-MANAGER-KEY",
            upstream_api_key="PASS-UPSTREAM-KEY",
            api_keys=["PASS-CLIENT-KEY"],
            log_format=log_format,
        ),
        embedder=FakeEmbedder(),
        manager_model=FunctionModel(lambda messages, info: ModelResponse(parts=[])),
    )
    capture(log, monkeypatch)
    async with running(app):
        await app.state.services.runner.drain(5)
    text = log.getvalue()
    assert "upstream not reachable at start" in text and "proxyuser:***@127.0.0.1" in text
    assert "mgr:***@127.0.0.1" in text
    assert "PASS" not in text, text


def unbound_warnings(log: io.StringIO) -> list[str]:
    return [line for line in log.getvalue().splitlines() if "bound to no user" in line]


@pytest.mark.parametrize(
    ("settings", "warned"),
    [
        ({"api_keys": ["sk-owui", "sk-b:bob", "sk-c"]}, True),
        ({"api_keys": ["sk-a:ann", "sk-b:bob"]}, False),
        ({"api_keys": ["sk-owui"], "openwebui_jwt_secret": "s" * 32}, False),
        ({"api_keys": ["sk-owui"], "unbound_keys_name_users": False}, False),
    ],
    ids=["unbound", "all-bound", "jwt-secret", "turned-off"],
)
def test_unbound_keys_that_may_name_users_are_warned_about_at_start(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], warned: bool
) -> None:
    configure_logging("INFO", "text")
    capture(log, monkeypatch)
    startup.report(
        make_settings(**settings), embedding_model="fake", keys=len(settings["api_keys"])
    )
    lines = unbound_warnings(log)
    if not warned:
        assert lines == []
        return
    (line,) = lines
    assert " WARNING memproxy " in line
    assert line.split(" [-] ", 1)[1].startswith(
        "2 of the 3 MEMPROXY_API_KEYS are bound to no user: whoever holds one can name any user "
        "(X-OpenWebUI-User-Id, X-User-Id, or the body's 'user') and read, export and delete"
    )
    assert "MEMPROXY_UNBOUND_KEYS_NAME_USERS=false" in line
    assert "MEMPROXY_OPENWEBUI_JWT_SECRET" in line and "sk-" not in line


async def test_a_user_id_cannot_fake_fields_of_the_text_access_line(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The text line is `key=value` fields split at spaces: a user id with spaces, quotes or `=`
    is quoted (logfmt's rule), so a shell-style split still finds one user and the true kind."""
    upstream.post("/chat/completions").respond(json=completion_json())
    app = build(upstream)
    capture(log, monkeypatch)
    user = 'ann" kind=task user=root \\'
    async with running(app) as client:
        response = await client.post("/v1/chat/completions", json=chat_body(user=user))
        assert response.status_code == 200
    (line,) = [line for line in log.getvalue().splitlines() if " memproxy.access " in line]
    fields = dict(token.split("=", 1) for token in shlex.split(line) if "=" in token)
    assert (fields["user"], fields["kind"]) == (user, "chat")
