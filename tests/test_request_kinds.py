"""Request kinds (chat / task / tool_continuation) and the X-Memory header."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.proxy.requests import MemoryMode, RequestKind, classify, parse_memory_mode


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


# The openings of Open WebUI's default task templates.
TEMPLATES = {
    "title_generation": "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history.",
    "tags_generation": "### Task:\nGenerate 1-3 broad tags categorizing the main themes of the chat history",
    "follow_up_generation": "### Task:\nSuggest 3-5 relevant follow-up questions or prompts that the user",
    "query_generation": "### Task:\nAnalyze the chat history to determine the necessity of generating search queries",
    "autocomplete_generation": "### Task:\nYou are an autocompletion system. Continue the text in `<text>`",
    "image_prompt_generation": "### Task:\nGenerate a detailed prompt for am image generation task based on",
    "emoji_generation": "Your task is to reflect the speaker's likely facial expression through a fitting emoji.",
    "moa_response_generation": 'You have been provided with a set of responses from various models to the latest user query: "x"',
}


@pytest.mark.parametrize(("task", "text"), TEMPLATES.items(), ids=list(TEMPLATES))
def test_open_webui_task_templates(task: str, text: str) -> None:
    result = classify(user(text + "\n<chat_history>\nUSER: hi\n</chat_history>"), None)
    assert (result.kind, result.task) == (RequestKind.TASK, task)


def test_old_title_template_and_list_content() -> None:
    old = "Create a concise, 3-5 word title with an emoji as a title for the chat history"
    assert classify(user(old), None).kind is RequestKind.TASK
    parts = [{"role": "user", "content": [{"type": "text", "text": TEMPLATES["tags_generation"]}]}]
    assert classify(parts, None).task == "tags_generation"


def test_rag_template_is_chat() -> None:
    rag = (
        "### Task:\nRespond to the user query using the provided context, incorporating inline "
        "citations\n<context>...</context>\n<chat_history>x</chat_history>"
    )
    assert classify(user(rag), None).kind is RequestKind.CHAT
    assert (
        classify([{"role": "system", "content": rag}, *user("what does the doc say?")], None).kind
        is RequestKind.CHAT
    )


def test_customised_task_template_is_recognised_by_its_chat_history() -> None:
    custom = (
        "### Task:\nWrite a haiku title for this chat.\n<chat_history>\nUSER: hi\n</chat_history>"
    )
    assert classify(user(custom), None).task == "custom_task"
    assert classify(user("### Task:\nplease help me plan a trip"), None).kind is RequestKind.CHAT


def test_template_text_inside_a_real_conversation_is_chat() -> None:
    messages = [
        *user("hi"),
        {"role": "assistant", "content": "hello"},
        *user(TEMPLATES["title_generation"]),
    ]
    assert classify(messages, None).kind is RequestKind.CHAT


@pytest.mark.parametrize("value", ["title_generation", "tags_generation", "custom"])
def test_task_header_wins(value: str) -> None:
    assert classify(user("hello"), value).kind is RequestKind.TASK


@pytest.mark.parametrize("value", ["", "  ", "{{TASK}}", "none"])
def test_empty_or_unfilled_task_header_is_chat(value: str) -> None:
    assert classify(user("hello"), value).kind is RequestKind.CHAT


def test_tool_continuation_and_function_calling() -> None:
    messages = [
        *user("q"),
        {"role": "assistant", "tool_calls": []},
        {"role": "tool", "content": "r"},
    ]
    assert classify(messages, None).kind is RequestKind.TOOL_CONTINUATION
    assert classify([*user("q"), {"role": "function", "name": "f", "content": "r"}], None).kind is (
        RequestKind.TOOL_CONTINUATION
    )
    tools = [
        {"role": "system", "content": "Available Tools: [{...}]\n\nYour task is to choose"},
        *user("Query: x"),
    ]
    assert classify(tools, None).task == "function_calling"


def test_plain_chat() -> None:
    assert (
        classify([{"role": "system", "content": "be nice"}, *user("I moved to Oslo")], None).kind
        is RequestKind.CHAT
    )


@pytest.mark.parametrize(
    ("value", "mode"),
    [
        (None, MemoryMode.ON),
        ("on", MemoryMode.ON),
        ("OFF", MemoryMode.OFF),
        ("false", MemoryMode.OFF),
        ("read-only", MemoryMode.READ_ONLY),
        ("readonly", MemoryMode.READ_ONLY),
    ],
)
def test_memory_header(value: str | None, mode: MemoryMode) -> None:
    assert parse_memory_mode(value) is mode


def test_unknown_memory_header_value() -> None:
    with pytest.raises(InvalidRequest):
        parse_memory_mode("maybe")
