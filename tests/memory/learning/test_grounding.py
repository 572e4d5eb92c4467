"""What the Manager writes must be the user's words: the grounding guard, alone and in the
applier, and UPDATEs that restate a memory change nothing."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import respx
from pydantic_ai.messages import ModelMessage, ModelResponse
from pydantic_ai.models.function import AgentInfo
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.extraction import requested
from app.memory.learning.grounding import Grounds, with_requests
from app.memory.learning.prompt import Shown
from app.memory.learning.turns import turn
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory, now
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder, decided
from tests.helpers import completion_json
from tests.memory.learning.support import ANN, manager_client, memories, no_jobs, until

TURNS = [
    turn("user", "I am a nurse and I live in Lyon."),
    turn("assistant", "Lyon is a lovely city with plenty of vegetarian restaurants."),
    turn("user", "What is the capital of Australia?"),
    turn("assistant", "The capital of Australia is Canberra."),
]
SHOWN = [Shown(1, "Plays the cello on Sundays", "fact", now())]


def new(content: str) -> Operation:
    return Operation(op=Op.NEW, content=content)


@pytest.mark.parametrize(
    "content",
    ["Lives in Lyon", "Works as a nurse", "I am a nurse", "Is a nurse living in Lyon"],
)
def test_the_users_words_in_the_third_person_are_grounded(content: str) -> None:
    assert Grounds.of(TURNS, SHOWN).refusal(new(content)) is None


@pytest.mark.parametrize(
    ("content", "missing"),
    [
        ("Lyon is a lovely city with plenty of vegetarian restaurants", "restaur"),  # the reply
        ("Lives in Canberra", "canberra"),  # the answer to the user's question
        ("Capital of Australia is Canberra", "australia"),  # what the user only asked about
        ("Moved to Oslo in May 2025", "oslo"),  # words of no one in the chat
    ],
)
def test_the_assistants_words_and_strangers_are_not(content: str, missing: str) -> None:
    refusal = Grounds.of(TURNS, SHOWN).refusal(new(content))
    assert refusal is not None and missing in refusal


def test_a_word_of_the_assistants_question_may_complete_the_users_answer() -> None:
    chat = [turn("assistant", "How is your painting going?"),
            turn("user", "Great, I just finished one of a sunset.")]  # fmt: skip
    assert Grounds.of(chat, []).refusal(new("Finished a painting of a sunset")) is None
    assert Grounds.of(chat, []).refusal(new("Is painting")) is not None  # the question alone
    asked = [turn("user", "Should I move to Paris? I got a job offer there!")]
    assert Grounds.of(asked, []).refusal(new("Got a job offer in Paris")) is None
    told = [turn("user", "I live in Oslo, what about the fjord?")]  # a fact, then a question
    assert Grounds.of(told, []).refusal(new("Lives in Oslo")) is None


def test_an_update_may_keep_the_words_of_the_memory_it_changes() -> None:
    grounds = Grounds.of([turn("user", "Actually it is on Saturdays now")], SHOWN)
    update = Operation(op=Op.UPDATE, id=1, content="Plays the cello on Saturdays")
    assert grounds.refusal(update) is None
    assert grounds.refusal(new("Plays the cello on Saturdays")) is not None  # not as a NEW
    assert grounds.refusal(Operation(op=Op.DELETE, id=1)) is not None  # nothing of it said


def test_a_delete_must_name_a_memory_the_user_spoke_of() -> None:
    shown = [Shown(1, "Lives in Paris", "fact", now()), Shown(2, "Is vegetarian", "fact", now())]
    grounds = Grounds.of([turn("user", "Please forget that I am vegetarian.")], shown)
    assert grounds.refusal(Operation(op=Op.DELETE, id=2)) is None
    refusal = grounds.refusal(Operation(op=Op.DELETE, id=1))
    assert refusal is not None and "shares no word" in refusal


@pytest.fixture
def service(engine: AsyncEngine) -> MemoryService:
    return MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]


async def test_the_applier_refuses_what_is_not_grounded_and_writes_the_rest(
    service: MemoryService,
) -> None:
    records = (await service.add("ann", [NewMemory("Plays the cello on Sundays")])).records
    aliases = {1: records[0].id}
    outcomes = await Applier(service).apply("ann", [
        new("Lives in Lyon"),
        new("Lyon is a lovely city with plenty of vegetarian restaurants"),
        Operation(op=Op.UPDATE, id=1, content="Lives in Canberra"),
    ], aliases, job_id="j", grounds=Grounds.of(TURNS, SHOWN))  # fmt: skip
    assert [o.result for o in outcomes] == ["ungrounded", "ungrounded", "created"]
    assert "not:" in (outcomes[0].reason or "")
    found = {m.content for m in (await service.page("ann"))[0]}
    assert found == {"Plays the cello on Sundays", "Lives in Lyon"}


async def test_an_update_that_restates_a_memory_writes_nothing(service: MemoryService) -> None:
    """Small models answer the memories they were shown back as UPDATEs: no write, no history."""
    records = (await service.add("ann", [NewMemory("Lives in  Lyon")])).records
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.UPDATE, id=1, content="lives in Lyon.")], {1: records[0].id},
        job_id="j",
    )  # fmt: skip
    assert (outcome.result, outcome.memory_id) == ("unchanged", records[0].id)
    history = await service.history("ann", records[0].id)
    assert history is not None and [e.action for e in history] == ["created"]


async def test_the_worker_applies_with_the_jobs_grounds(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """Through the app: the Manager writes the assistant's reply and the user's fact, and leaves
    out what the user asked to remember; the user's fact is stored, the reply refused (and
    counted), the request added."""
    upstream.post("/chat/completions").respond(
        json=completion_json("Lyon is a lovely city with plenty of restaurants.")
    )

    def answer(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        return decided(info, {"operations": [
            {"op": "NEW", "content": "Lives in Lyon"},
            {"op": "NEW", "content": "Lyon is a lovely city with plenty of restaurants"},
        ]})  # fmt: skip

    client = await manager_client(make_client, answer)
    said = "I live in Lyon. Remember that my cat is called Tom."
    body = {"model": "m", "messages": [{"role": "user", "content": said}]}
    assert (await client.post("/v1/chat/completions", json=body, headers=ANN)).status_code == 200
    await until(lambda: no_jobs(client))
    assert await memories(client) == ["Lives in Lyon", "Their cat is called Tom"]
    metrics = (await client.get("/metrics")).text
    assert 'memproxy_manager_operations_total{result="ungrounded"} 1.0' in metrics


@pytest.mark.parametrize(
    ("text", "asked"),
    [
        ("Remember that my daughter Mia turns 7 on 3 May.", ["My daughter Mia turns 7 on 3 May"]),
        ("Hi! Please note: I'm allergic to nuts. Thanks", ["I'm allergic to nuts"]),
        ("Don't forget my flight is on Friday!\nAlso remember I hate olives",
         ["My flight is on Friday", "I hate olives"]),
        ("I don't remember that film. Can you remember what I said?", []),
        ("Remember that?", []),
        ("Remember that " + "x" * 600 + " my", []),  # no single fact: the Manager's reading
        ("Could you remember that I'm allergic to peanuts?", ["I'm allergic to peanuts"]),
        ("Oh, and don’t forget: my GP is Dr. Smith.", ["My GP is Dr. Smith"]),
        ("Remember that time we went to Paris? Remember my name?", []),
        ("Note that the function returns None. Keep in mind the API limit is 10/s.", []),
        ("```\n# Note that I must sort x first\n```\nThanks", []),  # code is not read
        ("remember" + " " * 9000 + "my x", ["My x"]),  # no backtracking over the spaces
    ],
)  # fmt: skip
def test_what_the_user_explicitly_asks_to_remember(text: str, asked: list[str]) -> None:
    assert requested(text) == asked


def test_an_explicit_request_the_answer_left_out_is_added_in_the_users_words() -> None:
    turns = [turn("user", "I moved. Remember that my daughter Mia turns 7 on 3 May."),
             turn("assistant", "I'm sorry, but I can't assist with that.")]  # fmt: skip
    grounds = Grounds.of(turns, SHOWN)
    (added,) = with_requests([], turns, grounds)
    assert (added.op, added.content) == (Op.NEW, "My daughter Mia turns 7 on 3 May")
    assert grounds.refusal(added) is None
    kept = [new("Daughter Mia turns 7 on 3 May"), Operation(op=Op.DELETE, id=1)]
    assert with_requests(kept, turns, grounds) == kept  # the answer holds it already
    known = Grounds.of(turns, [Shown(1, "Daughter Mia turns 7 on 3 May", "fact", now())])
    assert with_requests([], turns, known) == []  # a memory shown holds it already
    # half the words but not whose birthday it is: the request is stored whole, the fragment goes
    cut = [new("Turns 7 on 3 May"), new("Moved house")]
    assert [o.content for o in with_requests(cut, turns, grounds)] == [
        "Moved house", "My daughter Mia turns 7 on 3 May",
    ]  # fmt: skip


def test_questions_about_the_user_are_their_words() -> None:
    asked = [turn("user", "Did I tell you I moved to Berlin last month?")]
    assert Grounds.of(asked, []).refusal(new("Moved to Berlin last month")) is None


def test_forgetting_everything_lets_any_delete_through() -> None:
    shown = [Shown(1, "Works as a nurse", "fact", now()), Shown(2, "Lives in Oslo", "fact", now())]
    erase = Grounds.of([turn("user", "Please forget everything you know about me.")], shown)
    assert erase.refusal(Operation(op=Op.DELETE, id=1)) is None
    one = Grounds.of([turn("user", "Please forget that I live in Oslo.")], shown)
    assert one.refusal(Operation(op=Op.DELETE, id=1)) is not None
    assert one.refusal(Operation(op=Op.DELETE, id=2)) is None


def test_a_name_no_one_in_the_chat_said_is_refused() -> None:
    """The 0.5B copied the instructions' made-up "Moved to Madrid" with "last month" said: half
    the words were the user's, the name no one's."""
    chat = [turn("user", "I moved last month, I love it. Thanks Caroline!"),
            turn("assistant", "Welcome to Oslo!")]  # fmt: skip
    grounds = Grounds.of(chat, [], said_on=datetime(2023, 5, 8, tzinfo=UTC))
    refusal = grounds.refusal(new("Moved to Madrid in May 2023"))
    assert refusal == "it names what no one in the chat said: Madrid"
    for said in ("Moved in April 2023", "Moved to Oslo in April 2023", "Loves it"):
        assert grounds.refusal(new(said)) is None, said
