"""One reading of a message's text (app.schemas.openai.content_text) for every place that needs
it: request kinds, the recall query, the completion reader, history, the Manager's turns."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai.messages import ImageUrl

from app.schemas.openai import TextPart, content_text


@pytest.mark.parametrize(
    ("content", "sep", "expected"),
    [
        ("plain", "\n", "plain"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "\n", "a\nb"),
        ([{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "", "ab"),
        (
            [{"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "c"}],
            "\n",
            "c",
        ),
        ([{"type": "text", "text": 5}, {"type": "text"}, "d", None, 3], "\n", "d"),
        ([TextPart(type="text", text="e"), {"type": "text", "text": "f"}], " ", "e f"),
        (("g", ImageUrl(url="https://example.com/i.png"), "h"), "\n", "g\nh"),
        (None, "\n", ""),
        ({"type": "text", "text": "not a list"}, "\n", ""),
        (42, "\n", ""),
    ],
)
def test_the_text_of_any_content(content: Any, sep: str, expected: str) -> None:
    assert content_text(content, sep) == expected
