"""Prometheus metrics, one registry per app (so tests and several apps in one process never clash)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "fedresearch_retriever_requests",
            "Retriever calls, cached answers included",
            ["retriever"],
            registry=self.registry,
        )
        self.failures = Counter(
            "fedresearch_retriever_failures",
            "Retriever calls that failed, by reason",
            ["retriever", "reason"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "fedresearch_retriever_latency_seconds",
            "Time to a retriever's answer",
            ["retriever"],
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=self.registry,
        )
        self.suspensions = Counter(
            "fedresearch_retriever_suspensions",
            "Times an upstream was suspended by its circuit breaker",
            ["retriever", "reason"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "fedresearch_retriever_cache_hits",
            "Answers served from the upstream cache",
            ["retriever"],
            registry=self.registry,
        )
        self.sockets = Gauge("fedresearch_active_sockets", "Open WebSocket connections", registry=self.registry)
        self.tasks = Gauge("fedresearch_active_tasks", "Research tasks running", registry=self.registry)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
