"""A large chat's data (an image's data URI, an audio clip, a file) is checked but never made into
a string: memproxy does not read it, and making a 50 MB string holds the GIL ~30 ms (app/proxy/
json_strings.py `Elided`). What the upstream receives is the client's bytes all the same, even
in a message memproxy rewrote; what is wrong in the data is refused as orjson refuses it."""

from __future__ import annotations

import base64
import json
from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

from app.proxy import json_pieces, json_splice, json_strings
from app.proxy.body import DATA_KEYS
from app.proxy.hooks import Preparation, RequestContext
from app.proxy.json_strings import Elided
from tests.helpers import RecordingHooks, assert_openai_error, completion_json

PIECE = 16
IMAGE = "data:image/png;base64," + base64.b64encode(bytes(range(256)) * 9).decode()
ANN = {"X-User-Id": "ann"}


def chat(url: str, *, system: bool = False) -> dict[str, Any]:
    parts = [
        {"type": "text", "text": "what is in it?"},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    messages = [{"role": "user", "content": parts}]
    if system:
        messages.insert(0, {"role": "system", "content": [dict(parts[1])]})
    return {"model": "m", "messages": messages, "metadata": {"data": url, "short": {"url": "x"}}}


def parsed(raw: bytes, elide: frozenset[str] = DATA_KEYS) -> tuple[Any, json_pieces.Spans]:
    """Parsed as a large body is, with pieces of a few bytes (a container holding a string
    longer than a piece is longer than the largest try: walked, never one call)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(json_strings, "PIECE_CHARS", PIECE)
        patch.setattr(json_pieces, "_TRIES", (2, 5, PIECE))
        return json_pieces.loads_with_spans(raw, elide)


def elided(value: Any) -> list[Elided]:
    if isinstance(value, Elided):
        return [value]
    if isinstance(value, dict):
        return [e for v in value.values() for e in elided(v)]
    if isinstance(value, list):
        return [e for v in value for e in elided(v)]
    return []


@pytest.mark.parametrize("ascii_only", [True, False])
def test_long_data_is_left_in_the_body_and_the_rest_is_parsed(ascii_only: bool) -> None:
    url = IMAGE + "é\\/\u00e9😀"  # escapes, a pair, characters cut by small pieces
    raw = json.dumps(chat(url, system=True), ensure_ascii=ascii_only).encode()
    value, _ = parsed(raw)
    found = elided(value)
    assert len(found) == 3  # the image twice and the metadata's data; the short url is made
    for e in found:
        assert orjson.loads(raw[e.start : e.end]) == url
        assert e == "data:image/png;base64,"  # its stand-in: the data URI's head
    assert value["metadata"]["short"]["url"] == "x"
    expected = orjson.loads(raw)
    assert value == json.loads(json.dumps(expected).replace(json.dumps(url), '"' + found[0] + '"'))
    # Without keys to elide, the very same body is parsed whole.
    assert parsed(raw, frozenset())[0] == expected


@pytest.mark.parametrize(
    ("inside", "error"),
    [
        (b"abc\xff", UnicodeDecodeError),
        (b"abc\x01", ValueError),
        (b"abc\\q", ValueError),
        (b"abc\\ud800 x", ValueError),
        (b"abc\\udc00", ValueError),
    ],
)
def test_what_is_wrong_in_long_data_is_refused_as_orjson_refuses_it(
    inside: bytes, error: type[Exception]
) -> None:
    fine = b'{"messages": [{"image_url": {"url": "' + b"y" * 40 + b'"}}]}'
    assert isinstance(parsed(fine)[0]["messages"][0]["image_url"]["url"], Elided)
    for at in (0, 5, 17, 40):
        data = b"y" * 40
        raw = b'{"messages": [{"image_url": {"url": "' + data[:at] + inside + data[at:] + b'"}}]}'
        with pytest.raises(orjson.JSONDecodeError):
            orjson.loads(raw)
        with pytest.raises(error) as caught:
            parsed(raw)
        if b"\\ud" in inside:
            assert "surrogate" in str(caught.value)
    with pytest.raises(ValueError):
        parsed(b'{"messages": [{"image_url": {"url": "' + b"y" * 40)  # unterminated


def test_a_rewritten_message_holding_long_data_is_written_with_the_client_s_bytes() -> None:
    raw = json.dumps(chat(IMAGE, system=True), ensure_ascii=True, indent=1).encode()
    value, spans = parsed(raw)
    system = value["messages"][0]
    changed = {**system, "content": [*system["content"], {"type": "text", "text": "memories"}]}
    result = {**value, "messages": [changed, *value["messages"][1:]], "metadata": {"n": 1}}
    written = orjson.loads(b"".join(json_splice.splice(result, value, raw, spans)))
    expected = orjson.loads(raw)
    assert written["messages"][0]["content"][0]["image_url"]["url"] == IMAGE
    assert written["messages"][1:] == expected["messages"][1:]
    assert written["metadata"] == {"n": 1}


def rewrite_the_first_message(ctx: RequestContext) -> Preparation:
    """A hook that changes the message holding the image (memproxy changes system messages
    only, but nothing in the proxy relies on that)."""
    first = ctx.body["messages"][0]
    changed = {**first, "content": [*first["content"], {"type": "text", "text": "and this?"}]}
    return Preparation(body={**ctx.body, "messages": [changed, *ctx.body["messages"][1:]]})


async def test_a_large_chat_s_image_reaches_the_upstream_as_sent(
    make_client: Any, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    hooks = RecordingHooks(rewrite_the_first_message)
    client: httpx.AsyncClient = await make_client(hooks=hooks)
    image = "data:image/jpeg;base64," + base64.b64encode(bytes(3 * 1024 * 1024)).decode()
    body = chat(image)
    response = await client.post("/v1/chat/completions", json=body, headers=ANN)
    assert response.status_code == 200, response.text
    sent = orjson.loads(route.calls.last.request.content)
    assert sent["messages"][0]["content"][1]["image_url"]["url"] == image
    assert sent["messages"][0]["content"][2] == {"type": "text", "text": "and this?"}
    assert sent["metadata"] == body["metadata"]
    # The hooks were given the stand-in, not 4 MB of image they do not read.
    given = hooks.prepared[0].body["messages"][0]["content"][1]["image_url"]["url"]
    assert isinstance(given, Elided) and given == "data:image/jpeg;base64,"


async def test_a_lone_surrogate_in_long_data_is_a_422_naming_it(
    make_client: Any, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client: httpx.AsyncClient = await make_client(hooks=RecordingHooks())
    image = "data:image/png;base64," + "A" * (2 * 1024 * 1024)
    raw = json.dumps(chat(image)).encode().replace(b"AAAA", b"A\\udc00", 1)
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={**ANN, "content-type": "application/json"}
    )
    error = assert_openai_error(response, 422)
    assert error["param"] == "messages[0].content[1].image_url.url"
    assert not route.called
    ok = await client.post("/v1/chat/completions", json=chat(image), headers=ANN)
    assert ok.status_code == 200  # still serving


@pytest.mark.parametrize("at", range(0, 24))
def test_a_surrogate_pair_is_never_cut_wherever_the_pieces_fall(at: int) -> None:
    url = "y" * at + "😀" * 5 + "z" * 40
    raw = json.dumps({"messages": [{"image_url": {"url": url}}]}, ensure_ascii=True).encode()
    value, _ = parsed(raw)
    got = value["messages"][0]["image_url"]["url"]
    assert isinstance(got, Elided) and orjson.loads(raw[got.start : got.end]) == url


texts = st.text(alphabet=st.characters(codec="utf-8") | st.sampled_from(["\\", '"', "😀", "é"]))


@settings(max_examples=150, deadline=None)
@given(
    urls=st.lists(texts, min_size=1, max_size=4),
    ascii_only=st.booleans(),
    rewrite=st.integers(min_value=0, max_value=3),
)
def test_an_elided_body_rewritten_is_written_as_the_whole_one_would_be(
    urls: list[str], ascii_only: bool, rewrite: int
) -> None:
    """Parsed with data left in the body, changed as memproxy changes bodies (a system message
    in front, a message rewritten), spliced: the same JSON as the change made to the body
    parsed whole, whatever the data holds and wherever the pieces cut it."""
    messages = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": u * 3}}]}
        for u in urls
    ]
    body = {"model": "m", "messages": messages, "audio": {"data": urls[0] * 5}}
    raw = json.dumps(body, ensure_ascii=ascii_only).encode()

    def change(value: dict[str, Any]) -> dict[str, Any]:
        out = list(value["messages"])
        if rewrite < len(out):
            part = {"type": "text", "text": "and?"}
            out[rewrite] = {**out[rewrite], "content": [*out[rewrite]["content"], part]}
        return {**value, "messages": [{"role": "system", "content": "memories"}, *out]}

    value, spans = parsed(raw)
    written = b"".join(json_splice.splice(change(value), value, raw, spans))
    assert orjson.loads(written) == change(orjson.loads(raw))
