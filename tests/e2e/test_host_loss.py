"""A worker dying mid-run (the paper's runs just hang): when the lost host's agents fit on no
other host, the run pauses with a reason naming the host and the round, the rounds that
closed stay recorded, and `resume` continues it once a host is back — to the same results as
an undisturbed run. An orchestrator restarted before the loss still watches the run.

One stack serves both tests (each leaves every process of it running again): hosts of 400
agents, so an 800-agent run fills both and a 200-agent run's lost half fits on the survivor."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import duckdb
import pytest

from populace.client.run import play, resume
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import HostInfo, RoundOpen, RunConfig

pytestmark = pytest.mark.e2e

ENV = {"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4", "POPULACE_HEARTBEAT_S": "0.5",
       "POPULACE_REGISTRY_TTL_S": "4"}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    db = tmp_path_factory.mktemp("host-loss") / "populace.duckdb"
    with Stack(hosts=2, db=str(db), env=ENV, host_env={"POPULACE_HOST_CAPACITY": "400"}).up(timeout=90) as s:
        yield s


def all_up(stack: Stack) -> None:
    """Start every killed process of the stack again and wait until each registered."""
    for key, proc in stack.procs.items():
        if proc.poll() is not None:
            stack.restart(key)
    asyncio.run(stack.wait_ready(timeout=90))


def hosts_idle(stack: Stack, timeout: float = 30) -> None:
    """Until every live host's heartbeat reports no agents (a finished run's agents are gone,
    its room is free again for a run that needs all of it)."""
    async def poll():
        nc = await bus.connect(stack.url, "e2e-host-loss-idle")
        try:
            deadline = time.monotonic() + timeout
            live = {p.pid for k, p in stack.procs.items() if k.startswith("agent-host") and p.poll() is None}
            while True:
                hosts = await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo)
                busy = {h.host_id: h.agents for h in hosts if h.pid in live and h.agents}
                if not busy and len({h.pid for h in hosts} & live) == len(live):
                    return
                assert time.monotonic() < deadline, f"hosts still report agents: {busy}"
                await asyncio.sleep(0.1)
        finally:
            await nc.close()

    asyncio.run(poll())


def play_following(stack: Stack, config: RunConfig, on_event=None):
    """Play a run, calling on_event for every event; bounded, so a hang fails the test."""
    async def go():
        nc = await bus.connect(stack.url, "e2e-host-loss")
        try:
            return await asyncio.wait_for(play(nc, config, on_event=on_event, stall_s=60), timeout=120)
        finally:
            await nc.close()

    return asyncio.run(go())


def values(db: str, run_id: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, agent_id, value, valid FROM guesses WHERE run_id = ? "
                           "ORDER BY round, agent_id", [run_id]).fetchall()


def test_a_lost_host_whose_agents_fit_nowhere_pauses_the_run_and_resume_finishes_it(stack):
    db = stack.db
    config = RunConfig.model_validate({"agents": 800, "rounds": 4, "model": {"latency_s": 1.0, "seed": 2}})
    try:
        hosts_idle(stack)  # the room of both hosts, whatever ran before
        reference = play_following(stack, config)
        assert reference.status == "completed", reference.reason
        hosts_idle(stack)  # the hosts' heartbeats report their room again (the reference run's agents are gone)

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 2 and stack.procs["agent-host-1"].poll() is None:
                os.kill(stack.procs["agent-host-1"].pid, signal.SIGKILL)  # round 1 closed, round 2 in play

        out = play_following(stack, config, on_event)
        assert out.status == "paused"
        assert out.reason.startswith("agent-host host-1 stopped (no heartbeat for 4s) during round 2 and no "
                                     "agent-host can take its 400 agents"), out.reason
        assert [r.round for r in out.results] == [1]
        with duckdb.connect(str(db), read_only=True) as con:
            assert con.execute("SELECT status FROM runs WHERE run_id = ?", [out.run_id]).fetchone() == ("paused",)
            assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND round = 1",
                               [out.run_id]).fetchone() == (800,)

        all_up(stack)

        async def go():
            nc = await bus.connect(stack.url, "e2e-host-loss")
            try:
                return await resume(nc, out.run_id, stall_s=60)
            finally:
                await nc.close()

        done = asyncio.run(go())
        assert done.status == "completed", done.reason
        assert values(str(db), out.run_id) == values(str(db), reference.run_id)
    finally:
        all_up(stack)


def test_a_restarted_orchestrator_still_watches_the_running_run(stack):
    try:
        config = RunConfig.model_validate({"agents": 200, "rounds": 4, "model": {"latency_s": 1.5, "seed": 2}})

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 2 and stack.procs["agent-host-1"].poll() is None:
                stack.kill("orchestrator")  # the orchestrator dies first, then a host
                stack.kill("agent-host-1")
                stack.restart("orchestrator")

        out = play_following(stack, config, on_event)
    finally:
        all_up(stack)
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == 800


def test_a_run_started_as_the_last_one_ends_finds_the_room_it_freed(stack):
    """Both hosts full with one run, the next started the moment it ends (as a script or a sweep
    does): its hosts say at once that the agents left, and the orchestrator waits for that."""
    config = RunConfig.model_validate({"agents": 800, "rounds": 1, "model": {"latency_s": 0.2, "seed": 2}})
    try:
        hosts_idle(stack)
        outs = [play_following(stack, config) for _ in range(3)]
    finally:
        all_up(stack)
    assert [o.status for o in outs] == ["completed"] * 3, [o.reason for o in outs]
