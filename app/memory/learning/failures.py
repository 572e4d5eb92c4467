"""How asking the Manager's model fails: the two outcomes the worker tells apart, and the few
words that say why a call failed."""

from __future__ import annotations

import socket

import httpx2
from pydantic_ai.exceptions import ModelHTTPError, ModelRequestTimeout, ModelTimeoutError

from app.errors import causes
from app.memory.learning.answer_cap import AnswerTooLarge
from app.proxy.tls import verification_failed, verification_hint

RAW_ANSWER_CHARS = 4000


class ManagerUnavailable(Exception):
    """The Manager's model could not be asked (unreachable, timed out, an HTTP error); the
    message names its URL (password and query values masked) and model, never a key."""


class ManagerAnswerUnusable(Exception):
    """The model answered, but nothing it said fits the answer's schema, through every retry
    and mode; `answer` is its last answer as it came (cut to :data:`RAW_ANSWER_CHARS`)."""

    def __init__(self, reason: str, answer: str) -> None:
        super().__init__(reason)
        self.answer = answer


def cause_of(exc: BaseException, timeout: float, job_timeout: float) -> str:
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
