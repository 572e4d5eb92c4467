"""The Manager's answers are read up to ``MEMPROXY_MANAGER_MAX_ANSWER_BYTES``: a bigger answer
(declared by its Content-Length, or streamed past the cap) fails the call at once, after reading
about the cap and no more, and the job fails like any Manager failure, naming the cap."""

from __future__ import annotations

import io
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2
import orjson
import pytest
import respx
from pydantic_ai import models

from app.config import Settings
from app.log import memproxy_handler
from app.main import create_app
from app.memory.learning.jobs import JobQueue
from app.memory.learning.manager import Manager, ManagerUnavailable, build_http_client
from tests.conftest import make_settings
from tests.fakes import FakeEmbedder
from tests.helpers import completion_json, running
from tests.memory.learning.manager_conversation import conversation
from tests.memory.learning.test_manager_wire import until
from tests.servers import serve

CAP = 256 * 1024
CHUNK = 64 * 1024
HUGE = 20 * 1024 * 1024
ANSWER = {"id": "x", "object": "chat.completion", "created": 1, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {
              "role": "assistant", "content": '{"operations": []}'}}]}  # fmt: skip


@pytest.fixture
def allow_http_models() -> Iterator[None]:
    models.ALLOW_MODEL_REQUESTS = True
    yield
    models.ALLOW_MODEL_REQUESTS = False


class Endless(httpx2.AsyncByteStream):
    """A 20 MB answer, counting the bytes the client pulled from it."""

    def __init__(self) -> None:
        self.read = 0

    async def __aiter__(self) -> AsyncIterator[bytes]:
        chunk = b" " * CHUNK
        while self.read < HUGE:
            self.read += len(chunk)
            yield chunk


@pytest.mark.usefixtures("allow_http_models")
@pytest.mark.parametrize("declared", [False, True])
async def test_an_answer_over_the_cap_fails_the_call_after_reading_about_the_cap(
    declared: bool,
) -> None:
    streams: list[Endless] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        if request.method == "GET":  # the Manager asks the model's size: none given
            return httpx2.Response(404)
        streams.append(Endless())
        headers = {"content-length": str(HUGE)} if declared else {}
        return httpx2.Response(200, headers=headers, stream=streams[-1])

    settings = Settings(upstream_base_url="http://manager.test/v1", manager_max_retries=0,
                             manager_max_answer_bytes=CAP)  # fmt: skip
    async with build_http_client(settings, transport=httpx2.MockTransport(handle)) as http:
        with pytest.raises(ManagerUnavailable) as raised:
            await Manager(settings, http_client=http).decide("m", **conversation())
    assert str(raised.value) == (
        "manager at http://manager.test/v1 (model m): answer larger than 262144 bytes "
        "(MEMPROXY_MANAGER_MAX_ANSWER_BYTES)"
    )
    (stream,) = streams  # neither the SDK nor another output mode asked again
    assert stream.read == (0 if declared else CAP + CHUNK)  # the cap, and the chunk that passed it


@pytest.mark.usefixtures("allow_http_models")
async def test_an_answer_under_the_cap_is_read_as_usual_and_asks_for_no_compression() -> None:
    sent: list[httpx2.Request] = []

    def handle(request: httpx2.Request) -> httpx2.Response:
        sent.append(request)
        return httpx2.Response(200, content=orjson.dumps(ANSWER))

    settings = Settings(upstream_base_url="http://manager.test/v1", manager_max_answer_bytes=1024)
    async with build_http_client(settings, transport=httpx2.MockTransport(handle)) as http:
        assert await Manager(settings, http_client=http).decide("m", **conversation()) == []
    # what is counted is what the answer becomes: a compressed one could grow past the cap
    assert sent[0].headers["accept-encoding"] == "identity"


async def huge_manager(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """A Manager's server on loopback answering 20 MB to every request (read or not)."""
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})  # fmt: skip
    for _ in range(HUGE // CHUNK):
        await send({"type": "http.response.body", "body": b" " * CHUNK, "more_body": True})
    await send({"type": "http.response.body", "body": b"", "more_body": False})


@pytest.mark.usefixtures("allow_http_models")
async def test_a_job_whose_manager_answers_20_mb_is_parked_naming_the_cap(
    upstream: respx.Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json("Noted."))
    log = io.StringIO()
    with serve(huge_manager) as manager_url:
        settings = make_settings(
            manager_enabled=True, processing_interval=0, conversation_threshold=1,
            manager_base_url=f"{manager_url}/v1", manager_model="qwen", manager_job_attempts=1,
            manager_max_retries=0, manager_max_answer_bytes=CAP,
        )  # fmt: skip
        app = create_app(
            settings,
            upstream_transport=httpx.MockTransport(upstream.async_handler),
            embedder=FakeEmbedder(),
        )
        monkeypatch.setattr(memproxy_handler(), "stream", log)
        async with running(app) as client:
            queue: JobQueue = app.state.services.jobs
            body = {"model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}]}
            await client.post("/v1/chat/completions", json=body, headers={"X-User-Id": "ann"})

            async def parked() -> bool:
                return (await queue.counts())["failed"] == 1

            await until(parked)
            ((_job, _user, reason, _answer),) = await queue.failed()
            listed = (await client.get("/v1/memories/jobs", headers={"X-User-Id": "ann"})).json()
    assert reason.endswith(": answer larger than 262144 bytes (MEMPROXY_MANAGER_MAX_ANSWER_BYTES)")
    assert listed["data"][0]["error"] == reason
    assert "Traceback" not in log.getvalue()
