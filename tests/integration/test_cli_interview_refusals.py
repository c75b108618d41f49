"""`populace interview` on the fleet refuses a round the run never played with one line and exit
2, and asks nothing (the CTL stream holds as many messages after as before): round 0, a round
beyond the last or not completed yet, and a fork's round before its fork point, saying whose
round it was. The runs are states in KV `runs` of a real nats-server; the CLI runs in process
(the `cli` fixture)."""

from __future__ import annotations

import asyncio

import pytest

from populace.core import bus, subjects
from populace.core.contracts import RunConfig
from populace.orchestrator.workflow import fork_run, new_run

pytestmark = pytest.mark.integration

ASK = ("--question", "Why?", "--max-chars", "80")


@pytest.fixture(scope="module")
def runs(nats_server):
    """A parent run of 3 rounds, done; its fork after round 2 (rounds 3..5), done; a run still
    playing its round 2."""
    parent = new_run("parent-1", RunConfig(agents=40, rounds=3), {"h1": [(0, 40)]})
    parent = parent.model_copy(update={"status": "done", "round": 3})
    fork = fork_run("fork-1", RunConfig(agents=40, rounds=5), {"h1": [(0, 40)]}, parent, 2, {}, {})
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

