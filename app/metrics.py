"""Prometheus metrics, in a registry of the app's own (two apps in one process do not share)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
        self.recall_failures = Counter(
            "memproxy_recall_failures",
            "Chat requests forwarded without memories because recall failed.",
            ["reason"],
            registry=self.registry,
        )
