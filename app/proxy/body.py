"""Reading a request body within the size limit, and checking a chat request against the schema.

Errors promise OpenAI's shape with a precise ``param``: ``messages[2].content`` names the exact
place in the client's JSON, not pydantic's internal union labels.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson
from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request

from app.errors import BodyTooLarge, InvalidJSON, InvalidRequest, ValidationFailed
from app.proxy import json_pieces, json_splice
from app.proxy.kinds import Classification, classify
from app.proxy.offload import PIECE_ITEMS, is_large, off_loop, pieces
from app.proxy.transport import Piece
from app.schemas.checks import WRITABLE_DEPTH, json_problem, lone_surrogate_in
from app.schemas.openai import ChatCompletionRequest, Message, chat_request_adapter


async def read_body(
    request: Request, limit: int, setting: str = "MEMPROXY_MAX_BODY_BYTES"
) -> bytes:
    """The whole body, or :class:`BodyTooLarge` (naming `setting`, the limit's source) as soon as
    it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(too_large(limit, setting))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(too_large(limit, setting))
        chunks.append(chunk)
    # Off the loop when large: joining 50 MB takes ~45 ms (a fresh 50 MB, faulted in page by
    # page), and CPython lets go of the GIL while it copies a large join (bench/loop_stall.py:
    # the longest hold of the loop left with a 50 MB chat).
    return await off_loop(size, b"".join, chunks)


def too_large(limit: int, setting: str = "MEMPROXY_MAX_BODY_BYTES") -> str:
    """The 413 message: the limit, and the setting that raises it."""
    return f"request body exceeds {limit} bytes (raise {setting} to allow more)"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse a JSON object body: 400 for invalid JSON or for any other JSON value."""
    return parse_json_body(raw)[0]


DATA_KEYS = frozenset({"url", "image_url", "data", "file_data"})
"""Keys whose long string values are data that memproxy never reads: an image's URL (a data
URI; some clients give it as the `image_url` string itself), an audio clip's base64, a file's.
In a large body such a value is checked but not made (:class:`~app.proxy.json_strings.Elided`):
only the upstream reads it, as the client sent it."""


def parse_json_body(
    raw: bytes, elide: frozenset[str] = frozenset()
) -> tuple[dict[str, Any], json_pieces.Spans | None]:
    """:func:`parse_json_object`, and for a large body where each of its members lies in it
    (:func:`~app.proxy.json_pieces.loads_with_spans`, long strings under the keys `elide`
    elided; None for a small one)."""
    if not raw.strip():
        raise InvalidJSON("request body is empty; expected a JSON object")
    spans = None
    try:
        # A large body a piece at a time: one call of orjson would hold the GIL throughout.
        if is_large(len(raw)):
            data, spans = json_pieces.loads_with_spans(raw, elide)
        else:
            data = orjson.loads(raw)
    except RecursionError:
        raise InvalidJSON("request body is not valid JSON: nested too deeply") from None
    except json_pieces.LoneSurrogate as exc:  # a "\ud800" escape, found where it is
        raise ValidationFailed(str(exc), param=exc.where) from None
    except ValueError as exc:  # orjson's and the standard library's errors, bad UTF-8
        found = lone_surrogate_in(raw) if "surrogate" in str(exc) else None
        if found is not None:  # a "\ud800" escape: say in which field, as a 422 would
            where, why = found
            raise ValidationFailed(f"{where} {why}", param=where) from None
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"request body must be a JSON object, not {type(data).__name__}", code="invalid_body"
        )
    return data, spans


def dump_json_object(
    data: dict[str, Any],
    client_body: dict[str, Any],
    raw: bytes | None = None,
    spans: json_pieces.Spans | None = None,
) -> bytes | list[Piece]:
    """`data` (`client_body` as memproxy changed it) as JSON to forward; a body orjson cannot
    write (nested deeper than 254 levels: orjson reads 1024) is a 422 naming the place in the
    client's own body. Given the client's `raw` body and its `spans` (a large body), the body
    comes in pieces, what memproxy left alone views of `raw` (:mod:`app.proxy.json_splice`):
    then only a part written anew can be too deep (the rest goes on as the client sent it)."""
    try:
        if raw is not None and spans is not None:
            return json_splice.splice(data, client_body, raw, spans)
        return _dumps(data)
    except orjson.JSONEncodeError:
        found = json_problem(client_body, max_depth=WRITABLE_DEPTH, numbers=False)
        where, why = found or ("", "cannot be written as JSON")
        raise ValidationFailed(
            f"{where or 'body'} {why}: too deep for memproxy to add memories to (send it "
            "with X-Memory: off)",
            param=where or None,
        ) from None


def _dumps(data: dict[str, Any]) -> bytes:
    """``orjson.dumps(data)``, byte for byte; many messages are written a slice at a time, so
    that no one call holds the GIL for long (:mod:`app.proxy.offload`)."""
    messages = data.get("messages")
    if not (isinstance(messages, list) and len(messages) > PIECE_ITEMS):
        return orjson.dumps(data)
    out = [b"{"]
    for key, value in data.items():
        out += [b"," if len(out) > 1 else b"", orjson.dumps(key), b":"]
        if key == "messages":
            # Each slice written as a list, its brackets dropped: the elements, comma-separated.
            items = b",".join(orjson.dumps(part)[1:-1] for _, part in pieces(messages))
            out += [b"[", items, b"]"]
        else:
            out.append(orjson.dumps(value))
    out.append(b"}")
    return b"".join(out)


_messages_adapter: TypeAdapter[list[Message]] = TypeAdapter(list[Message])


class ChatBody(NamedTuple):
    """A chat body read: the client's JSON, checked, classified, and for a large body where
    each member lies in it (to write it back: :func:`dump_json_object`)."""

    data: dict[str, Any]
    checked: ChatCompletionRequest
    kind: Classification
    spans: json_pieces.Spans | None


def read_chat(raw: bytes, task_header: str | None) -> ChatBody:
    """Parse, check and classify a chat body: the CPU-heavy start of every chat, in one function
    so that a large body takes one trip to a worker thread for all of it."""
    data, spans = parse_json_body(raw, DATA_KEYS)
    checked = validate_chat_request(data)
    return ChatBody(data, checked, classify(data["messages"], task_header), spans)


def validate_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    """Check a chat completion body; 422 with the first offending field as `param`."""
    messages = data.get("messages")
    if isinstance(messages, list) and len(messages) > PIECE_ITEMS:
        return _validate_in_pieces(data, messages)
    try:
        return chat_request_adapter.validate_python(data)
    except ValidationError as exc:
        raise _as_validation_failed(exc.errors(include_url=False), data) from None


def _validate_in_pieces(data: dict[str, Any], messages: list[Any]) -> ChatCompletionRequest:
    """The check of :func:`validate_chat_request`, a slice of messages per call into pydantic
    (:mod:`app.proxy.offload`): the body with its first slice, then each further slice. When
    several messages are wrong, the first wrong slice is the one reported."""
    try:
        first = chat_request_adapter.validate_python({**data, "messages": messages[:PIECE_ITEMS]})
    except ValidationError as exc:
        raise _as_validation_failed(exc.errors(include_url=False), data) from None
    checked = list(first.messages)
    for start, part in pieces(messages):
        if start == 0:
            continue
        try:
            checked += _messages_adapter.validate_python(part)
        except ValidationError as exc:
            errors = [
                {**e, "loc": ("messages", start + int(e["loc"][0]), *e["loc"][1:])}
                for e in exc.errors(include_url=False)
            ]
            raise _as_validation_failed(errors, data) from None
    return first.model_copy(update={"messages": checked})


def _as_validation_failed(errors: Sequence[Any], data: Any) -> ValidationFailed:
    located = [(_error_path(data, e), e) for e in errors]
    # A union reports one error per alternative: the deepest place is the one that matched the
    # input's shape (a list given where `str | list` was allowed fails inside the list).
    param = max((path for path, _ in located), key=_depth)
    same_place = [e for path, e in located if path == param]
    reasons = list(dict.fromkeys(_reason(e) for e in same_place))
    message = f"invalid {param or 'body'}: " + " or ".join(reasons)
    return ValidationFailed(message, param=param or None)


def _error_path(data: Any, error: Any) -> str:
    loc = tuple(error["loc"])
    if error["type"] == "missing" and loc and isinstance(loc[-1], str):
        # The last step names the missing field, even when it looks like a tag (`text`).
        parent = input_path(data, loc[:-1])
        return f"{parent}.{loc[-1]}" if parent else loc[-1]
    return input_path(data, loc)


def _depth(path: str) -> int:
    return path.count(".") + path.count("[") + (1 if path else 0)


def _reason(error: Any) -> str:
    if error["type"] == "missing":
        return "required field is missing"
    return str(error["msg"])


def input_path(data: Any, loc: tuple[int | str, ...]) -> str:
    """Map a pydantic error location onto the client's JSON (`messages[2].content`).

    Pydantic puts union labels (`user`, `str`, `list[...]`, `ImageURL`) into locations; walking
    the actual input and skipping labels keeps only the steps the client wrote.
    """
    path = ""
    current = data
    for step in loc:
        if isinstance(step, int):
            if not (isinstance(current, list) and 0 <= step < len(current)):
                break
            path += f"[{step}]"
            current = current[step]
        elif isinstance(current, dict) and step in current:
            path += f".{step}" if path else step
            current = current[step]
        elif _is_union_label(step):
            continue
        else:
            if isinstance(current, dict):  # a missing field: name it; nothing below to walk
                path += f".{step}" if path else step
            break
    return path


_TAGS = frozenset(
    {
        "system",
        "developer",
        "user",
        "assistant",
        "tool",
        "function",
        "text",
        "image_url",
        "input_audio",
        "file",
        "refusal",
        "other",
    }
)
_TYPE_NAMES = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})


def _is_union_label(step: str) -> bool:
    return step in _TAGS or step in _TYPE_NAMES or step[:1].isupper() or "[" in step
