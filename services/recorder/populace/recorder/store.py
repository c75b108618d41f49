"""DuckDB store for run events. Ingestion is exactly-once: each transaction writes a batch of
messages together with their message ids (`Nats-Msg-Id`) in a ledger; a redelivered or
replayed message whose id is in the ledger is skipped, so a replay never double-counts —
whatever order redeliveries arrive in."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pyarrow as pa

from populace.population.errors import PopulationError
from populace.population.jsonl import parse_personas
from populace.core.contracts import GuessBatch, LlmCallBatch, RoundResult, RunDone, RunStarted, SpawnBatch

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, config_json JSON,
    status VARCHAR, reason VARCHAR, hosts VARCHAR[]
);
CREATE TABLE IF NOT EXISTS agents (
    run_id VARCHAR, agent_id BIGINT, host_id VARCHAR, persona_json JSON
);
CREATE TABLE IF NOT EXISTS guesses (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, value DOUBLE, valid BOOLEAN, raw VARCHAR,
    latency_ms DOUBLE
);
CREATE TABLE IF NOT EXISTS rounds (
    run_id VARCHAR, round INTEGER, n_valid BIGINT, mean DOUBLE, target DOUBLE,
    winner_agent_id BIGINT, winner_value DOUBLE, n BIGINT, n_winners BIGINT, closed_at TIMESTAMP
);
CREATE TABLE IF NOT EXISTS llm_calls (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, replica VARCHAR, prompt_tokens INTEGER,
    completion_tokens INTEGER, latency_ms DOUBLE, attempts INTEGER, valid BOOLEAN, batch_id VARCHAR
);
CREATE TABLE IF NOT EXISTS agent_profiles (
    run_id VARCHAR, agent_id BIGINT, persona_index BIGINT, profile JSON, persona JSON
);
CREATE TABLE IF NOT EXISTS _ingested (msg_id VARCHAR PRIMARY KEY);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS manifest_json JSON;
"""

GUESS_SCHEMA = pa.schema([
    ("run_id", pa.string()), ("round", pa.int32()), ("agent_id", pa.int64()),
    ("value", pa.float64()), ("raw", pa.string()), ("latency_ms", pa.float64()),
])


def ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


@dataclass
class Event:
    msg_id: str  # Nats-Msg-Id, unique per logical message
    kind: str  # subjects.kind_of(subject)
    model: object
    blob: bytes | None = None  # RunStarted: the run's personas JSONL, when it has a population


@dataclass
class IngestResult:
    guesses: int = 0
    calls: int = 0
    finished: list[RunDone] = field(default_factory=list)


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._con: duckdb.DuckDBPyConnection | None = None

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
            self._con = duckdb.connect(self.path)
            self._con.execute(SCHEMA)
        return self._con

    def close(self) -> None:
        """Release the file so readers (`populace results`, reports) can open it."""
        if self._con is not None:
            self._con.close()
            self._con = None

    def _unseen(self, events: list[Event]) -> list[Event]:
        ids = [e.msg_id for e in events]
        seen = {r[0] for r in self.con.execute(
            "SELECT msg_id FROM _ingested WHERE msg_id IN (SELECT unnest(?))", [ids]).fetchall()}
        fresh, batch_ids = [], set()
        for e in events:
            if e.msg_id not in seen and e.msg_id not in batch_ids:
                batch_ids.add(e.msg_id)
                fresh.append(e)
        return fresh

    def ingest(self, events: list[Event]) -> IngestResult:
        out = IngestResult()
        events = [e for e in events if e.model is not None]
        if not events:
            return out  # nothing to write: don't even open the file
        con = self.con
        fresh = self._unseen(events)
        if not fresh:
            return out
        cols: dict[str, list] = {k: [] for k in GUESS_SCHEMA.names}
        con.execute("BEGIN TRANSACTION")
        try:
            for e in fresh:
                m = e.model
                if isinstance(m, GuessBatch):
                    n = len(m.agent_ids)
                    cols["run_id"].extend([m.run_id] * n)
                    cols["round"].extend([m.round] * n)
                    cols["agent_id"].extend(m.agent_ids)
                    cols["value"].extend(m.values)
                    cols["raw"].extend(m.raws)
                    cols["latency_ms"].extend(m.latency_ms)
                elif isinstance(m, LlmCallBatch):
                    n = len(m.agent_ids)
                    con.execute(
                        "INSERT INTO llm_calls SELECT ?, ?, unnest(?), unnest(?), unnest(?), unnest(?), "
                        "unnest(?), unnest(?), unnest(?), ?",
                        [m.run_id, m.round, m.agent_ids, m.replicas, m.prompt_tokens, m.completion_tokens,
                         m.latency_ms, m.attempts, m.valid, m.batch_id],
                    )
                    out.calls += n
                elif isinstance(m, RunStarted):
                    con.execute(
                        "INSERT OR REPLACE INTO runs (run_id, started_at, config_json, status, hosts, manifest_json) "
                        "VALUES (?, ?, ?, 'running', ?, ?)",
                        [m.run_id, ts(m.started_at), m.config.model_dump_json(), m.hosts,
                         json.dumps(m.manifest) if m.manifest is not None else None],
                    )
                    if e.blob is not None:
                        self._insert_profiles(m.run_id, m.config.agents, e.blob)
                elif isinstance(m, SpawnBatch):
                    for first, count in m.ranges:
                        con.execute(
                            "INSERT INTO agents SELECT ?, range, ?, NULL FROM range(?, ?)",
                            [m.run_id, m.host_id, first, first + count],
                        )
                elif isinstance(m, RoundResult):
                    con.execute(
                        "INSERT INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [m.run_id, m.round, m.n_valid, m.mean, m.target, m.winner_agent_id,
                         m.winner_value, m.n, m.n_winners, ts(m.closed_at)],
                    )
                elif isinstance(m, RunDone):
                    con.execute(
                        "UPDATE runs SET finished_at = ?, status = ?, reason = ? WHERE run_id = ?",
                        [ts(m.finished_at), m.status, m.reason, m.run_id],
                    )
                    out.finished.append(m)
            if cols["agent_id"]:
                con.register("guess_rows", pa.Table.from_pydict(cols, schema=GUESS_SCHEMA))
                con.execute(
                    "INSERT INTO guesses SELECT run_id, round, agent_id, value, value IS NOT NULL, "
                    "raw, latency_ms FROM guess_rows"
                )
                con.unregister("guess_rows")
                out.guesses = len(cols["agent_id"])
            con.execute("INSERT INTO _ingested SELECT unnest(?)", [[e.msg_id for e in fresh]])
            con.execute("COMMIT")
        except Exception:
            con.execute("ROLLBACK")
            raise
        return out

    def _insert_profiles(self, run_id: str, agents: int, blob: bytes) -> None:
        try:
            records = parse_personas(blob)[:agents]
        except PopulationError:
            return  # the client checked the file before the run; a bad blob must not block ingestion
        index = [(r.get("provenance") or {}).get("persona_index") for r in records]
        rows = pa.Table.from_pydict({
            "agent_id": list(range(len(records))),
            "persona_index": [j if isinstance(j, int) and not isinstance(j, bool) else i
                              for i, j in enumerate(index)],
            "profile": [json.dumps(r["profile"], ensure_ascii=False) for r in records],
            "persona": [json.dumps(r.get("persona"), ensure_ascii=False) for r in records],
        })
        self.con.register("profile_rows", rows)
        self.con.execute("DELETE FROM agent_profiles WHERE run_id = ?", [run_id])
        self.con.execute("INSERT INTO agent_profiles SELECT ?, agent_id, persona_index, profile, persona "
                         "FROM profile_rows", [run_id])
        self.con.unregister("profile_rows")

    def count_guesses(self, run_id: str) -> int:
        return self.con.execute("SELECT count(*) FROM guesses WHERE run_id = ?", [run_id]).fetchone()[0]

    def completeness(self, run_id: str) -> tuple[int, int]:
        """(guesses recorded, guesses the environment counted in the run's round results)."""
        got = self.count_guesses(run_id)
        expected = self.con.execute("SELECT coalesce(sum(n), 0) FROM rounds WHERE run_id = ?",
                                    [run_id]).fetchone()[0]
        return got, int(expected)

