"""Stopping `memproxy serve` with answers under way, and the access line of an answer that did
not end whole: memproxy under uvicorn with `memproxy serve`'s options (in a thread, or as a
process sent SIGINT), the fake upstream slow, on loopback."""

from __future__ import annotations

import io
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import uvicorn

from app.config import Settings
from app.devtools.fake_upstream import FakeUpstream
from app.main import create_app
from app.proxy.hooks import Outcome
from app.server import uvicorn_options
from tests import databases
from tests.fakes import FakeEmbedder
from tests.helpers import RecordingHooks, free_port
from tests.log_capture import capture, log_fixture  # noqa: F401 (the `log` fixture)
from tests.servers import serve

ROOT = Path(__file__).parent.parent
STORY = "tell me a long story about the sea, the ships and the sailors"
STREAM = {"model": "fake-model", "stream": True, "messages": [{"role": "user", "content": STORY}]}
SLOW = {"x-fake-delay-ms": "300", "x-fake-chunks": "40"}
"""A stream of ~12 s: far longer than any grace here."""


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextmanager
def memproxy(
    upstream: str, hooks: RecordingHooks | None = None, **overrides: Any
) -> Iterator[tuple[str, uvicorn.Server, _Records]]:
    """memproxy forwarding to `upstream`, as `memproxy serve` runs it, in a thread: its URL, the
    server (to stop it: `should_exit`), and what uvicorn's error logger let through."""
    settings = Settings(
        upstream_base_url=f"{upstream}/v1", manager_enabled=False, upstream_check_at_start=False,
        **overrides,
    )  # fmt: skip
    app = create_app(settings, hooks=hooks, embedder=FakeEmbedder())
    config = uvicorn.Config(app, host="127.0.0.1", port=0, **uvicorn_options(settings))
    server = uvicorn.Server(config)
    errors = _Records()
    uvicorn_errors = logging.getLogger("uvicorn.error")
    uvicorn_errors.addHandler(errors)  # after uvicorn's logging config, which replaces handlers
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait(lambda: server.started or not thread.is_alive(), "the server did not start")
        yield f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", server, errors
    finally:
        server.should_exit = True
        thread.join(30)
        uvicorn_errors.removeHandler(errors)
    assert not thread.is_alive(), "the server did not stop"


def _wait(condition: Callable[[], object], failure: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, failure
        time.sleep(0.02)


def _events(raw: bytes) -> list[bytes]:
    return [e.removeprefix(b"data: ") for e in raw.split(b"\n\n") if e.strip()]


def _access_line(log: io.StringIO) -> str:
    _wait(lambda: "memproxy.access" in log.getvalue(), "no access line")
    return next(line for line in log.getvalue().splitlines() if "memproxy.access" in line)


@pytest.mark.parametrize("grace", [0.5, 0], ids=["grace", "no-grace"])
def test_a_stream_going_at_the_end_of_the_grace_ends_with_an_error_event(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, grace: float
) -> None:
    hooks = RecordingHooks()
    raw = b""
    with (
        serve(FakeUpstream()) as upstream,
        memproxy(upstream, hooks, shutdown_grace_seconds=grace) as (url, server, errors),
    ):
        capture(log, monkeypatch)
        with (
            pytest.raises(httpx.RemoteProtocolError),  # a broken answer, never a short one
            httpx.stream(
                "POST", f"{url}/v1/chat/completions", json=STREAM, headers=SLOW, timeout=30
            ) as response,
        ):
            assert response.status_code == 200
            for chunk in response.iter_raw():
                raw += chunk
                server.should_exit = True  # memproxy is stopped mid-stream
    *answer, last = _events(raw)
    assert answer and all(b'"choices"' in event for event in answer)  # whole events, then:
    error = orjson.loads(last)["error"]
    assert error["code"] == "shutting_down" and error["type"] == "server_error"
    assert "MEMPROXY_SHUTDOWN_GRACE_SECONDS" in error["message"]
    line = _access_line(log)
    assert " POST /v1/chat/completions 200 " in line and line.endswith(" ended=shutdown")
    # The exchange reached its hook before the lifespan ended (a Manager job is handed back).
    [(_, completion)] = hooks.completed
    assert completion.outcome is Outcome.SHUTDOWN
    assert not [r for r in errors.records if r.levelno >= logging.ERROR]
    assert "Traceback" not in log.getvalue()


def test_an_answer_not_begun_at_the_end_of_the_grace_is_a_503(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    hooks = RecordingHooks()
    fake = FakeUpstream()
    body = {**STREAM, "stream": False}
    with (
        serve(fake) as upstream,
        memproxy(upstream, hooks, shutdown_grace_seconds=0.2) as (url, server, errors),
        ThreadPoolExecutor(1) as pool,
    ):
        capture(log, monkeypatch)
        answer = pool.submit(
            httpx.post, f"{url}/v1/chat/completions", json=body,
            headers={"x-fake-hang-ms": "20000"}, timeout=30,
        )  # fmt: skip
        _wait(lambda: fake.received, "the request never reached the upstream")
        server.should_exit = True
        response = answer.result()
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "shutting_down"
    line = _access_line(log)
    assert " POST /v1/chat/completions 503 " in line and line.endswith(" ended=shutdown")
    [(_, completion)] = hooks.completed
    assert completion.outcome is Outcome.SHUTDOWN
    assert not [r for r in errors.records if r.levelno >= logging.ERROR]


def _leave(url: str, headers: dict[str, str], *, after_head: bool) -> None:
    """A streamed chat whose client closes its socket (after the head, or before it came)."""
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps(STREAM)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(
            f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
            + body
        )
        if after_head:
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        else:
            time.sleep(0.3)  # the upstream is "thinking": nothing sent yet


@pytest.mark.parametrize(
    ("headers", "after_head"),
    [(SLOW, True), ({"x-fake-hang-ms": "20000"}, False)],
    ids=["mid-stream", "before-the-answer"],
)
def test_a_client_that_closes_first_is_logged_and_counted_499(
    log: io.StringIO, monkeypatch: pytest.MonkeyPatch, headers: dict[str, str], after_head: bool
) -> None:
    with serve(FakeUpstream()) as upstream, memproxy(upstream) as (url, _, errors):
        capture(log, monkeypatch)
        _leave(url, headers, after_head=after_head)
        line = _access_line(log)
        metrics = httpx.get(f"{url}/metrics").text
    assert " POST /v1/chat/completions 499 " in line and line.endswith(" ended=client_closed")
    assert 'route="/v1/chat/completions",status="499"' in metrics
    assert not [r for r in errors.records if r.levelno >= logging.ERROR]


def _lines(stream: Any, into: list[str]) -> None:
    for line in stream:
        into.append(line)


@pytest.mark.parametrize("signals", [1, 2], ids=["ctrl-c", "ctrl-c-twice"])
def test_ctrl_c_during_a_stream_prints_no_traceback(tmp_path: Path, signals: int) -> None:
    """The real process: one SIGINT ends the stream at the grace with its error event; a second
    one, while uvicorn waits for it, ends it at once; neither prints a traceback or an error."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMPROXY_")}
    env["PYTHONPATH"] = str(ROOT)
    grace = "1" if signals == 1 else "60"
    stderr: list[str] = []
    raw = b""
    with serve(FakeUpstream()) as upstream:
        process = subprocess.Popen(
            [sys.executable, "-m", "tests.signalled_server", str(port), f"{upstream}/v1",
             databases.url_in(tmp_path), grace],
            cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        reader = threading.Thread(target=_lines, args=(process.stderr, stderr), daemon=True)
        reader.start()
        try:
            _wait(lambda: "Uvicorn running" in "".join(stderr), "memproxy did not start", 60)
            url = f"http://127.0.0.1:{port}/v1/chat/completions"
            with (
                pytest.raises(httpx.RemoteProtocolError),
                httpx.stream("POST", url, json=STREAM, headers=SLOW, timeout=60) as response,
            ):
                for chunk in response.iter_raw():
                    if not raw:
                        process.send_signal(signal.SIGINT)
                        if signals == 2:
                            _wait(lambda: "Waiting for connections" in "".join(stderr), "no wait")
                            process.send_signal(signal.SIGINT)
                    raw += chunk
            process.wait(30)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        reader.join(10)
    text = "".join(stderr)
    assert "Traceback" not in text and "CancelledError" not in text, text
    assert "ERROR" not in text, text
    access = next(line for line in stderr if "memproxy.access" in line)
    assert access.rstrip().endswith(" ended=shutdown"), access
    if signals == 1:
        assert orjson.loads(_events(raw)[-1])["error"]["code"] == "shutting_down"
    else:
        assert "shutdown forced" in text


def test_the_log_filter_hides_only_what_shutdown_or_the_relay_meant(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Outside a shutdown a cancelled task is still an ERROR worth a traceback, and a body left
    unfinished by another route still logs uvicorn's complaint; the relay's own does not."""
    import asyncio
    import contextvars
    import logging

    from app import shutdown
    from app.log import ServerNoise

    def record(message: str, error: BaseException | None = None) -> logging.LogRecord:
        exc_info = (type(error), error, None) if error else None
        return logging.LogRecord("uvicorn.error", logging.ERROR, "", 0, message, (), exc_info)

    noise = ServerNoise()
    unfinished = "ASGI callable returned without completing response."
    cancelled = record("Exception in ASGI application", asyncio.CancelledError())
    monkeypatch.setattr(shutdown, "_begun_here", False)  # an earlier test's server stopped
    assert noise.filter(cancelled) and noise.filter(record(unfinished))
    monkeypatch.setattr(shutdown, "_begun_here", True)
    assert not noise.filter(cancelled)

    def relayed() -> bool:
        shutdown.leave_unfinished()
        return noise.filter(record(unfinished))

    assert not contextvars.copy_context().run(relayed)
    assert noise.filter(record(unfinished))  # another request's context: logged
