"""Which Manager a model gets under MEMPROXY_MANAGER_STEPS=auto: its size, from its name or from
what its server says (llama.cpp's /v1/models, Ollama's /api/show), asked once per model."""

from __future__ import annotations

from typing import Any

import httpx2
import pytest

from app.config import Settings
from app.memory.learning.model_size import Steps, billions_in_name

URL = "http://models.test/v1"


@pytest.mark.parametrize(("name", "size"), [
    ("qwen1.5b", 1.5), ("qwen2.5:0.5b", 0.5), ("Qwen/Qwen2.5-7B-Instruct", 7.0),
    ("llama3.2:3b", 3.0), ("mixtral-8x7b", 56.0), ("llama-3.1-70b-instruct", 70.0),
    ("qwen2.5-coder-1.5b-instruct-q4_k_m.gguf", 1.5), ("Qwen3-30B-A3B-Instruct", 30.0),
    ("qwen3:30b-a3b", 30.0), ("gpt-4o-mini", None), ("phi3:mini", None),
    ("gpt-3.5-turbo", None), ("m", None),
])  # fmt: skip
def test_the_size_a_model_s_name_gives(name: str, size: float | None) -> None:
    assert billions_in_name(name) == size


class Server:
    """A model server that answers the size questions with `answer` (or fails to connect)."""

    def __init__(self, answer: dict[str, Any] | None, status: int = 200) -> None:
        self.answer, self.status, self.asked = answer, status, 0

    def handle(self, request: httpx2.Request) -> httpx2.Response:
        self.asked += 1
        if self.answer is None:
            raise httpx2.ConnectError("refused", request=request)
        return httpx2.Response(self.status, json=self.answer)

    def steps(self, **settings: Any) -> Steps:
        http = httpx2.AsyncClient(transport=httpx2.MockTransport(self.handle))
        return Steps(Settings(upstream_base_url=URL, **settings), http, URL)


LLAMA_CPP = {"object": "list", "data": [{"id": "local", "object": "model",
             "meta": {"n_params": 1_543_714_304, "n_ctx_train": 32768}}]}  # fmt: skip


async def test_auto_reads_llama_cpp_s_parameter_count_once() -> None:
    server = Server(LLAMA_CPP)
    steps = server.steps()
    assert await steps.two("local") and await steps.two("local")
    assert server.asked == 1
    assert not await server.steps(manager_small_model_billions=1.0).two("local")


async def test_auto_reads_ollama_s_parameter_size() -> None:
    server = Server({"details": {"parameter_size": "1.5B", "family": "qwen2"}})
    assert await server.steps(manager_provider="ollama").two("mine")
    big = Server({"details": {"parameter_size": "70.6B"}})
    assert not await big.steps(manager_provider="ollama").two("mine")


async def test_a_model_named_small_is_not_asked_about_and_an_unknown_one_gets_one_call() -> None:
    server = Server({"object": "list", "data": [{"id": "gpt-4o-mini", "object": "model"}]})
    steps = server.steps()
    assert await steps.two("qwen2.5:1.5b") and server.asked == 0
    assert not await steps.two("gpt-4o-mini") and not await steps.two("gpt-4o-mini")
    assert server.asked == 1  # said nothing of its size: not asked again
    missing = Server({"error": "not found"}, status=404)
    once = missing.steps()
    assert not await once.two("x") and not await once.two("x") and missing.asked == 1


async def test_a_server_that_cannot_be_reached_is_asked_again_next_time() -> None:
    server = Server(None)
    steps = server.steps()
    assert not await steps.two("local") and not await steps.two("local")
    assert server.asked == 2
    server.answer = LLAMA_CPP
    assert await steps.two("local")


async def test_a_server_still_loading_its_model_is_asked_again() -> None:
    server = Server({"error": {"message": "Loading model"}}, status=503)
    steps = server.steps()
    assert not await steps.two("local") and not await steps.two("local")
    assert server.asked == 2
    server.answer, server.status = LLAMA_CPP, 200
    assert await steps.two("local")


async def test_one_and_two_are_taken_as_set_without_asking() -> None:
    server = Server(LLAMA_CPP)
    assert not await server.steps(manager_steps="one").two("qwen2.5:1.5b")
    assert await server.steps(manager_steps="two").two("gpt-4o")
    assert server.asked == 0
