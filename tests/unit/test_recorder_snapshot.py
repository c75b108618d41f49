"""The recorder's copy of some runs (populace.store.snapshot): the whole runs table, only the
asked runs' rows elsewhere, no ingestion ledger, every table present even when empty, and one
consistent instant while another cursor keeps appending."""

from __future__ import annotations

import threading

import duckdb
import pytest

from populace.store.snapshot import write_snapshot


@pytest.fixture
def con(tmp_path):
    c = duckdb.connect(str(tmp_path / "rec.duckdb"))
    c.execute("CREATE TABLE runs (run_id VARCHAR, status VARCHAR);"
              "CREATE TABLE guesses (run_id VARCHAR, round INTEGER, agent_id BIGINT, value DOUBLE);"
              "CREATE TABLE llm_calls (run_id VARCHAR, round INTEGER);"
              "CREATE TABLE _ingested (msg_id VARCHAR PRIMARY KEY)")
    c.execute("INSERT INTO runs VALUES ('a', 'running'), ('b', 'completed')")
    c.execute("INSERT INTO guesses SELECT r, 1, i, i FROM (VALUES ('a'), ('b')) t(r), range(1000) u(i)")
    c.execute("INSERT INTO _ingested VALUES ('m1')")
    yield c
    c.close()


def test_only_the_asked_runs_rows_and_the_whole_runs_table(con, tmp_path):
    path = tmp_path / "copy.duckdb"
    assert write_snapshot(con, path, ["a", "nope"]) == ["a"]
    with duckdb.connect(str(path), read_only=True) as copy:
        assert copy.execute("SELECT count(*) FROM runs").fetchone() == (2,)
        assert copy.execute("SELECT DISTINCT run_id FROM guesses").fetchall() == [("a",)]
        assert copy.execute("SELECT count(*) FROM llm_calls").fetchone() == (0,)  # there, empty
        tables = {r[0] for r in copy.execute("SHOW TABLES").fetchall()}
    assert "_ingested" not in tables
    # the recorder's own database is left as it was: nothing attached, nothing open
    assert {r[0] for r in con.execute("SELECT database_name FROM duckdb_databases()").fetchall()} == {
        "rec", "system", "temp"}


def test_runs_table_alone_when_no_run_is_asked(con, tmp_path):
    path = tmp_path / "index.duckdb"
    assert write_snapshot(con, path, []) == []
    with duckdb.connect(str(path), read_only=True) as copy:
        assert copy.execute("SELECT count(*) FROM runs").fetchone() == (2,)
        assert copy.execute("SELECT count(*) FROM guesses").fetchone() == (0,)


def test_an_existing_file_is_never_overwritten(con, tmp_path):
    path = tmp_path / "there.duckdb"
    path.write_bytes(b"x")
    with pytest.raises(FileExistsError):
        write_snapshot(con, path, ["a"])


def test_one_instant_while_another_cursor_appends(con, tmp_path):
    stop = threading.Event()

    def append() -> None:
        cur = con.cursor()
        n = 1000
        while not stop.is_set():  # whole batches of 100: a torn copy would show a partial one
            cur.execute("INSERT INTO guesses SELECT 'a', 2, i, i FROM range(?, ?) u(i)", [n, n + 100])
            n += 100
        cur.close()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        for k in range(5):
            path = tmp_path / f"copy-{k}.duckdb"
            write_snapshot(con, path, ["a"])
            with duckdb.connect(str(path), read_only=True) as copy:
                (n,) = copy.execute("SELECT count(*) FROM guesses WHERE round = 2").fetchone()
            assert n % 100 == 0
    finally:
        stop.set()
        writer.join()


async def test_without_a_snapshots_store_the_recorder_still_starts_and_says_why(monkeypatch):
    from types import SimpleNamespace

    from populace.core import bus
    from populace.core.contracts import SnapshotReply, SnapshotRequest
    from populace.recorder.read_server import Reads

    async def refused(*_a, **_k):
        raise PermissionError("Permissions Violation for $JS.API.STREAM.CREATE.OBJ_snapshots")

    monkeypatch.setattr(bus, "provision_snapshots", refused)
    logged = []
    svc = SimpleNamespace(settings=SimpleNamespace(storage="memory", stream_replicas=1), js=None,
                          log=SimpleNamespace(error=lambda event, **kw: logged.append(event)))
    reads = Reads(svc, store=None)
    await reads.start()  # no exception: recording goes on
    reply = SnapshotReply.model_validate_json(await reads.snapshot(SnapshotRequest(run_ids=["a"]), None))
    assert not reply.ok and "no snapshots store" in reply.error and "Permissions Violation" in reply.error
    assert logged == ["snapshots_unavailable"]


async def test_too_many_runs_for_one_copy_is_a_read_error_not_a_traceback():
    from populace.client.reads import ReadError, request_snapshot

    with pytest.raises(ReadError, match="cannot ask for these runs: run_ids"):
        await request_snapshot(None, [f"r{i}" for i in range(300)])
