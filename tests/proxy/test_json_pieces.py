"""A large body is parsed a value at a time (app/proxy/json_pieces.py) and the garbage collector
is held off while its objects are alive (offload.CollectorPause): both must be invisible to the
client. The piecewise parser is checked against orjson itself, on generated documents and on
every edge where the standard library and orjson differ."""

from __future__ import annotations

import asyncio
import gc
import json
from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

import app.proxy.offload as offload
from app.proxy import json_pieces, json_strings
from app.schemas.openai import UserMessage
from tests.conftest import AppClientFactory
from tests.helpers import completion_json
from tests.memory.learning.support import Remembering, manager_client, services

ANN = {"X-User-Id": "ann"}
PADDING = "x" * (offload.LARGE_BODY_BYTES + 10)
"""Makes any body large."""

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
bodies = st.dictionaries(st.text(), values, max_size=5)


def same_as_orjson(raw: bytes) -> None:
    """pieces.loads(raw) returns what orjson does, or both refuse it: with real pieces, and
    with pieces of a few characters, so that every cut (inside strings, escapes, surrogate
    pairs, nested values) is crossed by small documents."""
    for piece in (offload.PIECE_CHARS, 7, 1):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(json_strings, "PIECE_CHARS", piece)
            patch.setattr(json_pieces, "PIECE_CHARS", piece)  # runs of spaces, numbers
            patch.setattr(json_pieces, "_TRIES", (2, 5, piece))
            try:
                expected = orjson.loads(raw)
            except orjson.JSONDecodeError:
                with pytest.raises((ValueError, RecursionError)):
                    json_pieces.loads(raw)
                continue
            got = json_pieces.loads(raw)
            # Written back, equal values of another type (1 and 1.0, 0.0 and -0.0) differ.
            assert orjson.dumps(got) == orjson.dumps(expected), piece


@settings(max_examples=300, deadline=None)
@given(body=bodies, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_generated_documents_parse_as_orjson_parses_them(
    body: dict[str, Any], ascii_only: bool, indent: int | None
) -> None:
    for separators in ((",", ":"), (", ", ": ")):
        text = json.dumps(body, ensure_ascii=ascii_only, indent=indent, separators=separators)
        same_as_orjson(text.encode())  # st.text() makes no lone surrogate: pairs only


@settings(max_examples=200, deadline=None)
@given(body=bodies, data=st.data())
def test_cut_or_damaged_documents_are_refused_as_orjson_refuses_them(
    body: dict[str, Any], data: st.DataObject
) -> None:
    raw = json.dumps(body, ensure_ascii=data.draw(st.booleans())).encode()
    cut = data.draw(st.integers(min_value=0, max_value=len(raw)))
    same_as_orjson(raw[:cut])
    at = data.draw(st.integers(min_value=0, max_value=max(len(raw) - 1, 0)))
    byte = data.draw(st.sampled_from(b'{}[],:"\\ 0a\x00\xff'))
    same_as_orjson(raw[:at] + bytes([byte]) + raw[at + 1 :])


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 123456789012345678901234567890}',  # beyond 64 bits: a float, as orjson reads it
        b'{"a": 18446744073709551615, "b": -9223372036854775808, "c": -9223372036854775809}',
        b'{"a": 1' + b"0" * 400 + b"}",  # an integer that no double holds
        b'{"a": 1' + b"0" * 5000 + b"}",  # beyond Python's digit limit for int()
        b'{"a": ["\\ud83d\\ude00\\ud83d\\ude00", "\\\\ud83d x", "\\"\\\\\\/\\b\\f\\n\\r\\t"]}',
        b'{"a": "\\u00e9\\u4e2d", "b": "\\u00e9x"}',
        b'{"a": "abc\\',
        b'{"a": "abc\\q"}',
        b'{"a": "abc',
        b'{"abcdefghijklmnop": {"qrstuvwxyz": [1, 2, {"x": "yz"}]}, "k": [[[["deep"]]]]}',
        b'{"a": 1e400}',
        b'{"a": -1e400}',
        b'{"a": NaN}',
        b'{"a": Infinity}',
        b'{"a": -Infinity}',
        b'\xef\xbb\xbf{"a": 1}',
        b'{"a": 1} x',
        b'{"a": 1}{}',
        b'  {"a" : [ 1 , {"b" : [2]} ] }  \n',
        b'{"a": "\\ud83d\\ude00 \xc3\xa9"}',
        b'{"a": "\xc3"}',
        b'{"a": "\x01"}',
        b'{"a": [1,]}',
        b'{"a": 1,}',
        b"{'a': 1}",
        b'{"a" 1}',
        b'["messages"]',
        b"",
        b"[" * 5000 + b"]" * 5000,
        b'{"a": ' + b"[" * 5000 + b"]" * 5000 + b"}",
    ],
)
def test_edges_where_the_standard_library_and_orjson_differ(raw: bytes) -> None:
    same_as_orjson(raw)


def test_long_strings_are_cut_between_escapes_never_inside_one() -> None:
    """Pieces of 16 characters: every cut lands on a pair, an escape, a run of backslashes."""
    for filler in range(20):
        for inner in ("\\ud83d\\ude00", "\\\\ud83d", "\\\\\\ud83d\\ude00", '\\n\\u00e9\\"'):
            raw = ('{"k": ["' + "x" * filler + inner * 9 + '"]}').encode()
            same_as_orjson(raw)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": "\\ud800", "a": "ok"}',
        b'{"m": [{"role": "user", "content": "\\udc00 x", "content": "fine"}]}',
        b'{"m": [[{"k": {"a": "\\ud83d", "a": 1}}]]}',
    ],
)
def test_a_lone_surrogate_under_a_duplicate_key_is_refused_as_orjson_refuses_it(
    raw: bytes,
) -> None:
    """The later value would hide it from the caller's check of the parsed body."""
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(raw)
    for piece in (offload.PIECE_CHARS, 7):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(json_strings, "PIECE_CHARS", piece)
            patch.setattr(json_pieces, "_TRIES", (2, 5, piece))
            with pytest.raises(ValueError, match="surrogate"):
                json_pieces.loads(raw)
    assert json_pieces.loads(b'{"a": "\\ud83d\\ude00", "a": "ok"}') == {"a": "ok"}


def test_a_long_string_whose_first_piece_ends_inside_an_escape_is_still_cut(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first piece used to go whole to the C scanner when an escape straddled its end."""
    monkeypatch.setattr(json_strings, "PIECE_CHARS", 16)
    calls: list[int] = []
    real = json_strings._scanstring

    def scanstring(text: str, at: int) -> tuple[str, int]:
        value, end = real(text, at)
        calls.append(end - at)  # how much of the text this one call went through
        return value, end

    monkeypatch.setattr(json_strings, "_scanstring", scanstring)
    text = "x" * 15 + "\\n" + "y" * 200  # the escape straddles the first piece's end
    raw = ('{"k": "' + text + '"}').encode()
    assert json_pieces.loads(raw) == orjson.loads(raw)
    assert calls and max(calls) <= 40  # pieces, never the whole string


@pytest.mark.parametrize("size", [*range(16, 26), 1])
def test_utf8_is_never_cut_inside_a_character(size: int) -> None:
    """Pieces of a few bytes (a long string's are 16 at least): the cuts fall at every offset
    inside characters of 2, 3 and 4 bytes, in strings and in small values' windows alike."""
    for text in ("é中😀x" * 9, "x" + "中😀é" * 9, "xx" + "😀é中" * 9, "xxx" + "😀" * 20):
        for raw in (
            orjson.dumps({"a": text}),
            orjson.dumps({"a": [[text, "é"], {"中": ["😀"]}]}),
            orjson.dumps({"a": [[1, 2], [3, {"b": "é中"}]], "c": "é中😀"}),
        ):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(json_strings, "PIECE_CHARS", size)
                patch.setattr(json_pieces, "_TRIES", (size, size + 1, size + 3))
                assert json_pieces.loads(raw) == orjson.loads(raw)
                with pytest.raises(UnicodeDecodeError):
                    json_pieces.loads(b'{"a": "' + text.encode() + b'\xe4\xb8"}')


def test_a_surrogate_escape_is_found_wherever_a_window_cuts() -> None:
    step = offload.PIECE_CHARS
    for at in (0, step - 3, step - 1, step, step + 5, 3 * step - 2):
        raw = b" " * at + b"\\uD800" + b" " * 10
        assert json_strings.has_surrogate_escape(raw), at
    assert not json_strings.has_surrogate_escape(b'{"a": "\\u00e9 \\uD7FF"}' + b" " * step)


@pytest.fixture
def upstream_ok(upstream: respx.Router) -> respx.Route:
    return upstream.post("/chat/completions").respond(json=completion_json("Noted."))


@pytest.mark.parametrize(
    ("content", "status", "param"),
    [
        ('"' + PADDING + ' \\ud800"', 422, "messages[0].content"),
        ('"' + PADDING + ' \\ud83d\\ude00"', 200, None),
        ('"' + PADDING + '"', 200, None),
        ('"' + PADDING + '" oops', 400, None),
        ('"' + PADDING + ' \\x"', 400, None),
        ('"\\ud800", "content": "' + PADDING + '"', 400, None),  # hidden by a duplicate key
    ],
)
async def test_large_bodies_get_the_answers_small_ones_get(
    client: httpx.AsyncClient, upstream_ok: respx.Route, content: str, status: int, param: str
) -> None:
    raw = '{"model": "m", "messages": [{"role": "user", "content": ' + content + "}]}"
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={**ANN, "content-type": "application/json"}
    )
    assert response.status_code == status, response.text
    if status != 200:
        error = response.json()["error"]
        assert error["param"] == param
        assert error["type"] == "invalid_request_error"
        assert error["code"] == ("invalid_json" if status == 400 else "invalid_value")
    ok = await client.post("/v1/chat/completions", json=small_chat(), headers=ANN)
    assert ok.status_code == 200  # still serving
    await services(client).runner.drain(10)
    assert gc.isenabled()


def small_chat(text: str = "hello") -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": text}]}


def many_messages(n: int = 400) -> dict[str, Any]:
    turns = [
        {"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i} {PADDING[:1000]}"}
        for i in range(n)
    ]
    return {"model": "m", "messages": turns}


def alive(kind: type) -> int:
    return sum(isinstance(o, kind) for o in gc.get_objects())


async def test_the_collector_waits_while_a_large_chat_is_worked_on_then_runs_again(
    make_client: AppClientFactory, upstream: respx.Router
) -> None:
    """Paused from parsing until the Manager job is written; by the time the upstream answers,
    the parsed messages are gone and the collector runs again: the pause never spans a reply
    that may stream for minutes."""
    client = await manager_client(make_client, Remembering())
    seen: list[tuple[bool, int]] = []

    async def answer(request: httpx.Request) -> httpx.Response:
        before = gc.isenabled()
        for _ in range(200):  # the pause ends once the job is written, while this "thinks"
            if gc.isenabled():
                break
            await asyncio.sleep(0.01)
        seen.append((before, alive(UserMessage)))
        return httpx.Response(200, json=completion_json("Noted."))

    upstream.post("/chat/completions").mock(side_effect=answer)
    gc.collect()
    before = alive(UserMessage)  # other tests' leftovers, if any
    response = await client.post("/v1/chat/completions", json=many_messages(), headers=ANN)
    assert response.status_code == 200, response.text
    assert gc.isenabled()
    response = await client.post("/v1/chat/completions", json=small_chat(), headers=ANN)
    assert response.status_code == 200, response.text
    await services(client).runner.drain(10)
    # The large chat: paused when the request went upstream (the job was being written),
    # messages freed before the answer; the small one: never paused.
    assert seen[0] == (False, before), seen
    assert seen[1][0] is True
    assert gc.isenabled()


async def test_a_large_chat_refused_or_failing_ends_its_pause(
    client: httpx.AsyncClient, upstream: respx.Router
) -> None:
    bad = many_messages()
    bad["messages"][300] = {"role": "wizard", "content": "hi"}
    response = await client.post("/v1/chat/completions", json=bad, headers=ANN)
    assert response.status_code == 422
    assert gc.isenabled()
    upstream.post("/chat/completions").mock(side_effect=httpx.ConnectError("refused"))
    response = await client.post("/v1/chat/completions", json=many_messages(), headers=ANN)
    assert response.status_code == 502
    await services(client).runner.drain(10)
    assert gc.isenabled()


async def test_pauses_nest_and_a_forgotten_one_ends_by_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(offload, "PAUSE_SECONDS", 0.05)
    first = offload.pause_collector(offload.LARGE_BODY_BYTES + 1)
    second = offload.pause_collector(offload.LARGE_BODY_BYTES + 1)
    assert offload.pause_collector(10) is None
    assert first is not None and second is not None
    assert not gc.isenabled()
    first.release()
    first.release()  # twice is once
    assert not gc.isenabled()
    await asyncio.sleep(0.2)  # `second` is never released by hand
    assert gc.isenabled()
    gc.disable()  # a process that runs without the collector keeps it off
    try:
        pause = offload.pause_collector(offload.LARGE_BODY_BYTES + 1)
        assert pause is not None
        pause.release()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_overlapping_pauses_never_keep_the_collector_off_for_good(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Large bodies arriving faster than they finish would chain pauses forever: once the
    collector has been off for PAUSE_SECONDS, no new pause starts until it has run again."""
    monkeypatch.setattr(offload, "PAUSE_SECONDS", 0.1)
    large = offload.LARGE_BODY_BYTES + 1
    current = offload.pause_collector(large)
    assert current is not None
    for _ in range(6):  # each new body before the previous one is done
        await asyncio.sleep(0.05)
        following = offload.pause_collector(large)
        current.release()
        if following is None:
            break
        current = following
    else:
        pytest.fail("pauses chained for longer than PAUSE_SECONDS")
    assert gc.isenabled()
    assert offload.pause_collector(large) is not None  # after a break, large bodies pause again
    await asyncio.sleep(0.2)
    assert gc.isenabled()
