"""What one Manager job has left of its time and output tokens: the two-step Manager asks before
each batch (:mod:`app.memory.learning.staged`)."""

from __future__ import annotations

import time

from pydantic_ai.usage import RunUsage

from app.config import Settings


class JobBudget:
    """What a job has left of its time and output tokens, for the two-step Manager's batches."""

    def __init__(self, settings: Settings, usage: RunUsage) -> None:
        self._settings = settings
        self._usage = usage
        self._started = time.monotonic()
        self._longest = 0.0

    def took(self, seconds: float) -> None:
        self._longest = max(self._longest, seconds)

    def spent(self) -> str | None:
        """Why another call should not start: it could outlast the job's time (as long as the
        longest so far) or its output tokens (a whole call's max_tokens); None when it may."""
        s = self._settings
        if self._usage.output_tokens + s.manager_max_tokens > s.manager_job_max_tokens:
            return "MEMPROXY_MANAGER_JOB_MAX_TOKENS would run out"
        if time.monotonic() - self._started + self._longest > s.manager_job_timeout_seconds:
            return "MEMPROXY_MANAGER_JOB_TIMEOUT_SECONDS would run out"
        return None
