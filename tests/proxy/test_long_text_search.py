"""A long text's tags are looked for a window at a time, and its query made from its two ends.

One ``str.find`` over a 50 MB message holds the GIL ~40 ms when the tag is not there, and one
``strip`` copies it (~25 ms): with three such searches, a 50 MB chat's recall query kept every
other request waiting past 50 ms (bench/loop_stall.py). These tests check the answers are
those of ``str.find``/``str.rfind`` and of the query made the plain way, and that no call is
given more than a window of a long text.
"""

from __future__ import annotations

import random
import re
from typing import Any

import pytest

import app.memory.chat.query as query
import app.proxy.offload as offload
from app.memory.block import BLOCK_END, BLOCK_START, strip_block
from app.memory.foreign import OPENWEBUI_MEMORY_END, OPENWEBUI_MEMORY_START, user_words
from app.proxy.offload import PIECE_CHARS

SMALL = 16
"""The window the equivalence tests use, so that their texts cross many windows."""


def test_find_and_rfind_answer_as_str_does(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(offload, "PIECE_CHARS", 7)
    rng = random.Random(28)
    for _ in range(20_000):
        text = "".join(rng.choice("ab<") for _ in range(rng.randint(0, 60)))
        sub = "".join(rng.choice("ab<") for _ in range(rng.randint(0, 9)))
        start = rng.randint(0, len(text) + 3)
        end = rng.choice([None, rng.randint(0, len(text) + 5)])
        assert offload.find(text, sub, start, end) == text.find(sub, start, end)
        assert offload.rfind(text, sub, start, end) == text.rfind(sub, start, end)


class Watched(str):
    """A text that notes how much of itself each search or strip is given."""

    calls: list[tuple[str, int]]

    def find(self, sub: str, start: Any = None, end: Any = None) -> int:
        self.calls.append(("find", _span(self, start, end)))
        return super().find(sub, start, end)

    def rfind(self, sub: str, start: Any = None, end: Any = None) -> int:
        self.calls.append(("rfind", _span(self, start, end)))
        return super().rfind(sub, start, end)

    def __contains__(self, sub: str) -> bool:  # type: ignore[override]
        self.calls.append(("in", len(self)))
        return super().__contains__(sub)

    def strip(self, chars: str | None = None) -> str:
        self.calls.append(("strip", len(self)))
        return super().strip(chars)

    def lstrip(self, chars: str | None = None) -> str:
        self.calls.append(("lstrip", len(self)))
        return super().lstrip(chars)

    def rstrip(self, chars: str | None = None) -> str:
        self.calls.append(("rstrip", len(self)))
        return super().rstrip(chars)

    def __getitem__(self, key: Any) -> str:
        if isinstance(key, slice):
            self.calls.append(("slice", len(range(len(self))[key])))
        return super().__getitem__(key)


def _span(text: str, start: Any, end: Any) -> int:
    return len(range(len(text))[slice(start, end)])


def test_a_long_messages_tags_are_looked_for_a_window_at_a_time() -> None:
    document = "a few words of a long pasted document\n" * (3 * PIECE_CHARS // 38)
    text = Watched(f"  what do you make of this?\n{document}\n")
    text.calls = []
    got = query.recall_query([{"role": "user", "content": text}])
    plain = str(text).strip()
    assert got == f"{plain[:1000]} {plain[-1000:]}"
    assert text.calls, "the text was searched"  # Open WebUI's and memproxy's tags
    assert max(size for _, size in text.calls) <= PIECE_CHARS + 32, text.calls


def _reference(messages: list[Any]) -> str | None:
    """recall_query as it was written before: every message stripped whole, then cut (and
    searched in one call: run it with offload's window larger than the text)."""

    def plain(message: Any) -> str:
        return strip_block(user_words(message.get("content"))).strip()

    last = max(i for i, m in enumerate(messages) if m.get("role") == "user")
    text = plain(messages[last])
    if len(re.findall(r"\w+", text)) < query.MIN_QUERY_WORDS:
        before = [plain(m) for m in messages[:last] if m.get("role") in ("user", "assistant")]
        context = " ".join(t for t in before[-2:] if t)[-query.CONTEXT_CHARS :]
        text = f"{context} {text}".strip()
    if len(text) > query.MAX_QUERY_CHARS:
        half = query.MAX_QUERY_CHARS // 2
        text = f"{text[:half]} {text[-half:]}"
    return text or None


WORDS = "the sea was calm when we sailed to Oslo last spring".split()


def _long(rng: random.Random, size: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(size // 5))


def _texts(rng: random.Random) -> list[str]:
    """Long texts whose ends, blocks and tags fall on either side of many windows."""
    body = _long(rng, 3000)
    source = f'<source id="1" name="a.pdf">{_long(rng, 900)}</source>'
    block = f"{BLOCK_START}\n- {_long(rng, 1500)}\n{BLOCK_END}"
    return [
        body,
        f" \n\t{body}\n\n ",
        f"\xa0\u2028{body}\u3000\x85",  # whitespace beyond ASCII at both ends
        " " * 2500 + body + "\n" * 40,  # an end's whitespace longer than the window
        "\n" * 40 + "x" * 2500 + "\n" * 3000,  # one long word, then a run of newlines
        "=" * 1500 + " a b c d " + "=" * 1500,  # the words only in the middle
        "x" * 1500 + " a b c " + "y" * 1500,  # three words, and two cut by the ends
        "b " + "a" * 3000 + " d",  # three words, one of them longer than the ends
        f"{body}\n{block}\n{body}",
        f"{block}\n{body}\n{block}",  # blocks at both ends, across many windows
        f"{OPENWEBUI_MEMORY_START}{_long(rng, 1500)}{OPENWEBUI_MEMORY_END}\n{body}",
        f"### Task:\nRespond.\n<context>\n{source}{source}\n</context>\n{body}",
        f"{body}\n<user_query>{_long(rng, 2500)}</user_query>{source}",
        f"{source}\n{body}",
        "ok",
    ]


def test_words_are_counted_a_window_at_a_time_as_in_one_pass(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A word cut by a window's edge, or longer than a window, is one word."""
    monkeypatch.setattr(query, "PIECE_CHARS", 5)
    rng = random.Random(5)
    for _ in range(20_000):
        text = "".join(rng.choice("ab \xa0\u00e9,\u2028") for _ in range(rng.randint(0, 40)))
        enough = rng.randint(1, 8)
        assert query.count_words(text, enough) == min(enough, len(re.findall(r"\w+", text)))


@pytest.mark.parametrize("seed", range(8))
def test_a_long_message_gives_the_query_it_gave_before(
    monkeypatch: pytest.MonkeyPatch, seed: int
) -> None:
    monkeypatch.setattr(query, "PIECE_CHARS", SMALL * 64)  # the ends read: 1,024 characters
    rng = random.Random(seed)
    texts = _texts(rng)
    for text in texts:
        for before in ("", rng.choice(texts)):
            messages = [{"role": "assistant", "content": before}, {"role": "user", "content": text}]
            monkeypatch.setattr(offload, "PIECE_CHARS", 1 << 40)  # str.find itself
            expected = _reference(messages)
            monkeypatch.setattr(offload, "PIECE_CHARS", SMALL)
            assert query.recall_query(messages) == expected, (seed, text[:60])
