"""Deterministic fakes for the edges of memory: an embedder that needs no model, and the
Manager's answers in whichever output mode it asks for."""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from collections.abc import Sequence
from typing import Any

import numpy as np
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

_WORD = re.compile(r"[^\W_]+")


class FakeEmbedder:
    """Bag of words hashed into 64 dimensions, L2-normalised: texts sharing words are similar,
    texts sharing none are orthogonal (up to hash collisions). Same text, same vector, always.

    `fail_with` makes every call raise it (degraded-recall tests); `delay` makes calls slow.
    """

    dim = 64

    def __init__(self, model_name: str = "fake-bow-64") -> None:
        self.model_name = model_name
        self.calls: list[list[str]] = []
        self.fail_with: Exception | None = None
        self.delay = 0.0

    def vector(self, text: str) -> np.ndarray:
        out = np.zeros(self.dim, dtype=np.float32)
        for word in _WORD.findall(text.lower()):
            digest = hashlib.blake2b(word.rstrip("s").encode(), digest_size=4).digest()
            out[int.from_bytes(digest, "little") % self.dim] += 1.0
        norm = float(np.linalg.norm(out))
        if norm == 0:
            out[0] = 1.0
            return out
        return out / norm

    async def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.calls.append(list(texts))
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.fail_with is not None:
            raise self.fail_with
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.vector(t) for t in texts])

    async def embed_query(self, text: str) -> np.ndarray:
        vectors: np.ndarray = (await self.embed([text]))[0]
        return vectors

    def close(self) -> None:
        pass


def decided(info: AgentInfo, answer: Any) -> ModelResponse:
    """The Manager's `answer` as a model gives it in the output mode it was asked for: a call of
    the output tool (``tool``), or JSON text (``json_schema``, ``prompted``)."""
    if info.output_tools:
        return ModelResponse(parts=[ToolCallPart(info.output_tools[0].name, answer)])
    return ModelResponse(parts=[TextPart(json.dumps(answer))])


LEARN_AT_ONCE = {"manager_enabled": True, "processing_interval": 0, "conversation_threshold": 1}
"""Settings under which the Manager gets each chat's job at once (its model is the test's)."""


def unusable_manager(answer: str = "sure! I will remember that") -> tuple[FunctionModel, list[int]]:
    """A Manager whose every answer is text no output mode can use (the job ends parked as
    failed, with the answer), and the list it appends to at each call."""
    calls: list[int] = []

    def garbled(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        calls.append(1)
        return ModelResponse(parts=[TextPart(answer)])

    return FunctionModel(garbled), calls
