"""Prometheus metrics, one endpoint per service process (POPULACE_METRICS_PORT; 0 = off).
Counted per round and per batch — the same granularity as logs and spans."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, start_http_server

ROUNDS = Counter("populace_rounds_total", "Rounds opened (orchestrator), played (agent-host) or closed (environment)",
                 ["service"])
BATCHES = Counter("populace_batches_total", "Batches handled, by kind (infer, outcomes, recorded …)",
                  ["service", "kind"])
ITEMS = Counter("populace_items_total", "Items in those batches (prompts, outcomes, messages)", ["service", "kind"])
AGENTS = Gauge("populace_agents_hosted", "Agents hosted by this agent-host")
LLM_IN_FLIGHT = Gauge("populace_llm_in_flight", "LLM calls in flight (agent-host: awaiting the gateway; "
                      "gateway: admitted)", ["service"])
DEAD_LETTERS = Counter("populace_dead_letters_total", "Malformed messages dead-lettered", ["service"])

_started: set[int] = set()


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics on `port` (once per process; 0 disables)."""
    if port and port not in _started:
        start_http_server(port, addr=addr)
        _started.add(port)


def batch(service: str, kind: str, items: int) -> None:
    BATCHES.labels(service, kind).inc()
    ITEMS.labels(service, kind).inc(items)
