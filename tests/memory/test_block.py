"""The memory block's place in the system message."""

from __future__ import annotations

import copy

from app.memory.block import BLOCK_END, BLOCK_START, insert_memory_block


def test_new_system_message_when_none() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    original = copy.deepcopy(body)
    out = insert_memory_block(body, "- likes tea")
    assert body == original  # the client's body is not touched
    assert out["messages"][0] == {
        "role": "system",
        "content": f"{BLOCK_START}\n- likes tea\n{BLOCK_END}",
    }
    assert out["messages"][1:] == body["messages"]


def test_appended_to_first_system_message_and_replaced_not_duplicated() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Be kind."},
            {"role": "system", "content": "Second."},
            {"role": "user", "content": "hi"},
        ]
    }
    once = insert_memory_block(body, "- a")
    twice = insert_memory_block(once, "- b")
    first = twice["messages"][0]["content"]
    assert first.startswith("Be kind.\n\n" + BLOCK_START)
    assert first.count(BLOCK_START) == 1 and "- b" in first and "- a" not in first
    assert twice["messages"][1] == {"role": "system", "content": "Second."}


def test_list_content_gets_a_text_part() -> None:
    body = {
        "messages": [
            {"role": "system", "content": [{"type": "text", "text": "rules"}]},
            {"role": "user", "content": "x"},
        ]
    }
    out = insert_memory_block(insert_memory_block(body, "- one"), "- two")
    parts = out["messages"][0]["content"]
    assert parts[0] == {"type": "text", "text": "rules"}
    assert len(parts) == 2 and "- two" in parts[1]["text"]


def test_empty_text_only_removes_blocks() -> None:
    body = insert_memory_block({"messages": [{"role": "system", "content": "S"}]}, "- a")
    assert insert_memory_block(body, "")["messages"][0]["content"] == "S"
