"""The two-step Manager (issue 26): small talk left out by rule, a label per sentence chosen by the
model (type and profile mark with it), then one memory per chosen sentence, written against the
few memories most like it; bounded like the one-call Manager; the second look."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import httpx2
import pytest
import respx
from pydantic import ValidationError
from pydantic_ai.messages import ModelResponse, TextPart
from pydantic_ai.models.function import FunctionModel

from app.config import Settings
from app.memory.learning import choosing
from app.memory.learning.choosing import labels_for, sentences_of
from app.memory.learning.decisions import Op, Operation
from app.memory.learning.manager import Manager, ManagerAnswerUnusable
from app.memory.learning.prompt import Shown
from app.memory.learning.turns import turn
from app.memory.learning.writing import BATCH, Chosen, answer_for
from app.memory.store.tables import FactType
from tests.conftest import AppClientFactory
from tests.memory.learning.support import ANN, manager_client, no_jobs, services, until
from tests.memory.learning.two_step import TwoStep

NOW = datetime(2026, 11, 24, 10, 0, tzinfo=UTC)
SETTINGS = {"upstream_base_url": "http://upstream.test/v1", "manager_steps": "two"}
CHAT = [
    turn("user", "Hey Mel! Good to see you. I'm a nurse in Oslo since last week."),
    turn("assistant", "Welcome to Oslo! What do you do for fun?"),
    turn("user", "I love cross-country skiing. How about you? Thanks!"),
]


def shown(*texts: str) -> list[Shown]:
    return [Shown(i, t, "fact", NOW) for i, t in enumerate(texts, start=1)]


async def decide(
    model: TwoStep, memories: list[Shown] | None = None, **settings: Any
) -> list[Operation]:
    manager = Manager(Settings(**{**SETTINGS, **settings}), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    return await manager.decide("m", memories=memories or [], context=[], new=CHAT, now=NOW)


def test_small_talk_is_left_out_by_rule_and_each_turn_s_question_goes_with_it() -> None:
    sentences, dropped = sentences_of([], CHAT)
    assert [(s.text, s.asked) for s in sentences] == [
        ("I'm a nurse in Oslo since last week.", None),
        ("I love cross-country skiing.", "What do you do for fun?"),
    ]
    assert dropped == {"greeting": 1, "filler": 1, "question": 1, "thanks": 1}


async def test_each_chosen_sentence_is_written_once_with_the_type_and_mark_its_label_gives() -> (
    None
):
    model = TwoStep(labels={"nurse": "identity", "skiing": "preference"})
    operations = await decide(model)
    (choose,) = model.prompts["choose"]
    assert "Hey Mel" not in choose and "How about you" not in choose and "Thanks" not in choose
    (write,) = model.prompts["write"]
    assert (
        '2. [preference] (answering "What do you do for fun?") I love cross-country skiing.'
        in write
    )
    assert operations == [
        Operation(
            op=Op.NEW,
            content="I'm a nurse in Oslo since last week.",
            type=FactType.FACT,
            profile=True,
        ),
        Operation(
            op=Op.NEW,
            content="I love cross-country skiing.",
            type=FactType.PREFERENCE,
            profile=False,
        ),
    ]  # fmt: skip  (the rules after the model write them in the third person: the worker's)


async def test_a_sentence_labelled_nothing_gives_nothing_and_the_writer_is_not_asked() -> None:
    model = TwoStep()
    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    plain = [turn("user", "The colours really blend nicely. Family is everything.")]
    assert await manager.decide("m", memories=[], context=[], new=plain, now=NOW) == []
    assert len(model.prompts["choose"]) == 1 and model.prompts["write"] == []


async def test_the_words_hold_the_model_s_labels() -> None:
    """What the 1.5B got wrong on LoCoMo: "nothing" for a sentence that tells what the user did
    (kept, as an event), "identity" for a remark about life in general (dropped)."""
    model = TwoStep(labels={"Family": "identity"})
    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    said = [turn("user", "I ran a charity race last Saturday. Family is everything.")]
    operations = await manager.decide("m", memories=[], context=[], new=said, now=NOW)
    assert operations == [Operation(op=Op.NEW, content="I ran a charity race last Saturday.",
                                    type=FactType.EVENT, profile=False)]  # fmt: skip


async def test_a_correction_updates_the_memory_it_replaces_and_forget_deletes() -> None:
    model = TwoStep(
        labels={"nurse": "correction", "skiing": "forget", "keys": "forget"},
        replaces={"nurse": "Nurse in Oslo since 2019", "skiing": "Loves skiing downhill"},
    )
    memories = shown("Nurse in Oslo since 2019", "Plays chess", "Loves skiing downhill")
    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    said = [turn("user", "I'm a nurse in Oslo since last week."),
            turn("assistant", "What do you do for fun?"),
            turn("user", "Please forget that I love skiing. I keep forgetting my keys.")]  # fmt: skip
    operations = await manager.decide("m", memories=memories, context=[], new=said, now=NOW)
    (write,) = model.prompts["write"]
    assert "(similar memories: a. Nurse in Oslo since 2019)" in write  # those like the sentence
    assert "2. [a request to forget]" in write
    assert operations == [
        Operation(op=Op.UPDATE, id=1, content="I'm a nurse in Oslo since last week.",
                  type=FactType.CORRECTION, profile=None),
        Operation(op=Op.DELETE, id=3),
    ]  # fmt: skip


async def test_a_memory_named_to_be_replaced_that_says_another_thing_stays() -> None:
    """The 1.5B named memories it did not replace ("Built a community of hope" over "Went to a
    support group"): a replacement must hold half the replaced memory's words."""
    model = TwoStep(labels={"nurse": "correction"}, replaces={"nurse": "Works as a nurse in Rome"})
    operations = await decide(model, shown("Works as a nurse in Rome"))
    assert "(similar memories: a. Works as a nurse in Rome)" in model.prompts["write"][0]
    assert [(o.op, o.id) for o in operations] == [(Op.NEW, None)]


async def test_an_event_replaces_nothing_and_is_not_shown_memories_to_replace() -> None:
    model = TwoStep(labels={"nurse": "event"}, replaces={"nurse": "Moved to Rome in 2019"})
    operations = await decide(model, shown("Moved to Rome in 2019"))
    assert "similar memories" not in model.prompts["write"][0]
    assert [o.op for o in operations] == [Op.NEW]
    event = Chosen(sentences_of([], CHAT)[0][0], "event", choosing.kind_of("event", "x"),
                   shown("Lives in Rome"))  # fmt: skip
    schema = answer_for([event]).model_json_schema(by_alias=True)
    assert "replaces" not in str(schema) and schema["required"] == ["1"]


def test_the_label_s_profile_mark_holds_only_where_the_sentence_says_so() -> None:
    assert choosing.kind_of("identity", "I'm a nurse") == choosing.Kind(FactType.FACT, True)
    assert choosing.kind_of("identity", "So thankful for the support") == choosing.Kind(
        FactType.FACT, False)  # fmt: skip
    assert choosing.kind_of("instruction", "Please keep your answers short") == choosing.Kind(
        FactType.FEEDBACK, True)  # fmt: skip
    assert choosing.kind_of("instruction", "The group made me feel accepted") == choosing.Kind(
        FactType.FACT, False)  # fmt: skip
    assert choosing.kind_of("nothing", "I'm a nurse") is None


def test_the_labels_schema_holds_the_model_to_one_label_per_sentence() -> None:
    schema = labels_for(3).model_json_schema(by_alias=True)
    assert schema["required"] == ["1", "2", "3"] and schema["additionalProperties"] is False
    assert schema["properties"]["1"]["enum"] == [
        "identity", "event", "plan", "preference", "relationship", "feeling", "correction",
        "instruction", "forget", "nothing",
    ]  # fmt: skip
    labels = labels_for(3)
    assert labels.model_validate({"1": "event", "2": "nothing", "3": "plan"})
    with pytest.raises(ValidationError):
        labels.model_validate({"1": "event", "2": "nothing"})  # one left out
    # prompted mode holds no model to the list: a label it made up is a plain fact
    made_up = labels.model_validate({"1": "location", "2": "Nothing", "3": "plan"})
    assert choosing.labels_of(made_up, 3) == ["fact", "nothing", "plan"]


async def test_the_job_s_token_bound_stops_further_batches_and_keeps_what_was_written(
    caplog: pytest.LogCaptureFixture,
) -> None:
    many = [turn("user", " ".join(f"I own {n} red boats{'.' * 1}" for n in range(BATCH + 2)))]
    model = TwoStep(labels={"boats": "identity"})
    manager = Manager(Settings(**SETTINGS, manager_max_tokens=300, manager_job_max_tokens=360),
                      http_client=httpx2.AsyncClient(), model=FunctionModel(model))  # fmt: skip
    with caplog.at_level(logging.INFO, "memproxy.manager"):
        operations = await manager.decide("m", memories=[], context=[], new=many, now=NOW)
    assert len(model.prompts["write"]) == 1 and len(operations) == BATCH
    assert "left unwritten: MEMPROXY_MANAGER_JOB_MAX_TOKENS would run out" in caplog.text


async def test_a_batch_that_cannot_be_read_is_passed_over_once_another_gave_memories() -> None:
    many = [turn("user", " ".join(f"I own {n} red boats." for n in range(BATCH + 2)))]
    model = TwoStep(labels={"boats": "identity"})
    writes: list[int] = []

    def answer(messages: Any, info: Any) -> ModelResponse:
        if not info.instructions.startswith(choosing.INSTRUCTIONS.strip()):
            writes.append(1)
            if len(writes) > 1:  # the second batch, and its retry
                return ModelResponse(parts=[TextPart("sure! boats")])
        return model(messages, info)

    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(answer))  # fmt: skip
    operations = await manager.decide("m", memories=[], context=[], new=many, now=NOW)
    assert len(operations) == BATCH and len(writes) == 3


async def test_a_first_batch_that_cannot_be_read_fails_the_answer() -> None:
    def answer(messages: Any, info: Any) -> ModelResponse:
        if info.instructions.startswith(choosing.INSTRUCTIONS.strip()):
            return TwoStep(labels={"nurse": "identity"})(messages, info)
        return ModelResponse(parts=[TextPart("sure! I will remember")])

    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(answer))  # fmt: skip
    with pytest.raises(ManagerAnswerUnusable):
        await manager.decide("m", memories=[], context=[], new=CHAT, now=NOW)


async def test_the_second_look_adds_what_the_first_missed_and_is_off_by_default() -> None:
    model = TwoStep(labels={"nurse": "identity"}, missed=["Moved to Oslo last week"])  # e.g.
    assert len(await decide(model)) == 1 and model.prompts["look"] == []
    operations = await decide(model, manager_second_look=True)
    (look,) = model.prompts["look"]
    assert "- I'm a nurse in Oslo since last week." in look  # what was written
    assert operations[-1] == Operation(op=Op.NEW, content="Moved to Oslo last week",
                                       type=FactType.FACT)  # fmt: skip


async def test_through_the_worker_memories_are_third_person_and_small_talk_is_never_stored(
    make_client: AppClientFactory, upstream_ok: respx.Route
) -> None:
    model = TwoStep(labels={"nurse": "identity", "skiing": "preference", "fun": "feeling"})
    client = await manager_client(make_client, model, manager_steps="two", episodes=True)
    messages = [
        {"role": "user", "content": "Hey Mel! I'm a nurse. Thanks!"},
        {"role": "assistant", "content": "Nice! What do you do for fun?"},
        {"role": "user", "content": "I love cross-country skiing. How about you?"},
    ]
    response = await client.post("/v1/chat/completions", headers=ANN,
                                 json={"model": "m", "messages": messages})  # fmt: skip
    assert response.status_code == 200
    await until(lambda: no_jobs(client))
    listed = (await client.get("/v1/memories", headers=ANN)).json()["data"]
    facts = sorted((m["content"], m["type"], m["profile"]) for m in listed
                   if m["type"] != "episode")  # fmt: skip
    assert facts == [("Is a nurse.", "fact", True),
                     ("Loves cross-country skiing.", "preference", False)]  # fmt: skip
    assert len([m for m in listed if m["type"] == "episode"]) == 2  # the words are kept too
    assert (await services(client).jobs.counts())["failed"] == 0


def test_two_facts_in_one_sentence_are_chosen_and_written_apart() -> None:
    """The 1.5B wrote one memory, "Lives in Lyon", of "I am vegetarian and I live in Lyon."."""
    said = [turn("user", "I am vegetarian and I live in Lyon. My mom and I ski, but I hate it.")]
    assert [s.text for s in sentences_of([], said)[0]] == [
        "I am vegetarian", "I live in Lyon.", "My mom and I ski", "I hate it.",
    ]  # fmt: skip


async def test_a_memory_not_of_its_sentence_is_the_sentence_itself() -> None:
    """The 1.5B swapped two items ("Lives in Lyon" for "I am vegetarian", "Vegetarian" for "I
    live in Lyon"): a memory must be of its own sentence's words, and more than one word."""
    swapped = {"I am vegetarian": "Lives in Lyon", "I live in Lyon.": "Vegetarian"}
    model = TwoStep(labels={"vegetarian": "identity", "Lyon": "identity"},
                    write=lambda text: swapped.get(text, text))  # fmt: skip
    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    said = [turn("user", "I am vegetarian and I live in Lyon.")]
    operations = await manager.decide("m", memories=[], context=[], new=said, now=NOW)
    assert [o.content for o in operations] == ["I am vegetarian", "I live in Lyon."]


async def test_a_memory_that_names_what_its_sentence_does_not_is_the_sentence_itself() -> None:
    """In `prompted` mode the 1.5B wrote the instructions' example city for the user's."""
    model = TwoStep(labels={"Lyon": "identity"},
                    write=lambda text: "Lives in Madrid" if "Lyon" in text else text)  # fmt: skip
    manager = Manager(Settings(**SETTINGS), http_client=httpx2.AsyncClient(),
                      model=FunctionModel(model))  # fmt: skip
    said = [turn("user", "I live in Lyon.")]
    operations = await manager.decide("m", memories=[], context=[], new=said, now=NOW)
    assert [o.content for o in operations] == ["I live in Lyon."]
