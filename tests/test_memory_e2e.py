"""Memory end to end on real servers: memproxy and the fake upstream under uvicorn on loopback,
driven by the official `openai` SDK, with the real embedding model in its production
configuration (memories fp32, queries int8)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from app.config import Settings
from app.memory.block import BLOCK_START
from app.memory.search.embedder import PairedEmbedder, TextEmbedder, load_embedder
from tests.servers import Stack, serve_stack

MEMORIES = [
    "I moved to Oslo with my two kids last spring.",
    "I work as a night-shift nurse at the university hospital.",
    "My daughter Mia plays the violin and has a recital in June.",
    "I'm allergic to peanuts.",
    "We have a ginger cat called Tom.",
]


@pytest.fixture(scope="module")
def embedder(model_cache: Path) -> Iterator[TextEmbedder]:
    loaded = load_embedder(Settings(embedding_cache_dir=str(model_cache)))
    assert isinstance(loaded, PairedEmbedder)  # the default: int8 queries over fp32 memories
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def stack(embedder: TextEmbedder) -> Iterator[Stack]:
    with serve_stack(embedder=embedder) as running:
        response = httpx.post(
            f"{running.proxy_url}/v1/memories/batch",
            json={"memories": [{"content": m} for m in MEMORIES]},
            headers={"X-User-Id": "alice"},
        )
        assert response.status_code == 201, response.text
        yield running


def system_sent(stack: Stack) -> str:
    messages = stack.fake.received[-1].json()["messages"]
    return str(messages[0]["content"]) if messages[0]["role"] == "system" else ""


@pytest.mark.parametrize(("question", "expected"), [
    ("How can Mia get ready for her recital?", "Mia plays the violin"),
    ("Any tips for sleeping during the day after work?", "night-shift nurse"),
], ids=["violin", "night shift"])  # fmt: skip
def test_the_sdk_chat_gets_the_relevant_memory(stack: Stack, question: str, expected: str) -> None:
    client = openai.OpenAI(base_url=f"{stack.proxy_url}/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="fake-model", messages=[{"role": "user", "content": question}], user="alice"
    )
    assert raw.parse().choices[0].message.content == f"echo: {question}"
    assert int(raw.headers["x-memories-injected"]) >= 1
    system = system_sent(stack)
    assert system.startswith(BLOCK_START) and expected in system
    assert "ginger cat" not in system  # unrelated memories stay out


def test_streaming_through_the_sdk_recalls_too(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.proxy_url}/v1", api_key="unused", max_retries=0)
    stream = client.chat.completions.create(
        model="fake-model",
        messages=[{"role": "system", "content": "Be brief."},
                  {"role": "user", "content": "Which snacks are safe for me with my food allergy?"}],
        stream=True,
        extra_headers={"X-User-Id": "alice"},
    )  # fmt: skip
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.startswith("echo: Which snacks are safe")
    system = system_sent(stack)
    assert system.startswith("Be brief.\n\n") and "allergic to peanuts" in system


def test_an_unrelated_question_or_another_user_gets_nothing(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.proxy_url}/v1", api_key="unused", max_retries=0)
    for question, user in (("What is the capital of Australia?", "alice"),
                           ("How can Mia get ready for her recital?", "bob")):  # fmt: skip
        raw = client.chat.completions.with_raw_response.create(
            model="fake-model", messages=[{"role": "user", "content": question}], user=user
        )
        assert raw.headers["x-memories-injected"] == "0"
        assert BLOCK_START not in str(stack.fake.received[-1].json()["messages"])
