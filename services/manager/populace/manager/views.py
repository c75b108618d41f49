"""What the manager's pages and live streams show, built from the bus's models: pure functions
(no I/O), unit-tested on their own."""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass, field

from populace.client.estimate import projected
from populace.client.run import status_as_recorded
from populace.client.steer import cancel_refusal
from populace.client.steer import last_completed as last_completed  # the CLI's count, re-exported
from populace.core.contracts import (
    RESUMABLE_STATUSES,
    NodeInfo,
    ProcessInfo,
    Progress,
    ReplicaInfo,
    RoundResult,
    RunRecorded,
    RunState,
    money,
)

# numeric summary fields charted per round (the first few, as the CLI's progress line shows them)
CHART_SERIES = 2
MAX_RUNS = 500  # rows in the runs list and its live updates (newest first)


def mb(n: int) -> str:
    return f"{n / 2**20:,.0f} MB"


def can_cancel(state: RunState) -> bool:
    """Whether `populace cancel` would send the cancel (populace.client.steer.cancel_refusal)."""
    return cancel_refusal(state) is None


def can_resume(state: RunState) -> bool:
    return state.status in RESUMABLE_STATUSES and state.round < state.config.rounds


def run_row(state: RunState, recorded: RunRecorded | None = None) -> dict:
    """One run as the runs list shows it (and its live updates send it); `recorded`: its
    RunRecorded, when the page read it (the run page does)."""
    c = state.config
    done = last_completed(state)
    status, reason = status_as_recorded(state, recorded)
    return {
        "run_id": state.run_id, "name": c.name, "status": status, "simulation": c.simulation,
        "agents": c.agents, "rounds": c.rounds, "round": state.round if state.status == "running" else None,
        "completed": done, "progress": round(done / c.rounds, 4) if c.rounds else 0.0,
        "tokens": state.used.tokens, "llm_calls": state.used.llm_calls, "model": c.model.backend,
        "reason": reason, "updated_at": state.updated_at, **spending(state),
    }


def spending(state: RunState) -> dict:
    """A run's dollars (its rounds' and interviews'), the projection to its last round (spent /
    rounds done × rounds) and both as text; `priced`: whether its models have prices at all."""
    c = state.config
    spent = state.used.dollars + state.interviews.dollars
    ahead = projected(spent, last_completed(state), c.rounds)
    return {"priced": any(not m.prices.free for m in c.models), "dollars": spent, "dollars_projected": ahead,
            "dollars_text": money(spent), "dollars_projected_text": None if ahead is None else money(ahead)}


def runs_payload(states: list[RunState], limit: int = MAX_RUNS) -> dict:
    """The runs list's live update: every run's row, newest first (at most `limit`)."""
    rows = sorted((run_row(s) for s in states), key=lambda r: (r["updated_at"], r["run_id"]), reverse=True)
    return {"runs": rows[:limit], "total": len(rows), "at": time.time()}


def numeric_summary(summary: dict, limit: int | None = CHART_SERIES) -> dict[str, float]:
    """The first `limit` numbers of a round's summary (e.g. a ratio game's mean and target;
    None: all of them)."""
    out: dict[str, float] = {}
    for key, value in summary.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[key] = float(value)
            if limit is not None and len(out) >= limit:
                break
    return out


def result_row(result: RoundResult) -> dict:
    """A closed round as the run page charts and tabulates it."""
    u = result.usage
    return {"round": result.round, "n": result.n, "n_valid": result.n_valid,
            # what went wrong, in three classes: the model's, the simulation's own code, the infrastructure's
            "n_invalid_answers": result.n - result.n_valid - result.n_simulation_errors,
            "n_simulation_errors": result.n_simulation_errors, "infra_retries": u.infra_retries,
            "series": numeric_summary(result.summary), "numbers": numeric_summary(result.summary, None),
            "summary": _jsonable(result.summary),
            "llm_calls": u.llm_calls, "tokens": u.tokens, "prompt_tokens": u.prompt_tokens,
            "completion_tokens": u.completion_tokens, "cached_tokens": u.cached_tokens,
            "dollars": u.dollars, "closed_at": result.closed_at, "prototypes": prototype_rows(result)}


def prototype_rows(result: RoundResult) -> list[dict]:
    """A prototype run's round, per prototype (docs/prototypes.md): who called and copied, the
    audits, the draws' divergence from them with its 95% interval, the guard's next share."""
    report = result.prototypes
    if report is None:
        return []
    return [{"prototype": s.label, "agents": s.agents, "share": s.share, "representatives": s.representatives,
             "valid": s.valid, "drawn": s.drawn, "unanswered": s.unanswered, "audited": s.audited,
             "audited_valid": s.audited_valid, "metric": s.metric, "divergence": s.divergence, "ci_low": s.ci_low,
             "ci_high": s.ci_high, "breach": s.breach, "next_share": s.next_share} for s in report.stats]


def _jsonable(doc: dict) -> dict:
    return json.loads(json.dumps(doc, default=str))


@dataclass
class RoundTicks:
    """Answers in per round, summed from the hosts' progress ticks (one per batch, never one
    per agent). `since_open`: the ticks of a round are counted only from when this page began
    listening, so a round already in play when it opened shows a lower bound."""

    run_id: str
    answered: dict[int, int] = field(default_factory=dict)
    first_round: int | None = None  # the first round whose opening this listener saw
    malformed: int = 0

    def add(self, data: bytes) -> None:
        try:
            tick = Progress.model_validate_json(data)
        except ValueError:
            self.malformed += 1
            return
        if tick.run_id != self.run_id:
            self.malformed += 1
            return
        self.answered[tick.round] = self.answered.get(tick.round, 0) + max(0, tick.answered)

    def opened(self, n: int) -> None:
        if self.first_round is None or n < self.first_round:
            self.first_round = n

    def complete(self, n: int) -> bool:
        """Whether round `n` was counted from its opening."""
        return self.first_round is not None and n >= self.first_round


def run_payload(rid: str, state: RunState | None, ticks: RoundTicks, expected: int | None,
                new_results: list[RoundResult], recorded: RunRecorded | None = None) -> dict:
    """The run page's live update: its state, the round in play's answers in / expected, and
    the rounds closed since the last update (the page keeps them by round number)."""
    if state is None:
        return {"run_id": rid, "status": "submitted", "known": False, "results": [], "at": time.time()}
    row = run_row(state, recorded)
    current = state.round if state.status == "running" else None
    answered = ticks.answered.get(current, 0) if current else None
    if current and expected:
        answered = min(answered or 0, expected)
    return {**row, "known": True, "current_round": current, "answered": answered, "expected": expected,
            "answered_lower_bound": bool(current) and not ticks.complete(current),
            "can_cancel": can_cancel(state), "can_resume": can_resume(state),
            "results": [result_row(r) for r in sorted(new_results, key=lambda r: r.round)], "at": time.time()}


_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}$")


def trace_id(traceparent: str) -> str | None:
    """The trace id of a W3C traceparent header (None: absent, malformed or all zeros)."""
    m = _TRACEPARENT.match(traceparent.strip())
    if not m or set(m.group(1)) == {"0"}:
        return None
    return m.group(1)


def sse(data: dict, event: str | None = None) -> bytes:
    """One server-sent event carrying `data` as JSON on one line."""
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


# --- nodes -------------------------------------------------------------------------------
def spec_text(p: ProcessInfo) -> str:
    spec = p.spec.model_dump(exclude_defaults=True, exclude={"kind"})
    return ", ".join(f"{k}={v}" for k, v in spec.items())


def process_row(p: ProcessInfo) -> dict:
    running = p.state == "running"
    return {"proc_id": p.proc_id, "kind": p.spec.kind, "state": p.state, "pid": p.pid, "exit_code": p.exit_code,
            "restarts": p.restarts, "restart": p.restart.mode, "max_restarts": p.restart.max_restarts,
            "cpu": f"{p.cpu_percent:.0f}" if running else "", "memory": mb(p.rss_bytes) if running else "",
            "settings": spec_text(p), "running": running}


def node_row(n: NodeInfo, now: float | None = None) -> dict:
    return {"node_id": n.node_id, "hostname": n.hostname, "cpus": n.cpus, "memory": mb(n.memory_bytes),
            "memory_free": mb(n.memory_available_bytes), "gone": n.gone(now),
            "gpus": ", ".join(f"{g.index}: {g.name} ({g.memory_mb:,} MB)" for g in n.gpus) or "none",
            "version": n.version, "up_s": round(n.heartbeat_at - n.started_at),
            "running": sum(p.state == "running" for p in n.processes),
            "processes": [process_row(p) for p in n.processes]}


def nodes_payload(nodes: list[NodeInfo], now: float | None = None) -> dict:
    """The nodes page's live update: every live node's row (processes included), by id."""
    now = time.time() if now is None else now
    return {"nodes": [node_row(n, now) for n in sorted(nodes, key=lambda n: n.node_id) if not n.gone(now)],
            "at": now}


# --- fork ---------------------------------------------------------------------------------
def change_lines(text: str) -> list[str]:
    """The fork form's changes, one `key=value` per line as `populace fork --set` takes them
    (blank lines and `#` comments skipped)."""
    return [line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#")]


def fork_field(message: str) -> str:
    """Which field of the fork form a refusal of populace.client.steer names: the round
    (`--from-round: …`), the run itself (`run …`), else the changes."""
    if message.startswith("--from-round"):
        return "after_round"
    if message.startswith("run "):
        return ""
    return "changes"


# --- scenario errors ---------------------------------------------------------------------
_FIELD = re.compile(r"^(\([a-z ]+\)|[A-Za-z_][\w.\-\[\]]*): ")


@dataclass(frozen=True)
class FieldError:
    field: str  # the dotted field the CLI's message names ('' when it names none)
    message: str  # the CLI's whole line(s), field included

    @property
    def top(self) -> str:
        """The scenario's top-level key the field is under (e.g. 'game' for 'game.ratio')."""
        return self.field.split(".", 1)[0].split("[", 1)[0]


def field_errors(text: str) -> list[FieldError]:
    """The CLI's error text (one problem per line, each starting with its dotted field; an
    indented line continues the one before) as (field, message) pairs, in order."""
    out: list[FieldError] = []
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _FIELD.match(line)
        if m and not line[:1].isspace():
            out.append(FieldError(m.group(1), line))
        elif line.startswith("simulation '"):  # 'simulation 'x' (import path): cannot import …'
            out.append(FieldError("simulation", line))
        elif out and (line[:1].isspace() or not m):
            out[-1] = FieldError(out[-1].field, out[-1].message + "\n" + line)
        else:
            out.append(FieldError("", line))
    return out


# --- replicas ----------------------------------------------------------------------------
# Prometheus names per replica dialect: vLLM (and the simulated vLLM) and llama.cpp's server.
RUNNING = ("vllm:num_requests_running", "llamacpp:requests_processing")
WAITING = ("vllm:num_requests_waiting", "llamacpp:requests_deferred")
PREFIX_HITS, PREFIX_QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"
KV_USAGE = "vllm:kv_cache_usage_perc"


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text format → each metric's samples summed (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        try:
            value = float(line.rsplit(" ", 1)[1])
        except (IndexError, ValueError):
            continue
        out[name] = out.get(name, 0.0) + value
    return out


def replica_row(info: ReplicaInfo, healthy: bool | None, metrics: dict[str, float] | None,
                now: float | None = None, refused: str | None = None) -> dict:
    """A replica as the replicas page shows it: its registry entry, whether it answered its
    health check (None: not checked), and its load and prefix-cache hit rate from /metrics;
    `refused`: why no gateway calls it (then it is not checked either)."""
    m = metrics or {}

    def first(names: tuple[str, ...]) -> float | None:
        return next((m[n] for n in names if n in m), None)

    queries = m.get(PREFIX_QUERIES)
    hit_rate = m.get(PREFIX_HITS, 0.0) / queries if queries else None
    return {"replica_id": info.replica_id, "backend": info.backend, "kind": info.kind, "model": info.model,
            "url": info.url, "max_concurrency": info.max_concurrency, "pid": info.pid, "healthy": healthy,
            "heartbeat_age_s": round((now if now is not None else time.time()) - info.heartbeat_at, 1),
            "running": first(RUNNING), "waiting": first(WAITING), "kv_cache": m.get(KV_USAGE),
            "prefix_hit_rate": hit_rate, "prefix_hits": m.get(PREFIX_HITS), "prefix_queries": queries,
            "metrics": metrics is not None, "refused": refused}


def replicas_summary(rows: list[dict], backend: str | None = None) -> dict:
    """The replicas serving one backend (all: None) in one line: how many, how many healthy,
    requests running and waiting, and the prefix-cache hit rate over all of them (hits over
    queries summed, so a busy replica weighs more; None where no replica counts them). A refused
    one serves nothing."""
    mine = [r for r in rows if (backend is None or r["backend"] == backend) and not r.get("refused")]
    counted = [r for r in mine if r["prefix_queries"]]
    queries = sum(r["prefix_queries"] for r in counted)
    return {"backend": backend, "replicas": len(mine), "healthy": sum(1 for r in mine if r["healthy"]),
            "running": sum(r["running"] or 0 for r in mine), "waiting": sum(r["waiting"] or 0 for r in mine),
            "prefix_hit_rate": sum(r["prefix_hits"] or 0 for r in counted) / queries if queries else None}
