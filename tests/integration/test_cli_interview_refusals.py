"""`populace interview` on the fleet refuses a round the run never played with one line and exit
2, and asks nothing (the CTL stream holds as many messages after as before): round 0, a round
beyond the last or not completed yet, and a fork's round before its fork point, saying whose
round it was. Once placed, it says when a lost host's part is ordered again, and stops waiting
with one line and exit 1 when the orchestrator says the interview failed. The runs are states
in KV `runs` of a real nats-server; the CLI runs in process (the `cli` fixture); the
orchestrator's answers are played by a double (its decisions: tests/unit/test_orchestrator_interviews.py,
end to end: tests/e2e/test_host_loss.py)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from populace.core import bus, subjects
from populace.core.contracts import InterviewPlaced, InterviewRequest, RunConfig
from populace.orchestrator.workflow import fork_run, new_run, state_ref

pytestmark = pytest.mark.integration

ASK = ("--question", "Why?", "--max-chars", "80")


@pytest.fixture(scope="module")
def runs(nats_server):
    """A parent run of 3 rounds, done; its fork after round 2 (rounds 3..5), done; a run still
    playing its round 2."""
    parent = new_run("parent-1", RunConfig(agents=40, rounds=3), {"h1": [(0, 40)]})
    parent = parent.model_copy(update={"status": "done", "round": 3})
    fork = fork_run("fork-1", RunConfig(agents=40, rounds=5), {"h1": [(0, 40)]}, parent, 2,
                    state_ref("parent-1", 2, "e" * 64), {})
    fork = fork.model_copy(update={"status": "done", "round": 5})
    playing = new_run("playing-1", RunConfig(agents=40, rounds=4), {"h1": [(0, 40)]})
    playing = playing.model_copy(update={"status": "running", "round": 2})

    async def put():
        nc = await bus.connect(nats_server.url, "cli-interview-test")
        try:
            js = nc.jetstream()
            await bus.provision(js, storage="memory")
            kv = await js.key_value(subjects.RUNS_BUCKET)
            for state in (parent, fork, playing):
                await kv.put(state.run_id, bus.encode(state))
        finally:
            await nc.close()

    asyncio.run(put())
    return nats_server.url


def ctl_messages(url: str) -> int:
    async def count() -> int:
        nc = await bus.connect(url, "cli-interview-test")
        try:
            return (await nc.jetstream().stream_info(subjects.CTL_STREAM)).state.messages
        finally:
            await nc.close()

    return asyncio.run(count())


@pytest.mark.parametrize(("run", "after", "says"), [
    ("parent-1", "0", "--after-round: round 0 is not one of the run's rounds (1..3)"),
    ("parent-1", "-2", "--after-round: round -2 is not one of the run's rounds (1..3)"),
    ("parent-1", "4", "--after-round: round 4 is beyond the run's last (3)"),
    ("playing-1", "2", "--after-round: run playing-1 has completed 1 round(s), so round 2 has no checkpoint"),
    ("fork-1", "1", "--after-round: this fork never played round 1; its parent parent-1 did (the fork starts "
                    "from its state after round 2: `populace interview parent-1 --after-round 1`)"),
    ("fork-1", "2", "--after-round: this fork never played round 2; its parent parent-1 did"),
    ("nope", "1", "RUN: run nope is not known on this stack"),
])
def test_a_round_the_run_never_played_is_refused_in_one_line(cli, runs, run, after, says):
    before = ctl_messages(runs)
    res = cli("interview", run, "--after-round", after, *ASK, "--nats", runs)
    assert res.returncode == 2, (res.stdout, res.stderr)
    out = (res.stdout + res.stderr).strip()
    assert out.startswith("error: " + says) and "\n" not in out, out
    assert ctl_messages(runs) == before  # nothing was asked


def test_a_placed_interview_that_fails_stops_the_wait_with_its_reason(cli, runs):
    """The orchestrator places it on h1 and h2, orders h2's part from h1 (h2 stopped), then says
    it failed (h1 stopped too, and no host is up): the CLI prints the first, and exits 1 with
    the second at once, not at its timeout."""
    ready, stop = threading.Event(), threading.Event()

    def orchestrator() -> None:
        async def serve() -> None:
            nc = await bus.connect(runs, "double-orchestrator")

            async def on_request(msg) -> None:
                req = InterviewRequest.model_validate_json(msg.data)
                said = [InterviewPlaced(run_id=req.run_id, request=req.request, after_round=req.after_round,
                                        survey=req.survey, hosts={"h1": [(0, 20)], "h2": [(20, 20)]}, expected=40,
                                        placed_at=time.time()),
                        InterviewPlaced(run_id=req.run_id, request=req.request, after_round=req.after_round,
                                        survey=req.survey, hosts={"h1": [(0, 20), (20, 20)]}, expected=40,
                                        placed_at=time.time(), placement=1,
                                        reason="agent-host h2 stopped (no heartbeat for 30s) while answering "
                                               f"interview {req.request} after round 2: its 20 agents ordered again "
                                               "from h1"),
                        InterviewPlaced(run_id=req.run_id, request=req.request, after_round=req.after_round,
                                        expected=40, placed_at=time.time(),
                                        error=f"agent-host h1 stopped (no heartbeat for 30s) while answering "
                                              f"interview {req.request} after round 2, and no agent-host is up to "
                                              "answer its 40 agents; the answers recorded so far stay")]
                for placed in said:
                    await nc.publish(subjects.run_asked(req.run_id, req.request), bus.encode(placed))

            await nc.subscribe(subjects.RUN_INTERVIEW, cb=on_request)
            await nc.flush()
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)
            await nc.close()

        asyncio.run(serve())

    thread = threading.Thread(target=orchestrator, name="double-orchestrator")
    thread.start()
    try:
        assert ready.wait(10)
        res = cli("interview", "parent-1", "--after-round", "2", *ASK, "--nats", runs, "--timeout", "600")
    finally:
        stop.set()
        thread.join(10)
    assert res.returncode == 1, (res.stdout, res.stderr)
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("request iv-") and lines[0].endswith(
        ": agent-host h2 stopped (no heartbeat for 30s) while answering interview "
        f"{lines[0].split()[1].rstrip(':')} after round 2: its 20 agents ordered again from h1")
    assert lines[1].startswith("error: request iv-") and lines[1].endswith(
        "and no agent-host is up to answer its 40 agents; the answers recorded so far stay")
