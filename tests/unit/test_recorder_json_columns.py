"""A JSON column is stored as the text json.dumps writes, whatever its values: a column of
whole-number lists (an untyped `list` of ids, or an older file's list[int] column) is written by
DuckDB, anything else value by value (populace.store.store.arrow_rows) — the same text either
way."""

from __future__ import annotations

import json

import pytest

from populace.core.contracts import (
    ActColumns,
    Column,
    ConfigRef,
    OutcomeBatch,
    RunConfig,
    RunStarted,
    SimulationTables,
    SpawnBatch,
)
from populace.store.store import Event, Store

CFG = RunConfig(simulation="talks", agents=4, rounds=1)
TABLES = SimulationTables(simulation="talks", outcomes="talks_outcomes", outcome_columns=[Column(name="seen", type="JSON")],
                          rounds="talks_rounds", summary_columns=[], grouped=True, acts="talks_acts",
                          act_columns=[Column(name="targets", type="JSON"), Column(name="n", type="BIGINT")])
WHOLES = [[1, 2, 3], None, [], [-5, 2**62]]


@pytest.mark.parametrize("values", [
    WHOLES,
    [None, None, None, None],
    [[1, 2], [True], None, [3]],  # a bool: the column is written value by value
    [[1.0], [1.5], [0], None],
    [{"a": [1]}, "x", [[1]], [1, None]],
    [[2**70], [1], [2], [3]],  # past int64
    [[], None, [], []],  # lists of nothing: no element type
])
def test_a_json_column_is_stored_as_json_dumps_writes_it(tmp_path, values):
    store = Store(tmp_path / "x.duckdb")
    store.ingest([
        Event("started", "started", RunStarted(run_id="r1", config=CFG, started_at=1e9, hosts=["a"], tables=TABLES)),
        Event("spawn", "spawn", SpawnBatch(run_id="r1", host_id="a", ranges=[(0, 4)], config_ref=ConfigRef.of(CFG))),
    ])
    batch = OutcomeBatch(
        run_id="r1", round=1, host_id="a", seq=0, agent_ids=[0, 1, 2, 3], columns={"seen": values}, valid=[True] * 4,
        raws=["r"] * 4, latency_ms=[1.0] * 4, errors=[None] * 4, group_ids=[0, 0, 1, 1],
        acts=ActColumns(group_id=[0, 0, 1, 1], seq=[0, 1, 0, 1], agent_id=[0, 1, 2, 3], phase=["p"] * 4,
                        columns={"targets": values, "n": [1, 2, 3, 4]}, valid=[True] * 4, raw=["r"] * 4,
                        latency_ms=[1.0] * 4, error=[None] * 4))
    out = store.ingest([Event("b", "outcomes", batch)])
    assert out.outcomes == 4 and out.refused == []
    expected = [None if v is None else json.dumps(v) for v in values]
    for sql in ("SELECT seen FROM talks_outcomes ORDER BY agent_id", "SELECT targets FROM talks_acts ORDER BY agent_id"):
        assert [r[0] for r in store.con.execute(sql).fetchall()] == expected
    assert [r[0] for r in store.con.execute("SELECT n FROM talks_acts ORDER BY agent_id").fetchall()] == [1, 2, 3, 4]
    store.close()
