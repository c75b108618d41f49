"""Prometheus metrics: every metric the platform exports is defined here, and nowhere else.

One /metrics endpoint per service process on POPULACE_METRICS_PORT (0 = off). A local stack
(`populace up`, `demo`) gives each process its own port: see populace.client.stack. Metrics
are observed per round and per batch — the granularity of logs and spans — never per agent,
so the hot paths pay a few calls per thousand agents. Labels stay small and bounded (service,
kind, replica, status): never a run id or an agent id. The Grafana dashboard in
deploy/monitoring/ queries only names defined here (a unit test checks it)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics import MetricWrapperBase

PORT_VARIABLE = "POPULACE_METRICS_PORT"

# Seconds. Rounds run from a dummy model's milliseconds to an hour of a real model's work.
ROUND_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
BATCH_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)

# -- work done --------------------------------------------------------------------------------
ROUNDS = Counter("populace_rounds_total", "Rounds opened (orchestrator), played (agent-host) or closed (environment)",
                 ["service"])
BATCHES = Counter("populace_batches_total", "Batches handled, by kind (infer, outcomes, messages)",
                  ["service", "kind"])
ITEMS = Counter("populace_items_total", "Items in those batches (prompts, outcomes, messages)", ["service", "kind"])
RUNS = Counter("populace_runs_total", "Runs the orchestrator started or resumed, and finished by status "
               "(completed, failed, cancelled, paused)", ["status"])

# -- time ---------------------------------------------------------------------------------------
ROUND_SECONDS = Histogram("populace_round_seconds", "Round time: orchestrator, from the round's first announcement "
                          "to its result; agent-host, its share from the open to its partial sent",
                          ["service"], buckets=ROUND_BUCKETS)
BATCH_SECONDS = Histogram("populace_batch_seconds", "Batch latency by kind: agent-host infer, from sending a batch "
                          "to the gateway until every prompt has its answer (retries included); gateway infer, "
                          "from taking a batch to its reply; recorder messages, one fetched batch stored",
                          ["service", "kind"], buckets=BATCH_BUCKETS)
LLM_SECONDS = Histogram("populace_llm_seconds", "One decision on a replica as the gateway measured it (llm_calls."
                        "latency_ms): waiting for a slot, retries and re-asks included", ["replica"],
                        buckets=BATCH_BUCKETS)

# -- the model ------------------------------------------------------------------------------
LLM_CALLS = Counter("populace_llm_calls_total", "Decisions a replica answered (one per prompt; its retries and "
                    "re-asks are counted apart)", ["replica"])
LLM_TOKENS = Counter("populace_llm_tokens_total", "Tokens the replicas reported, by kind (prompt, completion)",
                     ["kind", "replica"])
REASKS = Counter("populace_reasks_total", "Corrective re-asks after an answer that did not satisfy the answer "
                 "schema (gateway, POPULACE_GATEWAY_REASKS)", ["replica"])
RETRIES = Counter("populace_retries_total", "Infrastructure retries: agent-host, prompts sent again because no "
                  "model answered them; gateway, calls sent again to another replica after one failed",
                  ["service"])
RATE_LIMITED = Counter("populace_rate_limited_total", "Calls a provider answered 429 (rate limited): waited out "
                       "as its Retry-After asked and sent again, never counted as failures", ["model"])
INVALID = Counter("populace_invalid_answers_total", "Invalid answers: gateway, answers still invalid after the "
                  "re-asks; agent-host, outcome rows recorded invalid (the model's answer or the agent's error)",
                  ["service"])
RUN_CONFIGS_VALIDATED = Counter("populace_run_configs_validated_total", "Run configs this process validated (a "
                                "message's or a run state's too): one per run per service; more means a path "
                                "validates again a config it already has")
DEAD_LETTERS = Counter("populace_dead_letters_total", "Messages dead-lettered (malformed, refused, or failing "
                       "every delivery)", ["service"])
UNOBSERVED = Counter("populace_unobserved_errors_total", "Errors no code was waiting for: a task's exception never "
                     "retrieved, a callback that raised (each logged once as task_exception_unobserved); 0 in a "
                     "healthy process", ["service"])
REFUSED_GROUPS = Counter("populace_refused_groups_total", "Groups the recorder took out of an outcome batch it "
                         "recorded otherwise (their outcomes, acts and lines are missing)", ["service"])

# -- now ------------------------------------------------------------------------------------------
AGENTS = Gauge("populace_agents_hosted", "Agents hosted by this agent-host")
RUNS_ACTIVE = Gauge("populace_runs_active", "Runs this orchestrator is placing or playing")
LLM_IN_FLIGHT = Gauge("populace_llm_in_flight", "LLM calls in flight (agent-host: awaiting the gateway; "
                      "gateway: admitted)", ["service"])
REPLICA_UP = Gauge("populace_replica_up", "1 while the gateway finds a replica healthy, 0 while not", ["replica"])
REPLICA_IN_FLIGHT = Gauge("populace_replica_in_flight", "Calls the gateway has in flight on a replica (sampled at "
                          "each registry poll)", ["replica"])
REPLICA_WAITING = Gauge("populace_replica_waiting", "Requests waiting inside a replica, from its own /metrics "
                        "(sampled at each registry poll)", ["replica"])

EXPORTED: tuple[MetricWrapperBase, ...] = (
    ROUNDS, BATCHES, ITEMS, RUNS, ROUND_SECONDS, BATCH_SECONDS, LLM_SECONDS, LLM_CALLS, LLM_TOKENS, REASKS, RETRIES,
    RATE_LIMITED, INVALID, DEAD_LETTERS, UNOBSERVED, REFUSED_GROUPS, AGENTS, RUNS_ACTIVE, LLM_IN_FLIGHT, REPLICA_UP,
    REPLICA_IN_FLIGHT, REPLICA_WAITING,
)

# The series each service exports from its start, at 0 until it works (a scrape shows the
# names before the first run; a rate over them starts at 0): the scrape test checks them.
# Series labelled by replica appear with their replica.
BY_SERVICE: dict[str, tuple[tuple[MetricWrapperBase, tuple[str, ...]], ...]] = {
    "orchestrator": ((ROUNDS, ("orchestrator",)), (ROUND_SECONDS, ("orchestrator",)), (RUNS, ("started",))),
    "environment": ((ROUNDS, ("environment",)),),
    "agent-host": ((ROUNDS, ("agent-host",)), (ROUND_SECONDS, ("agent-host",)), (BATCHES, ("agent-host", "infer")),
                   (ITEMS, ("agent-host", "infer")), (BATCH_SECONDS, ("agent-host", "infer")),
                   (BATCHES, ("agent-host", "outcomes")), (ITEMS, ("agent-host", "outcomes")),
                   (RETRIES, ("agent-host",)), (INVALID, ("agent-host",)), (LLM_IN_FLIGHT, ("agent-host",))),
    "gateway": ((BATCHES, ("gateway", "infer")), (ITEMS, ("gateway", "infer")), (BATCH_SECONDS, ("gateway", "infer")),
                (RETRIES, ("gateway",)), (INVALID, ("gateway",)), (LLM_IN_FLIGHT, ("gateway",))),
    "recorder": ((BATCHES, ("recorder", "messages")), (ITEMS, ("recorder", "messages")),
                 (BATCH_SECONDS, ("recorder", "messages")), (ITEMS, ("recorder", "outcomes")),
                 (REFUSED_GROUPS, ("recorder",))),
}


def declare(service: str) -> None:
    """Create the service's series (at 0): its own, its dead letters and its unobserved errors."""
    DEAD_LETTERS.labels(service)
    UNOBSERVED.labels(service)
    for metric, labels in BY_SERVICE.get(service, ()):
        metric.labels(*labels)


class MetricsPortUnavailable(OSError):
    """The metrics port cannot be bound (taken by another process, or not ours to bind)."""


def serve(port: int, addr: str = "0.0.0.0") -> None:
    """Expose /metrics on `port` (0: off). Called once per process, by the service frame."""
    if not port:
        return
    try:
        start_http_server(port, addr=addr)
    except OSError as err:
        raise MetricsPortUnavailable(f"{PORT_VARIABLE}={port}: cannot serve metrics on {addr}:{port} "
                                     f"({err.strerror or err}); choose a free port, or 0 to turn metrics off") from None


def batch(service: str, kind: str, items: int, seconds: float | None = None) -> None:
    """One batch handled: counted, its items counted, and its latency observed when given."""
    BATCHES.labels(service, kind).inc()
    ITEMS.labels(service, kind).inc(items)
    if seconds is not None:
        BATCH_SECONDS.labels(service, kind).observe(seconds)


def series_names() -> set[str]:
    """Every series name this module exports (a histogram's _bucket, _sum and _count, a
    counter's _total): what a dashboard or an alert may query."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names = set()
    for metric in EXPORTED:
        for family in metric.describe():
            names.update(family.name + s for s in suffixes[family.type])
    return names
