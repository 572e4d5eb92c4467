"""The Manager: a PydanticAI agent that reads a conversation and decides what to remember.

What it is shown (:func:`build_prompt`):

- the current date and time;
- the user's existing memories most related to the exchange, each numbered 1, 2, 3... (the real
  ids never reach the model: models invent UUIDs; :mod:`app.memory.learning.applier` maps back);
- the conversation from the PydanticAI history the proxy converted (:func:`transcript`): the
  earlier turns as context, the new exchange to extract from. Role-aware (the default), it sees
  both sides marked USER and ASSISTANT and is told that only what the user says about
  themselves is a memory; never the system prompt, documents, or tool output, which are left
  out of the transcript entirely. Not role-aware, it sees the user's messages only.

What it answers: :class:`Decisions`, a list of :class:`~app.memory.learning.applier.Operation`, as a
tool call (OpenAI-compatible servers) or as JSON in its text (``ollama``: local models follow a
schema in the prompt more reliably than they call tools). A malformed answer is sent back to the
model up to ``MEMPROXY_MANAGER_MAX_RETRIES`` times, then dropped with a log line. A model that
cannot be asked raises :class:`ManagerUnavailable`, naming the URL and model that failed.

Its HTTP client is an ``httpx2.AsyncClient`` (:func:`build_http_client`), the client
pydantic-ai's OpenAI-compatible providers are built on (a legacy ``httpx`` one is deprecated).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import httpx2
from pydantic import BaseModel, Field
from pydantic_ai import Agent, PromptedOutput, ToolOutput
from pydantic_ai.exceptions import (
    ModelHTTPError,
    ModelRequestTimeout,
    ModelTimeoutError,
    UnexpectedModelBehavior,
)
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart
from pydantic_ai.models import Model
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.ollama import OllamaProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings

from app.config import Settings
from app.errors import causes
from app.log import mask_url
from app.memory.foreign import strip_foreign
from app.memory.learning.decisions import Operation
from app.memory.learning.turns import Turn
from app.memory.store.tables import MemoryType
from app.proxy.history import ConvertedHistory
from app.proxy.tls import ssl_context, verification_failed, verification_hint
from app.schemas.openai import content_text

logger = logging.getLogger("memproxy.manager")

INSTRUCTIONS = f"""You keep the long-term memory of an assistant about one user.
Read the new exchange and decide which memories to add, change or remove.

Rules:
- A memory is something the USER says about themselves: facts about their life, preferences,
  what they know or work with, events with their dates, corrections, feedback on the assistant.
- Never remember what the ASSISTANT says, general knowledge, or anything the user only asks about.
- NEW adds a memory. UPDATE changes the memory with the given number (when the user corrects or
  refines it). DELETE removes the memory with the given number (when the user says it is no longer
  true or asks to forget it). Use only numbers of the memories listed.
- Write each memory as one short, self-contained statement in the third person, with absolute dates
  ("Moved to Oslo in May 2025"), never "yesterday".
- Do not repeat a memory that is already listed. When there is nothing to remember, answer with no
  operations.
- type is one of: {", ".join(t.value for t in MemoryType)}.
"""


class Decisions(BaseModel):
    """The Manager's answer."""

    operations: list[Operation] = Field(default_factory=list)


@dataclass(frozen=True, slots=True)
class Shown:
    """An existing memory as the Manager sees it."""

    alias: int
    content: str
    type: str
    created_at: datetime


def transcript(history: ConvertedHistory, reply: str | None) -> list[Turn]:
    """User and assistant text of a conversation, oldest first; the assistant's `reply` to the last
    user message ends it. System prompts, tool calls and tool results are left out, and so is
    another memory system's block in a user message (:mod:`app.memory.foreign`)."""
    turns: list[Turn] = []
    for message in history.history:
        if isinstance(message, ModelRequest):
            for part in message.parts:
                if isinstance(part, UserPromptPart):
                    turns.append(Turn("user", strip_foreign(content_text(part.content))))
        elif isinstance(message, ModelResponse):
            text = "".join(p.content for p in message.parts if isinstance(p, TextPart))
            if text.strip():
                turns.append(Turn("assistant", text))
    if history.prompt is not None:
        turns.append(Turn("user", strip_foreign(content_text(history.prompt))))
    if reply and reply.strip():
        turns.append(Turn("assistant", reply))
    return [t for t in turns if t.text.strip()]


def build_prompt(
    *,
    now: datetime,
    memories: Sequence[Shown],
    context: Sequence[Turn],
    new: Sequence[Turn],
    role_aware: bool,
) -> str:
    """The Manager's user prompt (the module docstring says what goes in and why)."""
    if not role_aware:
        context = [t for t in context if t.role == "user"]
        new = [t for t in new if t.role == "user"]
    lines = [f"Current date and time: {now.strftime('%A %d %B %Y, %H:%M %Z').strip()}", ""]
    lines.append("Existing memories:" if memories else "Existing memories: none yet.")
    lines += [
        f"{m.alias}. {m.content} [{m.type}, noted {m.created_at.date().isoformat()}]"
        for m in memories
    ]
    if context:
        lines += ["", "Earlier in the conversation (context only, already processed):"]
        lines += [_line(t) for t in context]
    lines += ["", "The new exchange (decide from this):"]
    lines += [_line(t) for t in new]
    return "\n".join(lines)


CONNECT_TIMEOUT_SECONDS = 10.0


def build_http_client(settings: Settings) -> httpx2.AsyncClient:
    """The Manager's HTTP client (the caller closes it), trusting what `app.proxy.tls` says."""
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(settings.manager_timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS),
        verify=ssl_context(settings, httpx2.create_ssl_context),
    )


class ManagerUnavailable(Exception):
    """The Manager's model could not be asked (unreachable, timed out, an HTTP error); the
    message names its URL (password masked) and model, never a key."""


class Manager:
    def __init__(
        self, settings: Settings, *, http_client: httpx2.AsyncClient, model: Model | None = None
    ) -> None:
        """`model` replaces the configured one (tests pass a FunctionModel)."""
        self._settings = settings
        self._http = http_client
        self._model = model
        self._base_url = settings.manager_base_url or settings.upstream_base_url

    def where(self, request_model: str) -> str:
        """Which model at which server answers for a chat that used `request_model`."""
        model = self._settings.manager_model or request_model
        return f"manager at {mask_url(self._base_url)} (model {model})"

    def model_for(self, request_model: str) -> Model:
        """The configured model, or the chat request's own model on the upstream."""
        if self._model is not None:
            return self._model
        s = self._settings
        base_url = self._base_url
        secret = s.manager_api_key or s.upstream_api_key
        key = secret.get_secret_value() if secret is not None else "unused"
        provider: OpenAIProvider | OllamaProvider
        if s.manager_provider == "ollama":
            provider = OllamaProvider(base_url=base_url, api_key=key, http_client=self._http)
        else:
            provider = OpenAIProvider(base_url=base_url, api_key=key, http_client=self._http)
        return OpenAIChatModel(s.manager_model or request_model, provider=provider)

    async def decide(self, request_model: str, prompt: str) -> list[Operation] | None:
        """The operations the Manager chose; None when its answers stayed malformed through the
        retries (dropped: asking again will not help). Failing to reach the model raises
        :class:`ManagerUnavailable` (the worker retries the job later)."""
        s = self._settings
        output = (
            PromptedOutput(Decisions) if s.manager_provider == "ollama" else ToolOutput(Decisions)
        )
        agent = Agent(
            self.model_for(request_model),
            output_type=output,
            instructions=INSTRUCTIONS,
            retries=s.manager_max_retries,
            model_settings=ModelSettings(
                temperature=s.manager_temperature,
                max_tokens=s.manager_max_tokens,
                timeout=s.manager_timeout_seconds,
            ),
        )
        try:
            result = await agent.run(prompt)
        except UnexpectedModelBehavior as exc:
            logger.warning("manager answer dropped: %s", exc)
            return None
        except Exception as exc:
            if self._model is not None:  # a test's stand-in: no server to name
                raise
            cause = _cause(exc, s.manager_timeout_seconds)
            raise ManagerUnavailable(f"{self.where(request_model)}: {cause}") from exc
        return result.output.operations


def _cause(exc: BaseException, timeout: float) -> str:
    """What went wrong, in a few words: the SDKs' own ("Connection error.") say too little."""
    if isinstance(exc, ModelHTTPError):
        return f"answered HTTP {exc.status_code}: {str(exc.body)[:200]}"
    chain = causes(exc)
    if (failed := verification_failed(exc)) is not None:
        return verification_hint(failed)
    for link in chain:
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, socket.gaierror):
            return f"host not found ({link})"
        timeouts = (TimeoutError, httpx2.TimeoutException, ModelTimeoutError, ModelRequestTimeout)
        if isinstance(link, timeouts):
            return f"no answer within {timeout:g} s (MEMPROXY_MANAGER_TIMEOUT_SECONDS)"
    innermost = chain[-1]
    return f"{type(innermost).__name__}: {innermost}"


def _line(turn: Turn) -> str:
    return f"{turn.role.upper()}: {' '.join(turn.text.split())}"
