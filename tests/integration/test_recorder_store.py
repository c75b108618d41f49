"""The recorder's DuckDB store: exactly-once ingestion whatever the redelivery order."""

from __future__ import annotations

import duckdb
import pytest
from populace_ratio_game import RatioGame

from populace.core.contracts import (
    Column,
    ConfigRef,
    DecideProfile,
    LlmCallBatch,
    OutcomeBatch,
    RoundPartial,
    RoundResult,
    RunConfig,
    RunDone,
    RunResumed,
    RunStarted,
    ShareProfile,
    SimulationTables,
    SpawnBatch,
)
from populace.store.store import Event, Store, StoreError

TABLES = RatioGame.tables()  # the ratio game keeps its historic tables: guesses, rounds


def guess_batch(run_id, round_, host, seq, ids) -> OutcomeBatch:
    values = [None if i % 7 == 0 else float(i % 101) for i in ids]
    return OutcomeBatch(run_id=run_id, round=round_, host_id=host, seq=seq, agent_ids=ids,
                        columns={"value": values}, valid=[v is not None for v in values],
                        raws=[f"raw{i}" for i in ids], latency_ms=[1.0] * len(ids), errors=[None] * len(ids))


def events(run_id="r1", rounds: int = 1) -> list[Event]:
    cfg = RunConfig(agents=20, rounds=rounds)
    evs = [
        Event("started", "started", RunStarted(run_id=run_id, config=cfg, started_at=1e9, hosts=["a", "b"],
                                               tables=TABLES)),
        Event("spawn-a", "spawn", SpawnBatch(run_id=run_id, host_id="a", ranges=[(0, 10)], config_ref=ConfigRef.of(cfg))),
        Event("spawn-b", "spawn", SpawnBatch(run_id=run_id, host_id="b", ranges=[(10, 10)], config_ref=ConfigRef.of(cfg))),
        Event("g-a-0", "outcomes", guess_batch(run_id, 1, "a", 0, list(range(10)))),
        Event("g-b-0", "outcomes", guess_batch(run_id, 1, "b", 0, list(range(10, 20)))),
        Event("partial", "partial", None),
        Event("result", "round.result", RoundResult(
            run_id=run_id, round=1, n=20, n_valid=17, summary={"mean": 1.0, "target": 0.5, "winner_agent_id": 1,
                                                               "winner_value": 1.0, "n_winners": 1},
            observation={}, closed_at=1e9)),
        Event("done", "done", RunDone(run_id=run_id, status="completed", rounds=1, finished_at=1e9 + 5)),
    ]
    for e in evs:  # message ids are unique per run, as subjects.msg_id makes them
        e.msg_id = f"{run_id}.{e.msg_id}"
    return evs


def test_ingest_writes_the_recorder_contract(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    out = store.ingest(events())
    assert out.outcomes == 20 and [d.run_id for d in out.finished] == ["r1"]
    assert store.completeness("r1") == (20, 20)
    store.close()
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    assert con.execute("SELECT count(*), count(DISTINCT agent_id) FROM agents").fetchone() == (20, 20)
    assert con.execute("SELECT host_id, count(*) FROM agents GROUP BY 1 ORDER BY 1").fetchall() == [("a", 10), ("b", 10)]
    row = con.execute("SELECT count(*), sum(valid::INT), count(value) FROM guesses").fetchone()
    assert row == (20, 17, 17)
    # value is NULL exactly when valid is false, and the raw text is always kept
    assert con.execute("SELECT count(*) FROM guesses WHERE (value IS NULL) <> (NOT valid) OR raw IS NULL").fetchone() == (0,)
    assert con.execute("SELECT status, finished_at IS NOT NULL FROM runs").fetchone() == ("completed", True)
    cols = [r[0] for r in con.execute("DESCRIBE guesses").fetchall()]
    assert cols == ["run_id", "round", "agent_id", "value", "valid", "raw", "latency_ms", "error"]
    assert con.execute("SELECT n, n_valid, mean, winner_agent_id, n_winners FROM rounds").fetchone() == (20, 17, 1.0, 1, 1)
    assert con.execute("SELECT simulation, tables_json->>'outcomes' FROM runs").fetchone() == ("ratio-game", "guesses")


def test_done_before_a_rounds_result_and_outcomes_is_not_complete(tmp_path):
    # A restarted recorder gets its predecessor's unacked round result and outcomes back only
    # after the ack wait, while `done` comes at once: the results recorded so far then sum to
    # fewer outcomes than the run has, and the run must not be announced as recorded.
    store = Store(tmp_path / "x.duckdb")
    evs = {e.msg_id.split(".", 1)[1]: e for e in events()}
    store.ingest([evs[k] for k in ("started", "spawn-a", "spawn-b", "done")])
    assert store.completeness("r1") == (0, 0)  # what the sum alone said: complete
    got, expected = store.completeness("r1", 1)
    assert got < expected
    store.ingest([evs[k] for k in ("result", "g-a-0", "g-b-0")])  # redelivered
    assert store.completeness("r1", 1) == (20, 20)
    assert store.completeness("r1", 0) == (20, 20)  # cancelled before a round: nothing to wait for
    store.close()


def test_replays_in_any_order_never_double_count(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    evs = events()
    store.ingest(evs[:3] + evs[4:])  # g-a-0 is "lost" and arrives later (redelivery)
    assert store.completeness("r1") == (10, 20)
    store.ingest([evs[3], evs[4], evs[0]])  # the late batch plus replays of old ones
    store.ingest(evs)  # a full replay
    assert store.completeness("r1") == (20, 20)
    con = store.con
    assert con.execute("SELECT count(*) FROM agents").fetchone() == (20,)
    assert con.execute("SELECT count(*) FROM rounds").fetchone() == (1,)
    assert con.execute("SELECT count(*) FROM (SELECT agent_id FROM guesses GROUP BY run_id, round, agent_id HAVING count(*) > 1)").fetchone() == (0,)
    store.close()


def test_close_releases_the_file_for_readers(tmp_path):
    path = tmp_path / "x.duckdb"
    store = Store(path)
    store.ingest(events())
    store.close()
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM guesses").fetchone() == (20,)
    store.ingest(events("r2"))  # reopens lazily
    assert store.count_outcomes("r2") == 20
    store.close()


def test_profiles_and_manifest_are_stored_with_the_run(tmp_path):
    import json

    blob = "".join(json.dumps({"profile": {"education": e, "age": 20 + i}, "persona": {"name": f"N{i}"},
                               "provenance": {"persona_index": i % 2}}) + "\n"
                   for i, e in enumerate(["Ph.D.", "high school", "Ph.D."])).encode()
    cfg = RunConfig(agents=3, rounds=1)
    started = RunStarted(run_id="p1", config=cfg, started_at=1e9, hosts=["a"], tables=TABLES,
                         manifest={"config_hash": "h"})
    store = Store(tmp_path / "x.duckdb")
    store.ingest([Event("p1.started", "started", started, blob=blob)])
    store.ingest([Event("p1.started", "started", started, blob=blob)])  # a replay adds nothing
    store.close()
    con = duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True)
    rows = con.execute("SELECT agent_id, persona_index, profile->>'education', persona->>'name' "
                       "FROM agent_profiles WHERE run_id = 'p1' ORDER BY agent_id").fetchall()
    assert rows == [(0, 0, "Ph.D.", "N0"), (1, 1, "high school", "N1"), (2, 0, "Ph.D.", "N2")]
    assert json.loads(con.execute("SELECT manifest_json FROM runs").fetchone()[0]) == {"config_hash": "h"}


def test_a_bad_personas_blob_does_not_block_ingestion(tmp_path):
    started = RunStarted(run_id="p2", config=RunConfig(agents=2), started_at=1e9, hosts=["a"], tables=TABLES)
    store = Store(tmp_path / "x.duckdb")
    store.ingest([Event("p2.started", "started", started, blob=b"not json\n")])
    assert store.con.execute("SELECT count(*) FROM runs").fetchone() == (1,)
    assert store.con.execute("SELECT count(*) FROM agent_profiles").fetchone() == (0,)


GROUPED = SimulationTables(
    simulation="pg", outcomes="pg_outcomes", rounds="pg_rounds", grouped=True, measure="contribution",
    measure_kind="numeric",
    outcome_columns=[Column(name="contribution", type="BIGINT"), Column(name="note", type="JSON")],
    summary_columns=[Column(name="mean_contribution", type="DOUBLE"), Column(name="counts", type="JSON")])


def test_a_simulations_declared_tables_are_created_and_filled(tmp_path):
    cfg = RunConfig(simulation="pg", agents=3, rounds=1)
    batch = OutcomeBatch(run_id="g1", round=1, host_id="a", seq=0, agent_ids=[0, 1, 2],
                         columns={"contribution": [5, None, 20], "note": [{"k": 1}, None, [1, 2]]},
                         valid=[True, False, True], raws=["5", "?", "20"], latency_ms=[1.0, 2.0, 3.0],
                         errors=[None, "agent: ValueError: x", None], group_ids=[0, 0, 1])
    result = RoundResult(run_id="g1", round=1, n=3, n_valid=2, summary={"mean_contribution": 12.5,
                                                                          "counts": {"a": 1}},
                         observation={}, closed_at=1e9)
    store = Store(tmp_path / "x.duckdb")
    store.ingest([Event("g1.s", "started", RunStarted(run_id="g1", config=cfg, started_at=1e9, hosts=["a"],
                                                        tables=GROUPED)),
                  Event("g1.o", "outcomes", batch), Event("g1.r", "round.result", result)])
    assert store.completeness("g1") == (3, 3)
    con = store.con
    assert [r[0] for r in con.execute("DESCRIBE pg_outcomes").fetchall()] == [
        "run_id", "round", "agent_id", "group_id", "contribution", "note", "valid", "raw", "latency_ms", "error"]
    rows = con.execute("SELECT agent_id, group_id, contribution, note->>'k', valid, error FROM pg_outcomes "
                       "ORDER BY agent_id").fetchall()
    assert rows == [(0, 0, 5, "1", True, None), (1, 0, None, None, False, "agent: ValueError: x"), (2, 1, 20, None, True, None)]
    assert con.execute("SELECT n, n_valid, mean_contribution, counts->>'a' FROM pg_rounds").fetchone() == (3, 2, 12.5, "1")
    store.close()
    # after a restart the run's tables come from the runs table: late batches still land
    again = Store(tmp_path / "x.duckdb")
    assert again.tables_of("g1") == GROUPED
    assert again.completeness("g1") == (3, 3)
    again.close()


def test_a_database_from_before_the_seam_gains_the_new_columns(tmp_path):
    path = str(tmp_path / "old.duckdb")
    with duckdb.connect(path) as con:  # the tables as release 0.1 created them
        con.execute("CREATE TABLE guesses (run_id VARCHAR, round INTEGER, agent_id BIGINT, value DOUBLE, "
                    "valid BOOLEAN, raw VARCHAR, latency_ms DOUBLE)")
        con.execute("CREATE TABLE rounds (run_id VARCHAR, round INTEGER, n_valid BIGINT, mean DOUBLE, target DOUBLE, "
                    "winner_agent_id BIGINT, winner_value DOUBLE, n BIGINT, n_winners BIGINT, closed_at TIMESTAMP)")
        con.execute("INSERT INTO guesses VALUES ('old', 1, 0, 5.0, true, '5', 1.0)")
    store = Store(path)
    store.ingest(events("r9"))
    assert store.completeness("r9") == (20, 20)
    assert store.con.execute("SELECT count(*), count(error) FROM guesses").fetchone() == (21, 0)
    assert store.con.execute("SELECT n, n_valid, mean FROM rounds WHERE run_id = 'r9'").fetchone() == (20, 17, 1.0)
    store.close()


def test_rounds_record_cached_tokens_and_dollars_and_an_older_rounds_table_gains_them(tmp_path):
    from populace.analysis import round_table, run_usage
    from populace.core.contracts import Usage

    path = str(tmp_path / "old.duckdb")
    evs = events("r8")
    result = next(e for e in evs if e.kind == "round.result")
    result.model = result.model.model_copy(update={"usage": Usage(llm_calls=20, prompt_tokens=2000, cached_tokens=800,
                                                                  completion_tokens=300, dollars=0.0123)})
    store = Store(path)
    store.ingest(events("r7"))  # a run on the old columns only, then the table loses the new ones
    store.con.execute("ALTER TABLE rounds DROP COLUMN cached_tokens")
    store.con.execute("ALTER TABLE rounds DROP COLUMN dollars")
    store.close()
    with duckdb.connect(path, read_only=True) as con:  # a file from before: usage without its cost
        assert run_usage(con, "r7")["llm_calls"] == 0 and "dollars" not in run_usage(con, "r7")
        assert round_table(con, "r7")[0]["usage"] == {"llm_calls": 0, "prompt_tokens": 0, "completion_tokens": 0,
                                                      "infra_retries": 0}
    store = Store(path)  # a new recorder adds the columns to the old table (ALTER TABLE … ADD COLUMN)
    store.ingest(evs)
    assert store.con.execute("SELECT cached_tokens, dollars FROM rounds WHERE run_id = 'r8'").fetchone() == (800, 0.0123)
    assert store.con.execute("SELECT cached_tokens, dollars FROM rounds WHERE run_id = 'r7'").fetchone() == (None, None)
    types = dict(store.con.execute("SELECT column_name, data_type FROM duckdb_columns() WHERE table_name = 'rounds'")
                 .fetchall())
    assert (types["cached_tokens"], types["dollars"]) == ("BIGINT", "DOUBLE")
    store.close()
    with duckdb.connect(path, read_only=True) as con:
        used = run_usage(con, "r8")
        assert (used["cached_tokens"], used["dollars"], used["prompt_tokens"]) == (800, 0.0123, 2000)
        assert round_table(con, "r8")[0]["usage"]["dollars"] == 0.0123
        assert round_table(con, "r7")[0]["usage"]["dollars"] == 0.0  # NULL in a row from before: nothing recorded


def test_a_table_another_simulation_declared_differently_is_refused(tmp_path):
    store = Store(tmp_path / "x.duckdb")
    store.ingest(events("r1"))
    clash = TABLES.model_copy(update={"outcome_columns": [Column(name="value", type="VARCHAR")]})
    started = RunStarted(run_id="c1", config=RunConfig(), started_at=1e9, hosts=["a"], tables=clash)
    with pytest.raises(StoreError, match="column value is DOUBLE .* but this run declares VARCHAR"):
        store.ingest([Event("c1.s", "started", started)])
    assert store.completeness("r1") == (20, 20)  # nothing of the refused transaction landed


def _result(run_id: str, round_: int, mean: float, epoch: int = 0, shares=("a@0", "b@0")) -> RoundResult:
    return RoundResult(run_id=run_id, round=round_, n=20, n_valid=17, epoch=epoch, shares=list(shares),
                       summary={"mean": mean, "target": mean / 2, "winner_agent_id": 1, "winner_value": 1.0,
                                "n_winners": 1}, observation={}, closed_at=1e9 + round_)


def _epoch(batch: OutcomeBatch, epoch: int) -> OutcomeBatch:
    return batch.model_copy(update={"epoch": epoch})


def test_a_resume_replaces_the_rounds_it_replays_and_stale_epochs_never_count(tmp_path):
    """Round 2 was in play when the run was cancelled; the resume (epoch 1, after round 1)
    places every agent again (share c@1) and plays round 2 again. What the replaced shares
    recorded of round 2 goes, whenever it arrives, and the agents' hosts are where the resume
    placed them."""
    store = Store(tmp_path / "x.duckdb")
    cfg = RunConfig(agents=20, rounds=2)
    first = events(rounds=2)[:3]  # started, spawn a, spawn b
    ids_a, ids_b = list(range(10)), list(range(10, 20))
    store.ingest(first + [
        Event("r1.g1a", "outcomes", guess_batch("r1", 1, "a", 0, ids_a)),
        Event("r1.g1b", "outcomes", guess_batch("r1", 1, "b", 0, ids_b)),
        Event("r1.res1", "round.result", _result("r1", 1, 1.0)),
        Event("r1.g2a", "outcomes", guess_batch("r1", 2, "a", 1, ids_a)),  # round 2, epoch 0: stale soon
        Event("r1.done0", "done", RunDone(run_id="r1", status="cancelled", rounds=1, finished_at=1e9, reason="x")),
    ])
    assert store.con.execute("SELECT status FROM runs").fetchone() == ("cancelled",)
    late_old = Event("r1.g2b", "outcomes", guess_batch("r1", 2, "b", 1, ids_b))  # epoch 0, arrives after the resume
    store.ingest([
        Event("r1.resumed", "resumed", RunResumed(run_id="r1", epoch=1, after_round=1, hosts=["c"], resumed_at=1e9)),
        Event("r1.spawn-c", "spawn", SpawnBatch(run_id="r1", host_id="c", ranges=[(0, 20)], config_ref=ConfigRef.of(cfg), epoch=1,
                                                    from_round=2)),
        late_old,
        Event("r1.g2c", "outcomes", _epoch(guess_batch("r1", 2, "c", 0, ids_a + ids_b), 1)),
        Event("r1.res2-old", "round.result", _result("r1", 2, 99.0, epoch=0)),  # the old epoch's straggler
        Event("r1.res2", "round.result", _result("r1", 2, 2.0, epoch=1, shares=("c@1",))),
        Event("r1.done1", "done", RunDone(run_id="r1", status="completed", rounds=2, finished_at=1e9, epoch=1)),
    ])
    con = store.con
    assert con.execute("SELECT round, count(*), count(DISTINCT agent_id) FROM guesses GROUP BY 1 ORDER BY 1"
                       ).fetchall() == [(1, 20, 20), (2, 20, 20)]
    assert con.execute("SELECT round, mean FROM rounds ORDER BY 1").fetchall() == [(1, 1.0), (2, 2.0)]
    assert con.execute("SELECT host_id, count(*) FROM agents GROUP BY 1").fetchall() == [("c", 20)]
    assert con.execute("SELECT status, reason, hosts FROM runs").fetchone() == ("completed", None, ["c"])
    assert store.completeness("r1") == (40, 40)
    store.close()
    # a restarted recorder knows the resume: the old epoch's batch redelivered is still stale
    again = Store(tmp_path / "x.duckdb")
    again.ingest([Event("r1.g2b-redelivered", "outcomes", guess_batch("r1", 2, "b", 7, ids_b))])
    assert again.completeness("r1") == (40, 40)
    again.close()


def test_a_lost_hosts_share_placed_again_replaces_only_its_agents_rows_from_the_round_in_play(tmp_path):
    """Host b stopped in round 2 after part of its batches; its agents were placed on a
    (share a@1, from round 2). Its rows of round 2 go, a's own rows stay, b's late batches and
    the result decided with b never count; the result decided again counts."""
    store = Store(tmp_path / "x.duckdb")
    cfg = RunConfig(agents=20, rounds=2)
    ids_a, ids_b = list(range(10)), list(range(10, 20))
    store.ingest(events(rounds=2)[:3] + [
        Event("r1.g1a", "outcomes", guess_batch("r1", 1, "a", 0, ids_a)),
        Event("r1.g1b", "outcomes", guess_batch("r1", 1, "b", 0, ids_b)),
        Event("r1.res1", "round.result", _result("r1", 1, 1.0)),
        Event("r1.g2a", "outcomes", guess_batch("r1", 2, "a", 1, ids_a)),
        Event("r1.g2b-part", "outcomes", guess_batch("r1", 2, "b", 1, ids_b[:4])),
    ])
    store.ingest([
        Event("r1.spawn-a1", "spawn", SpawnBatch(run_id="r1", host_id="a", ranges=[(10, 10)], config_ref=ConfigRef.of(cfg), epoch=1,
                                                 from_round=2)),
        Event("r1.g2b-late", "outcomes", guess_batch("r1", 2, "b", 2, ids_b[4:])),  # the lost host's straggler
        Event("r1.res2-b", "round.result", _result("r1", 2, 99.0)),  # decided with b before the re-placement
        Event("r1.g2a1", "outcomes", _epoch(guess_batch("r1", 2, "a", 0, ids_b), 1)),
        Event("r1.res2", "round.result", _result("r1", 2, 2.0, epoch=1, shares=("a@0", "a@1"))),
    ])
    con = store.con
    assert con.execute("SELECT round, count(*), count(DISTINCT agent_id) FROM guesses GROUP BY 1 ORDER BY 1"
                       ).fetchall() == [(1, 20, 20), (2, 20, 20)]
    assert con.execute("SELECT round, mean FROM rounds ORDER BY 1").fetchall() == [(1, 1.0), (2, 2.0)]
    assert con.execute("SELECT host_id, min(agent_id), count(*) FROM agents GROUP BY 1 ORDER BY 1").fetchall() == [
        ("a", 0, 20)]
    # a forged batch from a share nobody placed never counts
    store.ingest([Event("r1.forged", "outcomes", guess_batch("r1", 2, "intruder", 0, [0, 1]))])
    assert store.completeness("r1") == (40, 40)
    store.close()


def test_only_the_outcomes_a_run_expects_are_stored_whatever_their_message_ids(tmp_path):
    """Forged or replayed batches are refused with the reason (the service dead-letters them)
    and never add a row: a share never placed, agents outside the sender's share, a second
    outcome for an agent and round (a replay under a fresh id), a round the run does not have,
    call records of agents it does not have."""
    store = Store(tmp_path / "x.duckdb")
    evs = events()
    store.ingest(evs[:3])  # started, spawn a (agents 0-9), spawn b (10-19)
    forged = [
        Event("x1", "outcomes", guess_batch("r1", 1, "host-9", 0, list(range(10)))),
        Event("x2", "outcomes", guess_batch("r1", 1, "a", 1, list(range(5, 15)))),
        Event("x3", "outcomes", guess_batch("r1", 2, "a", 2, list(range(10)))),
        Event("x4", "outcomes", guess_batch("r1", 1, "b", 3, [10, 11, 11])),
        Event("x5", "calls", LlmCallBatch(run_id="r1", round=1, batch_id="b", agent_ids=[3, 25], replicas=["r", "r"],
                                          prompt_tokens=[1, 1], completion_tokens=[1, 1], latency_ms=[1.0, 1.0],
                                          attempts=[1, 1], valid=[True, True])),
    ]
    out = store.ingest(evs[3:5] + forged)
    assert out.outcomes == 20
    assert dict(out.refused) == {
        "x1": "share host-9@0 was never placed in run r1",
        "x2": "agent 10 is not one of share a@0's agents",
        "x3": "round 2: run r1 has 1 rounds",
        "x4": "agent 11 appears twice in the batch",
        "x5": "agent 25: run r1 has 20 agents",
    }
    # a replay of a stored batch under a new id (or none: the stream sequence), now and after a restart
    replay = Event("seq:991", "outcomes", guess_batch("r1", 1, "a", 0, list(range(10))))
    assert dict(store.ingest([replay]).refused) == {"seq:991": "agent 0 already has an outcome in round 1"}
    store.close()
    again = Store(tmp_path / "x.duckdb")
    replay.msg_id = "seq:992"
    assert dict(again.ingest([replay]).refused) == {"seq:992": "agent 0 already has an outcome in round 1"}
    assert again.completeness("r1") == (20, 0)
    assert again.con.execute("SELECT count(*), count(DISTINCT agent_id) FROM guesses").fetchone() == (20, 20)
    again.close()


def test_a_valid_value_outside_the_runs_declared_range_is_refused():
    from populace.store.columns import BadColumns, check_outcomes

    tables = TABLES.model_copy(update={"measure_range": (0.0, 100.0)})
    fine = guess_batch("r1", 1, "a", 0, list(range(10)))
    assert check_outcomes(fine, tables)[0].columns["value"] == fine.columns["value"]
    forged = fine.model_copy(update={"columns": {"value": [5.0] * 9 + [1e308]}})
    with pytest.raises(BadColumns, match=r"columns.value\[9\]: 1e\+308 is outside the run's declared range \[0, 100\]"):
        check_outcomes(forged, tables)
    invalid = forged.model_copy(update={"valid": [True] * 9 + [False]})  # an invalid row's value is not checked
    check_outcomes(invalid, tables)


def test_a_full_disk_stores_nothing_marks_nothing_and_everything_once_space_returns(small_disk):
    """The COMMIT fails on a full filesystem and DuckDB has already aborted the transaction, so
    ROLLBACK itself raises: the failure must still say "disk full at PATH", leave no agent
    marked as recorded, and the same events, ingested again once there is room, all count."""
    from populace.store.store import DiskFull

    agents, half = 4000, 2000  # rows enough to need new pages of the filesystem
    cfg = RunConfig(agents=agents, rounds=1)
    result = RoundResult(run_id="r1", round=1, n=agents, n_valid=agents, summary={"mean": 1.0}, observation={},
                         closed_at=1e9)
    path = small_disk.path / "x.duckdb"
    store = Store(path)
    store.ingest([Event("started", "started", RunStarted(run_id="r1", config=cfg, started_at=1e9, hosts=["a", "b"],
                                                         tables=TABLES)),
                  Event("spawn-a", "spawn", SpawnBatch(run_id="r1", host_id="a", ranges=[(0, half)], config_ref=ConfigRef.of(cfg))),
                  Event("spawn-b", "spawn", SpawnBatch(run_id="r1", host_id="b", ranges=[(half, half)], config_ref=ConfigRef.of(cfg)))])
    later = [Event("g-a", "outcomes", guess_batch("r1", 1, "a", 0, list(range(half)))),
             Event("g-b", "outcomes", guess_batch("r1", 1, "b", 0, list(range(half, agents)))),
             Event("result", "round.result", result),
             Event("done", "done", RunDone(run_id="r1", status="completed", rounds=1, finished_at=1e9 + 5))]
    small_disk.fill()
    with pytest.raises(DiskFull, match=f"disk full at {path}: .*No space left on device"):
        store.ingest(later)
    with pytest.raises(DiskFull):  # still full: the same again, and still nothing half-written
        store.ingest(later)
    small_disk.free()
    out = store.ingest(later)  # redelivered once there is room: every outcome counts, none refused
    assert (out.outcomes, out.refused) == (agents, [])
    assert store.completeness("r1", 1) == (agents, agents)
    store.close()
    with duckdb.connect(str(path), read_only=True) as con:
        assert con.execute("SELECT count(*), count(DISTINCT agent_id) FROM guesses").fetchone() == (agents, agents)
        assert con.execute("SELECT status FROM runs").fetchone() == ("completed",)


def test_a_valid_value_outside_the_runs_declared_options_is_refused():
    from populace.store.columns import BadColumns, check_outcomes

    tables = SimulationTables(simulation="walk", outcomes="walks", outcome_columns=[Column(name="move", type="VARCHAR")],
                              rounds="walk_rounds", summary_columns=[], measure="move", measure_kind="categorical",
                              measure_options=["go", "stay"])
    batch = OutcomeBatch(run_id="r1", round=1, host_id="a", seq=0, agent_ids=[0, 1, 2],
                         columns={"move": ["go", "stay", "maybe"]}, valid=[True, True, True], raws=["x"] * 3,
                         latency_ms=[1.0] * 3, errors=[None] * 3)
    with pytest.raises(BadColumns, match=r"columns.move\[2\]: 'maybe' is not one of the run's declared options"):
        check_outcomes(batch, tables)
    check_outcomes(batch.model_copy(update={"valid": [True, True, False]}), tables)  # an invalid row's value: kept


def test_a_start_seen_again_does_not_open_its_run_again(tmp_path):
    """The app keeps a run active (the file open) from its start to its recording; a start
    redelivered after that (a re-created durable reads from its last ack) must not count as a
    new one, or the file stays locked for readers for good (CI, fuzz durables test)."""
    store = Store(tmp_path / "x.duckdb")
    first = store.ingest(events())
    assert first.opened == {"r1"}
    again = store.ingest(events())
    assert again.opened == set() and again.finished == []
    resumed = RunResumed(run_id="r1", epoch=1, after_round=1, hosts=["a"], resumed_at=2e9)
    assert store.ingest([Event("r1.resumed.1", "resumed", resumed)]).opened == {"r1"}
    store.close()


def _partial(run_id: str, round_: int, host: str, view_s: float, epoch: int = 0) -> RoundPartial:
    return RoundPartial(run_id=run_id, round=round_, host_id=host, n=10, n_valid=10, payload={}, epoch=epoch,
                        profile=ShareProfile(agents=10, wall_s=view_s + 1.0, view_s=view_s, turn_s=0.5,
                                             merge_s=0.01, model_wait_s=1.0, view_bytes=4000, view_max_bytes=400,
                                             observation_bytes=30, held=3))


def test_round_profile_rows_come_from_placed_shares_the_result_and_the_recorders_own_time(tmp_path):
    """Table round_profile: a row per round and placed share (from its partial's profile; a
    partial of a share the run never placed counts nowhere, a share's partial delivered again
    replaces its row), the environment's (from the round's result), the recorder's record seconds
    (its transactions', shared among the rounds they stored by rows); a resume drops the rows of
    the rounds it plays again."""
    store = Store(tmp_path / "x.duckdb")
    first = events(rounds=2)[:3]  # started, spawn a, spawn b
    ids_a, ids_b = list(range(10)), list(range(10, 20))
    result = _result("r1", 1, 1.0).model_copy(update={"profile": DecideProfile(merge_s=0.02, decide_s=0.25,
                                                                               observation_bytes=30)})
    store.ingest(first + [
        Event("r1.g1a", "outcomes", guess_batch("r1", 1, "a", 0, ids_a)),
        Event("r1.g1b", "outcomes", guess_batch("r1", 1, "b", 0, ids_b)),
        Event("r1.p1a", "partial", _partial("r1", 1, "a", 8.0)),
        Event("r1.p1b", "partial", _partial("r1", 1, "b", 2.0)),
        Event("r1.p1z", "partial", _partial("r1", 1, "z", 99.0)),  # never placed
        Event("r1.res1", "round.result", result),
        Event("r1.g2a", "outcomes", guess_batch("r1", 2, "a", 1, ids_a)),
    ])
    store.ingest([Event("r1.p1a-again", "partial", _partial("r1", 1, "a", 7.5))])  # its row, replaced
    rows = store.con.execute("SELECT round, role, host_id, epoch, agents, view_s, decide_s, record_s > 0 "
                             "FROM round_profile ORDER BY round, role, host_id").fetchall()
    assert rows == [(1, "environment", "environment", 0, None, None, 0.25, None),
                    (1, "host", "a", 0, 10, 7.5, None, None), (1, "host", "b", 0, 10, 2.0, None, None),
                    (1, "recorder", "recorder", 0, None, None, None, True),
                    (2, "recorder", "recorder", 0, None, None, None, True)]
    # the first transaction's seconds, shared 2:1 between round 1's 20 rows and round 2's 10
    (r1, r2) = [r[0] for r in store.con.execute("SELECT record_s FROM round_profile WHERE role = 'recorder' "
                                                "ORDER BY round").fetchall()]
    assert r1 == pytest.approx(2 * r2)
    store.ingest([Event("r1.resumed", "resumed", RunResumed(run_id="r1", epoch=1, after_round=0, hosts=["c"],
                                                            resumed_at=1e9))])
    assert store.con.execute("SELECT count(*) FROM round_profile").fetchone() == (0,)
    store.close()
