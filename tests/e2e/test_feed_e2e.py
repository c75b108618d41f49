"""End to end, the feed — a world (the pool of posts), each agent's view made on its host, follows
as edge edits, activation by persona: played on real processes and recorded exactly as the local
runner records it (outcomes, rounds, edges, posts, shown) — examples/feed.yaml and a smaller feed
on 3 agent-hosts, with one agent per OS process, and with the environment service and an
agent-host killed in the middle of a round and restarted. The module's stack runs its services in
one process but those two (each has its own, to be killed): the world is imported three times,
not seven."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import duckdb
import pytest
from in_round import kill_in_round

from populace.client.prepare import PreparedRun, prepare, prepare_file
from populace.client.run import play, run_state
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.graph.serial import loads
from populace.population.cast import cast_from_jsonl
from populace.sdk.local import LocalResult, run_local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
DROP = ("run_id", "latency_ms", "closed_at", "prompt_tokens", "completion_tokens")
POPULATION = {"config": str(ROOT / "examples" / "population" / "microblog.yaml")}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    db = tmp_path_factory.mktemp("feed") / "populace.duckdb"
    # a lost host is noticed within seconds (the kill test), as in the fault matrix
    s = Stack(hosts=3, db=str(db), env={"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4",
                                         "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_REGISTRY_TTL_S": "4"},
              # its services share one process but the two the kill test SIGKILLs and restarts
              one_process=True, apart=("environment", "agent-host-1"))
    with s.up(timeout=120):
        yield s


def local_of(prepared) -> LocalResult:
    """The run in this process, from the same prepared scenario (its personas and graph)."""
    cast = cast_from_jsonl(prepared.personas) if prepared.personas is not None else None
    graph = loads(prepared.graph) if prepared.graph is not None else None
    return asyncio.run(run_local(prepared.resolved, cast=cast, graph=graph))


def table(db: str, name: str, run_id: str, order: str) -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{name}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [norm({k: v for k, v in zip(names, row) if k not in DROP}) for row in cur.fetchall()]


def norm(row: dict) -> dict:
    """DuckDB gives JSON columns as text, the local runner Python values: compare them as values."""
    return {k: json.loads(v) if isinstance(v, str) and v[:1] in "{[" else v for k, v in row.items()}


def rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    return [norm(dict(zip(keys, r))) for r in zip(*(columns[k] for k in keys))]


def assert_as_in_one_process(db: str, run_id: str, local: LocalResult) -> None:
    t = local.tables
    assert table(db, t.outcomes, run_id, "round, agent_id") == rows(local.outcomes)
    assert table(db, t.rounds, run_id, "round") == rows(local.rounds)
    # edits apply by round and follower (each agent's in the order it made them)
    assert table(db, "edges", run_id, "round, follower, rowid") == rows(local.edges)
    assert table(db, "posts", run_id, "round, agent_id") == rows(local.posts)
    # who saw what: every acting reader's feed, as one process ranked it
    assert table(db, "shown", run_id, "round, agent_id") == rows(local.shown)
    assert [(r["round"], r["agent_id"]) for r in rows(local.shown)] == \
        [(r["round"], r["agent_id"]) for r in rows(local.outcomes)]


def fleet(stack: Stack, data: dict | PreparedRun, during=None):
    prepared = data if isinstance(data, PreparedRun) else prepare(RunConfig.model_validate(data))

    async def go():
        nc = await bus.connect(stack.url, "e2e-feed")
        try:
            task = asyncio.create_task(play(nc, prepared.config, personas=prepared.personas,
                                            graph=prepared.graph_blobs, manifest=prepared.manifest, stall_s=180))
            if during is not None:
                await during(nc)
            out = await task
            return out, await run_state(nc, out.run_id)
        finally:
            await nc.close()

    out, state = asyncio.run(go())
    return prepared, out, state


def test_the_feed_example_on_three_hosts_records_what_one_process_records(stack):
    """examples/feed.yaml as `populace demo --scenario` prepares it (prepare_file), played on the
    module's stack. The demo command itself (its private stack, its --scenario options) is proved
    by tests/e2e/test_cli.py (test_demo_with_a_scenario_plays_the_agents_and_rounds_given,
    test_demo_plays_and_results_reads_the_db)."""
    prepared, out, _ = fleet(stack, prepare_file(ROOT / "examples" / "feed.yaml"))
    assert out.status == "completed", out.reason
    with duckdb.connect(stack.db, read_only=True) as con:
        hosts = con.execute("SELECT count(DISTINCT host_id) FROM agents WHERE run_id = ?", [out.run_id]).fetchone()[0]
    assert hosts == 3
    local = local_of(prepared)
    assert sum(local.rounds["follows"]) > 0 and sum(local.rounds["unfollows"]) > 0
    assert_as_in_one_process(stack.db, out.run_id, local)


FEED = {"simulation": "feed", "agents": 400, "rounds": 3, "seed": 6, "model": {"latency_s": 0.02, "seed": 2},
        "pool": {"size": 300, "seed_posts": 100}, "activity": {"rates": {"high": 0.8, "medium": 0.3, "low": 0.1}}}


@pytest.mark.parametrize("shape", ["3-hosts-graph-population", "one-agent-per-process"])
def test_the_feed_on_three_hosts_and_one_agent_per_process_equals_one_process(stack, shape):
    if shape == "one-agent-per-process":  # a run with a graph cannot place one agent per process (the client)
        data = {**FEED, "agents": 40, "placement": {"agents_per_process": 1}, "activity": {"default": 0.5}}
    else:
        data = {**FEED, "population": POPULATION, "graph": {"generator": "scale-free", "m": 3, "directed": True},
                "recommender": {"interest": 1.5}}  # the toolkit's interest recommender: each reader its own
    prepared, out, _ = fleet(stack, data)
    assert out.status == "completed", out.reason
    local = local_of(prepared)
    assert sum(local.rounds["follows"]) > 0
    assert_as_in_one_process(stack.db, out.run_id, local)
    if shape != "one-agent-per-process":
        with duckdb.connect(stack.db, read_only=True) as con:
            placed = con.execute("SELECT count(DISTINCT host_id) FROM agents WHERE run_id = ?", [out.run_id]).fetchone()
        assert placed[0] == 3


def test_the_environment_and_an_agent_host_killed_in_a_round_restart_and_every_table_is_exact(stack):
    """The environment service and agent-host 1 are SIGKILLed while round 2 waits on the model,
    then restarted: the environment reads its state and the round's world back by digest, the
    host's agents (and their follows) come back from their checkpoint, and every table equals
    an undisturbed run's."""
    data = {**FEED, "agents": 1200, "rounds": 4, "model": {"latency_s": 1.0, "seed": 2}, "population": POPULATION,
            "graph": {"generator": "scale-free", "m": 3, "directed": True}}

    async def kill_in_round_2(nc):  # inside the round: the agents wait on their answers
        await kill_in_round(nc, stack, 2, "environment", "agent-host-1", settle_s=0.5, restart_after_s=0.5)

    prepared, out, state = fleet(stack, data, during=kill_in_round_2)
    assert out.status == "completed", out.reason
    assert state.epoch >= 1, "the restarted host's agents should have been placed again"
    local = local_of(prepared)
    assert sum(local.rounds["follows"]) > 0
    assert_as_in_one_process(stack.db, out.run_id, local)
