"""A prototype run's rows in DuckDB (issue 39). Its representatives' outcomes come as outcome
batches (source `llm`); every other agent's row is drawn by reference: once a round's result is
in and every representative's row with it, one SQL statement copies, for each drawn agent, the
row of the representative it drew (source `prototype`, `drawn_from` naming it). Who drew whom is
`populace.population.prototypes.sources` — the same pure function the hosts and the environment
draw with — from the run's seed, the round, the agents' personas and which representatives'
answers are valid: nothing per agent travels.

Tables: `audits` (each audited agent's real answer on a copy of its state: never an outcome),
`prototype_rounds` (per round and prototype: the draws, the audits, the divergence with its
interval, the guard's share), `_drawn` (which rounds' draws are recorded)."""

from __future__ import annotations

import json
from collections.abc import Callable

import duckdb
import numpy as np
import pyarrow as pa

from populace.core.contracts import OutcomeBatch, PrototypeRound, RunConfig, SimulationTables
from populace.population import prototypes as rules

SCHEMA = """
CREATE TABLE IF NOT EXISTS audits (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, prototype VARCHAR, value DOUBLE, answer VARCHAR,
    outcome JSON, valid BOOLEAN, raw VARCHAR, latency_ms DOUBLE, error VARCHAR, host_id VARCHAR
);
CREATE TABLE IF NOT EXISTS prototype_rounds (
    run_id VARCHAR, round INTEGER, prototype VARCHAR, agents BIGINT, share DOUBLE, representatives BIGINT,
    valid BIGINT, drawn BIGINT, unanswered BIGINT, audited BIGINT, audited_valid BIGINT, metric VARCHAR,
    divergence DOUBLE, ci_low DOUBLE, ci_high DOUBLE, tv DOUBLE, breach BOOLEAN, next_share DOUBLE
);
CREATE TABLE IF NOT EXISTS _drawn (run_id VARCHAR, round INTEGER, representatives BIGINT, drawn BOOLEAN);
"""

STAT_KEYS = ("agents", "share", "representatives", "valid", "drawn", "unanswered", "audited", "audited_valid",
             "metric", "divergence", "ci_low", "ci_high", "tv", "breach", "next_share")


def _q(name: str) -> str:
    return f'"{name}"'


def insert_round(con: duckdb.DuckDBPyConnection, spec: SimulationTables, run_id: str, round_: int,
                 report: PrototypeRound) -> None:
    """A round's report (decided again after a re-placement: it replaces the earlier one, and
    the round's drawn rows go until they are drawn again from the new representatives)."""
    con.execute("DELETE FROM prototype_rounds WHERE run_id = ? AND round = ?", [run_id, round_])
    for s in report.stats:
        con.execute(f"INSERT INTO prototype_rounds (run_id, round, prototype, {', '.join(STAT_KEYS)}) "
                    f"VALUES ({', '.join('?' * (3 + len(STAT_KEYS)))})",
                    [run_id, round_, s.label, *(getattr(s, k) for k in STAT_KEYS)])
    forget_draws(con, spec, run_id, round_)
    con.execute("INSERT INTO _drawn VALUES (?, ?, ?, false)", [run_id, round_, report.representatives])


def forget_draws(con: duckdb.DuckDBPyConnection, spec: SimulationTables, run_id: str, round_: int,
                 after: bool = False) -> None:
    """The drawn rows of `round_` (`after`: of every round after it) go, and are drawn again."""
    op = ">" if after else "="
    con.execute(f"DELETE FROM {_q(spec.outcomes)} WHERE run_id = ? AND round {op} ? AND source = 'prototype'",
                [run_id, round_])
    con.execute(f"DELETE FROM _drawn WHERE run_id = ? AND round {op} ?", [run_id, round_])


def insert_audits(con: duckdb.DuckDBPyConnection, spec: SimulationTables, batches: list[OutcomeBatch]) -> int:
    measure, kind = spec.measure, spec.measure_kind
    cols: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "prototype", "value", "answer", "outcome",
                                             "valid", "raw", "latency_ms", "error", "host_id")}
    names = [c.name for c in spec.outcome_columns]
    for m in batches:
        n = len(m.agent_ids)
        cols["run_id"].extend([m.run_id] * n)
        cols["round"].extend([m.round] * n)
        cols["agent_id"].extend(m.agent_ids)
        cols["prototype"].extend(m.prototypes or [None] * n)
        values = m.columns.get(measure or "", [None] * n)
        cols["value"].extend(v if kind == "numeric" and ok else None for v, ok in zip(values, m.valid))
        cols["answer"].extend(None if v is None or not ok or kind == "numeric" else str(v)
                              for v, ok in zip(values, m.valid))
        cols["outcome"].extend(json.dumps({k: m.columns[k][i] for k in names}) for i in range(n))
        cols["valid"].extend(m.valid)
        cols["raw"].extend(m.raws)
        cols["latency_ms"].extend(m.latency_ms)
        cols["error"].extend(m.errors)
        cols["host_id"].extend([m.host_id] * n)
    schema = pa.schema([("run_id", pa.string()), ("round", pa.int32()), ("agent_id", pa.int64()),
                        ("prototype", pa.string()), ("value", pa.float64()), ("answer", pa.string()),
                        ("outcome", pa.string()), ("valid", pa.bool_()), ("raw", pa.string()),
                        ("latency_ms", pa.float64()), ("error", pa.string()), ("host_id", pa.string())])
    con.register("audit_rows", pa.Table.from_pydict(cols, schema=schema))
    try:
        con.execute("INSERT INTO audits BY NAME SELECT * FROM audit_rows")
    finally:
        con.unregister("audit_rows")
    return len(cols["agent_id"])


def audited(con: duckdb.DuckDBPyConnection, run_id: str, round_: int) -> set[int]:
    return {r[0] for r in con.execute("SELECT agent_id FROM audits WHERE run_id = ? AND round = ?",
                                      [run_id, round_]).fetchall()}


def pending(con: duckdb.DuckDBPyConnection, run_id: str) -> list[tuple[int, int]]:
    """(round, representatives) of the rounds decided but not yet drawn."""
    return con.execute("SELECT round, representatives FROM _drawn WHERE run_id = ? AND NOT drawn ORDER BY round",
                       [run_id]).fetchall()


def draw(con: duckdb.DuckDBPyConnection, spec: SimulationTables, config: RunConfig, run_id: str, round_: int,
         representatives: int, members: Callable[[], rules.Membership]) -> int | None:
    """Record round `round_`'s drawn rows once every representative's row is in (None: not yet);
    returns the rows added."""
    table = _q(spec.outcomes)
    reps = con.execute(f"SELECT agent_id, valid FROM {table} WHERE run_id = ? AND round = ? AND source = 'llm' "
                       "ORDER BY agent_id", [run_id, round_]).fetchnumpy()
    ids = np.asarray(reps["agent_id"], dtype=np.int64)
    if ids.size < representatives:
        return None
    p = config.prototypes
    assert p is not None
    m = members()
    is_rep = np.zeros(m.agents, dtype=bool)
    is_rep[ids] = True
    valid = np.zeros(m.agents, dtype=bool)
    valid[ids] = np.asarray(reps["valid"], dtype=bool)
    seed = p.seed if p.seed is not None else config.seed
    src = rules.sources(m, is_rep, valid, seed, round_)
    drawn = np.flatnonzero(src >= 0)
    labels = pa.array(list(m.labels), type=pa.string())

    def label_of(agents: np.ndarray) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(m.of[agents], type=pa.int32()), labels).dictionary_decode()

    con.register("drawn_rows", pa.table({"agent_id": pa.array(drawn), "drawn_from": pa.array(src[drawn]),
                                         "prototype": label_of(drawn)}))
    names = ", ".join(_q(c.name) for c in spec.outcome_columns)
    picked = ", ".join(f"o.{_q(c.name)}" for c in spec.outcome_columns)
    try:
        con.execute(f"INSERT INTO {table} (run_id, round, agent_id, {names}, valid, raw, latency_ms, error, source, "
                    f"prototype, drawn_from) SELECT ?, ?, d.agent_id, {picked}, o.valid, o.raw, 0.0, NULL, "
                    f"'prototype', d.prototype, d.drawn_from FROM drawn_rows d JOIN (SELECT * FROM {table} "
                    "WHERE run_id = ? AND round = ? AND source = 'llm') o ON o.agent_id = d.drawn_from",
                    [run_id, round_, run_id, round_])
    finally:
        con.unregister("drawn_rows")
    lost = np.flatnonzero(src == rules.NO_SOURCE)
    if lost.size:
        con.register("lost_rows", pa.table({"agent_id": pa.array(lost), "prototype": label_of(lost)}))
        try:
            con.execute(f"INSERT INTO {table} (run_id, round, agent_id, valid, raw, latency_ms, error, source, "
                        "prototype) SELECT ?, ?, agent_id, false, '', 0.0, 'prototype: no representative of ' || "
                        "prototype || ' gave a valid answer in round ' || ?, 'prototype', prototype FROM lost_rows",
                        [run_id, round_, round_])
        finally:
            con.unregister("lost_rows")
    con.execute("UPDATE _drawn SET drawn = true WHERE run_id = ? AND round = ?", [run_id, round_])
    return int(drawn.size + lost.size)


def profiles_of(con: duckdb.DuckDBPyConnection, run_id: str) -> list[dict] | None:
    """The run's agents' persona profiles, in agent order (None: none recorded)."""
    rows = con.execute("SELECT profile FROM agent_profiles WHERE run_id = ? ORDER BY agent_id", [run_id]).fetchall()
    return [json.loads(r[0]) for r in rows] if rows else None
