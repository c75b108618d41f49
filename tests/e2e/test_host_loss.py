"""A worker dying mid-run (the paper's runs just hang): when the lost host's agents fit on no
other host, the run pauses with a reason naming the host and the round, the rounds that
closed stay recorded, and `resume` continues it once a host is back — to the same results as
an undisturbed run. An orchestrator restarted before the loss still watches the run. A host
killed during a post-hoc interview has its part answered by the other, each answer once.

One stack serves every test (each leaves every process of it running again): hosts of 400
agents, so an 800-agent run fills both and a 200-agent run's lost half fits on the survivor.
The tests kill only the orchestrator and agent-host-1: those two keep a process each, the other
services (agent-host-0 among them) share one (imported once, not four times)."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import duckdb
import pytest

from populace.client.run import play, resume
from populace.client.stack import ONE_PROCESS, Stack
from populace.core import bus, subjects
from populace.core.contracts import HostInfo, RoundOpen, RunConfig

pytestmark = pytest.mark.e2e

ENV = {"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4", "POPULACE_HEARTBEAT_S": "0.5",
       "POPULACE_REGISTRY_TTL_S": "4"}


@pytest.fixture(scope="module")
def stack(stacks) -> Stack:
    # 500 interview answers out at once per host: a post-hoc interview's 2,000 per host take a few
    # waves of the model's latency, so a host is killed after it sent some of them
    host_env = {"POPULACE_HOST_CAPACITY": "400", "POPULACE_INTERVIEW_IN_FLIGHT": "500"}
    return stacks(hosts=2, env=ENV, host_env=host_env, one_process=True, apart=("orchestrator", "agent-host-1"))


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
            # the processes that hold hosts: agent-host-1's own, and the shared one that holds host-0
            live = {p.pid for k, p in stack.procs.items()
                    if (k.startswith("agent-host") or k == ONE_PROCESS) and p.poll() is None}
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
    # 3 rounds: the one closed before the loss, the one it hits (replayed by resume) and one after it
    config = RunConfig.model_validate({"agents": 800, "rounds": 3, "model": {"latency_s": 1.0, "seed": 2}})
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
        # killed as round 2 opens; round 3 is played under the restarted orchestrator after the loss
        config = RunConfig.model_validate({"agents": 200, "rounds": 3, "model": {"latency_s": 1.5, "seed": 2}})

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 2 and stack.procs["agent-host-1"].poll() is None:
                stack.kill("orchestrator")  # the orchestrator dies first, then a host
                stack.kill("agent-host-1")
                stack.restart("orchestrator")

        out = play_following(stack, config, on_event)
    finally:
        all_up(stack)
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == 600


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


def test_a_post_hoc_interview_whose_host_is_killed_is_answered_whole_by_the_other(stack):
    """4,000 answers (800 agents, 5 questions) on 2 hosts; host-1 is SIGKILLed when its first
    answers are stored. The orchestrator orders its 400 agents from host-0 (the client hears
    why), the recorder keeps the first answer of each agent and question: exactly 4,000 answers,
    the same as an undisturbed interview of the same round gives."""
    from populace.client.interviews import ask
    from populace.core.contracts import InterviewPlaced, Question, Survey

    config = RunConfig.model_validate({"agents": 800, "rounds": 1, "model": {"latency_s": 1.0, "seed": 2}})
    survey = Survey(id="after", questions=[Question(id=f"q{i}", text=f"Question {i}?", options=["yes", "no", "unsure"])
                                           for i in range(5)])
    placed_again: list[InterviewPlaced] = []
    try:
        hosts_idle(stack)
        run = play_following(stack, config)
        assert run.status == "completed", run.reason

        async def interview(kill: bool):
            nc = await bus.connect(stack.url, "e2e-host-loss-interview")
            killed = asyncio.Event()

            async def on_answers(msg) -> None:  # host-1's first answers stored: it dies
                if not killed.is_set():
                    killed.set()
                    os.kill(stack.procs["agent-host-1"].pid, signal.SIGKILL)

            sub = await nc.subscribe(subjects.run_interviews(run.run_id, 1, "host-1"), cb=on_answers) if kill else None
            try:
                done = await asyncio.wait_for(ask(nc, run.run_id, 1, survey, timeout_s=120,
                                                  on_placed=placed_again.append), timeout=150)
                return done, killed.is_set()
            finally:
                if sub is not None:
                    await sub.unsubscribe()
                await nc.close()

        done, killed = asyncio.run(interview(kill=True))
        assert killed and stack.procs["agent-host-1"].poll() is not None
        assert done.recorded.answers == 4000
        (again,) = placed_again
        assert again.placement == 1 and again.reason == (
            f"agent-host host-1 stopped (no heartbeat for 4s) while answering interview {done.placed.request} after "
            "round 1: its 400 agents ordered again from host-0")
        assert again.hosts == {"host-0": [(0, 400), (400, 400)]}
        all_up(stack)
        reference, _ = asyncio.run(interview(kill=False))
    finally:
        all_up(stack)
    assert reference.recorded.answers == 4000 and not placed_again[1:]
    with duckdb.connect(stack.db, read_only=True) as con:
        def answers(request: str) -> list[tuple]:
            return con.execute("SELECT agent_id, question, answer, raw, valid FROM interviews WHERE run_id = ? AND "
                               "request = ? ORDER BY agent_id, question", [run.run_id, request]).fetchall()

        got, want = answers(done.placed.request), answers(reference.placed.request)
        by_host = dict(con.execute("SELECT host_id, count(*) FROM interviews WHERE request = ? GROUP BY 1",
                                   [done.placed.request]).fetchall())
    assert len(got) == 4000 and len({(a, q) for a, q, *_ in got}) == 4000
    assert got == want  # each answer once, and the one an undisturbed interview gives
    assert by_host["host-0"] >= 2000 and 0 < by_host.get("host-1", 0) < 2000 and sum(by_host.values()) == 4000
