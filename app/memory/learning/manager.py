"""The Manager: a PydanticAI agent that reads a conversation and decides what to remember.

It is shown its instructions and one job's prompt (:mod:`app.memory.learning.prompt`), and
answers :class:`~app.memory.learning.decisions.Decisions` in one of three output modes
(``MEMPROXY_MANAGER_OUTPUT_MODE``):

- ``json_schema``: JSON text constrained by the server to the schema (OpenAI's
  ``response_format``; llama.cpp, vLLM and Ollama enforce it with a grammar);
- ``tool``: a call of an output tool (``tool_choice: required``, which not every server
  enforces: llama.cpp's does not);
- ``prompted``: JSON text following the schema given in the instructions, unenforced.

``auto`` (the default) tries them in that order and remembers, per server and model, the first
that gave a usable answer; a mode the server refuses (an HTTP error) or whose answers do not fit
is passed over for the next. Within a mode, an answer that does not fit is sent back once with
the validation error (``MEMPROXY_MANAGER_MAX_RETRIES``); an answer cut at ``max_tokens`` (small
models loop) gives the whole operations before the cut, if any.

Promises:

- :meth:`Manager.decide` returns the operations, or raises: :class:`ManagerAnswerUnusable` when
  the model answered but nothing it said fits (the worker parks the job as failed, with the raw
  answer, for inspection and ``memproxy jobs retry``; its turns are never dropped), or
  :class:`ManagerUnavailable` when the model could not be asked (the worker retries later). Both
  name the URL (password and query values masked) and model, never a key.
- A job's whole conversation with the model, every mode and retry included, takes at most
  ``MEMPROXY_MANAGER_JOB_TIMEOUT_SECONDS`` and ``MEMPROXY_MANAGER_JOB_MAX_TOKENS`` output tokens.

Its HTTP client is an ``httpx2.AsyncClient`` (:func:`build_http_client`), the client
pydantic-ai's OpenAI-compatible providers are built on (a legacy ``httpx`` one is deprecated).
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Literal

import httpx2
from pydantic_ai import Agent, NativeOutput, PromptedOutput, ToolOutput, capture_run_messages
from pydantic_ai.exceptions import (
    ModelHTTPError,
    ModelRequestTimeout,
    ModelTimeoutError,
    UnexpectedModelBehavior,
    UsageLimitExceeded,
)
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models import Model
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.ollama import OllamaProvider
from pydantic_ai.providers.openai import OpenAIProvider
from pydantic_ai.settings import ModelSettings
from pydantic_ai.usage import RunUsage, UsageLimits

from app.config import Settings
from app.errors import causes
from app.log import mask_url
from app.memory.learning.answer_cap import AnswerTooLarge, capped_hooks
from app.memory.learning.decisions import (
    Decisions,
    Operation,
    complete_operations,
    decisions_for,
)
from app.memory.learning.prompt import Shown, build_prompt, instructions
from app.proxy.tls import ssl_context, verification_failed, verification_hint

logger = logging.getLogger("memproxy.manager")

OutputMode = Literal["json_schema", "tool", "prompted"]
AUTO_ORDER: tuple[OutputMode, ...] = ("json_schema", "tool", "prompted")
REFUSED_STATUSES = frozenset({400, 404, 405, 415, 422, 500, 501})
"""HTTP statuses by which a server may refuse an output mode (llama-cpp-python answers a
``json_schema`` request with a 500): ``auto`` tries the next mode."""
RAW_ANSWER_CHARS = 4000

CONNECT_TIMEOUT_SECONDS = 10.0


def build_http_client(
    settings: Settings, *, transport: httpx2.AsyncBaseTransport | None = None
) -> httpx2.AsyncClient:
    """The Manager's HTTP client (the caller closes it), trusting what `app.proxy.tls` says and
    reading answers up to `app.memory.learning.answer_cap`'s cap. `transport`: tests' fakes."""
    return httpx2.AsyncClient(
        timeout=httpx2.Timeout(settings.manager_timeout_seconds, connect=CONNECT_TIMEOUT_SECONDS),
        verify=ssl_context(settings, httpx2.create_ssl_context),
        event_hooks=capped_hooks(settings.manager_max_answer_bytes),
        transport=transport,
    )


class ManagerUnavailable(Exception):
    """The Manager's model could not be asked (unreachable, timed out, an HTTP error); the
    message names its URL (password and query values masked) and model, never a key."""


class ManagerAnswerUnusable(Exception):
    """The model answered, but nothing it said fits :class:`Decisions`, through every retry and
    mode; `answer` is its last answer as it came (cut to :data:`RAW_ANSWER_CHARS`)."""

    def __init__(self, reason: str, answer: str) -> None:
        super().__init__(reason)
        self.answer = answer


class Manager:
    def __init__(
        self, settings: Settings, *, http_client: httpx2.AsyncClient, model: Model | None = None
    ) -> None:
        """`model` replaces the configured one (tests pass a FunctionModel)."""
        self._settings = settings
        self._http = http_client
        self._model = model
        self._base_url = settings.manager_base_url or settings.upstream_base_url
        self._works: dict[tuple[str, str], OutputMode] = {}
        """(server, model) -> the output mode that last gave a usable answer (``auto``)."""

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

    async def decide(
        self,
        request_model: str,
        *,
        memories: Sequence[Shown],
        context: Sequence[ModelMessage],
        new: Sequence[ModelMessage],
        now: datetime,
    ) -> list[Operation]:
        """The operations the Manager chose about the `new` turns (the earlier `context` turns
        and the user's related `memories` shown with them). Raises as the module says."""
        s = self._settings
        prompt = build_prompt(
            now=now, memories=memories, context=context, new=new, role_aware=s.role_aware
        )
        model = self.model_for(request_model)
        where = (self._base_url, s.manager_model or request_model)
        usage = RunUsage()
        unusable: ManagerAnswerUnusable | None = None
        refused: BaseException | None = None
        try:
            async with asyncio.timeout(s.manager_job_timeout_seconds):
                for mode in self._modes(where):
                    if usage.output_tokens >= s.manager_job_max_tokens:
                        break  # the job's budget is spent: no other mode gets a go
                    try:
                        operations = await self._ask(model, mode, prompt, usage, len(memories))
                    except ManagerAnswerUnusable as exc:
                        unusable = exc
                        continue
                    except ModelHTTPError as exc:
                        if exc.status_code not in REFUSED_STATUSES:
                            raise
                        refused = exc
                        continue
                    if self._works.get(where) != mode:
                        logger.info("%s: output mode %s works", self.where(request_model), mode)
                        self._works[where] = mode
                    return operations
        except Exception as exc:
            if self._model is not None and not isinstance(exc, TimeoutError):
                raise  # a test's stand-in: no server to name
            cause = _cause(exc, s.manager_timeout_seconds, s.manager_job_timeout_seconds)
            raise ManagerUnavailable(f"{self.where(request_model)}: {cause}") from exc
        if unusable is not None:
            raise ManagerAnswerUnusable(f"{self.where(request_model)}: {unusable}",
                                        unusable.answer)  # fmt: skip
        assert refused is not None
        cause = _cause(refused, s.manager_timeout_seconds, s.manager_job_timeout_seconds)
        raise ManagerUnavailable(f"{self.where(request_model)}: {cause}") from refused

    def _modes(self, where: tuple[str, str]) -> list[OutputMode]:
        configured = self._settings.manager_output_mode
        if configured != "auto":
            return [configured]
        known = self._works.get(where)
        return [known, *(m for m in AUTO_ORDER if m != known)] if known else list(AUTO_ORDER)

    async def _ask(
        self, model: Model, mode: OutputMode, prompt: str, usage: RunUsage, shown: int
    ) -> list[Operation]:
        """One mode's run (its retries included); the job's `usage` so far counts against the
        job's token bound."""
        s = self._settings
        schema = decisions_for(shown)
        output: Any = {
            "json_schema": NativeOutput(schema, name="Decisions"),
            "tool": ToolOutput(schema),
            "prompted": PromptedOutput(schema, name="Decisions"),
        }[mode]
        agent = Agent(
            model,
            output_type=output,
            instructions=instructions(shape=mode != "tool"),
            retries=s.manager_max_retries,
            model_settings=ModelSettings(
                temperature=s.manager_temperature,
                max_tokens=s.manager_max_tokens,
                timeout=s.manager_timeout_seconds,
            ),
        )
        limits = UsageLimits(request_limit=None, output_tokens_limit=s.manager_job_max_tokens)
        with capture_run_messages() as messages:
            try:
                result = await agent.run(prompt, usage=usage, usage_limits=limits)
            except UnexpectedModelBehavior as exc:
                if _cut(messages) and (kept := complete_operations(_raw(messages), schema)):
                    # Small models loop (the same UPDATE again and again) until max_tokens:
                    # what came whole before the cut is the answer.
                    logger.info("%s answer cut at max_tokens: %d whole operations kept",
                                mode, len(kept))  # fmt: skip
                    return kept
                raise ManagerAnswerUnusable(f"{mode}: {exc.message}", _raw(messages)) from exc
            except UsageLimitExceeded as exc:
                raise ManagerAnswerUnusable(
                    f"{mode}: no usable answer within {s.manager_job_max_tokens} output tokens "
                    "(MEMPROXY_MANAGER_JOB_MAX_TOKENS)",
                    _raw(messages),
                ) from exc
        decisions: Decisions = result.output
        return decisions.normalized()


def _last_answer(messages: Sequence[ModelMessage]) -> ModelResponse | None:
    return next((m for m in reversed(messages) if isinstance(m, ModelResponse)), None)


def _cut(messages: Sequence[ModelMessage]) -> bool:
    """Whether the model's last answer stopped at the token limit."""
    last = _last_answer(messages)
    return last is not None and last.finish_reason == "length"


def _raw(messages: Sequence[ModelMessage]) -> str:
    """The model's last answer as it came: its text, or its tool calls' arguments."""
    last = _last_answer(messages)
    if last is None:
        return ""
    pieces = [p.content for p in last.parts if isinstance(p, TextPart)]
    pieces += [p.args_as_json_str() for p in last.parts if isinstance(p, ToolCallPart)]
    return "\n".join(pieces)[:RAW_ANSWER_CHARS]


def _cause(exc: BaseException, timeout: float, job_timeout: float) -> str:
    """What went wrong, in a few words: the SDKs' own ("Connection error.") say too little."""
    if isinstance(exc, ModelHTTPError):
        return f"answered HTTP {exc.status_code}: {str(exc.body)[:200]}"
    chain = causes(exc)
    if (failed := verification_failed(exc)) is not None:
        return verification_hint(failed)
    if isinstance(exc, TimeoutError):  # the job's own bound (the calls' bound is theirs)
        return f"no answer within {job_timeout:g} s (MEMPROXY_MANAGER_JOB_TIMEOUT_SECONDS)"
    for link in chain:
        if isinstance(link, AnswerTooLarge):
            return str(link)
        if isinstance(link, ConnectionRefusedError):
            return "connection refused"
        if isinstance(link, socket.gaierror):
            return f"host not found ({link})"
        timeouts = (TimeoutError, httpx2.TimeoutException, ModelTimeoutError, ModelRequestTimeout)
        if isinstance(link, timeouts):
            return f"no answer within {timeout:g} s (MEMPROXY_MANAGER_TIMEOUT_SECONDS)"
    innermost = chain[-1]
    return f"{type(innermost).__name__}: {innermost}"
