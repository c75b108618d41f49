"""Recording a run played in one process (`populace run --local`, `simulate(local=True)`) in
the same DuckDB tables as a fleet run: its rows become the events the recorder ingests from the
bus — started, one share placed, outcome batches of ~1,000 rows, round results, done — and go
through the recorder's own store (`Store.ingest`, `check_outcomes`), so `results`, `report`
and `export` read a local run exactly as a fleet run; there is no second schema. The client
calls it directly: the store is a library, not the recorder service's."""

from __future__ import annotations

import time
from pathlib import Path

import duckdb
import pyarrow as pa

from populace.core.contracts import (
    PLATFORM_SUMMARY_COLUMNS,
    ActColumns,
    ConfigRef,
    DecideProfile,
    EdgeColumns,
    InterviewBatch,
    LineColumns,
    LivingRef,
    OutcomeBatch,
    PostColumns,
    PrototypeRound,
    RoundPartial,
    RoundResult,
    RunConfig,
    RunDone,
    RunStarted,
    ShareProfile,
    ShownColumns,
    SimulationTables,
    SpawnBatch,
    Usage,
)
from populace.store.columns import check_outcomes
from populace.store.store import Event, Store

LOCAL_HOST = "local"  # the one share a local run is recorded as: every agent in this process
BATCH = 1000  # rows per outcome batch, as an agent-host sends them


class LocalRecordError(RuntimeError):
    """The run could not be written (the file is held by another process, or a row is refused)."""


def _by_agent(table: dict[str, list] | None, key: str) -> dict[tuple[int, int], list[int]]:
    """Row indexes of `table` (acts, lines, edits) by (round, the agent they go with)."""
    out: dict[tuple[int, int], list[int]] = {}
    for i, (r, a) in enumerate(zip((table or {}).get("round", []), (table or {}).get(key, []))):
        out.setdefault((r, a), []).append(i)
    return out


def _rows(table: dict[str, list], idx: list[int], keys: tuple[str, ...]) -> dict[str, list]:
    return {k: [table[k][i] for i in idx] for k in keys}


ACT_KEYS = ("group_id", "seq", "agent_id", "phase", "valid", "raw", "latency_ms", "error")
LINE_KEYS = ("group_id", "seq", "speaker", "text", "fields")
EDIT_KEYS = ("follower", "author", "kind", "op")
SHOWN_KEYS = ("agent_id", "items", "ranks")


def _batches(run_id: str, tables: SimulationTables, outcomes: dict[str, list], posts: dict[str, list] | None,
             acts: dict[str, list] | None = None, lines: dict[str, list] | None = None,
             edits: dict[str, list] | None = None, shown: dict[str, list] | None = None) -> list[OutcomeBatch]:
    """The rows (sorted by round, then agent, as run_local gives them) as outcome batches; a
    scene's acts and lines, and an agent's edits and shown record, go in the batch of the agent they are about
    (the recorder refuses them anywhere else), a scene's own lines (speaker -1) with its acts."""
    rounds, n = outcomes.get("round", []), len(outcomes.get("agent_id", []))
    acts_of, edits_of = _by_agent(acts, "agent_id"), _by_agent(edits, "follower")
    shown_of = _by_agent(shown, "agent_id")
    lines_of = _by_agent(lines, "speaker")
    # a scene's own lines go with the agent of its first act (the group is whole in one batch)
    first_actor = {}
    for i in range(len((acts or {}).get("round", []))):
        first_actor.setdefault((acts["round"][i], acts["group_id"][i]), acts["agent_id"][i])  # type: ignore[index]
    for i in range(len((lines or {}).get("round", []))):
        if lines["speaker"][i] == -1:  # type: ignore[index]
            who = first_actor.get((lines["round"][i], lines["group_id"][i]), -1)  # type: ignore[index]
            lines_of.setdefault((lines["round"][i], who), []).append(i)  # type: ignore[index]
    out: list[OutcomeBatch] = []
    start = 0
    while start < n:
        end = start + 1
        while end < n and end - start < BATCH and rounds[end] == rounds[start]:
            end += 1
        part = slice(start, end)
        r, ids = rounds[start], outcomes["agent_id"][part]
        a_idx = sorted(i for a in ids for i in acts_of.get((r, a), ()))
        l_idx = sorted(i for a in ids for i in lines_of.get((r, a), ()))
        e_idx = [i for a in ids for i in edits_of.get((r, a), ())]
        s_idx = [i for a in ids for i in shown_of.get((r, a), ())]
        act_cols = {c.name for c in tables.act_columns}
        out.append(OutcomeBatch(
            run_id=run_id, round=r, host_id=LOCAL_HOST, seq=len(out), agent_ids=ids,
            columns={c.name: outcomes[c.name][part] for c in tables.outcome_columns},
            valid=outcomes["valid"][part], raws=outcomes["raw"][part], latency_ms=outcomes["latency_ms"][part],
            errors=outcomes["error"][part], group_ids=outcomes["group_id"][part] if tables.grouped else None,
            levels={lv: outcomes[f"{lv}_id"][part] for lv in tables.levels} or None,
            posts=PostColumns(texts=posts["text"][part], fields=posts["fields"][part], heard=posts["heard"][part],
                              heard_digest=posts["heard_digest"][part]) if posts else None,
            acts=ActColumns(**_rows(acts, a_idx, ACT_KEYS),  # type: ignore[arg-type]
                            columns=_rows(acts, a_idx, tuple(act_cols))) if a_idx else None,  # type: ignore[arg-type]
            lines=LineColumns(**_rows(lines, l_idx, LINE_KEYS)) if l_idx else None,  # type: ignore[arg-type]
            edits=EdgeColumns(**_rows(edits, e_idx, EDIT_KEYS)) if e_idx else None,  # type: ignore[arg-type]
            prototypes=outcomes["prototype"][part] if tables.prototypes else None,
            shown=ShownColumns(**_rows(shown, s_idx, SHOWN_KEYS)) if s_idx else None))  # type: ignore[arg-type]
        start = end
    return out


def _audit_batches(run_id: str, tables: SimulationTables, rows: dict[str, list]) -> list[OutcomeBatch]:
    """A prototype run's audits (run_local's rows, by round and agent) as an agent-host sends them."""
    out: list[OutcomeBatch] = []
    rounds = rows.get("round", [])
    start = 0
    while start < len(rounds):
        end = start + 1
        while end < len(rounds) and end - start < BATCH and rounds[end] == rounds[start]:
            end += 1
        part = slice(start, end)
        out.append(OutcomeBatch(
            run_id=run_id, round=rounds[start], host_id=LOCAL_HOST, seq=len(out), agent_ids=rows["agent_id"][part],
            columns={c.name: rows[c.name][part] for c in tables.outcome_columns}, valid=rows["valid"][part],
            raws=rows["raw"][part], latency_ms=rows["latency_ms"][part], errors=rows["error"][part], audit=True,
            prototypes=rows["prototype"][part]))
        start = end
    return out


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
                 outcomes: dict[str, list], rounds: dict[str, list], posts: dict[str, list] | None = None,
                 acts: dict[str, list] | None = None, transcripts: dict[str, list] | None = None,
                 edges: dict[str, list] | None = None, shown: dict[str, list] | None = None,
                 status: str = "completed", reason: str | None = None,
                 started_at: float | None = None, manifest: dict | None = None, personas: bytes | None = None,
                 interviews: dict[str, list] | None = None, interview_calls: dict[tuple[int, str], int] | None = None,
                 profile: dict[str, list] | None = None, audits: dict[str, list] | None = None,
                 prototypes: dict[int, PrototypeRound] | None = None, population: dict[str, list] | None = None) -> int:
    """Write a local run (run_local's columnar `outcomes`, `rounds`, `posts`, and its scenes'
    `acts` and `transcripts`, its `edges` and `shown` records, and the answers to its planned `interviews` with
    their LLM calls by (after round, survey), and where its rounds went (`profile`: run_local's
    `round_profile` rows), and its population's changes (`population`: table population's rows))
    to `db`; returns the outcomes recorded. A failed run keeps the rounds it closed."""
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
    if tables.prototypes:  # the representatives' own rows: the store draws the others' (as on the fleet)
        own = [i for i, source in enumerate(outcomes.get("source", [])) if source == "llm"]
        outcomes = {k: [v[i] for i in own] for k, v in outcomes.items()}
    for b in _batches(run_id, tables, outcomes, posts or None, acts or None, transcripts or None, edges or None,
                      shown or None):
        checked, refused = check_outcomes(b, tables)
        if refused:  # the engine's own rows: a bug, never a local run recorded with groups missing
            g = refused[0]
            raise LocalRecordError(f"{db}: round {b.round}, group {g.group_id} refused: {g.reason}")
        events.append(Event(f"local.{run_id}.{b.round}.{b.seq}", "outcomes", checked))
    errors: dict[int, int] = {}
    for r, ok, err in zip(outcomes.get("round", []), outcomes.get("valid", []), outcomes.get("error", []),
                          strict=True):
        if not ok and err and err.startswith("agent:"):
            errors[r] = errors.get(r, 0) + 1
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
    events += [Event(f"local.{run_id}.{b.round}.audits.{b.seq}", "outcomes", check_outcomes(b, tables)[0])
               for b in _audit_batches(run_id, tables, audits or {})]
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
