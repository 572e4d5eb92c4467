"""OpenAI `messages` -> PydanticAI history. The client resends the whole chat: no database here.

Mapping (the inverse of what PydanticAI's OpenAI model sends):

- `system` / `developer`: instructions (joined in order into `ConvertedHistory.instructions`, and
  set on the request they precede, so a model sees them where the client put them);
- `user`: a `UserPromptPart`; text parts stay text, `image_url` becomes `ImageUrl` (data URIs
  kept as URLs: decoding megabytes of base64 that memory never looks at would be waste),
  `input_audio` and `file` with inline data become `BinaryContent` (in a large body such data is
  a stand-in, the data URI's head: :data:`app.proxy.body.DATA_KEYS`), a `file_id` becomes
  `UploadedFile`; parts of unknown types are left out;
- `assistant`: a `ModelResponse` with a `TextPart` and one `ToolCallPart` per tool call;
- `tool` / `function`: a `ToolReturnPart`, its tool name found from the call it answers.

Consecutive request-side messages share one `ModelRequest`, as PydanticAI alternates requests and
responses. The last user message is the current prompt: `ConvertedHistory.prompt`, kept out of
`history` so `agent.run(prompt, message_history=history)` works as is.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelMessage,
    ModelRequest,
    ModelRequestPart,
    ModelResponse,
    ModelResponsePart,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UploadedFile,
    UserContent,
    UserPromptPart,
)

from app.proxy.offload import PIECE_CHARS
from app.schemas import openai as oa


@dataclass(slots=True)
class ConvertedHistory:
    history: list[ModelMessage] = field(default_factory=list)
    """Everything before the current prompt, as PydanticAI messages."""
    prompt: str | list[UserContent] | None = None
    """The last user message's content, when the conversation ends with one."""
    instructions: str | None = None
    """All system and developer messages' text, in order, blank-line separated."""


def convert(messages: Sequence[oa.Message]) -> ConvertedHistory:
    """Convert validated OpenAI messages; never raises for a message the schema accepted."""
    out: list[ModelMessage] = []
    pending: list[ModelRequestPart] = []
    pending_instructions: list[str] = []
    all_instructions: list[str] = []
    tool_names: dict[str, str] = {}

    def flush() -> None:
        # Instructions with no part to carry them wait for the next request; they are in
        # `ConvertedHistory.instructions` in any case.
        if pending:
            text = "\n\n".join(pending_instructions) or None
            out.append(ModelRequest(parts=list(pending), instructions=text))
            pending.clear()
            pending_instructions.clear()

    prompt_index = _last_user_index(messages)
    prompt: str | list[UserContent] | None = None
    for index, message in enumerate(messages):
        if isinstance(message, oa.SystemMessage | oa.DeveloperMessage):
            text = oa.content_text(message.content)
            pending_instructions.append(text)
            all_instructions.append(text)
        elif isinstance(message, oa.UserMessage):
            content = _user_content(message.content)
            if index == prompt_index:
                prompt = content
            else:
                pending.append(UserPromptPart(content=content))
        elif isinstance(message, oa.AssistantMessage):
            flush()
            out.append(ModelResponse(parts=_response_parts(message, tool_names)))
        elif isinstance(message, oa.ToolMessage):
            name = tool_names.get(message.tool_call_id, "unknown_tool")
            pending.append(
                ToolReturnPart(
                    name, oa.content_text(message.content), tool_call_id=message.tool_call_id
                )
            )
        elif isinstance(message, oa.FunctionMessage):
            pending.append(ToolReturnPart(message.name, message.content or ""))
    flush()
    instructions = "\n\n".join(all_instructions) or None
    return ConvertedHistory(history=out, prompt=prompt, instructions=instructions)


def _last_user_index(messages: Sequence[oa.Message]) -> int | None:
    """The current prompt: the last message, if it is the user's."""
    if messages and isinstance(messages[-1], oa.UserMessage):
        return len(messages) - 1
    return None


def _user_content(content: str | list[oa.ContentPart]) -> str | list[UserContent]:
    if isinstance(content, str):
        return content
    items: list[UserContent] = []
    for part in content:
        item = _user_item(part)
        if item is not None:
            items.append(item)
    return items


def _user_item(part: oa.ContentPart) -> UserContent | None:
    if isinstance(part, oa.TextPart):
        return part.text
    if isinstance(part, oa.ImagePart):
        url = part.image_url if isinstance(part.image_url, str) else part.image_url.url
        return ImageUrl(url=url)
    if isinstance(part, oa.AudioPart):
        data = _b64(part.input_audio.data)
        return (
            None
            if data is None
            else BinaryContent(data, media_type=f"audio/{part.input_audio.format}")
        )
    if isinstance(part, oa.FilePart):
        return _file_item(part.file)
    return None


def _file_item(ref: oa.FileRef) -> UserContent | None:
    if ref.file_data:
        if ref.file_data.startswith("data:"):
            return _from_data_uri(ref.file_data)
        data = _b64(ref.file_data)
        if data is not None:
            return BinaryContent(data, media_type="application/pdf", identifier=ref.filename)
    if ref.file_id:
        return UploadedFile(ref.file_id, provider_name="openai")
    return None


def _from_data_uri(uri: str) -> UserContent | None:
    media_type, marker, data = uri[len("data:") :].partition(";base64,")
    if marker and len(data) > PIECE_CHARS and "%" not in data:
        decoded = _b64(data)  # the same bytes as PydanticAI's, a piece at a time
        if decoded is not None:
            return BinaryContent.narrow_type(BinaryContent(decoded, media_type=media_type))
    try:
        return BinaryContent.from_data_uri(uri)
    except ValueError:
        return None


def _b64(data: str) -> bytes | None:
    """Strict base64, or None. A long string is decoded a piece at a time (a multiple of four
    characters each), so that no one call holds the GIL for long (:mod:`app.proxy.offload`)."""
    step = PIECE_CHARS - PIECE_CHARS % 4
    pieces = [data[start : start + step] for start in range(0, len(data), step)]
    if len(pieces) > 1 and pieces[-1].startswith("="):  # padding alone would be "leading"
        pieces[-2:] = [pieces[-2] + pieces[-1]]
    try:
        if len(pieces) < 2 or any("=" in piece for piece in pieces[:-1]):
            return base64.b64decode(data, validate=True)  # padding mid-way: one call says why
        return b"".join(base64.b64decode(piece, validate=True) for piece in pieces)
    except (binascii.Error, ValueError):
        return None


def _response_parts(
    message: oa.AssistantMessage, tool_names: dict[str, str]
) -> list[ModelResponsePart]:
    parts: list[ModelResponsePart] = []
    text = oa.content_text(message.content) or message.refusal or ""
    if text:
        parts.append(TextPart(text))
    for call in message.tool_calls or ():
        tool_names[call.id] = call.function.name
        parts.append(
            ToolCallPart(call.function.name, call.function.arguments, tool_call_id=call.id)
        )
    return parts
