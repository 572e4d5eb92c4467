"""The fake upstream's Manager (app/devtools/fake_manager.py): which sentences of the user become
which operations, read from the prompt the real Manager builds; both output styles through the
real Manager; and a whole chat -> job -> Worker -> stored memory run on loopback servers."""

from __future__ import annotations

import select
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

import httpx
import httpx2
import orjson
import pytest
from pydantic_ai import models

from app.config import Settings
from app.devtools.fake_manager import decisions, third_person
from app.devtools.fake_upstream import FakeUpstream
from app.memory.learning.decisions import Op
from app.memory.learning.manager import Manager
from app.memory.learning.prompt import INSTRUCTIONS, Shown, build_prompt
from app.memory.learning.turns import turn
from tests.helpers import free_port
from tests.servers import serve_stack

NOW = datetime(2026, 11, 22, 15, 4, tzinfo=UTC)
MEMORIES = ["The user plays chess", "The user lives in Oslo", "The user's daughter is Mia"]


def manager_messages(
    said: str, memories: list[str] = MEMORIES, role_aware: bool = True, earlier: str = ""
) -> list[dict[str, Any]]:
    """The messages the Manager sends: its instructions, then the prompt build_prompt makes."""
    prompt = build_prompt(
        now=NOW,
        memories=[Shown(i, text, "fact", NOW) for i, text in enumerate(memories, 1)],
        context=[turn("user", earlier), turn("assistant", "ok")] if earlier else [],
        new=[turn("user", said), turn("assistant", f"echo: {said}. I am a robot, my name is Bot")],
        role_aware=role_aware,
    )
    return [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": prompt}]


@pytest.mark.parametrize(("said", "operations"), [
    ("Remember that I play chess", []),  # already a memory: no duplicate
    ("Please remember that I play the piano.", [("NEW", "The user plays the piano", "fact")]),
    ("Don't forget that my cat is called Tom", [("NEW", "The user's cat is called Tom", "fact")]),
    ("remember I'm allergic to peanuts", [("NEW", "The user is allergic to peanuts", "fact")]),
    ("I am a nurse. I live in Bergen!", [("NEW", "The user is a nurse", "fact"),
                                         ("NEW", "The user lives in Bergen", "fact")]),
    ("I love hiking and I like tea", [("NEW", "The user loves hiking and the user likes tea",
                                       "preference")]),
    ("My son is Leo; my son is Leo.", [("NEW", "The user's son is Leo", "fact")]),
    ("Forget that I live in Oslo", [("DELETE", 2)]),
    ("Please forget about Mia.", [("DELETE", 3)]),
    ("forget about my daughter. Forget that my daughter is Mia", [("DELETE", 3)]),
    ("Forget about golf", []),  # matches no memory
    ("What game do I play?", []),
    ("Am I in Oslo? My cat, is it fine?", []),  # questions are no statements
    ("Hello! The weather is nice.", []),
], ids=lambda v: v if isinstance(v, str) else "")  # fmt: skip
def test_the_users_sentences_become_these_operations(said: str, operations: list[Any]) -> None:
    answer = decisions(manager_messages(said))
    assert answer is not None
    got = [(o["op"], o["content"], o["type"]) if o["op"] == "NEW" else (o["op"], o["id"])
           for o in answer["operations"]]  # fmt: skip
    assert got == operations


def test_only_the_users_new_words_count() -> None:
    """The assistant's reply ("I am a robot, my name is Bot") and the earlier, already processed
    turns are not the user's new words; without role awareness the user's lines still are."""
    answer = decisions(manager_messages("Hi there", earlier="Remember that I play golf"))
    assert answer == {"operations": []}
    answer = decisions(manager_messages("I play golf", role_aware=False))
    assert answer == {
        "operations": [{"op": "NEW", "content": "The user plays golf", "type": "fact"}]
    }


def test_forget_picks_the_memory_sharing_the_most_words() -> None:
    memories = ["The user plays chess", "The user plays chess on Sundays with Tom", "Likes tea"]
    for said, alias in (("Forget that I play chess on Sundays", 2), ("forget about tea", 3),
                        ("Forget that I play chess", 1)):  # fmt: skip
        assert decisions(manager_messages(said, memories)) == {
            "operations": [{"op": "DELETE", "id": alias}]
        }


def test_the_third_person_is_a_small_word_swap() -> None:
    assert third_person("I play chess.") == "The user plays chess"
    assert third_person("my wife and I watch films with me") == (
        "The user's wife and the user watches films with them"
    )
    assert third_person("I've got two kids, I don't eat meat and I no longer fly") == (
        "The user has got two kids, the user doesn't eat meat and the user no longer flies"
    )
    assert third_person("I moved to Oslo and I can swim") == (
        "The user moved to Oslo and the user can swim"
    )


async def test_other_requests_get_the_usual_answers() -> None:
    """Only the Manager's prompt is answered with decisions; a chat with tools still gets the tool
    call with the query, a plain chat its echo (with the system messages when asked)."""
    fake = FakeUpstream()
    chat = {"model": "m", "messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": "Remember that I play chess"}]}  # fmt: skip
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=fake), base_url="http://f") as c:
        plain = (await c.post("/v1/chat/completions", json=chat)).json()
        shown = await c.post("/v1/chat/completions", json=chat, headers={"X-Fake-Echo-System": "1"})
        called = (await c.post("/v1/chat/completions", json={**chat, "tools": tools})).json()
    assert plain["choices"][0]["message"]["content"] == "echo: Remember that I play chess"
    assert shown.json()["choices"][0]["message"]["content"] == (
        "echo: Remember that I play chess\nsystem: Be brief."
    )
    call = called["choices"][0]["message"]["tool_calls"][0]["function"]
    assert orjson.loads(call["arguments"]) == {"query": "Remember that I play chess"}


@pytest.mark.parametrize("provider", ["openai", "ollama"])
async def test_the_real_manager_reads_the_fakes_answer(
    provider: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either provider, in the default output mode (auto): JSON content held to the schema."""
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)
    fake = FakeUpstream()
    said = "Remember that I play go. Forget that I live in Oslo"
    shown = [Shown(i, text, "fact", NOW) for i, text in enumerate(MEMORIES, 1)]
    settings = Settings(upstream_base_url="http://fake.test/v1", manager_provider=provider,
                        manager_max_retries=0)  # fmt: skip
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=fake)) as http:
        operations = await Manager(settings, http_client=http).decide(
            "fake-model", memories=shown, context=[], new=[turn("user", said)], now=NOW
        )
    assert operations is not None
    assert [(o.op, o.id, o.content) for o in operations] == [
        (Op.NEW, None, "The user plays go"), (Op.DELETE, 2, None)
    ]  # fmt: skip
    sent = fake.received[-1].json()  # auto: the schema enforced by the server, for both
    assert sent["response_format"]["type"] == "json_schema" and "tools" not in sent


def test_a_remembered_fact_is_stored_through_the_real_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """memproxy with its Manager on, the fake on loopback as both the chat upstream and the
    Manager: "Remember that I play chess" ends as a memory the Manager made, and "forget" ends it."""
    monkeypatch.setattr(models, "ALLOW_MODEL_REQUESTS", True)  # the model server is the fake

    def memories(proxy: str) -> list[dict[str, Any]]:
        listed = httpx.get(f"{proxy}/v1/memories", headers={"X-User-Id": "alice"}).json()
        return [m for m in listed["data"] if m["type"] != "episode"]  # the facts

    def chat(proxy: str, text: str) -> None:
        body = {"model": "fake-model", "messages": [{"role": "user", "content": text}]}
        response = httpx.post(f"{proxy}/v1/chat/completions", json=body,
                              headers={"X-User-Id": "alice"})  # fmt: skip
        assert response.status_code == 200, response.text

    def wait_until(condition: Any) -> None:
        deadline = time.monotonic() + 30  # a bound, not a measurement
        while not condition():
            assert time.monotonic() < deadline, "the Manager's job did not apply"
            time.sleep(0.05)

    with serve_stack(manager_enabled=True) as stack:
        chat(stack.proxy_url, "Remember that I play chess")
        wait_until(lambda: memories(stack.proxy_url))
        [memory] = memories(stack.proxy_url)
        assert (memory["content"], memory["source"]) == ("The user plays chess", "manager")
        chat(stack.proxy_url, "Forget that I play chess")
        wait_until(lambda: not memories(stack.proxy_url))
        # the fact took the words it came from along ("forget" keeps none of its own)
        listed = httpx.get(f"{stack.proxy_url}/v1/memories", headers={"X-User-Id": "alice"})
        assert listed.json()["data"] == []


def test_the_command_says_where_it_listens_once_it_does() -> None:
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "fake-upstream", "--port", str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        printed, _, _ = select.select([process.stdout], [], [], 60)
        assert printed, "fake-upstream printed nothing in 60 s"
        line = process.stdout.readline().rstrip("\n")
        url = f"http://127.0.0.1:{port}"
        assert line == f"fake upstream listening on {url} (OpenAI base URL: {url}/v1)"
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 200  # already listening
    finally:
        process.terminate()
        process.wait(timeout=30)
