"""The completion hook never holds the response back; logs carry the request id; start-up
warns about an open server; a host that does not resolve is a 502."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import respx

import app.main as main
from app.config import Settings
from app.main import create_app
from app.memory.learning.manager import Manager
from app.proxy.hooks import Completion, Preparation, RequestContext
from tests.fakes import FakeEmbedder
from tests.helpers import (
    assert_openai_error,
    chat_body,
    completion_json,
    running,
    sse,
    sse_response,
)


class BlockingHooks:
    """after_response waits until the test lets it go: if the proxy awaited it before finishing
    the response, the request below could never complete."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.finished = asyncio.Event()

    async def before_forward(self, ctx: RequestContext) -> Preparation | None:
        return None

    async def after_response(self, ctx: RequestContext, completion: Completion) -> None:
        await self.release.wait()
        self.finished.set()


@pytest.mark.parametrize("stream", [False, True])
async def test_slow_completion_hook_does_not_delay_the_response(
    make_client, upstream: respx.Router, stream: bool
) -> None:
    if stream:
        upstream.post("/chat/completions").mock(return_value=sse_response(sse({"content": "hi"})))
    else:
        upstream.post("/chat/completions").respond(json=completion_json())
    hooks = BlockingHooks()
    client = await make_client(hooks=hooks)
    # ASGITransport returns only once the app has finished the whole exchange.
    response = await asyncio.wait_for(
        client.post("/v1/chat/completions", json=chat_body(stream=stream)), 5
    )
    assert response.status_code == 200
    assert not hooks.finished.is_set()
    hooks.release.set()
    await asyncio.wait_for(hooks.finished.wait(), 5)


@pytest.fixture
def memproxy_records() -> Iterator[list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("memproxy")
    logger.addHandler(handler)
    yield records
    logger.removeHandler(handler)


async def test_log_lines_carry_the_request_id_and_no_content(
    make_client, upstream, memproxy_records
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json("the secret reply"))
    client = await make_client()
    await client.post("/v1/chat/completions", json=chat_body("my secret message"),
                      headers={"x-request-id": "trace-123", "x-user-id": "ann"})  # fmt: skip
    access = [r for r in memproxy_records if r.name == "memproxy.access"]
    assert len(access) == 1
    line = logging.Formatter("%(message)s").format(access[0])
    assert access[0].request_id == "trace-123"
    assert "user=ann" in line and "kind=chat" in line and " 200 " in line
    formatted = " ".join(r.getMessage() for r in memproxy_records)
    assert "secret" not in formatted


async def test_open_server_warning_at_start(memproxy_records) -> None:
    for keys, expect_warning in (([], True), (["sk-1"], False)):
        memproxy_records.clear()
        app = create_app(Settings(api_keys=keys, manager_enabled=False), embedder=FakeEmbedder())
        async with app.router.lifespan_context(app):
            pass
        warned = any(
            r.levelno == logging.WARNING and "MEMPROXY_API_KEYS is empty" in r.getMessage()
            for r in memproxy_records
        )
        assert warned is expect_warning


async def test_with_signed_users_the_open_server_warning_says_users_cannot_be_named(
    memproxy_records,
) -> None:
    for secret, names in ((None, True), ("s3cret-of-32-bytes-at-the-least!", False)):
        memproxy_records.clear()
        settings = Settings(openwebui_jwt_secret=secret, manager_enabled=False)
        app = create_app(settings, embedder=FakeEmbedder())
        async with app.router.lifespan_context(app):
            pass
        (warning,) = [
            r.getMessage() for r in memproxy_records if "API_KEYS is empty" in r.getMessage()
        ]
        assert ("name any user" in warning) is names


async def test_unresolvable_upstream_host_is_502() -> None:
    base = "http://upstream.invalid:8080/v1"  # .invalid never resolves (RFC 2606)
    app = create_app(
        Settings(upstream_base_url=base, manager_enabled=False), embedder=FakeEmbedder()
    )
    async with running(app) as client:
        error = assert_openai_error(
            await client.post("/v1/chat/completions", json=chat_body()), 502
        )
    assert base in error["message"] and "MEMPROXY_UPSTREAM_BASE_URL" in error["message"]


async def test_the_managers_first_time_costs_are_paid_at_start_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process's first job built pydantic-ai's model (genai-prices' data loaded then) and the
    schema of a job's messages on the event loop: 0.2-0.3 s in which no chat moved."""
    on_loop: list[bool] = []
    warm = main._warm

    def watched(manager: Manager) -> None:
        on_loop.append(threading.current_thread() is threading.main_thread())
        warm(manager)

    monkeypatch.setattr(main, "_warm", watched)
    for manager, judge, expected in ((True, False, [False]), (False, True, [False]),
                                     (False, False, [])):  # fmt: skip
        on_loop.clear()
        settings = Settings(manager_enabled=manager, recall_judge=judge)
        app = create_app(settings, embedder=FakeEmbedder())
        async with app.router.lifespan_context(app):
            assert on_loop == expected


WARMED = """
import sys
import httpx2
from app.config import Settings
from app.main import _warm
from app.memory.learning.manager import Manager
from app.memory.learning.turns import ModelMessagesTypeAdapter
print(ModelMessagesTypeAdapter.pydantic_complete, "genai_prices.data" in sys.modules)
_warm(Manager(Settings(), http_client=httpx2.AsyncClient()))
print(ModelMessagesTypeAdapter.pydantic_complete, "genai_prices.data" in sys.modules)
"""


def test_warming_up_does_what_the_first_job_would() -> None:
    """In a process of its own: none of it done before, both of it after."""
    ran = subprocess.run([sys.executable, "-c", WARMED], capture_output=True, text=True,
                         timeout=120, check=True)  # fmt: skip
    assert ran.stdout.split() == ["False", "False", "True", "True"]


def test_a_failed_warm_up_is_logged_and_start_up_goes_on(memproxy_records) -> None:
    class Broken(Manager):
        def model_for(self, request_model: str) -> Any:
            raise RuntimeError("no model here")

    main._warm(Broken(Settings(), http_client=None))  # type: ignore[arg-type]
    assert any("warming the Manager up failed" in r.getMessage() for r in memproxy_records)
