"""OpenAI messages -> PydanticAI history."""

from __future__ import annotations

from pydantic_ai.messages import (
    BinaryContent,
    ImageUrl,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UploadedFile,
    UserPromptPart,
)

from app.proxy.history import convert
from app.schemas.openai import chat_request_adapter


def _convert(messages: list[dict]):
    return convert(
        chat_request_adapter.validate_python({"model": "m", "messages": messages}).messages
    )


def test_system_and_developer_become_instructions_and_last_user_is_prompt() -> None:
    result = _convert(
        [
            {"role": "system", "content": "You are terse."},
            {"role": "developer", "content": [{"type": "text", "text": "Use metric units."}]},
            {"role": "user", "content": "first"},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": "second"},
        ]
    )
    assert result.instructions == "You are terse.\n\nUse metric units."
    assert result.prompt == "second"
    first, reply = result.history
    assert (
        isinstance(first, ModelRequest)
        and first.instructions == "You are terse.\n\nUse metric units."
    )
    assert [type(p) for p in first.parts] == [UserPromptPart] and first.parts[0].content == "first"
    assert isinstance(reply, ModelResponse) and reply.parts == [TextPart("ok")]


def test_tool_calls_and_results_are_paired_by_id() -> None:
    result = _convert(
        [
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    },
                    {
                        "id": "c2",
                        "type": "function",
                        "function": {"name": "time", "arguments": "{}"},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "c2", "content": "noon"},
            {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "sunny"}]},
        ]
    )
    assert result.prompt is None  # ends with tool results: a tool continuation
    _request, response, results = result.history
    call = response.parts[0]
    assert isinstance(call, ToolCallPart) and (call.tool_name, call.args, call.tool_call_id) == (
        "weather",
        '{"city": "Oslo"}',
        "c1",
    )
    assert [(p.tool_name, p.content, p.tool_call_id) for p in results.parts] == [
        ("time", "noon", "c2"),
        ("weather", "sunny", "c1"),
    ]
    assert all(isinstance(p, ToolReturnPart) for p in results.parts)


def test_multimodal_user_parts() -> None:
    result = _convert(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "https://x/cat.png", "detail": "low"},
                    },
                    {"type": "image_url", "image_url": "data:image/png;base64,AAAA"},
                    {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                    {
                        "type": "file",
                        "file": {
                            "file_data": "data:application/pdf;base64,JVBERi0=",
                            "filename": "a.pdf",
                        },
                    },
                    {"type": "file", "file": {"file_id": "file-123"}},
                    {"type": "video_url", "video_url": {"url": "https://x/v.mp4"}},
                ],
            }
        ]
    )
    text, image, data_image, audio, pdf, uploaded = result.prompt
    assert text == "look"
    assert isinstance(image, ImageUrl) and image.url == "https://x/cat.png"
    assert isinstance(data_image, ImageUrl) and data_image.url.startswith("data:image/png")
    assert (
        isinstance(audio, BinaryContent)
        and audio.media_type == "audio/wav"
        and audio.data == b"RIFF"
    )
    assert (
        isinstance(pdf, BinaryContent)
        and pdf.media_type == "application/pdf"
        and pdf.data == b"%PDF-"
    )
    assert isinstance(uploaded, UploadedFile) and uploaded.file_id == "file-123"


def test_bad_base64_audio_is_skipped_not_fatal() -> None:
    result = _convert(
        [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "hear"},
                    {"type": "input_audio", "input_audio": {"data": "%%%", "format": "mp3"}},
                ],
            }
        ]
    )
    assert result.prompt == ["hear"]


def test_earlier_user_turns_and_legacy_function_role() -> None:
    result = _convert(
        [
            {"role": "user", "content": "a"},
            {"role": "user", "content": "b"},
            {"role": "function", "name": "calc", "content": "4"},
            {"role": "assistant", "content": [{"type": "text", "text": "four"}]},
        ]
    )
    request, response = result.history
    assert [getattr(p, "content", None) for p in request.parts] == ["a", "b", "4"]
    assert isinstance(request.parts[2], ToolReturnPart) and request.parts[2].tool_name == "calc"
    assert response.parts == [TextPart("four")]
    assert result.prompt is None and result.instructions is None


def test_fifty_message_conversation() -> None:
    messages = [{"role": "system", "content": "sys"}]
    for i in range(49):
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"turn {i}"})
    result = _convert(messages)
    assert result.prompt == "turn 48"
    assert len(result.history) == 48  # 24 requests and 24 responses, alternating
    assert [m.kind for m in result.history[:4]] == ["request", "response", "request", "response"]
