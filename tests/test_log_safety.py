"""No client input can forge a log line (controls escaped in text, JSON-escaped in json, user
ids quoted like logfmt's), and no line shows a secret: the passwords in the database's, the
upstream's and the Manager's URLs are masked, at start-up and after."""

from __future__ import annotations

import io
import logging
import shlex

import orjson
import pytest
import respx
from pydantic_ai.messages import ModelResponse
from pydantic_ai.models.function import FunctionModel

from app import startup
from app.config import Settings
from app.log import RequestIdFilter, TextFormatter, configure_logging, mask_url
from app.main import create_app
from tests.fakes import FakeEmbedder
from tests.helpers import chat_body, completion_json, free_port, running
from tests.log_capture import build, capture, log_fixture  # noqa: F401 (the `log` fixture)

FORGED = "2026-11-23 12:00:00,000 INFO memproxy.access [forged] GET /v1/admin 200 1.0ms user=root"


@pytest.mark.parametrize("log_format", ["text", "json"])
async def test_client_input_cannot_forge_a_log_line(
    upstream: respx.Router, log: io.StringIO, monkeypatch: pytest.MonkeyPatch, log_format: str
) -> None:
    """A path with %0d%0a and a forged access line after it, a user id with C1 line breaks (NEL,
    U+2028; a UTF-8 header and a body `user`, refused as user ids since issue 23): each request
    is exactly one line, the controls escaped (text) or JSON-escaped (json), and `splitlines()`,
    which breaks at NEL too, agrees."""
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
        ).status_code == 400
        body = chat_body(user="bob\u2028" + FORGED)
        assert (await client.post("/v1/chat/completions", json=body)).status_code == 400
    lines = log.getvalue().splitlines()
    access = [line for line in lines if "memproxy.access" in line]
    assert len(access) == 3, lines
    assert all(FORGED not in line.split(" memproxy.access ")[0] for line in lines)
    if log_format == "json":
        records = [orjson.loads(line) for line in lines]  # every line is a whole record
        paths = [r["path"] for r in records if r["logger"] == "memproxy.access"]
        assert paths[0] == "/nothing\r\n" + FORGED + "\n\x1b[2J\x7f\x85"
        users = [r["user"] for r in records if r["logger"] == "memproxy.access"]
        assert users[1:] == [None, None]  # refused before any user was named
    else:  # the path as sent (encoded: a decoded space would fake a field), users quoted
        assert f" GET {path} 404 " in access[0]
        assert all(" 400 " in line and "user=- " in line for line in access[1:])


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


def test_database_passwords_are_never_shown() -> None:
    shown = mask_url("postgresql+asyncpg://memproxy:hunter2@db:5432/memproxy")
    assert "hunter2" not in shown and shown.startswith("postgresql+asyncpg://memproxy:***@db")
    assert (
        mask_url("sqlite+aiosqlite:///./data/memproxy.db")
        == "sqlite+aiosqlite:///./data/memproxy.db"
    )


@pytest.mark.parametrize(("url", "shown"), [
    ("http://user:PASS@host:8080/v1", "http://user:***@host:8080/v1"),
    ("https://sk-TOKEN@api.example/v1", "https://***@api.example/v1"),  # a lone name: a key
    ("http://host/v1", "http://host/v1"),
])  # fmt: skip
def test_upstream_urls_are_masked_for_logs_and_errors(url: str, shown: str) -> None:
    assert mask_url(url) == shown


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
