"""DuckDB store for run events. Ingestion is exactly-once: each transaction writes a batch of
messages together with their message ids (`Nats-Msg-Id`) in a ledger; a redelivered or
replayed message whose id is in the ledger is skipped, so a replay never double-counts —
whatever order redeliveries arrive in.

A run's outcome and summary tables are the ones its simulation declared (`SimulationTables`,
carried by the run's `started` event): the platform's columns plus the simulation's. They are
created on first use; an existing table gains the columns it lacks (a database written by an
older release keeps working). The store imports no simulation."""

from __future__ import annotations

import errno
import json
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import numpy as np
import pyarrow as pa

from populace.core.contracts import (
    PROTOTYPE_COLUMNS,
    InterviewBatch,
    InterviewOrder,
    InterviewPlaced,
    LlmCallBatch,
    OutcomeBatch,
    RoundOpen,
    RoundPartial,
    RoundResult,
    RunConfig,
    RunDone,
    RunResumed,
    RunStarted,
    SimulationTables,
    SpawnBatch,
    Usage,
    share_key,
)
from populace.core.hostauth import SHARED_HOST_USER
from populace.population.errors import PopulationError
from populace.population.jsonl import iter_personas
from populace.population.living import EVENTS, Delta, Population
from populace.population.model_assignment import AssignmentError, assignment
from populace.population.prototypes import Membership, PrototypeError, membership
from populace.store import prototypes as prototype_rows
from populace.store.columns import RefusedGroup
from populace.store.expected import RunShape, calls_refusal, outcome_refusal
from populace.store.interview_tables import SCHEMA as INTERVIEWS_SCHEMA
from populace.store.interviews import InterviewStore, Owed
from populace.store.shortfall import RoundTally

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY, started_at TIMESTAMP, finished_at TIMESTAMP, config_json JSON,
    status VARCHAR, reason VARCHAR, hosts VARCHAR[]
);
CREATE TABLE IF NOT EXISTS agents (
    run_id VARCHAR, agent_id BIGINT, host_id VARCHAR, persona_json JSON
);
CREATE TABLE IF NOT EXISTS llm_calls (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, replica VARCHAR, prompt_tokens INTEGER,
    completion_tokens INTEGER, latency_ms DOUBLE, attempts INTEGER, valid BOOLEAN, batch_id VARCHAR
);
CREATE TABLE IF NOT EXISTS agent_profiles (
    run_id VARCHAR, agent_id BIGINT, persona_index BIGINT, profile JSON, persona JSON
);
CREATE TABLE IF NOT EXISTS _ingested (msg_id VARCHAR PRIMARY KEY);
-- a run with a graph: one row per agent per round, its post (text NULL: none) and what it heard
-- (how many posts, the sum of their digests mod 2^63: populace.sdk.post.post_hash)
CREATE TABLE IF NOT EXISTS posts (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, text VARCHAR, fields JSON, heard INTEGER, heard_digest BIGINT
);
-- graphs that change: every edge edit, in the order it applied (follower's edges after the round)
CREATE TABLE IF NOT EXISTS edges (
    run_id VARCHAR, round INTEGER, follower BIGINT, author BIGINT, kind VARCHAR, op VARCHAR
);
-- who saw what (a simulation that declares shown_items): each acting agent's items in the order
-- shown, and the recommender's rank of each (1: its best)
CREATE TABLE IF NOT EXISTS shown (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, items BIGINT[], ranks INTEGER[]
);
-- a simulation with scenes: what each group's members said, in order (seq is shared with its acts;
-- speaker -1: the scene itself)
CREATE TABLE IF NOT EXISTS transcripts (
    run_id VARCHAR, round INTEGER, group_id BIGINT, seq INTEGER, speaker BIGINT, text VARCHAR, fields JSON
);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS manifest_json JSON;
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS reasks INTEGER;
-- a run with `models:`: which model answered the call, the prompt tokens its provider had cached,
-- and what the call cost at the model's prices (US dollars)
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS model VARCHAR;
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS cached_tokens INTEGER;
ALTER TABLE llm_calls ADD COLUMN IF NOT EXISTS dollars DOUBLE;
-- a run with `models:`: each agent's model for the whole run (populace.population.model_assignment)
CREATE TABLE IF NOT EXISTS agent_models (run_id VARCHAR, agent_id BIGINT, model VARCHAR);
ALTER TABLE runs ADD COLUMN IF NOT EXISTS simulation VARCHAR;
ALTER TABLE runs ADD COLUMN IF NOT EXISTS tables_json JSON;
-- where each round went: a row per share (role 'host': its views, turns, settles and folds, its
-- model wait, its views' bytes), the environment's (merge, decide) and the recorder's (record)
CREATE TABLE IF NOT EXISTS round_profile (
    run_id VARCHAR, round INTEGER, role VARCHAR, host_id VARCHAR, epoch INTEGER, agents BIGINT, wall_s DOUBLE,
    view_s DOUBLE, turn_s DOUBLE, merge_s DOUBLE, model_wait_s DOUBLE, decide_s DOUBLE, record_s DOUBLE,
    view_bytes BIGINT, view_max_bytes BIGINT, observation_bytes BIGINT, held BIGINT, note VARCHAR
);
-- a population that changes (populace.sdk.population): every departure and newcomer, after the
-- round that decided it (event: born, arrived, died, left)
CREATE TABLE IF NOT EXISTS population (
    run_id VARCHAR, round INTEGER, agent_id BIGINT, event VARCHAR, reason VARCHAR
);
CREATE TABLE IF NOT EXISTS _resumes (run_id VARCHAR, epoch INTEGER, after_round INTEGER, resumed_at TIMESTAMP);
CREATE TABLE IF NOT EXISTS _shares (run_id VARCHAR, share VARCHAR, ranges JSON, from_round INTEGER,
                                    replaced_from INTEGER);
-- groups taken out of an outcome batch otherwise recorded (populace.store.columns): their
-- members' outcomes, acts and lines are missing, and the run cannot be `completed`
CREATE TABLE IF NOT EXISTS _refused_groups (run_id VARCHAR, round INTEGER, share VARCHAR, group_id BIGINT,
                                            agents BIGINT[], acts INTEGER, lines INTEGER, reason VARCHAR);
"""

ARROW = {"DOUBLE": pa.float64(), "BIGINT": pa.int64(), "VARCHAR": pa.string(), "BOOLEAN": pa.bool_(),
         "JSON": pa.string(), "DOUBLE[]": pa.list_(pa.float64()), "BIGINT[]": pa.list_(pa.int64()),
         "VARCHAR[]": pa.list_(pa.string()), "BOOLEAN[]": pa.list_(pa.bool_())}


def profile_rows(blob: bytes) -> pa.Table | None:
    """A personas file as the rows of `agent_profiles` (without the run id), in agent order;
    None when it cannot be read. Parsed once per file: the recorder keeps them by digest."""
    # one record at a time (iter_personas): 1M whole records at once took the recorder 3 GB
    index: list[int] = []
    profiles: list[str] = []
    personas: list[str] = []
    try:
        for i, r in enumerate(iter_personas(blob)):
            j = (r.get("provenance") or {}).get("persona_index")
            index.append(j if isinstance(j, int) and not isinstance(j, bool) else i)
            profiles.append(json.dumps(r["profile"], ensure_ascii=False))
            personas.append(json.dumps(r.get("persona"), ensure_ascii=False))
    except PopulationError:
        return None
    return pa.Table.from_pydict({"agent_id": list(range(len(index))), "persona_index": index,
                                 "profile": profiles, "persona": personas})


# The write-ahead log's size at which DuckDB folds it into the file. At its default (16 MB) a
# round of a million outcomes and two million acts folded the log a dozen times, inside the
# commits: a third of the recorder's commit time and about a sixth of its ingest CPU (measured:
# 500 commits of 2,000 outcomes and 4,000 acts, commits 2.1 -> 1.1 s, ingest 4.9 -> 3.8 s). What
# the log holds is durable either way (each commit writes it); the fold happens when the recorder
# releases the file (close) or the log reaches this size, and a restarted recorder replays at most
# this much.
CHECKPOINT_THRESHOLD = "256MB"

class StoreError(RuntimeError):
    """A run's declared tables clash with what the database holds (or are unknown)."""

    def __init__(self, run_id: str, message: str) -> None:
        super().__init__(f"run {run_id}: {message}")
        self.run_id = run_id


class DiskFull(RuntimeError):
    """The database's filesystem has no room (or the user's quota is spent): nothing of the
    failed transaction is stored, and the same events can be ingested again once there is."""

    def __init__(self, path: str, error: BaseException) -> None:
        super().__init__(f"disk full at {path}: {error}")
        self.path = path


# How DuckDB and the OS say a write found no room (DuckDB wraps the OS error in its message).
_NO_ROOM = ("No space left on device", "Disk quota exceeded")


def is_disk_full(err: BaseException) -> bool:
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return any(text in str(err) for text in _NO_ROOM)


def json_texts(values: list) -> list[str | None]:
    """A JSON column's values as the text json.dumps writes (None stays NULL). A list of whole
    numbers, the commonest (an untyped `list` of ids; an older file's list[int] column), is
    written directly: json.dumps cost a scene's recorder a quarter of its time."""
    out: list[str | None] = []
    for v in values:
        if v is None:
            out.append(None)
        elif v.__class__ is list and all(x.__class__ is int for x in v):
            out.append(f"[{', '.join(map(str, v))}]")
        else:
            out.append(json.dumps(v))
    return out


# A JSON column of whole-number lists or nulls goes to DuckDB as a list<int64> column and is
# written there as json.dumps writes it ("[1, 2, 3]"): the same text, without a json.dumps (or a
# Python format) per value. Such a column is an untyped `list` field, or a list[int] field in a
# file written before lists were LIST columns (Store._stored: a resumed run keeps that file's
# JSON); a list[int] field is a BIGINT[] column and never comes here. Anything else (a bool, a
# float, a string, a dict …) is written here, value by value.
_WHOLE_LISTS_TYPE = pa.list_(pa.int64())


def _whole_lists(values: list) -> pa.Array | None:
    """The column as a list<int64> array, or None when it is anything else. Arrow's own reading
    of the Python values decides, in one pass and no Python object: it reads a list of ints (and
    nothing else: not a bool, not a float) as list<int64>; an inner null would be written "null".
    """
    try:
        column = pa.array(values)
    except (pa.ArrowException, OverflowError, TypeError, ValueError):  # mixed values, or past int64
        return None
    if column.type != _WHOLE_LISTS_TYPE or column.values.null_count:
        return None
    return column


def arrow_rows(columns: dict[str, list], types: dict[str, str]) -> tuple[pa.Table, str]:
    """A batch of rows for DuckDB (columns in `types`' order, DuckDB type names) and the select
    list that inserts them: JSON columns become their text (see _whole_lists)."""
    fields: list[tuple[str, pa.DataType]] = []
    arrays: dict[str, list | pa.Array] = {}
    as_text: list[str] = []
    for name, type_ in types.items():
        values = columns[name]
        if type_ == "JSON":
            wholes = _whole_lists(values)
            if wholes is not None:
                arrays[name] = wholes
                fields.append((name, _WHOLE_LISTS_TYPE))
                as_text.append(f"'[' || array_to_string({_q(name)}, ', ') || ']' AS {_q(name)}")
                continue
            values = json_texts(values)
        arrays[name] = values
        fields.append((name, pa.int32() if type_ == "INTEGER" else ARROW[type_]))
    table = pa.Table.from_pydict(arrays, schema=pa.schema(fields))
    return table, f"* REPLACE ({', '.join(as_text)})" if as_text else "*"


def ts(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC).replace(tzinfo=None)


def outcome_columns(t: SimulationTables) -> list[tuple[str, str]]:
    """(name, type) of a run's outcome table, in table order."""
    return [("run_id", "VARCHAR"), ("round", "INTEGER"), ("agent_id", "BIGINT"),
            *((("group_id", "BIGINT"),) if t.grouped else ()),
            *((f"{level}_id", "BIGINT") for level in t.levels),
            *((c.name, c.type) for c in t.outcome_columns),
            ("valid", "BOOLEAN"), ("raw", "VARCHAR"), ("latency_ms", "DOUBLE"), ("error", "VARCHAR"),
            *(PROTOTYPE_COLUMNS if t.prototypes else ())]


def act_columns(t: SimulationTables) -> list[tuple[str, str]]:
    """(name, type) of a run's acts table (a simulation with scenes), in table order."""
    return [("run_id", "VARCHAR"), ("round", "INTEGER"), ("group_id", "BIGINT"), ("seq", "INTEGER"),
            ("agent_id", "BIGINT"), ("phase", "VARCHAR"), *((c.name, c.type) for c in t.act_columns),
            ("valid", "BOOLEAN"), ("raw", "VARCHAR"), ("latency_ms", "DOUBLE"), ("error", "VARCHAR")]


def summary_columns(t: SimulationTables) -> list[tuple[str, str]]:
    return [("run_id", "VARCHAR"), ("round", "INTEGER"), ("n", "BIGINT"), ("n_valid", "BIGINT"),
            # the round's LLM work, infra retries apart, and its dollars at the models' prices
            *((name, "DOUBLE" if name == "dollars" else "BIGINT") for name in Usage.RECORDED),
            *((c.name, c.type) for c in t.summary_columns), ("closed_at", "TIMESTAMP")]


def _q(name: str) -> str:
    return f'"{name}"'  # identifiers are validated ([a-z_][a-z0-9_]*) by SimulationTables


@dataclass
class Event:
    msg_id: str  # Nats-Msg-Id, unique per logical message
    kind: str  # subjects.kind_of(subject)
    model: object
    # RunStarted: the run's personas (JSONL, or its rows parsed already: profile_rows), when it has a population;
    # RoundResult: who is alive after the round, when it changed anyone (populace.population.living's bytes)
    blob: bytes | pa.Table | None = None
    # OutcomeBatch: the groups taken out of it (columns.check_outcomes), recorded as missing if the batch counts
    refused_groups: list[RefusedGroup] = field(default_factory=list)


@dataclass
class IngestResult:
    outcomes: int = 0
    calls: int = 0
    answers: int = 0  # interview answers
    finished: list[RunDone] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (msg_id, why): dead letters, stored nowhere
    # groups taken out of batches that were recorded: (run, round, share, group), missing for good
    refused_groups: list[tuple[str, int, str, RefusedGroup]] = field(default_factory=list)
    opened: set[str] = field(default_factory=set)  # runs whose start or resume was stored now (not a redelivery)


@dataclass
class ShareRecord:
    key: str
    ranges: list[tuple[int, int]]
    replaced_from: int | None  # the first round another share plays its agents in
    from_round: int = 1  # the first round it plays

    def counts_in(self, round_: int) -> bool:
        """Whether what it sends about `round_` counts: not once it was replaced."""
        return self.replaced_from is None or round_ < self.replaced_from


_NONE = SimulationTables(simulation="", outcomes="none", outcome_columns=[], rounds="none", summary_columns=[])


def _population_table(d: Delta) -> pa.Table:
    """A round's changes as table population's rows (departures, then newcomers), built from
    their arrays (a 1% turnover of 10M agents is 200,000 rows a round)."""
    ids = np.concatenate([d.departed, np.arange(d.born_first, d.born_first + d.births, dtype=np.int64)])
    events = np.concatenate([d.departed_events, d.birth_events]).astype(np.int32)
    reasons = np.concatenate([d.departed_reasons, d.birth_reasons]).astype(np.int32)

    def text(codes: np.ndarray, names: Sequence[str]) -> pa.Array:  # DuckDB stores it as VARCHAR
        return pa.DictionaryArray.from_arrays(pa.array(codes), pa.array(list(names), pa.string()))

    return pa.table({"round": pa.array(np.full(ids.size, d.round, dtype=np.int32)), "agent_id": pa.array(ids),
                     "event": text(events, EVENTS), "reason": text(reasons, d.reasons or ("",))})


def _share(key: str) -> tuple[str, int]:
    host_id, _, epoch = key.rpartition("@")
    return host_id, int(epoch)


# Rounds whose recorded agents the store keeps in memory (1 MB per round of a million agents);
# a round dropped is read again from DuckDB when a late batch comes.
MAX_LEDGER_ROUNDS = 64


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._opening = threading.Lock()
        self._tables: dict[str, SimulationTables] = {}  # by run id
        self._shares: dict[str, dict[str, ShareRecord]] = {}  # by run id, then share key
        self._ready: set[tuple[str, str]] = set()  # (table, spec) pairs created this connection
        # (table, column) declared a LIST but JSON in this file (written before lists were LIST columns):
        # its values go on as JSON text, so an older database keeps recording the same simulation
        self._as_json: set[tuple[str, str]] = set()
        self._shapes: dict[str, RunShape] = {}  # by run id: agents and rounds, from its config
        self._departed: dict[str, np.ndarray | None] = {}  # by run id: Store.departed
        # (run, round) -> per agent, whether its outcome is recorded: what makes a duplicate
        self._recorded: dict[tuple[str, int], np.ndarray] = {}
        self.interviews = InterviewStore(lambda: self.con)
        self._members: dict[str, Membership] = {}  # by run id: a prototype run's prototypes (its draws)

    @property
    def con(self) -> duckdb.DuckDBPyConnection:
        if self._con is None:
            with self._opening:  # ingestion and a read (recorder.reads) may both open it
                if self._con is None:
                    Path(self.path).parent.mkdir(parents=True, exist_ok=True)
                    con = duckdb.connect(self.path)
                    con.execute(f"SET checkpoint_threshold = '{CHECKPOINT_THRESHOLD}'")
                    con.execute(SCHEMA)
                    con.execute(INTERVIEWS_SCHEMA)
                    con.execute(prototype_rows.SCHEMA)
                    self._ready.clear()
                    self._as_json.clear()
                    self._con = con
        return self._con

    def close(self) -> None:
        """Release the file so readers (`populace results`, reports) can open it."""
        with self._opening:
            if self._con is not None:
                self._con.close()
                self._con = None

    # -- the run's tables -----------------------------------------------------------------
    def known_tables(self, run_id: str) -> SimulationTables | None:
        """The run's tables if this process has seen them (no database access)."""
        return self._tables.get(run_id)

    def tables_of(self, run_id: str) -> SimulationTables | None:
        """The run's declared tables: from its started event, or (after a restart) the runs table."""
        spec = self._tables.get(run_id)
        if spec is None:
            row = self.con.execute("SELECT tables_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if row and row[0]:
                spec = self._tables[run_id] = SimulationTables.model_validate_json(row[0])
        return spec

    def shape_of(self, run_id: str) -> RunShape | None:
        """The run's agents (every id given so far, newcomers included) and rounds (from its
        started event, or the runs table, and its population's newcomers)."""
        if run_id not in self._shapes:
            row = self.con.execute("SELECT config_json->>'$.agents', config_json->>'$.rounds', (SELECT max(agent_id) "
                                   "FROM population WHERE run_id = ?) FROM runs WHERE run_id = ?",
                                   [run_id, run_id]).fetchone()
            if not row or row[0] is None:
                return None
            placed = self.con.execute("SELECT max(agent_id) FROM agents WHERE run_id = ?", [run_id]).fetchone()
            most = max(int(row[2]) if row[2] is not None else -1, int(placed[0]) if placed and placed[0] is not None
                       else -1)
            self._shapes[run_id] = RunShape(max(int(row[0]), most + 1), int(row[1]))
        return self._shapes[run_id]

    def departed(self, run_id: str) -> np.ndarray | None:
        """Per agent id, the round after which it departed (0: alive), in a run whose population
        changed (None: none did)."""
        if run_id not in self._departed:
            rows = self.con.execute("SELECT agent_id, round FROM population WHERE run_id = ? AND event IN "
                                    "('died', 'left')", [run_id]).fetchnumpy()
            shape = self.shape_of(run_id)
            if not rows["agent_id"].size or shape is None:
                self._departed[run_id] = None
            else:  # room for the ids a run may still give (newcomers): grown again only past them
                gone = np.zeros(max(shape.agents, 2 * shape.agents), dtype=np.int32)
                gone[rows["agent_id"]] = rows["round"]
                self._departed[run_id] = gone
        return self._departed[run_id]

    def recorded(self, run_id: str, round_: int) -> np.ndarray:
        """Per agent of the run, whether round `round_` has its outcome recorded."""
        key = (run_id, round_)
        if key not in self._recorded:
            spec, shape = self._spec(run_id), self.shape_of(run_id)
            seen = np.zeros(shape.agents if shape else 0, dtype=bool)
            ids = self.con.execute(f"SELECT agent_id FROM {_q(spec.outcomes)} WHERE run_id = ? AND round = ?",
                                   [run_id, round_]).fetchnumpy()["agent_id"]
            seen[ids[(ids >= 0) & (ids < seen.size)]] = True
            while len(self._recorded) >= MAX_LEDGER_ROUNDS:
                self._recorded.pop(next(iter(self._recorded)))
            self._recorded[key] = seen
        return self._recorded[key]

    def _grow_recorded(self, run_id: str, agents: int) -> None:
        """The run gave newcomers ids up to `agents`: its rounds' ledgers reach them too."""
        for key, seen in self._recorded.items():
            if key[0] == run_id and seen.size < agents:
                self._recorded[key] = np.concatenate([seen, np.zeros(agents - seen.size, dtype=bool)])

    def _forget_recorded(self, run_id: str) -> None:
        for key in [k for k in self._recorded if k[0] == run_id]:
            self._recorded.pop(key)

    def _ensure(self, run_id: str, table: str, columns: list[tuple[str, str]]) -> None:
        key = (table, repr(columns))
        if key in self._ready:
            return
        con = self.con
        have = {r[0]: r[1] for r in con.execute(
            "SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = ? "
            "AND database_name = current_database()", [table]).fetchall()}
        if not have:
            cols = ", ".join(f"{_q(n)} {t}" for n, t in columns)
            con.execute(f"CREATE TABLE IF NOT EXISTS {_q(table)} ({cols})")
        else:
            for name, type_ in columns:
                if name not in have:
                    con.execute(f"ALTER TABLE {_q(table)} ADD COLUMN {_q(name)} {type_}")
                elif have[name] == "JSON" and type_.endswith("[]"):
                    self._as_json.add((table, name))
                elif have[name] != type_ and {have[name], type_} != {"VARCHAR", "JSON"}:
                    raise StoreError(run_id, f"table {table}: column {name} is {have[name]} in {self.path}, "
                                             f"but this run declares {type_} (another simulation uses the name?)")
        self._ready.add(key)

    def _stored(self, table: str, name: str, type_: str) -> str:
        """The type a declared column's values are written as in this file ("JSON" for a LIST
        column an older release made JSON)."""
        return "JSON" if (table, name) in self._as_json else type_

    def ensure_tables(self, run_id: str, spec: SimulationTables) -> None:
        self._ensure(run_id, spec.outcomes, outcome_columns(spec))
        self._ensure(run_id, spec.rounds, summary_columns(spec))
        if spec.acts is not None:
            self._ensure(run_id, spec.acts, act_columns(spec))

    @staticmethod
    def per_round_tables(spec: SimulationTables) -> list[str]:
        """The tables with rows per round that a resume or a re-placement plays again."""
        return [spec.outcomes, "llm_calls", "posts", *(("edges",) if spec.edge_kinds else ()),
                *(("shown",) if spec.shown_items else ()),
                *(("transcripts", spec.acts) if spec.acts else ()), *(("audits",) if spec.prototypes else ())]

    # -- ingestion ------------------------------------------------------------------------
    def requester_ranges(self, run_id: str, requester: str) -> list[tuple[int, int]] | None:
        """The agents a call record's requester may have asked about: every range of every share
        the run placed on the host of that name, and every range a post-hoc interview ordered it
        to ask (none: neither). None: not checked — a record from before requesters were named,
        or the shared agent-host user (which speaks for every host). A run not placed yet has no
        share, so no host may have asked about any of its agents: a record that comes before the
        run's spawn is refused, never stored unchecked (an attacker's records sent as a run starts
        were kept when they reached the recorder ahead of its placement)."""
        if not requester or requester == SHARED_HOST_USER:
            return None
        shares = self.shares_of(run_id)
        return ([r for share in shares.values() if _share(share.key)[0] == requester for r in share.ranges]
                + self.interviews.host_order_ranges(run_id, requester))

    def shares_of(self, run_id: str) -> dict[str, ShareRecord]:
        if run_id not in self._shares:
            self._shares[run_id] = {key: ShareRecord(key, [tuple(r) for r in json.loads(ranges)], replaced, first or 1)
                                    for key, ranges, replaced, first in self.con.execute(
                                        "SELECT share, ranges, replaced_from, from_round FROM _shares "
                                        "WHERE run_id = ?", [run_id]).fetchall()}
        return self._shares[run_id]

    def counts(self, run_id: str, round_: int, host_id: str, epoch: int) -> bool:
        """Whether what share `host@epoch` sends about `round_` counts: it must be a share the
        orchestrator placed, and not replaced before that round (a lost host's agents placed
        again, a resume). Runs recorded before shares existed have none: everything counts."""
        shares = self.shares_of(run_id)
        if not shares:
            return True
        share = shares.get(share_key(host_id, epoch))
        return share is not None and share.counts_in(round_)

    def _place(self, m: SpawnBatch) -> None:
        """A share placed: it replaces, from its first round on, every share whose agents it
        takes (a lost host's, or all of them on a resume), and what they recorded from then goes."""
        shares = self.shares_of(m.run_id)
        key = share_key(m.host_id, m.epoch)
        if key in shares:
            return
        con = self.con
        mine = [(f, f + c) for f, c in m.ranges]
        for old in shares.values():
            if old.replaced_from is None and any(a < hi and lo < b for a, b in mine for lo, hi in
                                                 ((f, f + c) for f, c in old.ranges)):
                old.replaced_from = m.from_round
                con.execute("UPDATE _shares SET replaced_from = ? WHERE run_id = ? AND share = ?",
                            [m.from_round, m.run_id, old.key])
                # what it sent from then on no longer counts: the new share plays those rounds again
                con.execute("DELETE FROM _refused_groups WHERE run_id = ? AND share = ? AND round >= ?",
                            [m.run_id, old.key, m.from_round])
        shares[key] = ShareRecord(key, list(m.ranges), None, m.from_round)
        con.execute("INSERT INTO _shares VALUES (?, ?, ?, ?, NULL)",
                    [m.run_id, key, json.dumps(m.ranges), m.from_round])
        if m.epoch == 0:
            return  # a run's first placement: nothing recorded of these agents yet
        self._forget_recorded(m.run_id)
        spec = self._spec(m.run_id)
        within = " OR ".join("(agent_id >= ? AND agent_id < ?)" for _ in mine)
        bounds = [x for pair in mine for x in pair]
        for table in self.per_round_tables(spec):
            if table == "edges":  # an agent's edits are its own
                followers = within.replace("agent_id", "follower")
                con.execute(f"DELETE FROM edges WHERE run_id = ? AND round >= ? AND ({followers})",
                            [m.run_id, m.from_round, *bounds])
                continue
            if table == "transcripts":  # a scene's lines go with its acts (a group is whole on one share)
                con.execute(f"DELETE FROM transcripts WHERE run_id = ? AND round >= ? AND (round, group_id) IN "
                            f"(SELECT round, group_id FROM {_q(spec.acts)} WHERE run_id = ? AND round >= ? "
                            f"AND ({within}))", [m.run_id, m.from_round, m.run_id, m.from_round, *bounds])
                continue
            con.execute(f"DELETE FROM {_q(table)} WHERE run_id = ? AND round >= ? AND ({within})",
                        [m.run_id, m.from_round, *bounds])
        con.execute(f"DELETE FROM agents WHERE run_id = ? AND ({within})", [m.run_id, *bounds])

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
        """Store the events in one transaction, each at most once. DiskFull when the database's
        filesystem has no room: then nothing of them is stored (ingest them again later)."""
        try:
            return self._ingest(events)
        except Exception as err:
            if is_disk_full(err):
                raise DiskFull(self.path, err) from err
            raise

    def _ingest(self, events: list[Event]) -> IngestResult:
        t0 = time.perf_counter()
        out = IngestResult()
        events = [e for e in events if e.model is not None]
        if not events:
            return out  # nothing to write: don't even open the file
        con = self.con
        fresh = self._unseen(events)
        if not fresh:
            return out
        outcomes: dict[str, list[Event]] = defaultdict(list)  # by run
        audits: dict[str, list[Event]] = defaultdict(list)  # by run: a prototype run's audits
        decided: set[str] = set()  # prototype runs with a round decided here: their draws may be due
        con.execute("BEGIN TRANSACTION")
        try:
            for e in fresh:
                m = e.model
                if isinstance(m, OutcomeBatch):
                    (audits if m.audit else outcomes)[m.run_id].append(e)
                elif isinstance(m, InterviewPlaced):
                    self.interviews.placed(m)
                elif isinstance(m, InterviewOrder):
                    self.interviews.ordered(m)
                elif isinstance(m, InterviewBatch):
                    answers = self._insert_answers(m)
                    if isinstance(answers, str):
                        out.refused.append((e.msg_id, answers))
                    else:
                        out.answers += answers
                elif isinstance(m, RunResumed):
                    self._resume(m)
                    out.opened.add(m.run_id)
                elif isinstance(m, LlmCallBatch):
                    shape = self.shape_of(m.run_id)
                    if shape is None:
                        continue  # a run never started here (personas generation, a benchmark)
                    if why := calls_refusal(m, shape, self.requester_ranges(m.run_id, m.requester)):
                        out.refused.append((e.msg_id, why))
                        continue
                    con.execute(
                        "INSERT INTO llm_calls BY NAME SELECT ? AS run_id, ? AS round, unnest(?) AS agent_id, "
                        "unnest(?) AS replica, unnest(?) AS prompt_tokens, unnest(?) AS completion_tokens, "
                        "unnest(?) AS latency_ms, unnest(?) AS attempts, unnest(?) AS valid, ? AS batch_id, "
                        "unnest(?) AS reasks, ? AS model, unnest(?) AS cached_tokens, unnest(?) AS dollars",
                        [m.run_id, m.round, m.agent_ids, m.replicas, m.prompt_tokens, m.completion_tokens,
                         m.latency_ms, m.attempts, m.valid, m.batch_id, m.reasks or [None] * len(m.agent_ids),
                         m.model or None, m.cached_tokens or [0] * len(m.agent_ids),
                         m.dollars or [None] * len(m.agent_ids)],
                    )
                    out.calls += len(m.agent_ids)
                elif isinstance(m, RunStarted):
                    out.opened.add(m.run_id)
                    self._tables[m.run_id] = m.tables
                    self._shapes[m.run_id] = RunShape(m.config.agents, m.config.rounds)
                    self.interviews.started(m.run_id, m.config)
                    self.ensure_tables(m.run_id, m.tables)
                    con.execute(
                        "INSERT OR REPLACE INTO runs (run_id, started_at, config_json, status, hosts, manifest_json, "
                        "simulation, tables_json) VALUES (?, ?, ?, 'running', ?, ?, ?, ?)",
                        [m.run_id, ts(m.started_at), m.config.model_dump_json(), m.hosts,
                         json.dumps(m.manifest) if m.manifest is not None else None,
                         m.config.simulation, m.tables.model_dump_json()],
                    )
                    if e.blob is not None:  # the newcomers' personas too (agent_profiles: every persona of the run)
                        pop = m.config.population
                        self._insert_profiles(m.run_id, m.config.agents + (pop.newcomers if pop else 0), e.blob)
                    if m.config.models:
                        self._insert_models(m.run_id, m.config, e.blob)
                elif isinstance(m, SpawnBatch):
                    if share_key(m.host_id, m.epoch) in self.shares_of(m.run_id):
                        continue  # a spawn announced again (its deadline): placed already
                    self._place(m)
                    shape = self.shape_of(m.run_id)
                    top = max((f + c for f, c in m.ranges), default=0)
                    if shape is not None and top > shape.agents:  # a fork of a population that had newcomers
                        self._shapes[m.run_id] = RunShape(top, shape.rounds)
                        self._grow_recorded(m.run_id, top)
                    for first, count in m.ranges:
                        con.execute(
                            "INSERT INTO agents SELECT ?, range, ?, NULL FROM range(?, ?)",
                            [m.run_id, m.host_id, first, first + count],
                        )
                elif isinstance(m, RoundResult):
                    if all(self.counts(m.run_id, m.round, *_share(k)) for k in m.shares):
                        self._insert_round(m)  # decided from live shares only (again, after a re-placement)
                        if m.profile is not None:
                            self._insert_profile(m)
                        if m.prototypes is not None:
                            prototype_rows.insert_round(con, self._spec(m.run_id), m.run_id, m.round, m.prototypes)
                            self._recorded.pop((m.run_id, m.round), None)
                            decided.add(m.run_id)
                        if m.population is not None and m.population.round == m.round:
                            self._insert_population(m, e.blob)
                elif isinstance(m, RoundOpen):
                    if m.population is not None:
                        self._grow(m)
                elif isinstance(m, RoundPartial):
                    # a share's round profile; a partial of a share not placed (or replaced) counts
                    # nowhere (the environment dead-letters a forged one)
                    if m.profile is not None and self.shape_of(m.run_id) is not None \
                            and self.counts(m.run_id, m.round, m.host_id, m.epoch):
                        self._insert_profile(m)
                elif isinstance(m, RunDone):
                    con.execute(
                        "UPDATE runs SET finished_at = ?, status = ?, reason = ? WHERE run_id = ?",
                        [ts(m.finished_at), m.status, m.reason, m.run_id],
                    )
                    out.finished.append(m)
            stored: list[OutcomeBatch] = []
            for run_id, batches in outcomes.items():
                # checked here, after every placement of this fetch: its batches wait to the end
                kept = self._expected(run_id, batches, out)
                if kept:
                    out.outcomes += self._insert_outcomes(run_id, kept)
                    stored += kept
            for run_id, batches in audits.items():
                self._insert_audits(run_id, batches, out)
            for run_id in decided | {r for r in outcomes if (self.tables_of(r) or _NONE).prototypes}:
                out.outcomes += self._draw(run_id)
            self._add_record_time(stored, time.perf_counter() - t0)
            con.execute("INSERT INTO _ingested SELECT unnest(?)", [[e.msg_id for e in fresh]])
            con.execute("COMMIT")
        except Exception:
            self._abandon()
            raise
        return out

    def _abandon(self) -> None:
        """Undo a failed ingest: its transaction, and every mark it left in memory. A COMMIT
        that failed (a full disk) has already aborted the transaction, so ROLLBACK raises; the
        marks must go all the same, or the agents would count as recorded and their outcomes,
        redelivered, be refused as duplicates."""
        try:
            self.con.execute("ROLLBACK")
        except duckdb.TransactionException:
            pass  # no transaction left: the failed statement or COMMIT aborted it
        except duckdb.Error:
            self._drop_connection()  # in no state to go on: the next use opens the file again
        self._ready.clear()  # tables created in the rolled-back transaction are gone again
        self._as_json.clear()
        self._shares.clear()  # and placements recorded in it: read them again
        self._recorded.clear()  # and the outcomes it marked
        self.interviews.forget()  # and the answers

    def _drop_connection(self) -> None:
        with self._opening:
            con, self._con = self._con, None
        if con is not None:
            try:
                con.close()
            except duckdb.Error:
                pass  # closing a connection DuckDB has invalidated: it is gone either way

    def _spec(self, run_id: str) -> SimulationTables:
        spec = self.tables_of(run_id)
        if spec is None:
            raise StoreError(run_id, "no started event recorded, so its tables are unknown")
        self.ensure_tables(run_id, spec)
        return spec

    def _resume(self, m: RunResumed) -> None:
        """Rounds after `after_round` are played again: what was recorded of them goes."""
        self._forget_recorded(m.run_id)
        spec = self._spec(m.run_id)
        con = self.con
        for table in (*self.per_round_tables(spec), spec.rounds, "_refused_groups", "round_profile", "population",
                      *(("prototype_rounds", "_drawn") if spec.prototypes else ())):
            con.execute(f"DELETE FROM {_q(table)} WHERE run_id = ? AND round > ?", [m.run_id, m.after_round])
        self._departed.pop(m.run_id, None)
        con.execute("UPDATE runs SET status = 'running', finished_at = NULL, reason = NULL, hosts = ? "
                    "WHERE run_id = ?", [m.hosts, m.run_id])
        con.execute("INSERT INTO _resumes VALUES (?, ?, ?, ?)", [m.run_id, m.epoch, m.after_round, ts(m.resumed_at)])
        self.interviews.resumed(m.run_id, m.after_round)

    def _insert_answers(self, b: InterviewBatch) -> int | str:
        """An interview batch's answers not stored yet (how many), or why it is refused."""
        config = self.interviews.config_of(b.run_id)
        if config is None:
            return f"run {b.run_id} was never started here"
        if b.request is not None:
            order = self.interviews.order_of(b.run_id, b.request, b.host_id)
            why = self.interviews.refusal(b, None, [], config, order=order)
            if why is not None:
                return why
            return self.interviews.insert(b, order.survey or b.survey, self._ids(b.run_id, config))
        share = self.shares_of(b.run_id).get(share_key(b.host_id, b.epoch))
        if b.request is None and share is not None and not (share.from_round - 1 <= b.after_round
                                                             and share.counts_in(b.after_round)):
            # a share answers for the rounds it played (or restored its agents from), until replaced
            return f"share {share.key} did not play round {b.after_round} (or was replaced before it)"
        why = self.interviews.refusal(b, share.ranges if share is not None else None, list(config.interviews),
                                      config)
        if why is not None:
            return why
        plan = next(p for p in config.interviews if p.id == b.survey.id)  # refusal() found it
        return self.interviews.insert(b, plan.survey, self._ids(b.run_id, config))

    def _ids(self, run_id: str, config: RunConfig) -> int:
        """Every agent id the run has given so far (newcomers included)."""
        shape = self.shape_of(run_id)
        return max(config.agents, shape.agents if shape is not None else 0)

    def _expected(self, run_id: str, batches: list[Event], out: IngestResult) -> list[OutcomeBatch]:
        """The batches the run expects, marked as recorded; the others refused (with why) or,
        from a share replaced since (recovery's stragglers), dropped quietly. A batch is checked
        with the agents of the groups taken out of it: a forged batch is refused whole, and the
        groups of a batch that counts are recorded as missing (_refused_groups)."""
        shares, shape = self.shares_of(run_id), self.shape_of(run_id)
        kept = []
        for e in batches:
            b: OutcomeBatch = e.model
            groups = e.refused_groups
            if not shares or shape is None:  # a run recorded before shares existed: as it was
                kept.append(b)
                self._refuse_groups(b, groups, out)
                continue
            share = shares.get(share_key(b.host_id, b.epoch))
            if share is not None and not share.counts_in(b.round):
                continue
            seen = self.recorded(run_id, b.round)
            ids = [*b.agent_ids, *(a for g in groups for a in g.agents)] if groups else None
            why = outcome_refusal(b, share.ranges if share else None, share.from_round if share else 1, shape, seen,
                                  ids=ids, departed=self.departed(run_id))
            if why is not None:
                out.refused.append((e.msg_id, why))
                continue
            seen[b.agent_ids] = True
            kept.append(b)
            self._refuse_groups(b, groups, out)
        return kept

    def _refuse_groups(self, b: OutcomeBatch, groups: list[RefusedGroup], out: IngestResult) -> None:
        if not groups:
            return
        key = share_key(b.host_id, b.epoch)
        self.con.executemany("INSERT INTO _refused_groups VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                             [[b.run_id, b.round, key, g.group_id, g.agents, g.acts, g.lines, g.reason]
                              for g in groups])
        out.refused_groups += [(b.run_id, b.round, key, g) for g in groups]

    def _insert_outcomes(self, run_id: str, batches: list[OutcomeBatch]) -> int:
        spec = self._spec(run_id)
        types = {n: self._stored(spec.outcomes, n, t) for n, t in outcome_columns(spec)}
        cols: dict[str, list] = {name: [] for name in types}
        for m in batches:
            n = len(m.agent_ids)
            cols["run_id"].extend([m.run_id] * n)
            cols["round"].extend([m.round] * n)
            cols["agent_id"].extend(m.agent_ids)
            if spec.grouped:
                cols["group_id"].extend(m.group_ids or [None] * n)
            for level in spec.levels:
                cols[f"{level}_id"].extend((m.levels or {}).get(level) or [None] * n)
            for c in spec.outcome_columns:
                cols[c.name].extend(m.columns[c.name])
            cols["valid"].extend(m.valid)
            cols["raw"].extend(m.raws)
            cols["latency_ms"].extend(m.latency_ms)
            cols["error"].extend(m.errors)
            if spec.prototypes:  # a representative's own answer (the others' rows are drawn: _draw)
                cols["source"].extend(["llm"] * n)
                cols["prototype"].extend(m.prototypes or [None] * n)
                cols["drawn_from"].extend([None] * n)
        rows, select = arrow_rows(cols, types)
        self.con.register("outcome_rows", rows)
        try:
            self.con.execute(f"INSERT INTO {_q(spec.outcomes)} BY NAME SELECT {select} FROM outcome_rows")
        finally:
            self.con.unregister("outcome_rows")
        self._insert_posts([m for m in batches if m.posts is not None])
        if spec.acts is not None:
            self._insert_scenes(spec, [m for m in batches if m.acts is not None or m.lines is not None])
        self._insert_edges([m for m in batches if m.edits is not None])
        self._insert_shown([m for m in batches if m.shown is not None])
        return len(cols["agent_id"])

    def _insert_audits(self, run_id: str, events: list[Event], out: IngestResult) -> None:
        """A prototype run's audits: each from a share the run placed, about its own agents, once
        per agent and round (a duplicate or a stranger's batch is refused whole)."""
        spec, shape, shares = self._spec(run_id), self.shape_of(run_id), self.shares_of(run_id)
        kept = []
        for e in events:
            b: OutcomeBatch = e.model
            share = shares.get(share_key(b.host_id, b.epoch))
            if shares and share is not None and not share.counts_in(b.round):
                continue  # a replaced share's straggler
            why = None if spec.prototypes else f"run {run_id} has no prototypes, so no audits"
            if why is None and shape is not None:
                seen = np.zeros(shape.agents, dtype=bool)
                done = np.fromiter(prototype_rows.audited(self.con, run_id, b.round), dtype=np.int64)
                seen[done[(done >= 0) & (done < shape.agents)]] = True
                why = outcome_refusal(b, share.ranges if share else None, share.from_round if share else 1, shape,
                                      seen)
            if why is None and (b.prototypes is None or len(b.prototypes) != len(b.agent_ids)):
                why = "an audit batch names each agent's prototype"
            if why is not None:
                out.refused.append((e.msg_id, why))
                continue
            kept.append(b)
        if kept:
            prototype_rows.insert_audits(self.con, spec, kept)

    def _draw(self, run_id: str) -> int:
        """The drawn rows of the run's rounds whose representatives are all recorded (populace.store.prototypes)."""
        spec = self._spec(run_id)
        config = self._config(run_id)
        if config is None or config.prototypes is None:
            return 0
        added = 0
        for round_, reps in prototype_rows.pending(self.con, run_id):
            rows = prototype_rows.draw(self.con, spec, config, run_id, round_, reps,
                                       lambda: self._membership(run_id, config))
            if rows is None:
                continue
            self._recorded.pop((run_id, round_), None)
            added += rows
        return added

    def _config(self, run_id: str) -> RunConfig | None:
        row = self.con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
        return RunConfig.model_validate_json(row[0]) if row and row[0] else None

    def _membership(self, run_id: str, config: RunConfig) -> Membership:
        if run_id not in self._members:
            p = config.prototypes
            assert p is not None
            try:
                profiles = prototype_rows.profiles_of(self.con, run_id) if p.by else None
                self._members[run_id] = membership(config.agents, p.by, profiles)
            except PrototypeError as err:
                raise StoreError(run_id, f"its prototypes cannot be drawn here: {err}") from None
        return self._members[run_id]

    def _insert_shown(self, batches: list[OutcomeBatch]) -> None:
        """What each of the batches' agents was shown (one row per agent that has a record)."""
        if not batches:
            return
        cols: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "items", "ranks")}
        for m in batches:
            x = m.shown
            assert x is not None
            cols["run_id"].extend([m.run_id] * len(x.agent_id))
            cols["round"].extend([m.round] * len(x.agent_id))
            for key in ("agent_id", "items", "ranks"):
                cols[key].extend(getattr(x, key))
        schema = pa.schema([("run_id", pa.string()), ("round", pa.int32()), ("agent_id", pa.int64()),
                            ("items", pa.list_(pa.int64())), ("ranks", pa.list_(pa.int32()))])
        self.con.register("shown_rows", pa.Table.from_pydict(cols, schema=schema))
        try:
            self.con.execute("INSERT INTO shown BY NAME SELECT * FROM shown_rows")
        finally:
            self.con.unregister("shown_rows")

    def _insert_edges(self, batches: list[OutcomeBatch]) -> None:
        """Every edge edit, in the order each batch lists them (the order they applied)."""
        if not batches:
            return
        cols: dict[str, list] = {k: [] for k in ("run_id", "round", "follower", "author", "kind", "op")}
        for m in batches:
            e = m.edits
            assert e is not None
            cols["run_id"].extend([m.run_id] * len(e.follower))
            cols["round"].extend([m.round] * len(e.follower))
            for key in ("follower", "author", "kind", "op"):
                cols[key].extend(getattr(e, key))
        schema = pa.schema([("run_id", pa.string()), ("round", pa.int32()), ("follower", pa.int64()),
                            ("author", pa.int64()), ("kind", pa.string()), ("op", pa.string())])
        self.con.register("edge_rows", pa.Table.from_pydict(cols, schema=schema))
        try:
            self.con.execute("INSERT INTO edges BY NAME SELECT * FROM edge_rows")
        finally:
            self.con.unregister("edge_rows")

    def _insert_scenes(self, spec: SimulationTables, batches: list[OutcomeBatch]) -> None:
        """The acts and lines of the scenes whose members' outcomes these batches carry."""
        if not batches:
            return
        types = {n: self._stored(spec.acts, n, t) for n, t in act_columns(spec)}
        acts: dict[str, list] = {name: [] for name in types}
        lines: dict[str, list] = {k: [] for k in ("run_id", "round", "group_id", "seq", "speaker", "text", "fields")}
        for m in batches:
            if (a := m.acts) is not None:
                n = len(a.agent_id)
                acts["run_id"].extend([m.run_id] * n)
                acts["round"].extend([m.round] * n)
                for key in ("group_id", "seq", "agent_id", "phase", "valid", "raw", "latency_ms", "error"):
                    acts[key].extend(getattr(a, key))
                for c in spec.act_columns:
                    acts[c.name].extend(a.columns[c.name])
            if (x := m.lines) is not None:
                n = len(x.seq)
                lines["run_id"].extend([m.run_id] * n)
                lines["round"].extend([m.round] * n)
                for key in ("group_id", "seq", "speaker", "text", "fields"):
                    lines[key].extend(getattr(x, key))
        line_types = {"run_id": "VARCHAR", "round": "INTEGER", "group_id": "BIGINT", "seq": "INTEGER",
                      "speaker": "BIGINT", "text": "VARCHAR", "fields": "VARCHAR"}
        for view, table, columns, sch in (("act_rows", spec.acts, acts, types),
                                          ("line_rows", "transcripts", lines, line_types)):
            if not columns["run_id"]:
                continue
            rows, select = arrow_rows(columns, sch)
            self.con.register(view, rows)
            try:
                self.con.execute(f"INSERT INTO {_q(table)} BY NAME SELECT {select} FROM {view}")
            finally:
                self.con.unregister(view)

    def _insert_posts(self, batches: list[OutcomeBatch]) -> None:
        """Each agent's post once per round (not once per edge: who hears whom is the graph)."""
        if not batches:
            return
        cols: dict[str, list] = {k: [] for k in ("run_id", "round", "agent_id", "text", "fields", "heard",
                                                 "heard_digest")}
        for m in batches:
            p = m.posts
            assert p is not None
            n = len(m.agent_ids)
            cols["run_id"].extend([m.run_id] * n)
            cols["round"].extend([m.round] * n)
            cols["agent_id"].extend(m.agent_ids)
            cols["text"].extend(p.texts)
            cols["fields"].extend(json.dumps(f, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
                                  if f is not None else None for f in p.fields)
            cols["heard"].extend(p.heard)
            cols["heard_digest"].extend(p.heard_digest)
        schema = pa.schema([("run_id", pa.string()), ("round", pa.int32()), ("agent_id", pa.int64()),
                            ("text", pa.string()), ("fields", pa.string()), ("heard", pa.int32()),
                            ("heard_digest", pa.int64())])
        self.con.register("post_rows", pa.Table.from_pydict(cols, schema=schema))
        try:
            self.con.execute("INSERT INTO posts BY NAME SELECT * FROM post_rows")
        finally:
            self.con.unregister("post_rows")

    def _insert_population(self, m: RoundResult, blob: bytes | pa.Table | None) -> None:
        """The round's departures and newcomers (table `population`), from who is alive after it
        (its bytes, read by the service against the result's digest); a round decided again
        replaces its rows."""
        ref = m.population
        assert ref is not None
        if isinstance(blob, pa.Table):  # a local run's rows (populace.store.local_runs)
            table = blob
        elif isinstance(blob, bytes):
            d = Population.from_bytes(blob).delta
            if d is None or d.round != m.round:
                raise RuntimeError(f"run {m.run_id}: {ref.name} holds no changes of round {m.round}")
            table = _population_table(d)
        else:  # not this result's fault alone: retried, then dead-lettered (logged)
            raise RuntimeError(f"run {m.run_id}: round {m.round}'s population ({ref.name}) could not be read")
        n = table.num_rows
        self.con.execute("DELETE FROM population WHERE run_id = ? AND round = ?", [m.run_id, m.round])
        run = pa.DictionaryArray.from_arrays(pa.array(np.zeros(n, dtype=np.int32)), pa.array([m.run_id], pa.string()))
        self.con.register("population_rows", table.append_column("run_id", run))
        try:
            self.con.execute("INSERT INTO population BY NAME SELECT * FROM population_rows")
        finally:
            self.con.unregister("population_rows")
        shape = self.shape_of(m.run_id)
        if shape is not None and ref.size > shape.agents:
            self._shapes[m.run_id] = RunShape(ref.size, shape.rounds)
            self._grow_recorded(m.run_id, ref.size)  # its ledgers are as long as the agents were
        gone = self._departed.get(m.run_id)
        if m.run_id in self._departed and gone is not None and gone.size >= ref.size:
            events = table.column("event").to_numpy(zero_copy_only=False)
            ids = table.column("agent_id").to_numpy()[(events == "died") | (events == "left")]
            gone[ids] = m.round  # kept up to date: read again from the table only after a restart
        else:
            self._departed.pop(m.run_id, None)

    def _grow(self, m: RoundOpen) -> None:
        """A round's announcement places newcomers (its shares' ranges grew): the shares own them
        from now on, and table `agents` has them."""
        shares = self.shares_of(m.run_id)
        for key, ranges in m.ranges.items():
            share = shares.get(key)
            if share is None:
                continue
            top = max((f + c for f, c in share.ranges), default=0)
            new = [(max(f, top), f + c - max(f, top)) for f, c in ranges if f + c > top]
            if not new:
                continue
            share.ranges = [tuple(r) for r in ranges]  # type: ignore[misc]
            self.con.execute("UPDATE _shares SET ranges = ? WHERE run_id = ? AND share = ?",
                             [json.dumps(share.ranges), m.run_id, key])
            host_id, _ = _share(key)
            for first, count in new:
                self.con.execute("INSERT INTO agents SELECT ?, range, ?, NULL FROM range(?, ?)",
                                 [m.run_id, host_id, first, first + count])

    def _insert_round(self, m: RoundResult) -> None:
        spec = self._spec(m.run_id)
        names = ["run_id", "round", "n", "n_valid", *Usage.RECORDED, *(c.name for c in spec.summary_columns),
                 "closed_at"]
        values = [m.run_id, m.round, m.n, m.n_valid, *(getattr(m.usage, u) for u in Usage.RECORDED),
                  *(json.dumps(m.summary.get(c.name)) if self._stored(spec.rounds, c.name, c.type) == "JSON"
                    else m.summary.get(c.name)
                    for c in spec.summary_columns),
                  ts(m.closed_at)]
        # a round decided again (after a re-placement) replaces its earlier decision
        self.con.execute(f"DELETE FROM {_q(spec.rounds)} WHERE run_id = ? AND round = ?", [m.run_id, m.round])
        self.con.execute(f"INSERT INTO {_q(spec.rounds)} ({', '.join(map(_q, names))}) "
                         f"VALUES ({', '.join('?' * len(names))})", values)

    def _insert_profile(self, m: RoundPartial | RoundResult) -> None:
        """A share's round profile (from its partial), or the environment's (from the round's
        result); the same share's or a round decided again replaces the row it had."""
        if isinstance(m, RoundPartial):
            p = m.profile
            assert p is not None
            row = {"role": "host", "host_id": m.host_id, "epoch": m.epoch, "agents": p.agents, "wall_s": p.wall_s,
                   "view_s": p.view_s, "turn_s": p.turn_s, "merge_s": p.merge_s, "model_wait_s": p.model_wait_s,
                   "view_bytes": p.view_bytes, "view_max_bytes": p.view_max_bytes,
                   "observation_bytes": p.observation_bytes, "held": p.held, "note": p.note}
        else:
            d = m.profile
            assert d is not None
            row = {"role": "environment", "host_id": "environment", "epoch": m.epoch, "merge_s": d.merge_s,
                   "decide_s": d.decide_s, "observation_bytes": d.observation_bytes, "note": d.note}
        self.con.execute("DELETE FROM round_profile WHERE run_id = ? AND round = ? AND role = ? AND host_id = ? "
                         "AND epoch = ?", [m.run_id, m.round, row["role"], row["host_id"], row["epoch"]])
        names = ["run_id", "round", *row]
        self.con.execute(f"INSERT INTO round_profile ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                         [m.run_id, m.round, *row.values()])

    def _add_record_time(self, batches: list[OutcomeBatch], seconds: float) -> None:
        """The recorder's row of each round whose outcomes this transaction stored: its seconds,
        shared among those rounds by the rows each had in it."""
        rows: dict[tuple[str, int], int] = defaultdict(int)
        for b in batches:
            rows[b.run_id, b.round] += len(b.agent_ids)
        total = sum(rows.values())
        if total == 0:  # batches with no rows (a forged one, refused group by group): no round's time
            return
        for (run_id, round_), n in rows.items():
            share = seconds * n / total
            (updated,) = self.con.execute(
                "UPDATE round_profile SET record_s = record_s + ? WHERE run_id = ? AND round = ? AND role = 'recorder'",
                [share, run_id, round_]).fetchone()
            if not updated:
                self.con.execute("INSERT INTO round_profile (run_id, round, role, host_id, epoch, record_s) "
                                 "VALUES (?, ?, 'recorder', 'recorder', 0, ?)", [run_id, round_, share])

    def _insert_profiles(self, run_id: str, agents: int, blob: bytes | pa.Table) -> None:
        rows = profile_rows(blob) if isinstance(blob, bytes) else blob
        if rows is None:
            return  # the client checked the file before the run; a bad blob must not block ingestion
        self.con.register("profile_rows", rows.slice(0, agents))
        self.con.execute("DELETE FROM agent_profiles WHERE run_id = ?", [run_id])
        self.con.execute("INSERT INTO agent_profiles SELECT ?, agent_id, persona_index, profile, persona "
                         "FROM profile_rows", [run_id])
        self.con.unregister("profile_rows")

    def _insert_models(self, run_id: str, config: RunConfig, blob: bytes | pa.Table | None) -> None:
        """Each agent's model (agent_models), assigned as the hosts assign it (pure, seeded)."""
        rows = profile_rows(blob) if isinstance(blob, bytes) else blob
        profiles = None
        if config.assign is not None and config.assign.attribute is not None:
            if rows is None:
                return  # the client checked the assignment before the run; a bad blob must not block ingestion
            profiles = [json.loads(p) for p in rows.column("profile").to_pylist()]
        try:
            assigned = assignment(config, profiles=profiles)
        except AssignmentError:
            return  # likewise
        assert assigned is not None
        names = pa.array([m.name for m in config.models])
        table = pa.table({"agent_id": pa.array(np.arange(config.agents, dtype=np.int64)),
                          "model": pa.DictionaryArray.from_arrays(pa.array(assigned.astype(np.int32)),
                                                                  names).dictionary_decode()})
        self.con.register("model_rows", table)
        self.con.execute("DELETE FROM agent_models WHERE run_id = ?", [run_id])
        self.con.execute("INSERT INTO agent_models SELECT ?, agent_id, model FROM model_rows", [run_id])
        self.con.unregister("model_rows")

    def count_outcomes(self, run_id: str) -> int:
        spec = self.tables_of(run_id)
        if spec is None:
            return 0
        self.ensure_tables(run_id, spec)
        return self.con.execute(f"SELECT count(*) FROM {_q(spec.outcomes)} WHERE run_id = ?",
                                [run_id]).fetchone()[0]

    def interviews_owed(self, run_id: str, last_round: int) -> Owed:
        """The run's planned answers after its last round `last_round` (InterviewStore.owed):
        owed from the first round it played (a fork's after its parent's), still awaited from
        the round its latest resume restored."""
        first = min((sh.from_round for sh in self.shares_of(run_id).values()), default=1)
        row = self.con.execute("SELECT after_round FROM _resumes WHERE run_id = ? ORDER BY epoch DESC LIMIT 1",
                               [run_id]).fetchone()
        return self.interviews.owed(run_id, last_round, first, row[0] if row else None)

    def completeness(self, run_id: str, last_round: int | None = None) -> tuple[int, int]:
        """(outcomes recorded, outcomes the environment counted in the run's round results).
        With `last_round` (its RunDone's rounds), a round result of the run's not yet recorded,
        from the first round it plays (a fork's after its parent's) to `last_round`, makes
        `expected` unknown: -1 more than `got`, so the run is not complete. A restarted recorder
        gets what its predecessor had fetched again only after the ack wait, while the run's
        later events, `done` among them, come at once: the sum of the results recorded so far
        would then count too few outcomes."""
        spec = self.tables_of(run_id)
        if spec is None:
            return 0, 0
        got = self.count_outcomes(run_id)
        expected = self.con.execute(f"SELECT coalesce(sum(n), 0) FROM {_q(spec.rounds)} WHERE run_id = ?",
                                    [run_id]).fetchone()[0]
        if last_round:
            shares = self.shares_of(run_id)
            first = min((sh.from_round for sh in shares.values()), default=1)
            (closed,) = self.con.execute(
                f"SELECT count(DISTINCT round) FROM {_q(spec.rounds)} WHERE run_id = ? AND round BETWEEN ? AND ?",
                [run_id, first, last_round]).fetchone()
            if closed < last_round - first + 1:
                return got, got + 1
        return got, int(expected)

    def tallies(self, run_id: str, last_round: int) -> list[RoundTally]:
        """Each round of the run, from the first it plays (a fork's after its parent's) to the
        last its result or `last_round` names: the outcomes its result counted, those recorded,
        and those of its refused groups not recorded since (populace.store.shortfall)."""
        spec = self.tables_of(run_id)
        if spec is None:
            return []
        self.ensure_tables(run_id, spec)
        con = self.con
        first = min((sh.from_round for sh in self.shares_of(run_id).values()), default=1)
        counted = dict(con.execute(f"SELECT round, n FROM {_q(spec.rounds)} WHERE run_id = ? AND round >= ?",
                                   [run_id, first]).fetchall())
        got = dict(con.execute(f"SELECT round, count(*) FROM {_q(spec.outcomes)} WHERE run_id = ? AND round >= ? "
                               "GROUP BY round", [run_id, first]).fetchall())
        # a refused group is missing until its outcomes are recorded (sent again whole, e.g. the
        # host's own batch after a forger's): its agents not recorded, or none of the group's rows
        # a group none of whose rows is recorded: only a grouped simulation's outcomes have group_id
        no_rows = (f"""OR NOT EXISTS (SELECT 1 FROM {_q(spec.outcomes)} o WHERE o.run_id = $1
                                      AND o.round = g.round AND o.group_id = g.group_id)""" if spec.grouped else "")
        refused = {r: rest for r, *rest in con.execute(
            f"""WITH g AS (SELECT *, row_number() OVER () AS k FROM _refused_groups WHERE run_id = $1),
                lost AS (SELECT m.k, count(*) AS n FROM (SELECT k, round, unnest(agents) AS agent_id FROM g) m
                         WHERE NOT EXISTS (SELECT 1 FROM {_q(spec.outcomes)} o WHERE o.run_id = $1
                                           AND o.round = m.round AND o.agent_id = m.agent_id)
                         GROUP BY m.k),
                missing AS (SELECT g.*, coalesce(lost.n, 0) AS lost FROM g LEFT JOIN lost USING (k)
                            WHERE lost.n > 0 {no_rows})
                SELECT round, count(*), sum(acts), sum(lines),
                       arg_min('group ' || group_id || ' of ' || share || ' refused: ' || reason, group_id), sum(lost)
                FROM missing GROUP BY round""", [run_id]).fetchall()}
        last = max([last_round or 0, *counted])
        out = []
        for r in range(first, last + 1):
            groups, acts, lines, why, missing = refused.get(r, (0, 0, 0, None, 0))
            out.append(RoundTally(r, counted.get(r), got.get(r, 0), int(missing or 0), int(acts or 0),
                                  int(lines or 0), int(groups), why))
        return out

    def has_refused_groups(self, run_id: str) -> bool:
        return self.con.execute("SELECT count(*) FROM _refused_groups WHERE run_id = ?", [run_id]).fetchone()[0] > 0

    def mark_incomplete(self, run_id: str, status: str, reason: str) -> None:
        """The run's status and reason once it is recorded with something missing."""
        self.con.execute("UPDATE runs SET status = ?, reason = ? WHERE run_id = ?", [status, reason, run_id])
