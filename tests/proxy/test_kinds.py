"""Request kinds (chat / task / tool_continuation) and the X-Memory header."""

from __future__ import annotations

import pytest

from app.errors import InvalidRequest
from app.proxy.kinds import MemoryMode, RequestKind, classify, parse_memory_mode


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


# Open WebUI's newer background requests, shaped as it sends them: its built-in memory's review
# (a system prompt and one user message holding the transcript) and context compaction (one user
# message, the default "### Task:" template filled in).
MEMORY_REVIEW = [
    {
        "role": "system",
        "content": "You are Open WebUI's private memory reviewer. Return only valid JSON.",
    },
    *user(
        "Review the completed conversation turn and decide whether long-term memory should "
        "change.\n\nMemory types:\n- user: durable facts...\n\nExisting memories:\n(none)\n\n"
        "Conversation:\nuser: I moved to Oslo last May\n\nassistant_final: Welcome to Oslo!\n"
    ),
]
CONTEXT_COMPACTION = user(
    "### Task:\nSummarize the conversation history that will be compacted out of the active chat "
    "context.\n\n### Instructions:\n- Preserve key decisions, user preferences, and constraints."
    "\n\n### Previous Summary:\n\n\n### Messages Being Compacted:\nUSER: I moved to Oslo\n"
    "ASSISTANT: Welcome!\n\n### Recent Messages Kept In Context:\nUSER: what about skiing?"
)


@pytest.mark.parametrize("task", ["memory_review", "context_compaction"])
def test_new_open_webui_tasks_by_header(task: str) -> None:
    result = classify(user("I moved to Oslo last May"), task)
    assert (result.kind, result.task) == (RequestKind.TASK, task)


@pytest.mark.parametrize(
    ("task", "messages"),
    [("memory_review", MEMORY_REVIEW), ("context_compaction", CONTEXT_COMPACTION)],
    ids=["memory_review", "context_compaction"],
)
def test_new_open_webui_tasks_by_prompt_alone(task: str, messages: list[dict]) -> None:
    result = classify(messages, None)
    assert (result.kind, result.task) == (RequestKind.TASK, task)


def test_memory_reviewer_recognised_by_either_of_its_prompts() -> None:
    system, prompt = MEMORY_REVIEW
    # the system prompt with another user text (a customised review), or as developer message
    assert classify([system, *user("Conversation:\nuser: hi")], None).task == "memory_review"
    as_developer = [{**system, "role": "developer"}, prompt]
    assert classify(as_developer, None).task == "memory_review"
    # the user prompt without its system prompt
    assert classify([prompt], None).task == "memory_review"
    # a user who mentions the reviewer in a real chat is still chatting
    chat = [{"role": "system", "content": "be nice"}, *user(str(system["content"]))]
    assert classify(chat, None).kind is RequestKind.CHAT
