"""Prometheus metrics, in a registry of the app's own (two apps in one process do not share)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "memproxy_requests",
            "HTTP requests by route (its template, not the raw path), status and request kind.",
            ["route", "status", "kind"],
            registry=self.registry,
        )
        self.jobs_applied = Counter(
            "memproxy_manager_jobs_applied",
            "Manager jobs applied (their decisions committed, possibly none).",
            registry=self.registry,
        )
        self.jobs_skipped = Counter(
            "memproxy_manager_jobs_skipped",
            "Manager jobs found gone when their decisions were to be applied (another process "
            "applied them first): nothing applied, not counted as applied.",
            registry=self.registry,
        )
        self.leases_expired = Counter(
            "memproxy_manager_leases_expired",
            "Manager jobs whose owner stopped renewing its lease (a process killed while running "
            "the job or awaiting its chat's answer), queued again for any process to run.",
            registry=self.registry,
        )
        self.jobs_failed = Counter(
            "memproxy_manager_jobs_failed",
            "Manager jobs parked as failed after their last attempt.",
            registry=self.registry,
        )
        self.memory_operations = Counter(
            "memproxy_manager_operations",
            "The Manager's operations by result: created, updated, deleted, unchanged, duplicate, "
            "ungrounded (not the user's words: refused), failed.",
            ["result"],
            registry=self.registry,
        )
        self.recall_seconds = Histogram(
            "memproxy_recall_seconds",
            "Time chat recall took, query embedding and search included.",
            buckets=(0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=self.registry,
        )
        self.memories_injected = Histogram(
            "memproxy_memories_injected",
            "Memories injected into one chat request.",
            buckets=(0, 1, 2, 4, 8, 16, 32),
            registry=self.registry,
        )
        self.jobs_queued = Counter(
            "memproxy_manager_jobs_queued",
            "Exchanges queued for the Manager.",
            ["kind"],
            registry=self.registry,
        )
        self.jobs_dropped = Counter(
            "memproxy_manager_jobs_dropped",
            "Routine Manager jobs dropped because the queue was full.",
            registry=self.registry,
        )
        self.idle_jobs = Counter(
            "memproxy_idle_jobs",
            "Idle jobs done: the idle-time upkeep of a quiet user's memories.",
            registry=self.registry,
        )
        self.memories_forgotten = Counter(
            "memproxy_memories_forgotten",
            "Memories forgotten over a capacity (into the archive they can be put back from), "
            "by type.",
            ["type"],
            registry=self.registry,
        )
        self.recall_judge = Counter(
            "memproxy_recall_judge",
            "Chats' candidates put to the relevance judge, by outcome: judged, cached, or the "
            "search's order kept (timeout, unavailable, unusable, error).",
            ["outcome"],
            registry=self.registry,
        )
        self.memories_consolidated = Counter(
            "memproxy_memories_consolidated",
            "Facts consolidation took out at idle time, by result: merged (into a fact saying "
            "the same) or superseded (no longer true).",
            ["result"],
            registry=self.registry,
        )
        self.distilled_exchanges = Counter(
            "memproxy_distilled_exchanges",
            "Exchanges whose words gave no fact, queued at idle time for the Manager once more.",
            registry=self.registry,
        )
        self.enriched_memories = Counter(
            "memproxy_enriched_memories",
            "Memories given a sentence of context in what they are found by, at idle time.",
            registry=self.registry,
        )
        self.consolidation_questions = Counter(
            "memproxy_consolidation_questions",
            "Groups of facts the model was asked about at idle time, by outcome: used, or "
            "refused (unusable, or a merge whose words were not the facts').",
            ["outcome"],
            registry=self.registry,
        )
        self.answers_unusable = Counter(
            "memproxy_manager_answers_unusable",
            "Manager answers that did not fit through the retries (their job parked as failed).",
            registry=self.registry,
        )
        self.recall_failures = Counter(
            "memproxy_recall_failures",
            "Chat requests forwarded without memories because recall failed.",
            ["reason"],
            registry=self.registry,
        )
        self.upstream_seconds = Histogram(
            "memproxy_upstream_seconds",
            "Time until the upstream's response headers (for a stream, its first token), by "
            "endpoint (chat, models, other) and result (2xx, 4xx, 5xx, unreachable, timeout).",
            ["endpoint", "result"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0),
            registry=self.registry,
        )

    def count_embedding_cache(self, hits: Callable[[], int]) -> None:
        """Export the embedder's cache hits (read when scraped)."""
        documentation = "Query embeddings answered from the cache."
        self.registry.register(_Read("memproxy_embedding_cache_hits", documentation, hits))


class _Read(Collector):
    def __init__(self, name: str, documentation: str, read: Callable[[], int]) -> None:
        self._name, self._documentation, self._read = name, documentation, read

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield CounterMetricFamily(self._name, self._documentation, value=self._read())
