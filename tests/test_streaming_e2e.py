"""Streaming over real sockets: memproxy and the fake upstream each on a loopback uvicorn."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import orjson
import pytest

from app.devtools.fake_upstream import FakeUpstream
from app.proxy.hooks import Outcome
from tests.helpers import RecordingHooks
from tests.servers import Stack, serve_stack

STREAM_BODY = {
    "model": "fake-model",
    "stream": True,
    "messages": [{"role": "user", "content": "tell me a story"}],
}


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    with serve_stack() as running:
        yield running


@pytest.fixture(scope="module")
def fake(stack: Stack) -> tuple[FakeUpstream, str]:
    return stack.fake, stack.upstream_url.removesuffix("/v1")


@pytest.fixture(scope="module")
def proxy_url(stack: Stack) -> str:
    return stack.proxy_url


def _events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e.strip()]


def test_stream_matches_direct_call(fake: tuple[FakeUpstream, str], proxy_url: str) -> None:
    direct = httpx.post(f"{fake[1]}/v1/chat/completions", json=STREAM_BODY)
    proxied = httpx.post(f"{proxy_url}/v1/chat/completions", json=STREAM_BODY)
    assert proxied.headers["content-type"].startswith("text/event-stream")
    strip = [orjson.loads(e[6:]) if e != b"data: [DONE]" else e for e in _events(direct.content)]
    got = [orjson.loads(e[6:]) if e != b"data: [DONE]" else e for e in _events(proxied.content)]
    for event in (*strip, *got):  # `created` is a timestamp: a second may pass between the calls
        if isinstance(event, dict):
            event.pop("created")
    assert got == strip


def test_upstream_failing_mid_stream_ends_with_one_error_event(proxy_url: str) -> None:
    raw = b""
    with (
        pytest.raises(httpx.RemoteProtocolError),  # then the connection breaks: never a clean end
        httpx.stream(
            "POST",
            f"{proxy_url}/v1/chat/completions",
            json=STREAM_BODY,
            headers={"x-fake-fail-after": "3"},
        ) as response,
    ):
        assert response.status_code == 200
        for chunk in response.iter_raw():
            raw += chunk
    events = _events(raw)
    # The three whole events, never the half one the upstream wrote, then exactly one error.
    assert len(events) == 4
    for event in events[:3]:
        assert "choices" in orjson.loads(event.removeprefix(b"data: "))
    final = orjson.loads(events[-1].removeprefix(b"data: "))
    assert set(final["error"]) == {"message", "type", "param", "code"}
    assert final["error"]["code"] == "upstream_disconnected"
    assert raw.endswith(b"\n\n")
    # The server keeps serving.
    ok = httpx.post(f"{proxy_url}/v1/chat/completions", json={**STREAM_BODY, "stream": False})
    assert ok.json()["choices"][0]["message"]["content"] == "echo: tell me a story"


def _disconnect_after_first_bytes(url: str, headers: dict[str, str], wait_for_bytes: bool) -> float:
    """Send a raw streaming request, optionally read the first bytes, then drop the socket."""
    host, port = url.removeprefix("http://").split(":")
    body = orjson.dumps(STREAM_BODY)
    extra = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body
    sock = socket.create_connection((host, int(port)))
    sock.sendall(request)
    if wait_for_bytes:
        sock.settimeout(5)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    else:
        time.sleep(0.3)  # the upstream is "thinking": no headers yet
    sock.close()
    return time.monotonic()


@pytest.mark.parametrize(
    ("headers", "wait_for_bytes"),
    [
        ({"x-fake-delay-ms": "300", "x-fake-chunks": "50"}, True),
        ({"x-fake-hang-ms": "30000"}, False),
    ],
    ids=["mid-stream", "before-first-byte"],
)
def test_client_disconnect_closes_upstream_within_a_second(
    fake: tuple[FakeUpstream, str], proxy_url: str, headers: dict[str, str], wait_for_bytes: bool
) -> None:
    upstream = fake[0]
    before = len(upstream.disconnects)
    left_at = _disconnect_after_first_bytes(proxy_url, headers, wait_for_bytes)
    deadline = left_at + 1.0
    while len(upstream.disconnects) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(upstream.disconnects) == before + 1, "upstream never saw the client leave"
    assert upstream.disconnects[-1] - left_at < 1.0
    assert httpx.get(f"{proxy_url}/healthz").status_code == 200


def test_events_split_across_reads_arrive_whole(
    fake: tuple[FakeUpstream, str], proxy_url: str
) -> None:
    headers = {"x-fake-delay-ms": "20", "x-fake-split": "1"}
    with httpx.stream(
        "POST", f"{fake[1]}/v1/chat/completions", json=STREAM_BODY, headers=headers
    ) as direct:
        direct_chunks = list(direct.iter_raw())
    assert not all(chunk.endswith(b"\n\n") for chunk in direct_chunks)  # the upstream does split
    with httpx.stream(
        "POST", f"{proxy_url}/v1/chat/completions", json=STREAM_BODY, headers=headers
    ) as proxied:
        chunks = list(proxied.iter_raw())
    assert all(chunk.endswith(b"\n\n") for chunk in chunks)
    assert len(_events(b"".join(chunks))) == len(_events(b"".join(direct_chunks)))


def test_client_leaving_mid_stream_is_reported_to_the_completion_hook() -> None:
    hooks = RecordingHooks()
    with serve_stack(hooks=hooks) as stack:
        _disconnect_after_first_bytes(
            stack.proxy_url, {"x-fake-delay-ms": "200", "x-fake-chunks": "20"}, True
        )
        deadline = time.monotonic() + 5
        while not hooks.completed and time.monotonic() < deadline:
            time.sleep(0.02)
        httpx.post(f"{stack.proxy_url}/v1/chat/completions", json={**STREAM_BODY, "stream": False})
        while len(hooks.completed) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
    (_, left), (_, finished) = hooks.completed
    assert left.outcome is Outcome.CLIENT_DISCONNECTED
    # Only what was relayed before the client left (here at most the first events).
    assert "echo: tell me a story".startswith(left.assistant_text)
    assert left.assistant_text != "echo: tell me a story"
    assert (
        finished.outcome is Outcome.COMPLETED and finished.assistant_text == "echo: tell me a story"
    )
