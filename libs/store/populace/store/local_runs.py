"""Recording a run played in one process (`populace run --local`, `simulate(local=True)`) in
the same DuckDB tables as a fleet run: the events the recorder ingests from the bus — started,
one share placed, the outcome batches the run's shares emitted (the very wire batches an
agent-host publishes: populace.sdk.outcome_wire), round results, done — go through the
recorder's own store (`Store.ingest`, `check_outcomes`), so `results`, `report` and `export`
read a local run exactly as a fleet run; there is no second schema and no second cut of its
rows. The client calls it directly: the store is a library, not the recorder service's."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pyarrow as pa
from pydantic import ValidationError

from populace.core.contracts import (
    LOCAL_HOST,
    PLATFORM_SUMMARY_COLUMNS,
    ConfigRef,
    DecideProfile,
    InterviewBatch,
    LivingRef,
    OutcomeBatch,
    PrototypeRound,
    RoundPartial,
    RoundResult,
    RunConfig,
    RunDone,
    RunStarted,
    ShareProfile,
    SimulationTables,
    SpawnBatch,
    Usage,
)
from populace.store.columns import check_outcomes
from populace.store.store import Event, Store

BATCH = 1000  # rows per interview batch, as an agent-host sends them


class LocalRecordError(RuntimeError):
    """The run could not be written (the file is held by another process, or a row is refused)."""


def _interview_batches(run_id: str, config: RunConfig, rows: dict[str, list],
                       calls: dict[tuple[int, str], int]) -> list[InterviewBatch]:
    """The answers to the scenario's planned interviews (run_local's rows, sorted by round,
    survey and agent) as the batches an agent-host sends, ~1,000 rows each; each (round,
    survey)'s LLM calls go with its first batch."""
    surveys = {plan.survey.id: plan.survey for plan in config.interviews}
    n = len(rows.get("agent_id", []))
    out: list[InterviewBatch] = []
    start = 0
    while start < n:
        key = (rows["after_round"][start], rows["survey"][start])
        end = start + 1
        while end < n and end - start < BATCH and (rows["after_round"][end], rows["survey"][end]) == key:
            end += 1
        part = slice(start, end)
        first = not out or (out[-1].after_round, out[-1].survey.id) != key
        out.append(InterviewBatch(
            run_id=run_id, after_round=key[0], host_id=LOCAL_HOST, seq=len(out), survey=surveys[key[1]],
            agent_ids=rows["agent_id"][part], questions=rows["question"][part], answers=rows["answer"][part],
            values=rows["value"][part], raws=rows["raw"][part], valid=rows["valid"][part],
            errors=rows["error"][part], latency_ms=rows["latency_ms"][part],
            usage=Usage(llm_calls=calls.get(key, 0)) if first else Usage()))
        start = end
    return out


def _living(run_id: str, agents: int, population: dict[str, list]) -> dict[int, tuple[LivingRef, pa.Table]]:
    """Per round that changed the population, who is alive after it (as a round result names
    it) and its rows of table population."""
    out: dict[int, tuple[LivingRef, pa.Table]] = {}
    size = living = agents
    rounds = population.get("round", [])
    for r in sorted(set(rounds)):
        idx = [i for i, x in enumerate(rounds) if x == r]
        events = [population["event"][i] for i in idx]
        came = sum(1 for e in events if e in ("born", "arrived"))
        first, size = size, size + came
        living += 2 * came - len(events)
        ref = LivingRef(name=f"{run_id}.{r}.population", digest="0" * 64, round=r, size=size, first=first,
                        living=living)
        out[r] = (ref, pa.table({k: [population[k][i] for i in idx] for k in ("round", "agent_id", "event",
                                                                               "reason")}))
    return out


def _profiles(run_id: str, profile: dict[str, list] | None) -> tuple[list[Event], dict[int, DecideProfile]]:
    """run_local's `round_profile` rows as the recorder gets them on the fleet: the process's in a
    partial of its share per round, the environment's with the round's result (by round)."""
    partials: list[Event] = []
    decided: dict[int, DecideProfile] = {}
    rows = [dict(zip(profile, r)) for r in zip(*profile.values())] if profile else []
    for row in rows:
        if row["role"] == "host":
            p = ShareProfile(**{k: row[k] for k in ShareProfile.model_fields if k != "v" and row.get(k) is not None})
            partials.append(Event(f"local.{run_id}.{row['round']}.partial", "partial", RoundPartial(
                run_id=run_id, round=row["round"], host_id=LOCAL_HOST, n=p.agents, n_valid=0, payload={}, profile=p)))
        elif row["role"] == "environment":
            decided[row["round"]] = DecideProfile(**{k: row[k] for k in DecideProfile.model_fields
                                                     if k != "v" and row.get(k) is not None})
    return partials, decided


def record_local(db: str | Path, *, run_id: str, config: RunConfig, tables: SimulationTables,
                 batches: list[OutcomeBatch], rounds: dict[str, list], status: str = "completed",
                 reason: str | None = None, started_at: float | None = None, manifest: dict | None = None,
                 personas: bytes | None = None, interviews: dict[str, list] | None = None,
                 interview_calls: dict[tuple[int, str], int] | None = None, profile: dict[str, list] | None = None,
                 prototypes: dict[int, PrototypeRound] | None = None, population: dict[str, list] | None = None) -> int:
    """Write a local run to `db`: the outcome and audit `batches` its shares emitted (run_local's
    `batches`: host LOCAL_HOST, as an agent-host publishes them), its `rounds` (run_local's round
    rows), the answers to its planned `interviews` with their LLM calls by (after round, survey),
    where its rounds went (`profile`: run_local's `round_profile` rows), and its population's
    changes (`population`: table population's rows); returns the outcomes recorded. A failed run
    keeps the rounds it closed."""
    partials, decided = _profiles(run_id, profile)
    now = time.time()
    started_at = started_at or now
    living = _living(run_id, config.agents, population or {})
    # one share holds every agent id the run gave (newcomers' too)
    ranges = [(0, max([config.agents, *(ref.size for ref, _ in living.values())]))]
    events = [Event(f"local.{run_id}.started", "started",
                    RunStarted(run_id=run_id, config=config, started_at=started_at, hosts=[LOCAL_HOST], tables=tables,
                               manifest=manifest), blob=personas),
              Event(f"local.{run_id}.spawn", "spawn",
                    SpawnBatch(run_id=run_id, host_id=LOCAL_HOST, ranges=ranges, config_ref=ConfigRef.of(config)))]
    errors: dict[int, int] = {}  # by round: invalid rows the simulation's own code caused
    for b in batches:
        if b.run_id != run_id or b.host_id != LOCAL_HOST:
            raise ValueError(f"batches: round {b.round}'s batch {b.seq} is run {b.run_id!r}'s from host "
                             f"{b.host_id!r}, not a local run {run_id!r}'s (host {LOCAL_HOST!r})")
        try:  # validated as the recorder validates what it reads off the wire (its values shared, not copied)
            wire = OutcomeBatch.model_validate(b.model_dump())
        except ValidationError as err:  # the engine's own batch: a bug
            raise LocalRecordError(f"{db}: round {b.round}, batch {b.seq} refused: {err}") from None
        checked, refused = check_outcomes(wire, tables)
        if refused and not b.audit:  # the engine's own rows: a bug, never a local run recorded with groups missing
            g = refused[0]
            raise LocalRecordError(f"{db}: round {b.round}, group {g.group_id} refused: {g.reason}")
        events.append(Event(f"local.{run_id}.{b.round}.{'audit-' if b.audit else ''}{b.seq}", "outcomes", checked))
        if not b.audit:
            errors[b.round] = errors.get(b.round, 0) + sum(1 for ok, err in zip(b.valid, b.errors, strict=True)
                                                           if not ok and err and err.startswith("agent:"))
    summary_names = [c.name for c in tables.summary_columns]
    for i, r in enumerate(rounds.get("round", [])):
        row = {k: v[i] for k, v in rounds.items()}
        events.append(Event(f"local.{run_id}.{r}.result", "round.result", RoundResult(
            run_id=run_id, round=r, n=row["n"], n_valid=row["n_valid"], summary={k: row.get(k) for k in summary_names},
            observation={}, closed_at=row.get("closed_at") or now, shares=[f"{LOCAL_HOST}@0"],
            usage=Usage(**{k: row.get(k) or 0 for k in Usage.RECORDED}), n_simulation_errors=errors.get(r, 0),
            profile=decided.get(r), prototypes=(prototypes or {}).get(r),
            population=living[r][0] if r in living else None),
            blob=living[r][1] if r in living else None))
    events += partials
    events += [Event(f"local.{run_id}.interviews.{b.after_round}.{b.survey.id}.{b.seq}", "interviews", b)
               for b in _interview_batches(run_id, config, interviews or {}, interview_calls or {})]
    events.append(Event(f"local.{run_id}.done", "done", RunDone(
        run_id=run_id, status=status, rounds=len(rounds.get("round", [])), finished_at=now, reason=reason)))
    assert not set(summary_names) & set(PLATFORM_SUMMARY_COLUMNS)  # Simulation.check refuses such names
    store = Store(db)
    try:
        result = store.ingest(events)
        if result.refused:
            msg_id, why = result.refused[0]
            raise LocalRecordError(f"{db}: {len(result.refused)} batch(es) refused, the first ({msg_id}): {why}")
        return store.count_outcomes(run_id)
    except duckdb.IOException as err:  # another process (a populace up recorder) holds the file
        raise LocalRecordError(f"{db}: cannot write it ({str(err).splitlines()[0]}); is a recorder (populace up) "
                               "writing it? Give another file (--db)") from None
    finally:
        store.close()


__all__ = ["LOCAL_HOST", "LocalRecordError", "record_local"]
