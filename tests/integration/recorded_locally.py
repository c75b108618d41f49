"""A local run recorded into DuckDB by the recorder's own Store, as the fleet's recorder records
it (started, spawn, outcome batches, round results, interview answers, done): real rows for the
analysis, the report and the browser without starting a stack. (Tests' helper, not a test.)"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path

from populace.client.prepare import PreparedRun
from populace.core.contracts import (
    PLATFORM_SUMMARY_COLUMNS,
    ConfigRef,
    InterviewBatch,
    OutcomeBatch,
    RoundResult,
    RunDone,
    RunStarted,
    SpawnBatch,
)
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import LocalResult, run_local
from populace.store.store import Event, Store


def play(prepared: PreparedRun) -> LocalResult:
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    return asyncio.run(run_local(prepared.resolved, cast=cast))


def record(db: Path, prepared: PreparedRun, result: LocalResult, run_id: str) -> None:
    cfg = prepared.config
    tables = prepared.resolved.tables()
    t0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()
    sim_columns = [c.name for c in tables.outcome_columns]
    events = [Event(f"{run_id}.started", "started", RunStarted(run_id=run_id, config=cfg, started_at=t0,
                                                               hosts=["local"], tables=tables,
                                                               manifest=prepared.manifest), blob=prepared.personas),
              Event(f"{run_id}.spawn", "spawn", SpawnBatch(run_id=run_id, host_id="local",
                                                           ranges=[(0, cfg.agents)], config_ref=ConfigRef.of(cfg)))]
    o = result.outcomes
    for n in range(1, cfg.rounds + 1):
        rows = [i for i, r in enumerate(o["round"]) if r == n]
        events.append(Event(f"{run_id}.{n}.outcomes", "outcomes", OutcomeBatch(
            run_id=run_id, round=n, host_id="local", seq=0, agent_ids=[o["agent_id"][i] for i in rows],
            columns={c: [o[c][i] for i in rows] for c in sim_columns}, valid=[o["valid"][i] for i in rows],
            raws=[o["raw"][i] for i in rows], latency_ms=[o["latency_ms"][i] for i in rows],
            errors=[o["error"][i] for i in rows])))
        k = result.rounds["round"].index(n)
        summary = {c: result.rounds[c][k] for c in result.rounds if c not in PLATFORM_SUMMARY_COLUMNS}
        events.append(Event(f"{run_id}.{n}.result", "round.result", RoundResult(
            run_id=run_id, round=n, n=result.rounds["n"][k], n_valid=result.rounds["n_valid"][k], summary=summary,
            observation={}, closed_at=t0 + 60 * n, shares=["local@0"])))
    iv = result.interviews
    plans = {p.id: p for p in cfg.interviews}
    keys = sorted({(r, s) for r, s in zip(iv.get("after_round", []), iv.get("survey", []))})
    for n, survey in keys:
        rows = [i for i, (r, s) in enumerate(zip(iv["after_round"], iv["survey"])) if (r, s) == (n, survey)]
        events.append(Event(f"{run_id}.{n}.{survey}.answers", "interviews", InterviewBatch(
            run_id=run_id, after_round=n, host_id="local", seq=0, survey=plans[survey].survey,
            agent_ids=[iv["agent_id"][i] for i in rows], questions=[iv["question"][i] for i in rows],
            answers=[iv["answer"][i] for i in rows], values=[iv["value"][i] for i in rows],
            raws=[iv["raw"][i] for i in rows], valid=[iv["valid"][i] for i in rows],
            errors=[iv["error"][i] for i in rows], latency_ms=[iv["latency_ms"][i] for i in rows])))
    events.append(Event(f"{run_id}.done", "done", RunDone(run_id=run_id, status="completed", rounds=cfg.rounds,
                                                          finished_at=t0 + 600)))
    store = Store(db)
    try:
        out = store.ingest(events)
        assert not out.refused, out.refused
    finally:
        store.close()
