"""The recorder's disk fills up in the middle of a run (a real tmpfs of a few MB under the
recorder): the run pauses saying "disk full at PATH" (`populace follow` shows it), no
outcome is dead-lettered or lost; once space is freed the recorder stores what it held, and
`resume` finishes the run with every outcome recorded exactly once, equal to an undisturbed
run's. Every service runs in one process (`one_process=True`): nothing here kills, restarts or
measures one, and the recorder's log lines carry its name."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from test_faults_e2e import guesses, play_with, summaries

from populace.client.run import resume
from populace.client.stack import ONE_PROCESS, Stack
from populace.core import bus

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS = 1000, 5
CONFIG = {"agents": AGENTS, "rounds": ROUNDS, "seed": 8, "model": {"latency_s": 0.5, "seed": 31}}


def recorder_events(stack: Stack) -> list[dict]:
    """The recorder's events, from the log its services share (each line names its service)."""
    lines = (Path(stack.log_dir) / f"{ONE_PROCESS}.log").read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [e for e in events if e.get("service") == "recorder"]


def test_a_full_disk_pauses_the_run_and_once_space_returns_every_outcome_is_recorded_once(small_disk, cli):
    db = small_disk.path / "populace.duckdb"
    with Stack(hosts=2, db=str(db), env={"POPULACE_STORAGE": "file"}, one_process=True).up(timeout=90) as stack:
        reference, _, _ = play_with(stack, config=CONFIG)
        assert reference.status == "completed", reference.reason

        out, state, _ = play_with(stack, small_disk.fill, at_round=2, config=CONFIG)
        assert out.status == "paused", (out.status, out.reason)
        assert out.reason.startswith(f"disk full at {db}: the recorder cannot store"), out.reason
        assert state.status == "paused"
        followed = cli("follow", out.run_id, "--nats", stack.url, "--no-progress")  # in process: the stack answers
        assert followed.returncode == 1 and f"disk full at {db}" in followed.stdout, followed.stdout + followed.stderr
        assert any(e.get("event") == "disk_full" and e.get("db") == str(db) for e in recorder_events(stack))

        small_disk.free()

        async def go():
            nc = await bus.connect(stack.url, "e2e-disk-full")
            try:
                return await asyncio.wait_for(resume(nc, out.run_id, stall_s=120), timeout=240)
            finally:
                await nc.close()

        done = asyncio.run(go())
        assert done.status == "completed", done.reason
        assert done.recorded is not None and done.recorded.outcomes == AGENTS * ROUNDS
        got = guesses(stack.db, out.run_id)
        assert [(g[0], g[1]) for g in got] == [(n, a) for n in range(1, ROUNDS + 1) for a in range(AGENTS)]
        assert got == guesses(stack.db, reference.run_id)
        assert summaries(stack.db, out.run_id) == summaries(stack.db, reference.run_id)
        events = recorder_events(stack)
        assert not [e for e in events if e.get("event") == "dead_letter"], "nothing is dead-lettered"
        assert any(e.get("event") == "disk_room_again" for e in events)
