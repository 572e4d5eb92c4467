"""Reading chat exports (app/memory/learning/history/): each conversation's current branch, its
user and assistant words only, each with its own time; a bad file refused whole, naming the
place. The files are made by tests/memory/learning/exports.py in each format's shape."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.memory.learning.history.export import BadExport, Export
from app.memory.learning.history.read import read_export
from tests.memory.learning.exports import (
    MAY_1,
    dumped,
    gpt_conversation,
    gpt_linear,
    gpt_message,
    owui_chat,
    owui_linear,
    owui_message,
)


def said(export: Export, index: int = 0) -> list[tuple[str, str]]:
    return [(s.role, s.text) for s in export.conversations[index].said]


def at(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def test_an_open_webui_chat_is_its_current_branch() -> None:
    # "I have a cat" was edited into "I have two dogs"; the first answer was regenerated.
    messages = [
        owui_message("q1", None, "user", "I have a cat", MAY_1),
        owui_message("a1", "q1", "assistant", "Cats are nice", MAY_1 + 5),
        owui_message("q2", None, "user", "I have two dogs", MAY_1 + 60),
        owui_message("a2", "q2", "assistant", "Dogs need walks", MAY_1 + 65),
        owui_message("a3", "q2", "assistant", "Two dogs! What are their names?", MAY_1 + 70),
        owui_message("q3", "a3", "user", "Rex and Fido", MAY_1 + 120),
        owui_message("a4", "q3", "assistant", "Lovely names", MAY_1 + 125),
    ]
    export = read_export(dumped(owui_chat("Pets", messages, "a4")))
    assert export.format == "openwebui"
    (chat,) = export.conversations
    assert (chat.index, chat.title, chat.model) == (0, "Pets", "llama3")
    assert said(export) == [
        ("user", "I have two dogs"), ("assistant", "Two dogs! What are their names?"),
        ("user", "Rex and Fido"), ("assistant", "Lovely names"),
    ]  # fmt: skip
    assert [s.at for s in chat.said] == [at(MAY_1 + t) for t in (60, 70, 120, 125)]


def test_open_webui_words_only() -> None:
    reasoning = (
        '<details type="reasoning" done="true" duration="3">\n<summary>Thought for 3 seconds'
        "</summary>\n&gt; The user says they are vegan.\n</details>\nNoted: no animal products."
    )
    tools = '<details type="tool_calls" done="true" id="c1" name="web" arguments="{}">\n</details>'
    chat = owui_linear("Food", [
        ("system", "You are a helpful cook"),
        ("user", "I am vegan"),
        ("assistant", reasoning),
        ("user", [{"type": "text", "text": "I cook on Sundays"},
                  {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]),
        ("assistant", tools),  # only a tool call: nothing said
        ("user", None),
        ("user", "  "),
    ])  # fmt: skip
    assert said(read_export(dumped(chat))) == [
        ("user", "I am vegan"), ("assistant", "Noted: no animal products."),
        ("user", "I cook on Sundays"),
    ]  # fmt: skip


def test_open_webui_times_and_lost_current_id() -> None:
    messages = [
        owui_message("q1", None, "user", "I live in Oslo", None),  # no time: the next one's
        owui_message("a1", "q1", "assistant", "Nice city", MAY_1 + 30),
        owui_message("q2", "a1", "user", "I work at a bakery", None),  # the one before
        owui_message("a2", "q1", "assistant", "an older answer", MAY_1 + 10),
    ]
    export = read_export(dumped(owui_chat("Home", messages, "q2")))
    assert said(export) == [("user", "I live in Oslo"), ("assistant", "Nice city"),
                            ("user", "I work at a bakery")]  # fmt: skip
    assert [s.at for s in export.conversations[0].said] == [at(MAY_1 + 30)] * 3
    # currentId unknown: the newest leaf, as Open WebUI repairs it (a leaf without a time is
    # older than any with one)
    messages[2]["timestamp"] = MAY_1 + 40
    export = read_export(dumped(owui_chat("Home", messages, "gone")))
    assert said(export)[-1] == ("user", "I work at a bakery")
    messages[3]["timestamp"] = MAY_1 + 50
    export = read_export(dumped(owui_chat("Home", messages, None)))
    assert said(export) == [("user", "I live in Oslo"), ("assistant", "an older answer")]


def test_open_webui_legacy_list_and_millisecond_times() -> None:
    chat = owui_linear("Old", [("user", "I play chess")])
    del chat["chat"]["history"]
    chat["chat"]["messages"] = [{"role": "user", "content": "I play chess"}]  # no times at all
    export = read_export(dumped(chat))
    assert said(export) == [("user", "I play chess")]
    assert export.conversations[0].said[0].at == at(MAY_1)  # the chat's created_at
    del chat["created_at"]  # then chat.timestamp, in milliseconds
    assert read_export(dumped(chat)).conversations[0].said[0].at == at(MAY_1)


def test_a_time_of_0_is_no_time() -> None:
    chat = owui_linear("Zero", [("user", "I knit"), ("assistant", "Nice")])
    chat["chat"]["history"]["messages"]["m0"]["timestamp"] = 0
    assert [s.at for s in read_export(dumped(chat)).conversations[0].said] == [at(MAY_1 + 60)] * 2


def test_a_chatgpt_conversation_is_its_current_branch() -> None:
    t = MAY_1
    nodes: list[tuple[str, str | None, dict[str, Any] | None]] = [
        ("root", None, None),
        ("sys", "root", gpt_message("system", [""], None, hidden=True)),
        ("ctx", "sys", gpt_message("system", [""], None, content_type="user_editable_context")),
        ("u1", "ctx", gpt_message("user", ["I moved to Oslo yesterday"], t)),
        ("a1", "u1", gpt_message("assistant", ["Welcome to Oslo!"], t + 5)),  # regenerated:
        ("a1b", "u1", gpt_message("assistant", ["How do you like Oslo?"], t + 9)),
        ("u2", "a1b", gpt_message("user", ["Find me a bakery"], t + 60)),
        ("call", "u2", gpt_message("assistant", ['{"q": "bakery oslo"}'], t + 61,
                                   content_type="code", recipient="browser")),
        ("tool", "call", gpt_message("tool", ["results..."], t + 62, name="browser")),
        ("th", "tool", gpt_message("assistant", [], t + 63, content_type="thoughts")),
        ("a2", "th", gpt_message("assistant", ["Try Apent Bakeri."], t + 64)),
        ("a3", "a2", gpt_message("assistant", ["It opens at 7."], t + 65)),
        ("u3", "a3", gpt_message("user", [{"content_type": "image_asset_pointer",
                                           "asset_pointer": "file-service://x"},
                                          "This is my dog Rex"], t + 120,
                                 content_type="multimodal_text")),
        ("u4", "u3", gpt_message("user", [{"content_type": "audio_transcription",
                                           "text": "He is three", "direction": "in"}],
                                 None, content_type="multimodal_text")),
        ("hid", "u4", gpt_message("user", ["hidden context"], t + 130, hidden=True)),
    ]  # fmt: skip
    export = read_export(dumped(gpt_conversation("Oslo", nodes, "hid")))
    assert export.format == "chatgpt"
    assert said(export) == [
        ("user", "I moved to Oslo yesterday"), ("assistant", "How do you like Oslo?"),
        ("user", "Find me a bakery"), ("assistant", "Try Apent Bakeri.\n\nIt opens at 7."),
        ("user", "This is my dog Rex"), ("user", "He is three"),
    ]  # fmt: skip
    times = [s.at for s in export.conversations[0].said]
    assert times == [at(t + d) for d in (0, 9, 60, 64, 120, 120)]  # u4: the time before
    assert export.conversations[0].model is None  # ChatGPT's model is not memproxy's upstream's


def test_chatgpt_current_node_missing_and_conversation_time() -> None:
    conversation = gpt_linear("Chess", [("user", "I play chess"), ("assistant", "Fun")])
    for node in conversation["mapping"].values():
        if node["message"] is not None:
            node["message"]["create_time"] = None
    conversation["current_node"] = None  # the newest leaf
    export = read_export(dumped(conversation))
    assert said(export) == [("user", "I play chess"), ("assistant", "Fun")]
    assert {s.at for s in export.conversations[0].said} == {at(MAY_1)}  # create_time


def test_empty_and_wordless_conversations_are_read_with_nothing_to_learn() -> None:
    export = read_export(dumped(
        owui_chat("Empty", [], None),
        owui_linear("Only the assistant", [("assistant", "Hello! How can I help?")]),
    ))  # fmt: skip
    assert [c.user_turns for c in export.conversations] == [0, 0]
    export = read_export(dumped(gpt_conversation("New chat", [("root", None, None)], "root")))
    assert export.conversations[0].said == ()


def test_a_lone_chat_object_and_a_named_format() -> None:
    chat = owui_linear("One", [("user", "I sing")])
    assert said(read_export(orjson.dumps(chat))) == [("user", "I sing")]
    assert read_export(dumped(chat), "openwebui").format == "openwebui"
    with pytest.raises(BadExport) as refused:
        read_export(dumped(chat), "chatgpt")
    assert (refused.value.code, refused.value.param) == ("unknown_format", "[0]")


BAD: list[tuple[str, bytes, str, str, list[str]]] = [
    ("not JSON", b"[{", "invalid_json", "", ["not valid JSON"]),
    ("empty file", b"  \n", "empty", "", ["empty"]),
    ("no conversation", b"[]", "empty", "", ["no conversation"]),
    ("a string", b'"hello"', "unknown_format", "", ["a JSON list", "not a string"]),
    ("unknown objects", b'[{"foo": 1}]', "unknown_format", "[0]", ["neither"]),
    (
        "mixed formats",
        dumped(owui_linear("A", [("user", "hi")]), gpt_linear("B", [("user", "hi")])),
        "unknown_format",
        "[1]",
        ["conversations[1] is not an Open WebUI chat"],
    ),
]


def _broken(path: list[Any], value: Any, conversation: dict[str, Any]) -> bytes:
    target = conversation
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    fine = owui_linear if "chat" in conversation else gpt_linear
    return dumped(fine("Fine", [("user", "hi")]), conversation)


def _owui() -> dict[str, Any]:
    return owui_linear("Trip to Oslo", [("user", "I like fjords"), ("assistant", "Me too")])


def _gpt() -> dict[str, Any]:
    return gpt_linear("Trip to Oslo", [("user", "I like fjords"), ("assistant", "Me too")])


BAD += [
    ("content a number", _broken(["chat", "history", "messages", "m1", "content"], 5, _owui()),
     "invalid_export", "[1].chat.history.messages.m1.content", ['("Trip to Oslo")', "a number"]),
    ("role missing", _broken(["chat", "history", "messages", "m0", "role"], None, _owui()),
     "invalid_export", "[1].chat.history.messages.m0.role", ["must be a string, not null"]),
    ("messages a list", _broken(["chat", "history", "messages"], [], _owui()),
     "invalid_export", "[1].chat.history.messages", ["must be an object"]),
    ("time a word", _broken(["chat", "history", "messages", "m0", "timestamp"], "yesterday",
                            _owui()),
     "invalid_export", "[1].chat.history.messages.m0.timestamp", ["is not a time"]),
    ("time in 2999", _broken(["chat", "history", "messages", "m0", "timestamp"], 32503680000,
                             _owui()),
     "invalid_export", "[1].chat.history.messages.m0.timestamp", ["a day from now"]),
    ("a cycle", _broken(["chat", "history", "messages", "m0", "parentId"], "m1", _owui()),
     "invalid_export", "[1].chat.history.messages.m0.parentId", ["cycle"]),
    ("title a list", _broken(["title"], ["x"], _owui()), "invalid_export", "[1].title",
     ["must be a string"]),
    ("parts a string", _broken(["mapping", "n0", "message", "content", "parts"], "hi", _gpt()),
     "invalid_export", "[1].mapping.n0.message.content.parts", ["must be a list"]),
    ("author missing", _broken(["mapping", "n1", "message", "author"], None, _gpt()),
     "invalid_export", "[1].mapping.n1.message.author.role", ["not null"]),
    ("node a number", _broken(["mapping", "n1"], 3, _gpt()), "invalid_export",
     "[1].mapping.n1", ["must be an object"]),
    ("create_time true", _broken(["mapping", "n0", "message", "create_time"], True, _gpt()),
     "invalid_export", "[1].mapping.n0.message.create_time", ["not a boolean"]),
]  # fmt: skip


def _timeless() -> bytes:
    chat = owui_linear("Timeless", [("user", "I like tea")])
    chat["chat"]["history"]["messages"]["m0"]["timestamp"] = None
    for key in ("created_at", "updated_at"):
        del chat[key]
    del chat["chat"]["timestamp"]
    return dumped(chat)


BAD.append(("no time at all", _timeless(), "invalid_export", "[0]", ["has no time"]))


@pytest.mark.parametrize(("raw", "code", "param", "words"), [b[1:] for b in BAD],
                         ids=[b[0] for b in BAD])  # fmt: skip
def test_a_bad_file_is_refused_naming_the_place(
    raw: bytes, code: str, param: str, words: list[str]
) -> None:
    with pytest.raises(BadExport) as refused:
        read_export(raw)
    assert (refused.value.code, refused.value.param) == (code, param)
    for word in words:
        assert word in str(refused.value)


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)


def _places(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [path]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _places(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            found += _places(item, (*path, i))
    return found


@settings(max_examples=300, derandomize=True, deadline=None, database=None)
@given(which=st.sampled_from(["openwebui", "chatgpt"]), pick=st.integers(0, 10**6), value=JSON)
def test_any_damage_to_an_export_is_read_or_refused_never_a_crash(
    which: str, pick: int, value: Any
) -> None:
    """Whatever part of an export is replaced by whatever JSON: an export or a BadExport."""
    said = [("user", "I like fjords"), ("assistant", "Me too"), ("user", "and tea")]
    export: Any = [owui_linear("Trip", said) if which == "openwebui" else gpt_linear("Trip", said)]
    places = _places(export)
    path = places[pick % len(places)]
    if not path:
        export = value
    else:
        target = export
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    try:
        read_export(orjson.dumps(export))
    except BadExport as exc:
        assert str(exc) and exc.code in {"invalid_json", "unknown_format", "empty",
                                         "invalid_export"}  # fmt: skip
