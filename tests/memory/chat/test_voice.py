"""A question naming the user is searched in the user's voice (app/memory/chat/voice.py), when the
client says the user's name."""

from __future__ import annotations

import re

import pytest
import respx

from app.memory.chat import voice
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
        ("What did Caroline say?", "caroline", "What did I say?"),  # the header's case: any
        ("What did caroline say?", "Caroline", "What did caroline say?"),  # the question's: a capital
        ("Is Marie-Ann here?", "Ann", "Is Marie-Ann here?"),
        ("What is Caroline Smith's job?", "caroline smith", "What is my job?"),
        ("What did CAROLINE say?", "CAROLINE", "What did I say?"),
        ("Where does Mary-Jane live?", "mary-jane", "Where do I live?"),
        ("Is Sam O’Neil’s car red?", "Sam O'Neil", "Is my car red?"),
        ("What did Dr Jones say?", "Dr. Smith", "What did Dr Jones say?"),  # a title: not a name
        ("Who is Mr Brown?", "Mr Smith", "Who is Mr Brown?"),
        ("Van rental prices near me?", "van der Berg", "Van rental prices near me?"),
        ("What did Berg say?", "van der Berg", "What did I say?"),
        ("What did J say?", "J. Smith", "What did J say?"),  # an initial: not a given name
        ("What did Caroline Jones say?", "Caroline Smith", "What did Caroline Jones say?"),
        ("What has Ann's dog eaten?", "Ann'", "What has my dog eaten?"),
        ("Is Ann-Marie here?", "Ann-", "Is Ann-Marie here?"),
        ("Is I a vowel? Ask Ann", "Ann", "Is I a vowel? Ask me"),  # agreement only beside it
        ("Where does Zoe\u0308 live?", "Zoë", "Where do I live?"),  # NFC
        ("प्रिया का काम क्या है?", "प्रिया शर्मा", "प्रिया का काम क्या है?"),  # marks: not matched
        ("मुझे प्यार और पानी पसंद है", "प्रिया शर्मा", "मुझे प्यार और पानी पसंद है"),
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


def test_each_match_looks_back_a_bounded_way(monkeypatch: pytest.MonkeyPatch) -> None:
    """A long run of letters before many mentions of the name: the word before each is read
    from at most LOOK_BACK characters (a search over all of the text before each mention made
    a 2 KB question take seconds on the event loop)."""
    read: list[int] = []
    real = voice._PREVIOUS

    class Counting:
        def search(self, text: str) -> re.Match[str] | None:
            read.append(len(text))
            return real.search(text)

    monkeypatch.setattr(voice, "_PREVIOUS", Counting())
    question = "x" * 100_000 + " " + "and J " * 5_000
    searched = in_own_voice(question, "Jo Smith") + in_own_voice(question, "J")
    # "Jo Smith" is not in it; "J", a whole name, is read as the user each time
    assert searched.count("and J ") == 5_000 and searched.count("and I ") == 5_000
    assert len(read) == 5_000 and max(read) <= voice.LOOK_BACK


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
