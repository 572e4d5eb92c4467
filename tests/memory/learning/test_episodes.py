"""The texts of episodes: the user's own words of a job's new turns, in passages, and a short
answer with the question it answers."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import respx
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from app.memory.learning.applier import Applier
from app.memory.learning.decisions import New, Op, Operation
from app.memory.learning.episodes import PASSAGE_CHARS, SENTENCES, episode_texts, passages
from app.memory.learning.turns import turn
from app.memory.service import MemoryService
from app.memory.store.memories import MemoryStore
from app.memory.store.records import NewMemory
from app.memory.store.tables import MemoryLink, MemoryType
from tests.conftest import AppClientFactory
from tests.fakes import FakeEmbedder
from tests.memory.learning.support import (
    ANN,
    Prompted,
    Remembering,
    manager_client,
    memories,
    no_jobs,
    until,
)


def test_a_short_answer_keeps_the_question_it_answers() -> None:
    context = [turn("user", "Any dessert ideas?"), turn("assistant", "Sure. Do you eat honey?")]
    assert episode_texts(context, [turn("user", "No.")]) == ['No. (answering "Do you eat honey?")']
    # the assistant's new turn in the job, then the user's answer to it
    new = [turn("assistant", "How often do you run?"), turn("user", "Twice a week")]
    assert episode_texts([], new) == ['Twice a week (answering "How often do you run?")']


def test_an_answer_that_stands_alone_is_kept_alone() -> None:
    context = [turn("assistant", "Do you eat honey?")]
    long_answer = "No, I am vegan since 2019 and I avoid honey too."
    assert episode_texts(context, [turn("user", long_answer)]) == [long_answer]
    told = [turn("assistant", "Here is the recipe."), turn("user", "Thanks, noted.")]
    assert episode_texts([], told) == ["Thanks, noted."]  # no question asked: nothing added
    # two user turns in a row: the second answers nothing of the assistant's
    new = [turn("assistant", "Do you eat honey?"), turn("user", "Wait."), turn("user", "No.")]
    assert episode_texts([], new) == ['Wait. (answering "Do you eat honey?")', "No."]


def test_pasted_material_is_not_the_users_words() -> None:
    text = "Summarise this email:\nFrom: bob@example.com\nSubject: plan\nWe move to Lyon in May."
    assert episode_texts([], [turn("user", text)]) == ["Summarise this email:"]  # not the email
    mixed = "I work at a bakery.\n```\nSELECT * FROM users;\n```"
    assert episode_texts([], [turn("user", mixed)]) == ["I work at a bakery."]


def test_a_long_turn_is_cut_into_passages_of_whole_sentences() -> None:
    sentences = [f"Sentence number {i} is about topic {i}." for i in range(1, 10)]
    cut = passages(" ".join(sentences))
    assert cut == [" ".join(sentences[0:4]), " ".join(sentences[4:8]), sentences[8]]
    assert SENTENCES == 4
    long_sentence = " ".join(["word"] * 400)  # no sentence end at all
    pieces = passages(long_sentence)
    assert len(pieces) > 1 and all(len(p) <= PASSAGE_CHARS for p in pieces)
    assert " ".join(pieces) == long_sentence  # nothing lost, nothing doubled
    assert passages("Line one\nLine two\n\n  ") == ["Line one Line two"]


SAID = datetime(2024, 5, 1, 9, 30, tzinfo=UTC)


async def test_a_jobs_episodes_are_written_with_its_facts_and_linked(engine: AsyncEngine) -> None:
    """Episodes are memories of kind episode, said when the job's turns were; each fact the job
    wrote links to the episode it came from (the one sharing its words)."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    words = ["I have been vegetarian since 2019.", "My sister Ana lives in Porto."]
    outcomes = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, content="Is vegetarian since 2019")], {}, job_id="j",
        observed_at=SAID, episodes=words,
    )  # fmt: skip
    (fact,) = [o.memory_id for o in outcomes if o.result == "created"]
    listed, _ = await service.page("ann", types=[MemoryType.EPISODE])
    episodes = {m.content: m for m in listed}
    assert sorted(episodes) == sorted(words)
    assert all(m.observed_at == SAID and m.source == "manager" for m in episodes.values())
    async with service.store.sessions() as session:
        links = (await session.execute(select(MemoryLink.fact_id, MemoryLink.episode_id))).all()
    assert links == [(fact, episodes[words[0]].id)]
    # a job whose Manager wrote nothing still keeps what was said
    await Applier(service).apply("ann", [], {}, job_id="k", episodes=["Just saying hi."])
    listed, total = await service.page("ann", types=[MemoryType.EPISODE])
    assert total == 3


async def test_chats_keep_episodes_once_and_the_manager_never_sees_them(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    manager = Prompted()
    client = await manager_client(make_client, manager, episodes=True)
    asked = [
        {"role": "user", "content": "I want dessert ideas."},
        {"role": "assistant", "content": "Sure. Do you eat honey?"},
        {"role": "user", "content": "No."},
    ]
    for _ in range(2):  # resent: nothing more
        response = await client.post(
            "/v1/chat/completions", headers=ANN, json={"model": "m", "messages": asked}
        )
        assert response.status_code == 200
        await until(lambda: no_jobs(client))

    async def episodes() -> list[str]:
        listed = await client.get("/v1/memories", params={"type": "episode"}, headers=ANN)
        return sorted(m["content"] for m in listed.json()["data"])

    assert await episodes() == ["I want dessert ideas.", 'No. (answering "Do you eat honey?")']
    response = await client.post("/v1/chat/completions", headers={**ANN, "X-Memory": "read-only"},
                                 json={"model": "m", "messages": [*asked, {"role": "assistant",
                                       "content": "ok"}, {"role": "user", "content": "I love figs"}]})  # fmt: skip
    assert response.status_code == 200
    assert len(await episodes()) == 2  # read-only: nothing kept
    # what the Manager is shown of the user's memories are facts, never episodes
    response = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": "Honey is not vegan, right?"}],
    })  # fmt: skip
    assert response.status_code == 200
    await until(lambda: no_jobs(client))
    # a fact, as the rules wrote it ("No." was dropped as filler)
    assert len(manager.prompts) == 2 and "1. Wants dessert ideas." in manager.prompts[1]
    assert "2." not in manager.prompts[1].split("Existing memories", 1)[1].split("\n\n")[0]
    assert "answering" not in manager.prompts[1]


async def test_episodes_are_on_unless_turned_off(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client = await manager_client(make_client, Remembering())
    response = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}],
    })  # fmt: skip
    assert response.status_code == 200
    await until(lambda: no_jobs(client))
    assert await memories(client, episodes=True) == ["I live in Oslo"]


async def test_episodes_turned_off_keep_none(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    client = await manager_client(make_client, Remembering(), episodes=False)
    response = await client.post("/v1/chat/completions", headers=ANN, json={
        "model": "m", "messages": [{"role": "user", "content": "I live in Oslo"}],
    })  # fmt: skip
    assert response.status_code == 200
    await until(lambda: no_jobs(client))
    listed = await client.get("/v1/memories", params={"type": "episode"}, headers=ANN)
    assert listed.json()["data"] == []


def test_nul_characters_never_reach_the_database() -> None:
    """PostgreSQL's text cannot hold NUL: the user's words and the Manager's lose theirs."""
    assert episode_texts([], [turn("user", "I like\x00 tea.")]) == ["I like tea."]
    assert episode_texts([], [turn("user", "\x00")]) == []
    assert New.model_validate({"op": "NEW", "content": "Likes\x00 tea"}).content == "Likes tea"
    with pytest.raises(ValidationError, match="NUL"):
        New.model_validate({"op": "NEW", "content": "\x00"})


async def test_episodes_never_make_a_fact_a_duplicate_nor_keep_a_deleted_ones_link(
    engine: AsyncEngine,
) -> None:
    """A fact said again, whose words an episode keeps, is still written; a fact the same job
    updates then deletes leaves no link behind."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    said = "My daughter Mia plays the violin"
    await Applier(service).apply("ann", [], {}, job_id="j", episodes=[said])
    (outcome,) = await Applier(service).apply(
        "ann", [Operation(op=Op.NEW, content=said)], {}, job_id="k"
    )
    assert outcome.result == "created"  # the episode holds the same words: no duplicate
    (fact,) = (await service.add("ann", [NewMemory("Plays chess")])).records
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.UPDATE, id=1, content="Plays chess on Sundays"),
        Operation(op=Op.DELETE, id=1),
    ], {1: fact.id}, job_id="l", episodes=["I play chess on Sundays."])  # fmt: skip
    assert [o.result for o in outcomes] == ["updated", "deleted"]
    async with service.store.sessions() as session:
        assert (await session.execute(select(MemoryLink))).all() == []


async def test_a_request_to_remember_with_a_nul_is_written_without_it(
    engine: AsyncEngine,
) -> None:
    """ "Remember that ..." is written by rule, not through the model's schema: the applier
    takes the NUL out (PostgreSQL refused the whole job)."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    operation = Operation(op=Op.NEW, content="Likes\x00 green tea")
    (outcome,) = await Applier(service).apply("ann", [operation], {}, job_id="j")
    memory = await service.get("ann", outcome.memory_id or "")
    assert outcome.result == "created" and memory is not None
    assert memory.content == "Likes green tea"


def test_a_long_short_answer_is_kept_as_passages() -> None:
    url = "https://example.com/" + "a" * 2000
    (text, *rest) = episode_texts([turn("assistant", "What is your id?")], [turn("user", url)])
    assert "answering" not in text and all(len(t) <= PASSAGE_CHARS for t in [text, *rest])


async def test_a_fact_updated_twice_in_one_job_is_linked_once(engine: AsyncEngine) -> None:
    """One job that updates a fact twice (or writes then updates it) names it twice among its
    facts: its link to the episode is written once (the second one broke the link table's unique
    key, and the job was parked with all it had learned: seen with the real 1.5B)."""
    service = MemoryService(MemoryStore(engine), FakeEmbedder())  # type: ignore[arg-type]
    (fact,) = (await service.add("ann", [NewMemory("Plays chess")])).records
    outcomes = await Applier(service).apply("ann", [
        Operation(op=Op.UPDATE, id=1, content="Plays chess on Sundays"),
        Operation(op=Op.UPDATE, id=1, content="Plays chess on Sundays with Ana"),
    ], {1: fact.id}, job_id="m", episodes=["I play chess on Sundays with Ana."])  # fmt: skip
    assert [o.result for o in outcomes] == ["updated", "updated"]
    async with service.store.sessions() as session:
        links = (await session.execute(select(MemoryLink.fact_id))).scalars().all()
    assert links == [fact.id]
