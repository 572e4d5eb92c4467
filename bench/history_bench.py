"""How long the hot path's request work takes for a conversation (50 messages by default).

Prints, per step, p50 / p99 / mean in microseconds over many runs:
  validate   the body checked against the OpenAI schema (on every request)
  classify   request kind detection (on every request)
  convert    OpenAI messages -> PydanticAI history (target: < 1 ms)
  turns      the history -> the Manager's turns (a chat that may write memories)
  marks      the fingerprints of its user turns (idem)

Run: .venv/bin/python bench/history_bench.py [--runs 2000]
     .venv/bin/python bench/history_bench.py --messages 100001 --runs 5   # a very long chat
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from app.memory.learning.turns import fingerprints_of, turns_of
from app.proxy.history import convert
from app.proxy.kinds import classify
from app.schemas.openai import chat_request_adapter


def conversation(n: int = 50) -> dict[str, Any]:
    """A realistic mixed chat: system prompt, text turns, one image turn, one tool round trip."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a helpful assistant. Answer briefly and kindly."}
    ]
    i = 0
    while len(messages) < n - 1:
        messages.append(
            {
                "role": "user",
                "content": f"Question {i}: what about the {i}th thing I mentioned? " * 3,
            }
        )
        if i == 3:
            messages[-1] = {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is in this picture?"},
                    {
                        "type": "image_url",
                        "image_url": {"url": "data:image/png;base64," + "A" * 4000},
                    },
                ],
            }
        if i == 5:
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "search", "arguments": '{"q": "x"}'},
                        }
                    ],
                }
            )
            messages.append(
                {"role": "tool", "tool_call_id": "call_1", "content": "result text " * 10}
            )
        messages.append(
            {"role": "assistant", "content": f"Answer {i}: here is a fairly ordinary reply. " * 4}
        )
        i += 1
    messages = [*messages[: n - 1], {"role": "user", "content": "And the last question?"}]
    return {"model": "llama3.2", "stream": True, "messages": messages}


def measure(fn: Callable[[], object], runs: int) -> list[float]:
    for _ in range(min(200, runs)):
        fn()
    samples = []
    for _ in range(runs):
        start = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - start) / 1000)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--messages", type=int, default=50)
    args = parser.parse_args()
    body = conversation(args.messages)
    checked = chat_request_adapter.validate_python(body)
    assert len(checked.messages) == args.messages
    history = convert(checked.messages)
    turns = turns_of(history, None)
    steps = {
        "validate": lambda: chat_request_adapter.validate_python(body),
        "classify": lambda: classify(body["messages"], None),
        "convert": lambda: convert(checked.messages),
        "turns": lambda: turns_of(history, None),
        "marks": lambda: fingerprints_of(turns),
    }
    print(f"{args.messages:,}-message conversation, {args.runs} runs each (microseconds)")
    print(f"{'step':<10} {'p50':>8} {'p99':>8} {'mean':>8}")
    for name, fn in steps.items():
        samples = sorted(measure(fn, args.runs))
        p50 = samples[len(samples) // 2]
        p99 = samples[int(len(samples) * 0.99)]
        print(f"{name:<10} {p50:>8.1f} {p99:>8.1f} {statistics.fmean(samples):>8.1f}")


if __name__ == "__main__":
    main()
