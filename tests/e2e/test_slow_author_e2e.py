"""Issue 36, item 4, on real processes: a simulation whose `Env.view` burns CPU — one call longer
than the host-lost timeout, and every agent's view a recommender's worth — holds its agent-host's
event loop, yet the host is not declared lost (its heartbeat beats from a thread of its own, and
the round's launcher and gate give the loop back between slices): the run completes without a
re-placement, exactly as in one process; and `round_profile` says where each round went — a row
per round and host whose view seconds are the burnt ones, the environment's decide and the
recorder's record — as `populace results --profile` shows it.

Mostly CPU, not waiting: host-0 burns about 8.5 s of views, host-1 about 2.5 s."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import duckdb
import pytest

from populace.client.prepare import prepare
from populace.client.reads import request_profile
from populace.client.run import play, run_state
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.sdk.local import run_local

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SIMS = Path(__file__).with_name("sims")
sys.path.insert(0, str(SIMS))  # slow_sims, for prepare() and the local run here; the services get it through PYTHONPATH

LOST_S = 4.0  # POPULACE_HOST_LOST_S here: a host silent this long is lost
AGENTS, ROUNDS, VIEW_MS, FIRST_MS = 100, 2, 25.0, 6000.0
CONFIG = {"simulation": "slow_sims:SlowView", "agents": AGENTS, "rounds": ROUNDS, "seed": 3,
          "model": {"latency_s": 0.05, "seed": 2},
          # agent 0's view in round 1 takes 6 s (one call, longer than LOST_S); every view 25 ms:
          # 50 agents' views on a host hold its loop 1.25 s a round (25 slices of the loop), and
          # 7.25 s in host-0's round 1
          "slow": {"view_ms": VIEW_MS, "first_ms": FIRST_MS, "first_agent": 0}}
DROP = ("run_id", "latency_ms", "closed_at", "prompt_tokens", "completion_tokens")


@pytest.fixture(scope="module")
def stack(stacks):
    # a lost host is noticed within seconds, as in the fault matrix; each host has a process of
    # its own (sharing the orchestrator's would hold its loop with the host's), the other
    # services share one
    return stacks(hosts=2, env={"PYTHONPATH": str(SIMS), "POPULACE_STORAGE": "memory",
                                "POPULACE_HOST_LOST_S": str(LOST_S), "POPULACE_HEARTBEAT_S": "0.5",
                                "POPULACE_REGISTRY_TTL_S": "4"},
                  one_process=True, apart=("agent-host-0", "agent-host-1"), timeout=120)


def rows_of(db: str, sql: str, params: list) -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(sql, params)
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r)) for r in cur.fetchall()]


def local_rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    return [dict(zip(keys, r)) for r in zip(*(columns[k] for k in keys))]


def test_a_host_held_by_its_views_is_not_lost_and_the_profile_says_where_the_time_went(stack, cli):
    prepared = prepare(RunConfig.model_validate(CONFIG))

    async def go():
        nc = await bus.connect(stack.url, "e2e-slow-author")
        try:
            out = await play(nc, prepared.config, manifest=prepared.manifest, stall_s=300)
            # what the manager's run page reads of the recorder (recorder.read.profile)
            return out, await run_state(nc, out.run_id), await request_profile(nc, out.run_id, timeout=60)
        finally:
            await nc.close()

    out, state, read = asyncio.run(go())
    rid, db = out.run_id, stack.db
    assert out.status == "completed", out.reason
    # never re-placed: the two shares of the first placement played every round
    assert sorted((sh.host_id, sh.epoch) for sh in state.shares) == [("host-0", 0), ("host-1", 0)]
    shares = rows_of(db, "SELECT share, replaced_from FROM _shares WHERE run_id = ? ORDER BY share", [rid])
    assert shares == [{"share": "host-0@0", "replaced_from": None}, {"share": "host-1@0", "replaced_from": None}]

    # exactly the run in one process (the dummy model answers by seed, round and agent: the
    # same without the burn, which only holds the loop)
    local = asyncio.run(run_local(RunConfig.model_validate({**CONFIG, "slow": {}})))
    outcomes = rows_of(db, "SELECT * EXCLUDE (run_id, latency_ms) FROM slow_guesses WHERE run_id = ? "
                           "ORDER BY round, agent_id", [rid])
    assert outcomes == local_rows(local.outcomes)
    rounds = rows_of(db, "SELECT * EXCLUDE (run_id, closed_at, prompt_tokens, completion_tokens) FROM slow_rounds "
                         "WHERE run_id = ? ORDER BY round", [rid])
    assert rounds == local_rows(local.rounds)

    # round_profile: a row per round and host, the environment's, the recorder's
    profile = rows_of(db, "SELECT * FROM round_profile WHERE run_id = ? ORDER BY round, role, host_id", [rid])
    keys = [(r["round"], r["role"], r["host_id"], r["epoch"]) for r in profile]
    assert keys == [(n, role, host, 0) for n in range(1, ROUNDS + 1)
                    for role, host in (("environment", "environment"), ("host", "host-0"), ("host", "host-1"),
                                       ("recorder", "recorder"))]
    hosts = {(r["round"], r["host_id"]): r for r in profile if r["role"] == "host"}
    per_host = AGENTS // 2 * VIEW_MS / 1000  # 1.25 s of views a round
    for (n, host), r in hosts.items():
        burnt = per_host + (FIRST_MS / 1000 if (n, host) == (1, "host-0") else 0.0)
        assert r["agents"] == AGENTS // 2
        # the burnt seconds at least (more on a loaded machine, which preempts the burn: no upper
        # bound on time in a test); and the views, not the turns, are where the time went
        assert burnt <= r["view_s"]
        assert r["turn_s"] < r["view_s"] / 10  # the ratio game's turns are cheap
        assert r["wall_s"] >= r["view_s"]
        assert r["model_wait_s"] > 0  # the dummy model's 50 ms latency, through the gateway
        assert r["observation_bytes"] > 0 and r["view_max_bytes"] > 0 and r["note"] is None
        # turns held at the gate, or paced by the launcher before they start (timing decides which
        # one slows slow author code): both keep the loop turning, which the heartbeat proved above
    assert all(r["decide_s"] > 0 and r["merge_s"] >= 0 for r in profile if r["role"] == "environment")
    assert all(r["record_s"] > 0 for r in profile if r["role"] == "recorder")

    # as the manager's run page reads it of the recorder, and as `populace results --profile` says
    # it: views are where the time went
    assert read.ok, read.error
    assert read.rounds_total == ROUNDS and read.top is not None and read.top[0] == "view_s"
    assert sorted((r["round"], r["host_id"], r["view_s"]) for r in read.rows if r["role"] == "host") == \
        sorted((n, host, r["view_s"]) for (n, host), r in hosts.items())
    res = cli("results", rid, "--profile", "--json", "--db", db)
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    assert run["top"][0] == "view_s"
    assert run["seconds"]["view_s"] == pytest.approx(sum(r["view_s"] for r in hosts.values()))
    text = cli("results", rid, "--profile", "--db", db)
    assert "most of the time: views (Env.view)" in text.stdout
