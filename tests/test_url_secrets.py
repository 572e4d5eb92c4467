"""Secrets in URLs never reach a client or a log: the password of a URL's user info and every
value of its query (`?key=...`, Azure's `?api-key=...`) are masked by one helper wherever a URL is
shown: the upstream's 502/504 messages, the Manager's failures in the jobs API, the start-up
lines and the settings errors."""

from __future__ import annotations

import io

import httpx
import pytest
import respx
from sqlalchemy.ext.asyncio import async_sessionmaker

from app import startup
from app.config import Settings
from app.log import mask_url, mask_urls_in
from app.main import create_app
from app.memory.store.db import create_engine, writing
from app.memory.store.records import now
from app.memory.store.tables import JobStatus, ManagerJob
from app.settings_errors import _shown
from tests.conftest import AppClientFactory, make_settings
from tests.fakes import FakeEmbedder
from tests.helpers import assert_openai_error, chat_body, completion_json, free_port, running
from tests.log_capture import capture, log_fixture  # noqa: F401 (the `log` fixture)
from tests.memory.learning.test_manager_wire import until


@pytest.mark.parametrize(("url", "shown"), [
    ("http://host/v1?key=SECRET", "http://host/v1?key=***"),
    ("https://h.example/v1?api-key=S1&api-version=2024-01", "https://h.example/v1?api-key=***&api-version=***"),
    ("http://host/v1?SECRET", "http://host/v1?***"),  # a bare value is a value
    ("http://host/v1?key=", "http://host/v1?key="),  # nothing to hide
    ("http://u:PASS@host:8080/v1?key=SECRET#SECRET", "http://u:***@host:8080/v1?key=***#***"),
    ("http://host:8080/v1?mail=ann@example.org", "http://host:8080/v1?mail=***"),  # '@' in a value
    ("postgresql+asyncpg://u:pa#SECRET@db/x", "postgresql+asyncpg://u:***@db/x"),  # unescaped
    ("postgresql+asyncpg://u:pa/SECRET@db/x", "postgresql+asyncpg://u:***@db/x"),
    ("postgresql+asyncpg://u:12/SECRET@db/x", "postgresql+asyncpg://u:***@db/x"),  # not a port
    ("postgresql+asyncpg://u:12#SECRET@db/x", "postgresql+asyncpg://u:***@db/x"),
    ("admin:12/SECRET@host/v1", "admin:***@host/v1"),  # a setting without its scheme
    ("postgresql+asyncpg://u@db/x?password=SECRET", "postgresql+asyncpg://***@db/x?password=***"),
    ("http://[::1]:8080/v1?key=SECRET", "http://[::1]:8080/v1?key=***"),
    ("sqlite+aiosqlite:///./data/memproxy.db", "sqlite+aiosqlite:///./data/memproxy.db"),
])  # fmt: skip
def test_query_values_and_passwords_are_masked(url: str, shown: str) -> None:
    assert mask_url(url) == shown


async def test_a_502_never_shows_the_upstream_urls_query(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A closed loopback port: the message (and the WARNING line) name the URL, key masked."""
    base = f"http://127.0.0.1:{free_port()}/v1?key=SECRET-UPSTREAM"
    app = create_app(
        Settings(upstream_base_url=base, manager_enabled=False), embedder=FakeEmbedder()
    )
    capture(log, monkeypatch)
    async with running(app) as client:
        for stream in (False, True):
            response = await client.post("/v1/chat/completions", json=chat_body(stream=stream))
            error = assert_openai_error(response, 502)
            assert "SECRET" not in response.text
            assert base.replace("SECRET-UPSTREAM", "***") in error["message"]
        assert "SECRET" not in (await client.get("/v1/models")).text
    assert "key=***" in log.getvalue() and "SECRET" not in log.getvalue()


async def test_the_jobs_listing_never_shows_the_manager_urls_query(
    upstream: respx.Router, monkeypatch: pytest.MonkeyPatch, log: io.StringIO
) -> None:
    from pydantic_ai import models

    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # a closed port is the edge
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    manager_url = f"http://127.0.0.1:{free_port()}/v1?api-key=SECRET-MANAGER"
    settings = make_settings(
        manager_enabled=True, processing_interval=0, conversation_threshold=1,
        manager_base_url=manager_url, manager_model="qwen", manager_job_attempts=1,
        manager_max_retries=0,
    )  # fmt: skip
    app = create_app(
        settings,
        upstream_transport=httpx.MockTransport(upstream.async_handler),
        embedder=FakeEmbedder(),
    )
    capture(log, monkeypatch)
    ann = {"X-User-Id": "ann"}
    async with running(app) as client:
        body = {"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]}
        await client.post("/v1/chat/completions", json=body, headers=ann)

        async def failed() -> bool:
            jobs = (await client.get("/v1/memories/jobs", headers=ann)).json()["data"]
            return bool(jobs) and jobs[0]["status"] == "failed"

        await until(failed)
        listed = await client.get("/v1/memories/jobs", headers=ann)
        stats = await client.get("/v1/memories/stats", headers=ann)
    (job,) = listed.json()["data"]
    assert job["error"].startswith(f"manager at {manager_url.replace('SECRET-MANAGER', '***')} ")
    for text in (listed.text, stats.text, log.getvalue()):
        assert "SECRET" not in text


def test_start_up_lines_never_show_url_queries() -> None:
    settings = Settings(
        upstream_base_url="http://upstream.example/v1?key=SECRET-UPSTREAM",
        manager_enabled=True,
        manager_base_url="https://manager.example/v1?api-key=SECRET-MANAGER",
        database_url="postgresql+asyncpg://memproxy@db/memproxy?password=SECRET-DB",
    )
    text = "\n".join(startup.summary(settings, embedding_model="m", keys=0))
    assert "upstream: http://upstream.example/v1?key=***" in text
    assert "at https://manager.example/v1?api-key=***" in text and "password=***" in text
    assert "SECRET" not in text


def test_a_bad_url_setting_never_shows_its_query() -> None:
    shown = _shown("upstream_base_url", "localhost:11434/v1?key=SECRET")
    assert shown == "'localhost:11434/v1?key=***'"


async def test_a_job_error_stored_before_masking_is_shown_masked(
    make_client: AppClientFactory, database_url: str
) -> None:
    """An older version wrote the Manager's URL as it was: the error is masked where it is read,
    for the jobs listing and the stats (the page and `memproxy jobs list` read the same)."""
    client = await make_client()  # the database migrated by the app's start
    old = (
        "manager at http://h/v1?api-key=SECRET-1 (model m): ConnectError, "
        "retried via http://u:SECRET-2@h/ and 'postgresql://db/x?password=SECRET-3'."
    )
    engine = create_engine(database_url)
    try:
        async with writing(async_sessionmaker(engine)) as session:
            session.add(ManagerJob(
                id="old-job", user_id="ann", explicit=True, status=JobStatus.FAILED.value,
                attempts=3, next_attempt_at=now(), payload={"new": []}, error=old,
                created_at=now(),
            ))  # fmt: skip
    finally:
        await engine.dispose()
    ann = {"X-User-Id": "ann"}
    listed = await client.get("/v1/memories/jobs", headers=ann)
    stats = await client.get("/v1/memories/stats", headers=ann)
    (job,) = listed.json()["data"]
    assert job["error"] == (
        "manager at http://h/v1?api-key=*** (model m): ConnectError, "
        "retried via http://u:***@h/ and 'postgresql://db/x?password=***'."
    )
    assert stats.json()["jobs"]["failures"][0]["reason"] == job["error"]
    for text in (listed.text, stats.text):
        assert "SECRET" not in text


@pytest.mark.parametrize(("text", "shown"), [
    ("", ""),
    ("no URL here: key=SECRET", "no URL here: key=SECRET"),  # only URLs are looked into
    ("at https://h/v1?key=S, then", "at https://h/v1?key=***, then"),
    ("(see http://u:S@h/v1)", "(see http://u:***@h/v1)"),
    ("<http://h/?a=S&b=T>", "<http://h/?a=***&b=***>"),
    ("two: http://h/?k=S\nhttps://TOKEN@h2/x.", "two: http://h/?k=***\nhttps://***@h2/x."),
])  # fmt: skip
def test_urls_in_free_text_are_masked(text: str, shown: str) -> None:
    assert mask_urls_in(text) == shown
