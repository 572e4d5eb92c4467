"""Reading the assistant's reply back from captured bytes."""

from __future__ import annotations

import orjson

from app.proxy.hooks import Completion, Outcome
from app.proxy.relay import _split_at_event_end
from tests.helpers import completion_json, sse


def test_stream_text_tool_calls_and_usage() -> None:
    raw = (
        sse(
            {"role": "assistant", "content": ""},
            {"content": "Hi "},
            {"content": "you"},
            {
                "tool_calls": [
                    {"index": 0, "id": "c1", "function": {"name": "lo", "arguments": '{"a"'}}
                ]
            },
            {"tool_calls": [{"index": 0, "function": {"name": "okup", "arguments": ": 1}"}}]},
        )
        + b'data: {"choices": [], "usage": {"total_tokens": 9}}\n\ndata: not json\n\n'
    )
    # Split anywhere: the reader joins the captured chunks first.
    captured = [raw[:17], raw[17:80], raw[80:]]
    result = Completion(Outcome.COMPLETED, 200, captured, sse=True)
    assert result.assistant_text == "Hi you"
    assert result.tool_calls == [
        {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": '{"a": 1}'}}
    ]
    assert result.usage == {"total_tokens": 9}


def test_json_body_and_errors() -> None:
    body = orjson.dumps(completion_json("done"))
    result = Completion(Outcome.COMPLETED, 200, [body], sse=False)
    assert (result.assistant_text, result.finish_reason) == ("done", "stop")
    assert Completion(Outcome.UPSTREAM_FAILED, 500, [b"{}"], sse=False).assistant_text == ""
    assert Completion(Outcome.COMPLETED, 200, [b"<html>"], sse=False).assistant_text == ""


def test_event_splitter() -> None:
    assert _split_at_event_end(b"data: a\n\n") == (b"data: a\n\n", b"")
    assert _split_at_event_end(b"data: a\n\ndata: b") == (b"data: a\n\n", b"data: b")
    assert _split_at_event_end(b"data: a\r\n\r\ndata: b") == (b"data: a\r\n\r\n", b"data: b")
    assert _split_at_event_end(b"data: partial") == (b"", b"data: partial")
    huge = b"x" * (2 * 1024 * 1024)
    assert _split_at_event_end(huge) == (huge, b"")
