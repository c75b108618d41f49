"""A worker dying mid-run (the paper's runs just hang): SIGKILL one of two agent-hosts during
a round; the orchestrator notices the silent host and fails the run with a reason naming it,
the client gets that answer, and the rounds that closed stay recorded."""

from __future__ import annotations

import asyncio
import os
import signal

import duckdb
import pytest

from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RoundOpen, RunConfig

pytestmark = pytest.mark.e2e


def play_following(stack: Stack, config: RunConfig, on_event):
    """Play a run, calling on_event for every event; bounded, so a hang fails the test."""
    async def go():
        nc = await bus.connect(stack.url, "e2e-host-loss")
        try:
            return await asyncio.wait_for(play(nc, config, on_event=on_event, stall_s=60), timeout=120)
        finally:
            await nc.close()

    return asyncio.run(go())


def test_killed_host_fails_the_run_with_a_reason(tmp_path):
    db = tmp_path / "populace.duckdb"
    stack = Stack(hosts=2, db=str(db), env={"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "6",
                                            "POPULACE_HEARTBEAT_S": "0.5"})
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=90))
        victim = stack.procs["agent-host-1"]
        config = RunConfig.model_validate({"agents": 400, "rounds": 4, "model": {"latency_s": 1.5, "seed": 2}})

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 2 and victim.poll() is None:
                os.kill(victim.pid, signal.SIGKILL)  # mid-run: round 1 closed, round 2 in flight

        out = play_following(stack, config, on_event)
    finally:
        stack.stop()
    assert victim.poll() is not None
    assert out.status == "failed"
    assert out.reason.startswith("agent-host host-1 stopped during round 2 (no heartbeat for 6s)"), out.reason
    assert [r.round for r in out.results] == [1]
    assert out.recorded is not None
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status, reason LIKE 'agent-host host-1 stopped%' FROM runs").fetchone() == (
            "failed", True)
        assert con.execute("SELECT count(*) FROM guesses WHERE round = 1").fetchone() == (400,)


def test_a_restarted_orchestrator_still_watches_the_running_run(tmp_path):
    import os as _os

    db = tmp_path / "populace.duckdb"
    env = {"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "6", "POPULACE_HEARTBEAT_S": "0.5"}
    stack = Stack(hosts=2, db=str(db), env=env)
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=90))
        old, victim = stack.procs["orchestrator"], stack.procs["agent-host-1"]
        config = RunConfig.model_validate({"agents": 200, "rounds": 4, "model": {"latency_s": 1.5, "seed": 2}})

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 2 and old.poll() is None:
                os.kill(old.pid, signal.SIGKILL)  # the orchestrator dies first, then a host
                os.kill(victim.pid, signal.SIGKILL)
                stack._spawn("orchestrator-2", ["-m", "populace.core.serve", "orchestrator"],
                             {**_os.environ, "POPULACE_NATS_URL": stack.url, "POPULACE_DB": str(db),
                              "POPULACE_LOG_FORMAT": "json", "POPULACE_PARENT_PID": str(_os.getpid()), **env})

        out = play_following(stack, config, on_event)
    finally:
        stack.stop()
    assert out.status == "failed"
    assert out.reason.startswith("agent-host host-1 stopped during round 2"), out.reason
