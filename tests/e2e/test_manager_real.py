"""The Manager with a real small model, in each output mode: scripted chats through memproxy,
asserting on what was stored (a fact is there, the assistant's words are not), never on the
exact wording a model chose."""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from app.main import create_app
from app.memory.learning.third_person import FIRST_PERSON
from app.memory.search.embedder import TextEmbedder
from app.memory.search.windows import day_text
from bench.llm_server import LlamaServer
from tests.e2e.conftest import _server, proxy_settings
from tests.servers import serve

MANAGER_MODEL = "qwen1.5b"
"""The smallest model here that extracts facts usefully (the 0.5B mostly copies or misses)."""


@pytest.fixture(scope="module")
def manager_llm() -> Iterator[LlamaServer]:
    yield from _server(MANAGER_MODEL)


class Chat:
    """One user's chats through a memproxy whose Manager is the real model."""

    def __init__(self, url: str, user: str, model: str) -> None:
        self.url, self.user, self.model = url, {"X-User-Id": user}, model

    def say(self, text: str, *, wait: bool = True) -> str:
        body = {"model": self.model, "temperature": 0, "seed": 1, "max_tokens": 60,
                "messages": [{"role": "user", "content": text}]}  # fmt: skip
        reply = httpx.post(f"{self.url}/chat/completions", json=body, headers=self.user,
                           timeout=300)  # fmt: skip
        assert reply.status_code == 200, reply.text
        answer = str(reply.json()["choices"][0]["message"]["content"])
        print("said:", text, "answered:", answer)  # shown with -s, and on a failure
        if wait:
            self.learned()
        return answer

    def learned(self, seconds: float = 600) -> None:
        """Wait until every job of the user has been applied (or parked: that fails below)."""
        deadline = time.monotonic() + seconds
        while True:
            jobs = self.stats()["jobs"]
            if jobs["pending"] == 0:
                assert jobs["failed"] == 0, jobs["failures"]
                return
            assert time.monotonic() < deadline, jobs
            time.sleep(0.5)

    def stats(self) -> dict[str, Any]:
        found: dict[str, Any] = httpx.get(f"{self.url}/memories/stats", headers=self.user).json()
        return found

    def memories(self, *, episodes: bool = False) -> list[str]:
        """The facts the Manager wrote; with `episodes`, the user's words kept beside them."""
        listed = httpx.get(f"{self.url}/memories", headers=self.user,
                           params={"limit": 100}).json()["data"]  # fmt: skip
        found = [str(m["content"]) for m in listed if (m["type"] == "episode") == episodes]
        print("episodes:" if episodes else "memories:", found)  # shown with -s, and on a failure
        return found


@contextmanager
def memproxy(
    llm: LlamaServer, manager: LlamaServer, embedder: TextEmbedder, mode: str, **more: Any
) -> Iterator[Chat]:
    """A fresh memproxy: chats go to the 0.5B, the Manager is the 1.5B in one output mode."""
    with tempfile.TemporaryDirectory() as data:
        settings = proxy_settings(
            llm, data, manager_enabled=True, manager_base_url=manager.base_url,
            manager_model=manager.alias, manager_output_mode=mode,
            processing_interval=0, conversation_threshold=1, manager_job_attempts=1, **more,
        )  # fmt: skip
        with serve(create_app(settings, embedder=embedder)) as url:
            yield Chat(f"{url}/v1", "e2e-manager", llm.alias)


def has(memories: list[str], *words: str) -> bool:
    return any(all(w.lower() in m.lower() for w in words) for m in memories)


@pytest.mark.parametrize(
    ("mode", "steps"), [("json_schema", "two"), ("json_schema", "one"), ("prompted", "two")]
)
def test_a_scripted_chat_is_learned_corrected_and_forgotten(
    llm: LlamaServer, manager_llm: LlamaServer, embedder: TextEmbedder, mode: str, steps: str
) -> None:
    """One user's chats, each a new conversation, each learned before the next: two facts in
    one sentence, an explicit "remember", a correction that must replace the old fact, "forget
    that", and small talk that must change nothing. `json_schema` is what `auto` picks with
    llama.cpp; `prompted` is JSON asked for in the instructions only. `two` is the two-step
    Manager (what `auto` gives the 1.5B), `one` the one-call Manager of larger models. Asserted
    on what is stored (words that must or must not be there), never on the wording a model
    chose.

    The chat model answers "Remember that my daughter Mia..." with "I'm sorry, but I can't
    assist with that", and the 1.5B then often answers no operation: the request is stored in
    the user's words all the same (`grounding.with_requests`)."""
    with memproxy(llm, manager_llm, embedder, mode, manager_steps=steps) as chat:
        answer = chat.say("I am vegetarian and I live in Lyon.")
        stated = chat.memories()
        assert has(stated, "vegetarian") and has(stated, "Lyon"), stated
        assert not any(answer[:30].lower() in m.lower() for m in stated), (answer, stated)
        assert not any(m.startswith(("USER:", "ASSISTANT:", "Current date")) for m in stated)

        chat.say("Remember that my daughter Mia turns 7 on 3 May.")
        remembered = chat.memories()
        assert has(remembered, "Mia", "May"), remembered
        assert has(remembered, "vegetarian") and has(remembered, "Lyon"), remembered

        chat.say("I have moved: I live in Paris now, not in Lyon any more.")
        moved = chat.memories()
        assert has(moved, "Paris"), moved
        assert not any("lyon" in m.lower() and "paris" not in m.lower() for m in moved), moved
        assert has(moved, "vegetarian") and has(moved, "Mia"), moved

        chat.say("Please forget that I am vegetarian.")
        forgot = chat.memories()
        assert not has(forgot, "vegetarian"), forgot
        assert has(forgot, "Paris"), forgot
        said = chat.memories(episodes=True)  # the words it came from went with it
        assert not has(said, "vegetarian") and has(said, "Paris"), said

        chat.say("Thanks, that's all for now. Have a nice evening!")
        assert sorted(chat.memories()) == sorted(forgot)


def test_a_mode_the_server_cannot_keep_parks_the_job_with_the_answer(
    llm: LlamaServer, manager_llm: LlamaServer, embedder: TextEmbedder
) -> None:
    """llama.cpp does not enforce `tool_choice`: Qwen answers the call as JSON text, never a
    tool call. In `tool` mode that is no usable answer: the job is parked, the answer kept, the
    turns not lost (in `auto` mode the next mode takes over)."""
    # Answers cut at 200 tokens: the text-not-a-call is unusable whatever its length, and a
    # 1,024-token one takes minutes on a busy machine (past the call's own timeout).
    with memproxy(llm, manager_llm, embedder, "tool", manager_max_tokens=200) as chat:
        chat.say("I am vegetarian and I live in Lyon.", wait=False)
        deadline = time.monotonic() + 900
        while (jobs := chat.stats()["jobs"])["failed"] == 0:
            assert time.monotonic() < deadline, jobs
            time.sleep(1)
        (failure,) = jobs["failures"]
        assert failure["answer"] and "tool" in failure["reason"], failure
        assert jobs["pending"] == 0 and chat.memories() == []


def test_small_talk_a_relative_date_and_a_preference_are_written_as_a_person_would(
    llm: LlamaServer, manager_llm: LlamaServer, embedder: TextEmbedder
) -> None:
    """Greetings, thanks and questions among two facts, one with "yesterday": what the two-step
    Manager stores (`auto` with the 1.5B) is the facts, in the third person, the day written
    out; no greeting, no first person, nothing of the small talk."""
    with memproxy(llm, manager_llm, embedder, "json_schema") as chat:
        chat.say("Hi there! How are you today?")
        assert chat.memories() == []
        chat.say("Hey! Yesterday I adopted a cat named Luna. Thanks for asking!")
        chat.say("Haha, nice. By the way, I really love spicy Thai food. Anyway, how is the "
                 "weather where you are?")  # fmt: skip
        stored = chat.memories()
        yesterday = day_text(datetime.now(UTC).date() - timedelta(days=1))
        assert any("luna" in m.lower() and yesterday in m for m in stored), (yesterday, stored)
        assert has(stored, "Thai"), stored
        assert not any(FIRST_PERSON.search(m) for m in stored), stored
        assert not any(re.match(r"\W*(?:hi|hey|hello|thanks)\b", m, re.I) for m in stored), stored
        assert not has(stored, "weather") and not has(stored, "how are you"), stored
        assert not has(stored, "yesterday"), stored
