"""Reading a request body within the size limit, and checking a chat request against the schema.

Errors promise OpenAI's shape with a precise ``param``: ``messages[2].content`` names the exact
place in the client's JSON, not pydantic's internal union labels.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError
from starlette.requests import Request

from app.errors import BodyTooLarge, InvalidJSON, InvalidRequest, ValidationFailed
from app.schemas.openai import ChatCompletionRequest, chat_request_adapter


async def read_body(request: Request, limit: int) -> bytes:
    """The whole body, or :class:`BodyTooLarge` as soon as it is known to exceed `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BodyTooLarge(_too_large(limit))
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(_too_large(limit))
        chunks.append(chunk)
    return b"".join(chunks)


def _too_large(limit: int) -> str:
    return f"request body exceeds {limit} bytes (raise MEMPROXY_MAX_BODY_BYTES to allow more)"


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """Parse a JSON object body: 400 for invalid JSON or for any other JSON value."""
    if not raw.strip():
        raise InvalidJSON("request body is empty; expected a JSON object")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidJSON(f"request body is not valid JSON: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidRequest(
            f"request body must be a JSON object, not {type(data).__name__}", code="invalid_body"
        )
    return data


def validate_chat_request(data: dict[str, Any]) -> ChatCompletionRequest:
    """Check a chat completion body; 422 with the first offending field as `param`."""
    try:
        return chat_request_adapter.validate_python(data)
    except ValidationError as exc:
        raise _as_validation_failed(exc, data) from None


def _as_validation_failed(exc: ValidationError, data: Any) -> ValidationFailed:
    errors = exc.errors(include_url=False)
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
