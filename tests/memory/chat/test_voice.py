"""A question naming the user is searched in the user's voice (app/memory/chat/voice.py), when the
client says the user's name."""

from __future__ import annotations

import pytest
import respx

from app.memory.chat.voice import in_own_voice
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder
from tests.helpers import completion_json


@pytest.mark.parametrize(
    ("question", "name", "searched"),
    [
        ("What is Caroline's relationship status?", "Caroline", "What is my relationship status?"),
        ("When did Caroline go to the support group?", "Caroline",
         "When did I go to the support group?"),
        ("Who supports Caroline when she is down?", "Caroline", "Who supports me when she is down?"),
        ("What has Melanie painted?", "Melanie", "What have I painted?"),
        ("Is Evan a runner?", "Evan", "Am I a runner?"),
        ("Does Evan like hiking?", "Evan", "Do I like hiking?"),
        ("Caroline is moving where?", "Caroline Smith", "I am moving where?"),  # the given name
        ("Did Caroline Smith meet Mel?", "Caroline Smith", "Did I meet Mel?"),
        ("What did Melanie and Caroline do?", "Caroline", "What did Melanie and I do?"),
        ("Where is James' bike?", "James", "Where is my bike?"),
        ("Any plans for Zoë’s birthday?", "Zoë", "Any plans for my birthday?"),
        ("What did caroline say?", "caroline", "What did caroline say?"),  # as written: a capital
        # a name that is a word too: only its possessive
        ("Will you check Will's calendar?", "Will", "Will you check my calendar?"),
        ("May I see May's notes from May?", "May", "May I see my notes from May?"),
        # nothing to change
        ("What did Melanie paint?", "Caroline", "What did Melanie paint?"),
        ("Carolines are rare", "Caroline", "Carolines are rare"),
        ("When did Caroline go?", None, "When did Caroline go?"),
        ("When did Caroline go?", "", "When did Caroline go?"),
        ("When did Caroline go?", "!!", "When did Caroline go?"),
    ],
)  # fmt: skip
def test_the_question_in_the_users_voice(question: str, name: str | None, searched: str) -> None:
    assert in_own_voice(question, name) == searched


async def test_recall_searches_the_question_in_the_users_voice(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    upstream.post("/chat/completions").respond(json=completion_json())
    embedder = FakeEmbedder()
    client = await make_client(embedder=embedder)
    added = await client.post(
        "/v1/memories/batch",
        json={"memories": [{"content": "I joined a pottery class"},
                           {"content": "Glad you agree, Caroline"}]},
        headers={"X-User-Id": "caro"},
    )  # fmt: skip
    assert added.status_code == 201, added.text
    question = {"role": "user", "content": "What class did Caroline join?"}

    async def shown(headers: dict[str, str]) -> str:
        embedder.calls.clear()
        response = await client.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [question]},
            headers={"X-User-Id": "caro", **headers},
        )
        assert response.status_code == 200, response.text
        (searched,) = embedder.calls[-1]
        return searched

    assert await shown({}) == "What class did Caroline join?"
    assert await shown({"X-OpenWebUI-User-Name": "Caroline"}) == "What class did I join?"
    assert await shown({"X-User-Name": "Caroline%20Smith"}) == "What class did I join?"
