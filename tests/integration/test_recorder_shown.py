"""The recorder's store for who saw what and list columns: an outcome's `list[int]` is a DuckDB
LIST column (a database from before, where it was JSON, keeps recording it as JSON); each agent's
`shown` record is a row of table `shown`, replaced when its round is played again (a resume, a
lost host's agents placed again) and refused when it does not belong to the batch."""

from __future__ import annotations

import duckdb
import pytest

from populace.core.contracts import (
    Column,
    ConfigRef,
    OutcomeBatch,
    RoundResult,
    RunConfig,
    RunResumed,
    RunStarted,
    ShownColumns,
    SimulationTables,
    SpawnBatch,
)
from populace.store.columns import BadColumns, check_outcomes
from populace.store.store import Event, Store

TABLES = SimulationTables(
    simulation="reader", outcomes="reader_outcomes", rounds="reader_rounds",
    outcome_columns=[Column(name="liked", type="BIGINT[]"), Column(name="tags", type="VARCHAR[]")],
    summary_columns=[Column(name="top", type="BIGINT[]")], measure="liked", measure_kind="categorical",
    shown_items="post_id")
CFG = RunConfig(simulation="reader", agents=4, rounds=2)


def batch(round_: int, host: str, ids: list[int], epoch: int = 0, shown: bool = True) -> OutcomeBatch:
    n = len(ids)
    return OutcomeBatch(
        run_id="s1", round=round_, host_id=host, seq=0, epoch=epoch, agent_ids=ids,
        columns={"liked": [[i, 10 * round_] if i % 2 else None for i in ids], "tags": [["a", "b"]] * n},
        valid=[True] * n, raws=[""] * n, latency_ms=[1.0] * n, errors=[None] * n,
        shown=ShownColumns(agent_id=ids, items=[[100 * round_ + i, 7] for i in ids], ranks=[[2, 1]] * n)
        if shown else None)


def result(round_: int, epoch: int = 0, shares=("a@0", "b@0")) -> RoundResult:
    return RoundResult(run_id="s1", round=round_, n=4, n_valid=4, summary={"top": [3, 1]}, observation={},
                       closed_at=1e9, epoch=epoch, shares=list(shares))


def opening() -> list[Event]:
    return [Event("s1.start", "started", RunStarted(run_id="s1", config=CFG, started_at=1e9, hosts=["a", "b"],
                                                    tables=TABLES)),
            Event("s1.spawn-a", "spawn", SpawnBatch(run_id="s1", host_id="a", ranges=[(0, 2)],
                                                    config_ref=ConfigRef.of(CFG))),
            Event("s1.spawn-b", "spawn", SpawnBatch(run_id="s1", host_id="b", ranges=[(2, 2)],
                                                    config_ref=ConfigRef.of(CFG))),
            Event("s1.o1a", "outcomes", batch(1, "a", [0, 1])), Event("s1.o1b", "outcomes", batch(1, "b", [2, 3])),
            Event("s1.r1", "round.result", result(1))]


def test_lists_are_list_columns_and_shown_records_are_rows(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    store.ingest(opening())
    con = store.con
    types = dict(con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'reader_outcomes'")
                 .fetchall())
    assert (types["liked"], types["tags"]) == ("BIGINT[]", "VARCHAR[]")
    assert con.execute("SELECT agent_id, liked, tags FROM reader_outcomes ORDER BY agent_id").fetchall() == [
        (0, None, ["a", "b"]), (1, [1, 10], ["a", "b"]), (2, None, ["a", "b"]), (3, [3, 10], ["a", "b"])]
    assert con.execute("SELECT top FROM reader_rounds").fetchone() == ([3, 1],)
    assert con.execute("SELECT round, agent_id, items, ranks FROM shown ORDER BY agent_id").fetchall() == [
        (1, 0, [100, 7], [2, 1]), (1, 1, [101, 7], [2, 1]), (1, 2, [102, 7], [2, 1]), (1, 3, [103, 7], [2, 1])]
    # a LIST is queried as one: who saw post 7 at rank 1
    assert con.execute("SELECT count(*) FROM (SELECT unnest(items) AS item, unnest(ranks) AS rank FROM shown) "
                       "WHERE item = 7 AND rank = 1").fetchone() == (4,)
    store.close()
    from populace.analysis.export import export_parquet

    with duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True) as con:
        written = export_parquet(con, "s1", tmp_path / "out")
    assert tmp_path / "out" / "shown.parquet" in written
    with duckdb.connect() as con:
        assert con.execute(f"SELECT agent_id, items FROM '{tmp_path / 'out' / 'shown.parquet'}' ORDER BY agent_id "
                           "LIMIT 1").fetchone() == (0, [100, 7])


def test_a_resume_and_a_lost_hosts_share_replace_the_shown_rows_of_the_rounds_played_again(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    store.ingest(opening() + [Event("s1.o2a", "outcomes", batch(2, "a", [0, 1])),
                              Event("s1.o2b", "outcomes", batch(2, "b", [2, 3]))])
    # host b lost in round 2: its agents placed on a (epoch 1) play round 2 again, showing other items
    again = batch(2, "a", [2, 3], epoch=1)
    again = again.model_copy(update={"shown": ShownColumns(agent_id=[2, 3], items=[[9], [8]], ranks=[[1], [1]])})
    store.ingest([Event("s1.spawn-a1", "spawn", SpawnBatch(run_id="s1", host_id="a", ranges=[(2, 2)], epoch=1,
                                                           from_round=2, config_ref=ConfigRef.of(CFG))),
                  Event("s1.o2a1", "outcomes", again)])
    con = store.con
    assert con.execute("SELECT agent_id, items FROM shown WHERE round = 2 ORDER BY agent_id").fetchall() == [
        (0, [200, 7]), (1, [201, 7]), (2, [9]), (3, [8])]
    # a resume after round 1: every row of round 2 goes
    store.ingest([Event("s1.resumed", "resumed", RunResumed(run_id="s1", epoch=2, after_round=1, hosts=["c"],
                                                            resumed_at=1e9))])
    assert con.execute("SELECT DISTINCT round FROM shown").fetchall() == [(1,)]
    store.close()


def test_a_database_where_a_list_column_is_json_keeps_recording_it_as_json(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with duckdb.connect(path) as con:  # an older release made `list[int]` fields JSON columns
        con.execute("CREATE TABLE reader_outcomes (run_id VARCHAR, round INTEGER, agent_id BIGINT, liked JSON, "
                    "tags JSON, valid BOOLEAN, raw VARCHAR, latency_ms DOUBLE, error VARCHAR)")
        con.execute("CREATE TABLE reader_rounds (run_id VARCHAR, round INTEGER, n BIGINT, n_valid BIGINT, top JSON, "
                    "closed_at TIMESTAMP)")
    store = Store(path)
    store.ingest(opening())
    assert store.con.execute("SELECT liked->>'$[1]', tags->>'$[0]' FROM reader_outcomes WHERE agent_id = 1"
                             ).fetchone() == ("10", "a")
    assert store.con.execute("SELECT top->>'$[0]' FROM reader_rounds").fetchone() == ("3",)
    assert store.completeness("s1") == (4, 4)
    store.close()


@pytest.mark.parametrize("shown,why", [
    (ShownColumns(agent_id=[9], items=[[1]], ranks=[[1]]), "shown.agent_id: agent 9 has no outcome in this batch"),
    (ShownColumns(agent_id=[0, 0], items=[[1], [2]], ranks=[[1], [1]]), "two records in one round"),
])
def test_a_shown_record_that_does_not_ride_with_its_agents_outcome_is_refused(shown, why):
    forged = batch(1, "a", [0, 1]).model_copy(update={"shown": shown})
    with pytest.raises(BadColumns, match=why):
        check_outcomes(forged, TABLES)
    with pytest.raises(BadColumns, match="declares shown_items"):
        check_outcomes(batch(1, "a", [0, 1]), TABLES.model_copy(update={"shown_items": None}))
    with pytest.raises(BadColumns, match=r"columns.liked\[0\]"):
        bad = batch(1, "a", [0, 1])
        check_outcomes(bad.model_copy(update={"columns": {**bad.columns, "liked": [["x"], None]}}), TABLES)
