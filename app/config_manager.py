"""The settings of the Manager and of the memories' idle-time upkeep: a part of
:class:`app.config.Settings` (read the same way, prefix ``MEMPROXY_``), kept apart for size."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings


class ManagerSettings(BaseSettings):
    # --- the Manager: memory extraction after each chat -----------------------------------------
    manager_enabled: bool = True
    """Learn memories from chats in the background (false: memories come from the API only)."""
    conversation_threshold: int = Field(default=2, ge=1)
    """User messages a conversation needs before it is first processed (explicit requests to
    remember or forget are processed at once)."""
    processing_interval: float = Field(default=60.0, ge=0)
    """Least seconds between two routine jobs of one user; exchanges in between join the next."""
    manager_concurrency: int = Field(default=2, ge=1, le=64)
    """Jobs run at once (never two of one user)."""
    manager_queue_limit: int = Field(default=1000, ge=1)
    """Queued jobs kept; beyond it the oldest routine jobs are dropped (explicit ones never)."""
    manager_job_attempts: int = Field(default=5, ge=1)
    """Attempts at a job before it is parked as failed (`memproxy jobs retry` queues it again)."""
    manager_retry_seconds: float = Field(default=10.0, ge=0)
    """Wait before a failed job's second attempt; doubled for each one after."""
    manager_provider: Literal["openai", "ollama"] = "openai"
    """The Manager's model server: `openai` (any OpenAI-compatible API) or `ollama`."""
    manager_output_mode: Literal["auto", "json_schema", "tool", "prompted"] = "auto"
    """How the Manager answers: `json_schema` (JSON the server holds to the schema), `tool` (an
    output tool call), `prompted` (JSON asked for in the instructions); `auto` tries them in
    that order and keeps the first that works for the server and model."""
    manager_base_url: str = ""
    """The Manager's model server; empty: MEMPROXY_UPSTREAM_BASE_URL."""
    manager_api_key: SecretStr | None = None
    """Key for the Manager's server; unset: MEMPROXY_UPSTREAM_API_KEY."""
    manager_model: str = ""
    """The Manager's model; empty: the model the chat request itself used."""
    manager_temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    """Sampling temperature of the Manager (0: its most likely answer)."""
    manager_max_tokens: int = Field(default=1024, ge=16)
    """Longest answer the Manager may give."""
    manager_max_answer_bytes: int = Field(default=4 * 1024 * 1024, ge=1024)
    """Most bytes of one answer of the Manager's server that are read; a bigger answer fails the
    call (the job is retried later, then parked) instead of being held in memory."""
    manager_timeout_seconds: float = Field(default=120.0, gt=0)
    """Longest one Manager call may take."""
    manager_max_retries: int = Field(default=1, ge=0, le=10)
    """How often an answer that does not fit is sent back with the error, per output mode."""
    manager_job_timeout_seconds: float = Field(default=300.0, gt=0)
    """Longest one job's whole exchange with the Manager may take, every call and retry included
    (then it is retried later, and parked after MEMPROXY_MANAGER_JOB_ATTEMPTS)."""
    manager_job_max_tokens: int = Field(default=4096, ge=16)
    """Most output tokens one job's calls may use together; beyond, its answer counts as unusable
    and the job is parked with it."""
    manager_lease_seconds: float = Field(default=30.0, gt=0)
    """How long a process holds a job it runs (or whose chat answer it awaits) without renewing
    it; it renews every third of this while it lives. A process killed mid-job: another one takes
    the job up this long after, and runs it once."""
    manager_steps: Literal["auto", "one", "two"] = "auto"
    """`two`: the Manager first picks the user's sentences worth keeping, then writes one memory
    for each (small models do well this way); `one`: one call decides everything; `auto`: two
    for a model of at most MEMPROXY_MANAGER_SMALL_MODEL_BILLIONS (by its name or its server)."""
    manager_small_model_billions: float = Field(default=8.0, gt=0)
    """Largest model, in billions of parameters, that `auto` gives the two-step Manager."""
    manager_second_look: bool = False
    """Two-step Manager: one more call listing facts of the user the first pass missed."""
    role_aware: bool = True
    """Show the Manager both sides of the conversation, marked (only the user's words count);
    false: the user's messages only."""
    episodes: bool = True
    """Keep each user turn the Manager learns from as memories of kind ``episode`` (the user's
    own words, in passages), written with the job's facts, each fact linked to its episodes;
    recall shows them after the facts (MEMPROXY_EPISODE_SHARE)."""
    dedup_threshold: float = Field(default=0.9, ge=0.0, le=1.0)
    """A new memory this similar (cosine) to an existing one is not created a second time."""

    # --- memory over time: idle-time upkeep -------------------------------------------------
    idle_seconds: float = Field(default=900.0, ge=0)
    """A user quiet this long (no chat learned from), with their Manager jobs done, gets an idle
    job: consolidation and enrichment (below), then forgetting over the capacities. 0: no idle
    work."""
    idle_job_timeout_seconds: float = Field(default=120.0, gt=0)
    """Longest one idle job may take (then it is retried later, as a Manager job is)."""
    max_facts: int = Field(default=10_000, ge=0)
    """Facts a user keeps; past it, the least used leave at idle time (a user who chats on:
    once past it by 5 %), never pinned or profile ones, into the forgotten memories, from where
    they can be put back. 0: no limit."""
    max_episodes: int = Field(default=50_000, ge=0)
    """Episodes (the user's own words) a user keeps, the same way; an episode a fact was
    written from is worth half. 0: no limit."""
    consolidation: bool = True
    """At idle time, the words of an exchange that gave no fact are queued for the Manager once
    more, and facts written since the last idle job are compared with the user's facts nearest
    them: near copies (MEMPROXY_DEDUP_THRESHOLD) merge into the newest; the Manager's
    model is asked about the others (MEMPROXY_CONSOLIDATION_COSINE): facts saying the same
    become one, a fact a newer one shows no longer true leaves as superseded (with the day it
    ended). Both go to the forgotten memories, from where they can be put back."""
    consolidation_cosine: float = Field(default=0.5, ge=0.0, le=1.0)
    """How close (cosine) a fact must be to a new one to be shown to the model with it."""
    enrichment: bool = False
    """At idle time, each exchange's new facts and episodes get one sentence of context written
    by the Manager's model (when, who, what about), added to what they are found by (never to
    what the chat's model is shown)."""
    forgotten_keep_days: float = Field(default=90.0, ge=0)
    """How long forgotten memories can still be put back before they are erased for good."""
