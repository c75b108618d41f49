"""The recorder answers the run page's reads of a live run (`recorder.read.agents`,
`recorder.read.distribution`) from its own DuckDB while it records the run: a page of agents
with their profile, persona and each round's outcome and raw answer, a search of the personas,
the last closed round's histogram; an unknown run is refused with its reason, and a malformed
request is dead-lettered once and answered."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

from populace.client.prepare import prepare
from populace.client.reads import ReadError, request_agents, request_distribution
from populace.client.run import play, run_state
from populace.client.stack import Stack
from populace.core import bus, replies, subjects
from populace.core.contracts import ReadReply, RunConfig

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 4
# 50 personas (examples/personas/education-50.jsonl), 5 at a time, 0.4 s each: rounds of ~4 s; the
# reads come once round 2 has closed, while rounds 3 and 4 play (~8 s for a few requests)
CONFIG = {"rounds": ROUNDS, "seed": 3, "population": {"personas": "personas/education-50.jsonl"},
          "model": {"latency_s": 0.4, "seed": 2}}
SLOW = {"POPULACE_MAX_IN_FLIGHT": "5", "POPULACE_OUTCOME_BATCH_SIZE": "5"}


@pytest.fixture(scope="module")
def stack(stacks):
    """The services in one process: the reads go to the recorder over the bus, as across processes."""
    return stacks(hosts=1, env={"POPULACE_STORAGE": "memory", **SLOW}, one_process=True)


def ask(stack: Stack, fn):
    async def go():
        nc = await bus.connect(stack.url, "e2e-live-agents")
        try:
            return await fn(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


def test_agents_and_distribution_of_a_live_run(stack):
    prepared = prepare(RunConfig.model_validate(CONFIG), base=ROOT / "examples")
    done: dict = {}

    def run() -> None:
        async def go(nc):
            done["out"] = await play(nc, prepared.config, run_id="live-agents", personas=prepared.personas,
                                     manifest=prepared.manifest, stall_s=120)

        ask(stack, go)

    player = threading.Thread(target=run, daemon=True)
    player.start()
    deadline = time.monotonic() + 120
    while (s := ask(stack, lambda nc: run_state(nc, "live-agents"))) is None or s.round < 3:
        assert time.monotonic() < deadline, "the run did not reach round 3"
        time.sleep(0.2)

    page = ask(stack, lambda nc: request_agents(nc, "live-agents", offset=10, limit=5))
    assert page.total == 50 and page.personas and page.columns == ["value"]
    assert [a.agent_id for a in page.agents] == [10, 11, 12, 13, 14]
    first = page.agents[0]
    assert "education:" in first.profile and first.persona
    closed = [c for c in first.rounds if c.round <= 2]
    assert [c.round for c in closed] == [1, 2] and all(c.raw for c in closed)
    assert all(c.valid and isinstance(c.values["value"], float) for c in closed)

    # search: words of the persona and profile, any case, and an agent id
    word = first.profile.split("education: ", 1)[1].split(" · ")[0].split()[0].upper()
    found = ask(stack, lambda nc: request_agents(nc, "live-agents", search=word, limit=50))
    assert 0 < found.total < 50 and 10 in [a.agent_id for a in found.agents]
    assert all(word.lower() in (a.profile + " " + a.persona).lower() for a in found.agents)
    one = ask(stack, lambda nc: request_agents(nc, "live-agents", search="42"))
    assert one.total == 1 and one.agents[0].agent_id == 42

    d = ask(stack, lambda nc: request_distribution(nc, "live-agents", bins=10))
    assert d.kind == "numeric" and d.measure == "value" and d.round == d.closed and d.round >= 2
    assert sum(d.counts) == d.n == 50 and len(d.edges) == len(d.counts) + 1
    assert "mean" in d.summary

    with pytest.raises(ReadError, match="not recorded"):
        ask(stack, lambda nc: request_agents(nc, "no-such-run"))

    player.join(180)
    assert done["out"].status == "completed", done["out"].reason


def test_a_malformed_agents_request_is_dead_lettered_once_and_answered(stack):
    async def go(nc):
        js = nc.jetstream()
        before = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
        msg = await replies.request(nc, "recorder", subjects.recorder_read("agents", replies.requester(nc)),
                                    b'{"run_id": "r", "limit": 100000}', timeout=10)
        for _ in range(50):
            after = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
            if after > before:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(0.5)  # once: nothing more comes
        after = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
        return ReadReply.model_validate_json(msg.data), after - before

    reply, dead = ask(stack, go)
    assert not reply.ok and "malformed" in reply.error and "limit" in reply.error
    assert dead == 1
