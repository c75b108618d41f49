"""What the model did in a run, from the gateway's `llm_calls` rows and the run's manifest: per
round the calls, HTTP attempts, corrective re-asks, retries on other replicas, tokens (cached
ones too), dollars, latency percentiles and replicas; per model (a run with `models:`) its
agents, calls, tokens, dollars and latency; per run the model and replica names. (The round table's `usage`
counts what the agent-hosts saw: calls, tokens and the infrastructure retries the gateway never
answered; these rows say how the gateway got each answer.)"""

from __future__ import annotations

import duckdb

from populace.analysis.tables import has_table, table_columns

LATENCY_QUANTILES = (0.5, 0.95)


def call_stats(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[int, dict]:
    """{round: stats} over the run's `llm_calls` rows, for rounds that have any::

        calls                      decisions the gateway answered (one row each)
        attempts                   HTTP calls it made for them
        reasks                     of those, corrective re-asks after an invalid answer
                                   (None: recorded before re-asks were counted)
        replica_retries            attempts − calls − reasks: calls again on another replica
                                   after one failed (None when reasks is)
        valid                      answers the gateway's schema check accepted
        prompt_tokens, completion_tokens
        cached_tokens              of the prompt tokens, those the provider served from its cache
        dollars                    at the run's models' prices (None: no priced model answered,
                                   or recorded before prices were)
        latency_ms_p50, latency_ms_p95, latency_ms_max   per decision, re-asks included
        replicas                   {replica: calls}

    Empty for a run whose model never went through the gateway (the dummy model)."""
    if not has_table(con, "llm_calls"):
        return {}
    have = set(table_columns(con, "llm_calls"))
    reasks = "sum(reasks)" if "reasks" in have else "NULL"
    cached, dollars = _cost_sql(have)
    rows = con.execute(
        f"""
        SELECT round, count(*), sum(attempts), {reasks}, count(*) FILTER (WHERE valid),
               sum(prompt_tokens), sum(completion_tokens), {cached}, {dollars},
               quantile_cont(latency_ms, {LATENCY_QUANTILES[0]}), quantile_cont(latency_ms, {LATENCY_QUANTILES[1]}),
               max(latency_ms), histogram(replica)
        FROM llm_calls WHERE run_id = ? GROUP BY round ORDER BY round
        """, [run_id]).fetchall()
    out: dict[int, dict] = {}
    for rnd, calls, attempts, n_reasks, valid, ptok, ctok, ctok_cached, cost, p50, p95, top, replicas in rows:
        attempts = int(attempts or 0)
        n_reasks = None if n_reasks is None else int(n_reasks)
        out[int(rnd)] = {
            "calls": int(calls), "attempts": attempts, "reasks": n_reasks,
            "replica_retries": None if n_reasks is None else max(attempts - int(calls) - n_reasks, 0),
            "valid": int(valid), "prompt_tokens": int(ptok or 0), "completion_tokens": int(ctok or 0),
            "cached_tokens": int(ctok_cached or 0), "dollars": None if cost is None else float(cost),
            "latency_ms_p50": _ms(p50), "latency_ms_p95": _ms(p95), "latency_ms_max": _ms(top),
            "replicas": {str(k): int(v) for k, v in sorted((replicas or {}).items(), key=lambda kv: str(kv[0]))},
        }
    return out


def total_calls(per_round: dict[int, dict]) -> dict | None:
    """The run's totals of `call_stats` (latency: the worst round's p95 and max; None without calls)."""
    if not per_round:
        return None
    rounds = list(per_round.values())
    out = {k: sum(r[k] for r in rounds)
           for k in ("calls", "attempts", "valid", "prompt_tokens", "completion_tokens", "cached_tokens")}
    cost = [r["dollars"] for r in rounds if r["dollars"] is not None]
    out["dollars"] = sum(cost) if cost else None
    for k in ("reasks", "replica_retries"):
        out[k] = None if any(r[k] is None for r in rounds) else sum(r[k] for r in rounds)
    for k in ("latency_ms_p95", "latency_ms_max"):
        out[k] = max((r[k] for r in rounds if r[k] is not None), default=None)
    replicas: dict[str, int] = {}
    for r in rounds:
        for name, n in r["replicas"].items():
            replicas[name] = replicas.get(name, 0) + n
    out["replicas"] = dict(sorted(replicas.items()))
    return out


def round_cost(usage: dict, calls: dict) -> tuple[int | None, float | None]:
    """A round's cached tokens and dollars: the agent-hosts' count (`round_table`'s usage), else
    the gateway's (`call_stats`); None where neither recorded them."""
    cached = usage["cached_tokens"] if "cached_tokens" in usage else calls.get("cached_tokens")
    dollars = usage["dollars"] if "dollars" in usage else calls.get("dollars")
    return cached, dollars


def _cost_sql(have: set[str]) -> tuple[str, str]:
    """SQL sums of cached tokens and dollars (NULL where the rows predate them)."""
    return ("sum(cached_tokens)" if "cached_tokens" in have else "NULL",
            "sum(dollars)" if "dollars" in have else "NULL")


def model_stats(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, dict]:
    """{model: stats} over the run's `llm_calls` rows, for a run with `models:` (empty without,
    or for a file from before calls recorded their model)::

        agents                     the run's agents on the model (agent_models; None: not recorded)
        calls, valid               decisions the gateway answered, and of them those its schema check accepted
        prompt_tokens, cached_tokens, completion_tokens
        dollars                    at the model's prices (None: it has none)
        latency_ms_mean, latency_ms_p50   per decision, re-asks included

    Models in the run's agent_models that answered no call are listed with zeros."""
    if not has_table(con, "llm_calls") or "model" not in (have := set(table_columns(con, "llm_calls"))):
        return {}
    cached, dollars = _cost_sql(have)
    rows = con.execute(
        f"""
        SELECT model, count(*), count(*) FILTER (WHERE valid), sum(prompt_tokens), {cached}, sum(completion_tokens),
               {dollars}, avg(latency_ms), quantile_cont(latency_ms, 0.5)
        FROM llm_calls WHERE run_id = ? AND model IS NOT NULL GROUP BY model ORDER BY model
        """, [run_id]).fetchall()
    agents: dict[str, int] = {}
    if has_table(con, "agent_models"):
        agents = {str(m): int(n) for m, n in con.execute(
            "SELECT model, count(*) FROM agent_models WHERE run_id = ? GROUP BY model", [run_id]).fetchall()}
    out: dict[str, dict] = {}
    for model, calls, valid, ptok, ctok_cached, ctok, cost, mean, p50 in rows:
        out[str(model)] = {"agents": agents.get(str(model)), "calls": int(calls), "valid": int(valid),
                           "prompt_tokens": int(ptok or 0), "cached_tokens": int(ctok_cached or 0),
                           "completion_tokens": int(ctok or 0), "dollars": None if cost is None else float(cost),
                           "latency_ms_mean": _ms(mean), "latency_ms_p50": _ms(p50)}
    for model, n in agents.items():
        out.setdefault(model, {"agents": n, "calls": 0, "valid": 0, "prompt_tokens": 0, "cached_tokens": 0,
                               "completion_tokens": 0, "dollars": None, "latency_ms_mean": None,
                               "latency_ms_p50": None})
    return dict(sorted(out.items()))


def model_of(info: dict, per_round: dict[int, dict] | None = None) -> dict:
    """The run's model as recorded: ``backend``, ``name`` (the model the replicas served, from the
    manifest; None for the dummy model or a run without a manifest) and ``replicas`` (their ids:
    those registered when the run started, then any more that answered it)."""
    manifest = (info.get("manifest") or {}).get("model") or {}
    config = info.get("model") or {}
    listed = manifest.get("replicas") or []
    ids = [str(r.get("replica_id")) if isinstance(r, dict) else str(r) for r in listed]
    names = {r.get("model") for r in listed if isinstance(r, dict) and r.get("model")}
    answered = {name for r in (per_round or {}).values() for name in r["replicas"]}
    ids += sorted(answered - set(ids))
    name = manifest.get("name") or config.get("name") or (names.pop() if len(names) == 1 else None)
    return {"backend": manifest.get("backend") or config.get("backend"), "name": name, "replicas": ids}


def _ms(x: float | None) -> float | None:
    return None if x is None else round(float(x), 1)
