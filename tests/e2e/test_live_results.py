"""Results of a run read while it is being written: the recorder holds the DuckDB file (no other
process can open it), so `populace results`, `report` and `export` get a consistent copy of
the run's rows from the recorder over the bus. The live figures of each closed round are the
figures the finished run has; a malformed read request is dead-lettered and answered.

The commands run in this process (the `cli` fixture, typer's runner on the real app): what is under
test is the recorder's copy over the bus and the file lock, not the console script (test_cli.py)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time

import duckdb
import pytest

from populace.client.prepare import prepare
from populace.client.run import play, run_state
from populace.client.stack import Stack
from populace.core import bus, replies, subjects
from populace.core.contracts import ReadReply, RunConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

AGENTS, ROUNDS = 200, 5
CONFIG = {"agents": AGENTS, "rounds": ROUNDS, "seed": 5, "model": {"latency_s": 0.4, "seed": 8}}
# rounds of about 8 s (10 agents at a time, 0.4 s each), so the run is still going when read:
# rounds 3 to 5 outlast the first CLI command, the one that must find the run running, also on a
# loaded machine; `report` and `export` read the file itself if the run is over by then. (When
# all three had to find it running, rounds of 5 s were too short there.) The waves make the pace,
# not the agents: 2,000 agents 100 at a time made the same 20 waves a round.
SLOW = {"POPULACE_MAX_IN_FLIGHT": "10", "POPULACE_OUTCOME_BATCH_SIZE": "10"}
# a process that holds a DuckDB file (argv[1]) until its stdin closes
HOLD = ("import duckdb, sys; con = duckdb.connect(sys.argv[1]); con.execute('CREATE TABLE runs (run_id VARCHAR)'); "
        "print('held', flush=True); sys.stdin.read(); con.close()")


@pytest.fixture(scope="module")
def stack(stacks):
    """The services in one process: the recorder still holds the file against every other process."""
    return stacks(hosts=1, env={"POPULACE_STORAGE": "memory", **SLOW}, one_process=True)


def state(stack: Stack, rid: str):
    async def go():
        nc = await bus.connect(stack.url, "e2e-live")
        try:
            return await run_state(nc, rid)
        finally:
            await nc.close()

    return asyncio.run(go())


def test_results_report_and_export_of_a_live_run(stack, tmp_path, cli):
    # what `results` imports on first use, imported before the run: in this process the first
    # command pays for it, and at a load of 12, with 4 rounds, it once found the run over
    import populace.analysis
    import populace.cli.reading  # noqa: F401

    prepared = prepare(RunConfig.model_validate(CONFIG))
    outcome: dict = {}

    def run() -> None:
        async def go():
            nc = await bus.connect(stack.url, "e2e-live-play")
            try:
                outcome["out"] = await play(nc, prepared.config, run_id="live-1", manifest=prepared.manifest,
                                            stall_s=120)
            finally:
                await nc.close()

        asyncio.run(go())

    player = threading.Thread(target=run, daemon=True)
    player.start()
    deadline = time.monotonic() + 120
    while (s := state(stack, "live-1")) is None or s.round < 3:  # rounds 1 and 2 closed
        assert time.monotonic() < deadline, "the run did not reach round 3"
        time.sleep(0.2)
    with pytest.raises(duckdb.IOException):  # the recorder holds the file: only a copy can be read
        duckdb.connect(stack.db, read_only=True).close()

    live = cli("results", "last", "--db", stack.db, "--nats", stack.url, "--json")
    assert live.returncode == 0, live.stderr
    assert "being written by a recorder" in live.stderr
    run_live = json.loads(live.stdout)["runs"][0]
    assert run_live["run_id"] == "live-1" and run_live["status"] == "running"
    closed = [r for r in run_live["rounds"] if r["n"] == AGENTS]
    assert len(closed) >= 2

    report = cli("report", "live-1", "--db", stack.db, "--nats", stack.url, "--out", str(tmp_path / "r.html"))
    assert report.returncode == 0, report.stderr
    assert "live-1" in (tmp_path / "r.html").read_text()
    export = cli("export", "live-1", "--db", stack.db, "--nats", stack.url, "--out", str(tmp_path / "x"))
    assert export.returncode == 0, export.stderr
    assert list((tmp_path / "x").glob("*.parquet"))

    player.join(180)
    assert outcome["out"].status == "completed", outcome["out"].reason
    final = cli("results", "live-1", "--db", stack.db, "--json")
    assert final.returncode == 0, final.stderr
    assert "being written" not in final.stderr  # the recorder let the file go: read directly
    by_round = {r["round"]: r for r in json.loads(final.stdout)["runs"][0]["rounds"]}
    assert len(by_round) == ROUNDS
    for r in closed:  # a round closed in the live copy has the figures it has in the end
        want = by_round[r["round"]]
        assert {k: v for k, v in r.items() if k != "calls"} == {k: v for k, v in want.items() if k != "calls"}


def test_no_recorder_to_ask_is_a_clear_error(tmp_path, cli):
    held = tmp_path / "held.duckdb"
    # another process holds it, as a recorder would (not this one: the command runs in it, and DuckDB
    # refuses a second configuration of a file a process has open, a ConnectionException, not the lock)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        # the `cli` fixture fails the test on an exception the command did not turn into an exit
        out = cli("results", "last", "--db", str(held), "--nats", "nats://127.0.0.1:1")
    finally:
        holder.communicate("", timeout=30)
    assert out.returncode == 1
    assert "--db" in out.stderr and "--nats" in out.stderr


def test_a_malformed_read_request_is_dead_lettered_and_answered(stack):
    async def go():
        nc = await bus.connect(stack.url, "e2e-live-bad")
        try:
            js = nc.jetstream()
            before = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
            msg = await replies.request(nc, "recorder", subjects.recorder_read("snapshot", replies.requester(nc)),
                                        b'{"run_ids": "not a list"}', timeout=10)
            for _ in range(50):
                after = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
                if after > before:
                    break
                await asyncio.sleep(0.1)
            return ReadReply.model_validate_json(msg.data), after - before
        finally:
            await nc.close()

    reply, dead = asyncio.run(go())
    assert not reply.ok and "malformed" in reply.error
    assert dead == 1
