"""The OpenAI chat wire format, as far as memproxy needs to check and read it.

Every model allows extra fields (``extra="allow"``): these schemas *validate* a request; the bytes
forwarded upstream are the client's own, so a field we do not model (tools, response_format,
``num_keep``...) is never lost. A content part of a type we do not know is accepted and forwarded
(upstreams add new ones: ``video_url``...); a known type with the wrong shape is rejected.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, StrictBool, Tag, TypeAdapter


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="allow")


# --- content parts ----------------------------------------------------------------------------


class TextPart(OpenAIBaseModel):
    type: Literal["text"]
    text: str


def content_text(content: Any, sep: str = "\n") -> str:
    """The text of a message's `content`, its text parts joined by `sep`: a string as it is; of a
    list, the ``text`` parts (as the client sent them, or validated :class:`TextPart`) and plain
    strings (PydanticAI's user content); '' for anything else. Other parts are skipped."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list | tuple):
        return ""
    texts = []
    for part in content:
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, TextPart):
            texts.append(part.text)
        elif isinstance(part, dict) and part.get("type") == "text":
            text = part.get("text")
            if isinstance(text, str):
                texts.append(text)
    return sep.join(texts)


class ImageURL(OpenAIBaseModel):
    url: str
    detail: str | None = None


class ImagePart(OpenAIBaseModel):
    type: Literal["image_url"]
    image_url: ImageURL | str
    """An object per the OpenAI spec; a bare URL string is accepted too (some clients send it)."""


class InputAudio(OpenAIBaseModel):
    data: str
    """Base64-encoded audio."""
    format: str
    """`wav`, `mp3`..."""


class AudioPart(OpenAIBaseModel):
    type: Literal["input_audio"]
    input_audio: InputAudio


class FileRef(OpenAIBaseModel):
    file_data: str | None = None
    """A data URI or bare base64 of the file."""
    file_id: str | None = None
    filename: str | None = None


class FilePart(OpenAIBaseModel):
    type: Literal["file"]
    file: FileRef


class RefusalPart(OpenAIBaseModel):
    type: Literal["refusal"]
    refusal: str


class OtherPart(OpenAIBaseModel):
    """A part of a type memproxy does not model: forwarded as is, skipped in memory work."""

    type: str


_KNOWN_PARTS = frozenset({"text", "image_url", "input_audio", "file", "refusal"})


def _part_tag(value: Any) -> str | None:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    if not isinstance(kind, str):
        return None  # pydantic reports "unable to extract tag": the part needs a string `type`
    return kind if kind in _KNOWN_PARTS else "other"


ContentPart = Annotated[
    Annotated[TextPart, Tag("text")]
    | Annotated[ImagePart, Tag("image_url")]
    | Annotated[AudioPart, Tag("input_audio")]
    | Annotated[FilePart, Tag("file")]
    | Annotated[RefusalPart, Tag("refusal")]
    | Annotated[OtherPart, Tag("other")],
    Discriminator(_part_tag),
]


# --- messages ---------------------------------------------------------------------------------


class SystemMessage(OpenAIBaseModel):
    role: Literal["system"]
    content: str | list[ContentPart]
    name: str | None = None


class DeveloperMessage(OpenAIBaseModel):
    role: Literal["developer"]
    content: str | list[ContentPart]
    name: str | None = None


class UserMessage(OpenAIBaseModel):
    role: Literal["user"]
    content: str | list[ContentPart]
    name: str | None = None


class FunctionCall(OpenAIBaseModel):
    name: str
    arguments: str = ""
    """JSON text, as the model produced it (not necessarily valid JSON)."""


class ToolCall(OpenAIBaseModel):
    id: str
    type: str = "function"
    function: FunctionCall


class AssistantMessage(OpenAIBaseModel):
    role: Literal["assistant"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCall] | None = None
    refusal: str | None = None
    name: str | None = None


class ToolMessage(OpenAIBaseModel):
    role: Literal["tool"]
    content: str | list[ContentPart]
    tool_call_id: str


class FunctionMessage(OpenAIBaseModel):
    """The deprecated `function` role: a function result, like a tool message without an id."""

    role: Literal["function"]
    content: str | None = None
    name: str


Message = Annotated[
    SystemMessage
    | DeveloperMessage
    | UserMessage
    | AssistantMessage
    | ToolMessage
    | FunctionMessage,
    Field(discriminator="role"),
]


class EndUser(OpenAIBaseModel):
    """`user` as an object, as Open WebUI pipelines send it (`{"id", "name", "email", "role"}`)."""

    id: str


class ChatCompletionRequest(OpenAIBaseModel):
    model: str
    messages: Annotated[list[Message], Field(min_length=1)]
    stream: StrictBool | None = False  # as OpenAI: `"yes"` or `1` is refused, not read as true
    user: str | EndUser | None = None


chat_request_adapter: TypeAdapter[ChatCompletionRequest] = TypeAdapter(ChatCompletionRequest)


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """The one error shape every endpoint answers with (see `app.errors`)."""

    error: ErrorDetail
