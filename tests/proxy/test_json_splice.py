"""A large body written back with the client's own bytes for what memproxy left alone
(app/proxy/json_splice.py), found where the piecewise parser said (json_pieces.loads_with_spans).

The written body must be the JSON of the changed body, whatever was changed, and must not pass
an unchanged part (a 50 MB message) through orjson."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest
import respx
from hypothesis import given, settings
from hypothesis import strategies as st

import app.proxy.offload as offload
from app.proxy import json_pieces, json_splice, json_strings
from app.proxy.body import dump_json_object
from app.proxy.hooks import Preparation, RequestContext
from tests.helpers import RecordingHooks, completion_json

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)  # what orjson writes (a new part)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text()
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(st.dictionaries(st.text(max_size=5), values, max_size=3), max_size=6)
bodies = st.fixed_dictionaries(
    {"messages": messages}, optional={"model": st.text(), "n": values, "extra": values}
)


def spelled(body: dict[str, Any], ascii_only: bool, indent: int | None) -> bytes:
    return json.dumps(body, ensure_ascii=ascii_only, indent=indent).encode()


@settings(max_examples=200, deadline=None)
@given(body=bodies, ascii_only=st.booleans(), indent=st.sampled_from([None, 0, 2]))
def test_every_span_holds_its_member_and_every_message(
    body: dict[str, Any], ascii_only: bool, indent: int | None
) -> None:
    raw = spelled(body, ascii_only, indent)
    for piece in (offload.PIECE_CHARS, 7):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(json_strings, "PIECE_CHARS", piece)
            patch.setattr(json_pieces, "_TRIES", (2, 5, piece))
            parsed, spans = json_pieces.loads_with_spans(raw)
        assert parsed == orjson.loads(raw) and set(spans) == set(parsed)
        for key, span in spans.items():
            assert orjson.loads(raw[span.start : span.end]) == parsed[key]
            is_list = isinstance(parsed[key], list)
            assert (span.items is not None) == is_list
            for (start, end), item in zip(
                span.items or [], parsed[key] if is_list else [], strict=True
            ):
                assert orjson.loads(raw[start:end]) == item
            assert len(span.items or []) == (len(parsed[key]) if is_list else 0)


def test_a_repeated_key_s_span_is_its_last_value_s() -> None:
    raw = b'{"messages": [1], "model": "a", "messages": [2, 3]}'
    parsed, spans = json_pieces.loads_with_spans(raw)
    assert parsed["messages"] == [2, 3]
    two, three = raw.index(b"2"), raw.index(b"3")
    assert spans["messages"] == json_pieces.Span(
        two - 1, three + 2, [(two, two + 1), (three, three + 1)]
    )


@st.composite
def changed(draw: st.DrawFn, body: dict[str, Any]) -> dict[str, Any]:
    """`body` changed on copies, as memproxy changes one: messages replaced, inserted, dropped,
    moved or repeated, members replaced, added or dropped."""
    before = body["messages"]
    kept = draw(st.lists(st.sampled_from(before), max_size=8)) if before else []
    new = draw(st.lists(st.dictionaries(st.text(max_size=3), scalars, max_size=2), max_size=3))
    shuffled = draw(st.permutations(kept + new))
    result = {k: v for k, v in body.items() if draw(st.booleans()) or k == "messages"}
    result["messages"] = shuffled if draw(st.booleans()) else [*new, *before]
    if draw(st.booleans()):
        result["added"] = draw(values)
    if "model" in result and draw(st.booleans()):
        result["model"] = draw(st.text())
    return result


@settings(max_examples=300, deadline=None)
@given(body=bodies, ascii_only=st.booleans(), indent=st.sampled_from([None, 2]), data=st.data())
def test_a_spliced_body_is_the_json_of_the_changed_body(
    body: dict[str, Any], ascii_only: bool, indent: int | None, data: st.DataObject
) -> None:
    raw = spelled(body, ascii_only, indent)
    parsed, spans = json_pieces.loads_with_spans(raw)
    result = data.draw(changed(parsed))
    written = b"".join(json_splice.splice(result, parsed, raw, spans))
    assert orjson.loads(written) == result
    assert list(orjson.loads(written)) == list(result)  # the members in the same order


def test_what_was_left_alone_is_the_client_s_bytes_and_never_goes_through_orjson(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    large = "caf\u00e9 " * (offload.LARGE_BODY_BYTES // 4)
    body = {"model": "m", "messages": [{"role": "user", "content": large}, {"role": "user"}]}
    raw = json.dumps(body, ensure_ascii=True, indent=1).encode()  # é as \u00e9, spaced
    parsed, spans = json_pieces.loads_with_spans(raw)
    written_by_orjson: list[Any] = []
    real = orjson.dumps

    def dumps(value: Any, *args: Any, **kwargs: Any) -> bytes:
        written_by_orjson.append(value)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(orjson, "dumps", dumps)
    memories = {"role": "system", "content": "The user plays chess."}
    result = {**parsed, "messages": [memories, *parsed["messages"]]}
    pieces = dump_json_object(result, parsed, raw, spans)
    assert isinstance(pieces, list)
    views = [bytes(p) for p in pieces if isinstance(p, memoryview)]
    assert views == [b'"m"', raw[raw.index(b"[") + 1 : raw.rindex(b"]")].strip()]
    written = b"".join(pieces)
    assert orjson.loads(written) == result
    first, last = spans["messages"].items[0][0], spans["messages"].items[-1][1]  # type: ignore[index]
    assert raw[first:last] in written  # both messages as the client spelled them, in one piece
    assert written_by_orjson == ["model", "messages", memories]  # keys, and the new message
    # Without the spans (a small body), the whole body goes through orjson, as before.
    whole = dump_json_object(result, parsed)
    assert isinstance(whole, bytes) and orjson.loads(whole) == result
    assert written_by_orjson[-1] is result


def inject(ctx: RequestContext) -> Preparation:
    memories = {"role": "system", "content": "The user plays chess."}
    return Preparation(body={**ctx.body, "messages": [memories, *ctx.body["messages"]]})


async def test_a_large_chat_with_memories_goes_upstream_in_the_client_s_own_spelling(
    make_client: Any, upstream: respx.Router
) -> None:
    route = upstream.post("/chat/completions").respond(json=completion_json())
    client: httpx.AsyncClient = await make_client(hooks=RecordingHooks(inject))
    text = "\u00e9t\u00e9 " + "x" * offload.LARGE_BODY_BYTES
    body = {"model": "m", "messages": [{"role": "user", "content": text}], "user": "ann"}
    raw = json.dumps(body, ensure_ascii=True, indent=2).encode()
    response = await client.post(
        "/v1/chat/completions", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 200, response.text
    sent = route.calls.last.request.content
    assert orjson.loads(sent) == {**body, "messages": [inject_message(), *body["messages"]]}
    start = raw.index(b'{\n      "role": "user"')
    assert raw[start : raw.rindex(b"}", 0, raw.rindex(b"]"))] in sent  # \u00e9 kept as sent


def inject_message() -> dict[str, str]:
    return {"role": "system", "content": "The user plays chess."}
