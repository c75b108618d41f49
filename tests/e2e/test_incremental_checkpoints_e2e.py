"""End to end, incremental checkpoints: with 1% of the agents acting per round, each round's
checkpoint holds only the agents that acted (a delta on the previous one), and everything that
starts from a checkpoint still sees exactly the state it saw with full checkpoints: an agent-host
killed mid-run has its agents placed on the survivor (restored through the chain), and a fork
from a middle round plays the rest of the run exactly as the uninterrupted run did. The
population turns over too (1% leave and 20 arrive after every round, issue 37): the killed host's
newcomers and departed come back with its checkpoint and who was alive after the round."""

from __future__ import annotations

import asyncio
import json

import duckdb
import pytest
from in_round import kill_in_round

from populace.client.prepare import prepare, prepare_fork
from populace.client.run import play, run_state
from populace.core import bus, checkpoints, owned_objects, subjects
from populace.core.contracts import Restore, RunConfig
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS, FORK_AFTER = 2000, 6, 3
VOTE = {"simulation": "vote", "agents": AGENTS, "rounds": ROUNDS, "seed": 11, "model": {"latency_s": 1.0, "seed": 2},
        "ballot": {"turnout": 0.01},
        "population": {"changes": [{"after": "every", "left": 0.01, "arrived": 20, "reason": "moved"}]}}
DROP = ("run_id", "latency_ms", "closed_at")


@pytest.fixture(scope="module")
def stack(stacks):
    # a lost host is noticed within seconds, as in the fault matrix; the host the test kills has a
    # process of its own, the other services share one
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4",
                                "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_REGISTRY_TTL_S": "4"},
                  one_process=True, apart=("agent-host-1",), timeout=120)


def outcomes(db: str, table: str, run_id: str, after: int = 0) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? AND round > ? ORDER BY round, agent_id',
                          [run_id, after])
        names = [d[0] for d in cur.description]
        return [tuple(v for k, v in zip(names, row) if k not in DROP) for row in cur.fetchall()]


def local_rows(columns: dict[str, list], after: int = 0) -> list[tuple]:
    keys = [k for k in columns if k not in DROP]
    rows = [tuple(r) for r in zip(*(columns[k] for k in keys))]
    at = keys.index("round")
    return sorted((r for r in rows if r[at] > after), key=lambda r: (r[at], r[keys.index("agent_id")]))


async def checkpoint_values(nc, rid: str, round_: int) -> list[dict]:
    js = nc.jetstream()
    prefix = subjects.checkpoint_agents_prefix(rid, round_)
    objects = sorted((name, writer) for writer, name in await checkpoints.run_objects(js, rid)
                     if name.startswith(prefix))
    return [json.loads(await owned_objects.read_object(js, name, writer)) for name, writer in objects]


def test_a_one_percent_run_killed_mid_run_and_forked_from_a_middle_round_equals_the_uninterrupted_run(stack):
    prepared = prepare(RunConfig.model_validate(VOTE))
    local = asyncio.run(run_local(prepared.resolved))
    table = prepared.resolved.simulation.tables().outcomes
    assert 0 < sum(local.rounds["n"]) < AGENTS * ROUNDS / 20  # about 1% act per round

    async def go():
        nc = await bus.connect(stack.url, "e2e-ckpt")
        try:
            task = asyncio.create_task(play(nc, prepared.config, manifest=prepared.manifest, stall_s=180))
            await kill_in_round(nc, stack, 4, "agent-host-1", settle_s=0.3)  # the voters wait on the model
            out = await task
            middle = await checkpoint_values(nc, out.run_id, FORK_AFTER)
            config = (await run_state(nc, out.run_id)).config
            fork = prepare_fork(config, FORK_AFTER, {}, None, out.run_id)
            forked = await play(nc, fork.config, manifest=fork.manifest, stall_s=180,
                                fork=Restore(run_id=out.run_id, round=FORK_AFTER))
            return out, middle, forked
        finally:
            await nc.close()

    try:
        out, middle, forked = asyncio.run(go())
    finally:
        stack.restart("agent-host-1")
    assert out.status == "completed", out.reason
    with duckdb.connect(stack.db, read_only=True) as con:
        shares = con.execute("SELECT count(*) FROM _shares WHERE run_id = ?", [out.run_id]).fetchone()[0]
    assert shares >= 3, "the lost host's agents should have been placed again, in a new share"
    assert outcomes(stack.db, table, out.run_id) == local_rows(local.outcomes)
    assert population(stack.db, out.run_id) == local_rows(local.population)

    # the middle round's checkpoint holds the agents that acted (and came and went), on the chain
    # before it; a range of newcomers has a chain of its own
    first = [v for v in middle if v["first"] < AGENTS]
    assert first and all("builds_on" in v and len(v["changed"]) < v["count"] / 10 for v in first), \
        [(v.get("count"), len(v.get("changed", ()))) for v in first]
    assert forked.status == "completed", forked.reason
    assert outcomes(stack.db, table, forked.run_id) == local_rows(local.outcomes, after=FORK_AFTER)
    assert population(stack.db, forked.run_id) == local_rows(local.population, after=FORK_AFTER)


def population(db: str, run_id: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, agent_id, event, reason FROM population WHERE run_id = ? "
                           "ORDER BY round, agent_id", [run_id]).fetchall()
