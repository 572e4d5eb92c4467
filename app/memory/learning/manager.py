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
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import httpx2
from pydantic import BaseModel
from pydantic_ai import Agent, NativeOutput, PromptedOutput, ToolOutput, capture_run_messages
from pydantic_ai.exceptions import (
    ModelHTTPError,
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
from app.log import mask_url
from app.memory.learning import staged
from app.memory.learning.answer_cap import capped_hooks
from app.memory.learning.budget import JobBudget
from app.memory.learning.decisions import (
    Decisions,
    Operation,
    complete_operations,
    decisions_for,
)
from app.memory.learning.failures import RAW_ANSWER_CHARS, cause_of
from app.memory.learning.failures import ManagerAnswerUnusable as ManagerAnswerUnusable
from app.memory.learning.failures import ManagerUnavailable as ManagerUnavailable
from app.memory.learning.model_size import Steps
from app.memory.learning.prompt import Shown, build_prompt, instructions
from app.proxy.tls import ssl_context

logger = logging.getLogger("memproxy.manager")

OutputMode = Literal["json_schema", "tool", "prompted"]
AUTO_ORDER: tuple[OutputMode, ...] = ("json_schema", "tool", "prompted")
REFUSED_STATUSES = frozenset({400, 404, 405, 415, 422, 500, 501})
"""HTTP statuses by which a server may refuse an output mode (llama-cpp-python answers a
``json_schema`` request with a 500): ``auto`` tries the next mode."""

CONNECT_TIMEOUT_SECONDS = 10.0
T = TypeVar("T")
AnswerT = TypeVar("AnswerT", bound=BaseModel)


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
        self._steps = Steps(settings, http_client, self._base_url)

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
        lookup: staged.Lookup | None = None,
    ) -> list[Operation]:
        """The operations the Manager chose about the `new` turns (the earlier `context` turns
        and the user's related `memories` shown with them; the two-step Manager asks `lookup`
        for the memories most like each sentence, else picks among `memories`). Raises as the
        module says."""
        s = self._settings
        name = s.manager_model or request_model
        two = await self._steps.two(name, ask_server=self._model is None)
        prompt = "" if two else build_prompt(
            now=now, memories=memories, context=context, new=new, role_aware=s.role_aware
        )  # fmt: skip

        async def attempt(model: Model, mode: OutputMode, usage: RunUsage,
                          budget: JobBudget) -> list[Operation]:  # fmt: skip
            if two:
                return await staged.decide(
                    functools.partial(self._answer, model, mode, usage, budget),
                    lookup or staged.Listed(memories), context=context, new=new,
                    budget=budget.spent, look_again=s.manager_second_look,
                )  # fmt: skip
            return await self._ask(model, mode, prompt, usage, budget, len(memories))

        return await self._asking(request_model, attempt, RunUsage())

    async def ask(
        self,
        request_model: str,
        schema: type[AnswerT],
        instructions_text: str,
        prompt: str,
        *,
        usage: RunUsage | None = None,
        max_tokens: int | None = None,
    ) -> AnswerT:
        """One answer of the model as `schema` to `prompt` (the idle work's questions), with
        what :meth:`decide` has: the output modes, retries, the time and token bounds of one
        job (`usage`, shared by a caller's several questions, counts against the tokens; an
        answer has at most `max_tokens`, or MEMPROXY_MANAGER_MAX_TOKENS), and the same two
        failures."""

        async def attempt(model: Model, mode: OutputMode, usage: RunUsage,
                          budget: JobBudget) -> AnswerT:  # fmt: skip
            answer = await self._answer(model, mode, usage, budget, schema, instructions_text,
                                        prompt, max_tokens)  # fmt: skip
            assert isinstance(answer, schema)
            return answer

        return await self._asking(request_model, attempt, usage or RunUsage())

    async def _asking(
        self,
        request_model: str,
        attempt: Callable[[Model, OutputMode, RunUsage, JobBudget], Awaitable[T]],
        usage: RunUsage,
    ) -> T:
        """`attempt` in each output mode in turn (:meth:`_modes`) until one gives an answer,
        within the job's bounds; raises as the module says."""
        s = self._settings
        model = self.model_for(request_model)
        where = (self._base_url, s.manager_model or request_model)
        budget = JobBudget(s, usage)
        unusable: ManagerAnswerUnusable | None = None
        refused: BaseException | None = None
        try:
            async with asyncio.timeout(s.manager_job_timeout_seconds):
                for mode in self._modes(where):
                    if usage.output_tokens >= s.manager_job_max_tokens:
                        break  # the job's budget is spent: no other mode gets a go
                    try:
                        answer = await attempt(model, mode, usage, budget)
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
                    return answer
        except Exception as exc:
            if self._model is not None and not isinstance(exc, TimeoutError):
                raise  # a test's stand-in: no server to name
            cause = cause_of(exc, s.manager_timeout_seconds, s.manager_job_timeout_seconds)
            raise ManagerUnavailable(f"{self.where(request_model)}: {cause}") from exc
        if unusable is not None:
            raise ManagerAnswerUnusable(f"{self.where(request_model)}: {unusable}",
                                        unusable.answer)  # fmt: skip
        if refused is None:  # the budget was spent before any mode was tried
            raise ManagerAnswerUnusable(f"{self.where(request_model)}: no output tokens left "
                                        "(MEMPROXY_MANAGER_JOB_MAX_TOKENS)", "")  # fmt: skip
        cause = cause_of(refused, s.manager_timeout_seconds, s.manager_job_timeout_seconds)
        raise ManagerUnavailable(f"{self.where(request_model)}: {cause}") from refused

    def _modes(self, where: tuple[str, str]) -> list[OutputMode]:
        configured = self._settings.manager_output_mode
        if configured != "auto":
            return [configured]
        known = self._works.get(where)
        return [known, *(m for m in AUTO_ORDER if m != known)] if known else list(AUTO_ORDER)

    async def _ask(
        self,
        model: Model,
        mode: OutputMode,
        prompt: str,
        usage: RunUsage,
        budget: JobBudget,
        shown: int,
    ) -> list[Operation]:
        """The one-call Manager: one mode's run (its retries included)."""
        schema = decisions_for(shown)
        try:
            answer = await self._answer(
                model, mode, usage, budget, schema, instructions(shape=mode != "tool"), prompt
            )
        except _Cut as cut:
            if kept := complete_operations(cut.answer, schema):
                # Small models loop (the same UPDATE again and again) until max_tokens:
                # what came whole before the cut is the answer.
                logger.info("%s answer cut at max_tokens: %d whole operations kept",
                            mode, len(kept))  # fmt: skip
                return kept
            raise
        assert isinstance(answer, Decisions)
        return answer.normalized()

    async def _answer(
        self, model: Model, mode: OutputMode, usage: RunUsage, budget: JobBudget,
        schema: type[BaseModel], instructions_text: str, prompt: str,
        max_tokens: int | None = None,
    ) -> BaseModel:  # fmt: skip
        """One call of the model in `mode` (its retries included), answered as `schema`; the
        job's `usage` so far counts against the job's token bound. Raises
        :class:`ManagerAnswerUnusable` (:class:`_Cut` when the answer stopped at max_tokens)."""
        s = self._settings
        name = schema.__name__
        output: Any = {
            "json_schema": NativeOutput(schema, name=name),
            "tool": ToolOutput(schema),
            "prompted": PromptedOutput(schema, name=name),
        }[mode]
        agent = Agent(
            model,
            output_type=output,
            instructions=instructions_text,
            retries=s.manager_max_retries,
            model_settings=ModelSettings(
                temperature=s.manager_temperature,
                max_tokens=min(max_tokens or s.manager_max_tokens, s.manager_max_tokens),
                timeout=s.manager_timeout_seconds,
            ),
        )
        limits = UsageLimits(request_limit=None, output_tokens_limit=s.manager_job_max_tokens)
        started = time.monotonic()
        with capture_run_messages() as messages:
            try:
                result = await agent.run(prompt, usage=usage, usage_limits=limits)
            except UnexpectedModelBehavior as exc:
                failure = _Cut if _cut(messages) else ManagerAnswerUnusable
                raise failure(f"{mode}: {exc.message}", _raw(messages)) from exc
            except UsageLimitExceeded as exc:
                raise ManagerAnswerUnusable(
                    f"{mode}: no usable answer within {s.manager_job_max_tokens} output tokens "
                    "(MEMPROXY_MANAGER_JOB_MAX_TOKENS)",
                    _raw(messages),
                ) from exc
            finally:
                budget.took(time.monotonic() - started)
        output_value: BaseModel = result.output
        return output_value


class _Cut(ManagerAnswerUnusable):
    """The answer stopped at max_tokens (its whole parts may still be used)."""


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
