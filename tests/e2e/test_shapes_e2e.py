"""End to end, the shapes of study beyond "everyone acts at once": scenes (ordered acts inside a
round), activation (only some agents act) and nested groups, each played on real processes and
recorded exactly as the local runner records it — on 3 agent-hosts, with one agent per OS process,
and after an agent-host is killed in the middle of a round of scenes. The module's stack runs its
services in one process but agent-host-1 (the one the kill test SIGKILLs): the world is imported
twice, not seven times."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import duckdb
import pytest
from in_round import kill_in_round
from locked_reads import read_recorded

from populace.client.prepare import PreparedRun, prepare, prepare_file
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.sdk.local import LocalResult, run_local

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
SIMS = Path(__file__).with_name("sims")  # meadow_sim: importable by the services through PYTHONPATH
sys.path.insert(0, str(SIMS))  # … and by this process, which prepares the runs and plays the reference
DROP = ("run_id", "latency_ms", "closed_at")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    db = tmp_path_factory.mktemp("shapes") / "populace.duckdb"
    # a lost host is noticed within seconds (the kill test), as in the fault matrix
    # its services share one process but agent-host-1, which the kill test SIGKILLs and restarts
    s = Stack(hosts=3, db=str(db), env={"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4",
                                         "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_REGISTRY_TTL_S": "4",
                                         "PYTHONPATH": str(SIMS)}, one_process=True, apart=("agent-host-1",))
    with s.up(timeout=120):
        yield s


def fleet(stack: Stack, data: dict | PreparedRun, during=None):
    prepared = data if isinstance(data, PreparedRun) else prepare(RunConfig.model_validate(data))

    async def go():
        nc = await bus.connect(stack.url, "e2e-shapes")
        try:
            task = asyncio.create_task(play(nc, prepared.config, manifest=prepared.manifest, stall_s=180))
            if during is not None:
                await during(nc)
            return await task
        finally:
            await nc.close()

    return prepared, asyncio.run(go())


def table(db: str, name: str, run_id: str, order: str) -> list[dict]:
    """A recorded table's rows of one run (read again while the recorder holds the file for a
    late batch: locked_reads)."""
    def rows_of(con: duckdb.DuckDBPyConnection) -> list[dict]:
        cur = con.execute(f'SELECT * FROM "{name}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [norm({k: v for k, v in zip(names, row) if k not in DROP}) for row in cur.fetchall()]

    return read_recorded(db, rows_of)


def norm(row: dict) -> dict:
    """DuckDB gives JSON columns as text, the local runner Python values: compare them as values."""
    return {k: json.loads(v) if isinstance(v, str) and v.startswith(("{", "[")) else v for k, v in row.items()}


def rows(columns: dict[str, list]) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    return [norm(dict(zip(keys, r))) for r in zip(*(columns[k] for k in keys))]


def assert_as_in_one_process(db: str, run_id: str, local: LocalResult) -> None:
    """Every table the run writes equals the local runner's: outcomes, rounds, acts, transcripts."""
    t = local.tables
    assert table(db, t.outcomes, run_id, "round, agent_id") == rows(local.outcomes)
    recorded_rounds = table(db, t.rounds, run_id, "round")
    local_rounds = [{k: v for k, v in r.items() if k not in ("prompt_tokens", "completion_tokens")}
                    for r in rows(local.rounds)]
    assert [{k: v for k, v in r.items() if k not in ("prompt_tokens", "completion_tokens")}
            for r in recorded_rounds] == local_rounds
    if t.acts is not None:
        assert table(db, t.acts, run_id, "round, group_id, seq") == rows(local.acts)
        assert table(db, "transcripts", run_id, "round, group_id, seq") == rows(local.transcripts)


ULTIMATUM = {"simulation": "ultimatum", "agents": 240, "rounds": 3, "seed": 2,
             "model": {"latency_s": 0.02, "seed": 4}, "game": {"block": 40}}


def test_the_ultimatum_example_on_three_hosts_records_what_one_process_records(stack):
    """examples/ultimatum.yaml as `populace demo --scenario` prepares it (prepare_file), played on
    the module's stack: an offer and a reply per pair, every table as one process records it. The
    demo command itself (its private stack, its --scenario options) is proved by tests/e2e/test_cli.py
    (test_demo_with_a_scenario_plays_the_agents_and_rounds_given, test_demo_plays_and_results_reads_the_db)."""
    prepared, out = fleet(stack, prepare_file(ROOT / "examples" / "ultimatum.yaml"))
    assert out.status == "completed", out.reason
    with duckdb.connect(stack.db, read_only=True) as con:
        hosts = con.execute("SELECT count(DISTINCT host_id) FROM agents WHERE run_id = ?", [out.run_id]).fetchone()[0]
    assert hosts == 3
    local = asyncio.run(run_local(prepared.resolved))
    assert len(local.acts["seq"]) == prepared.config.agents * prepared.config.rounds  # an offer and a reply per pair
    assert_as_in_one_process(stack.db, out.run_id, local)


BARGAINING = {"simulation": "bargaining", "agents": 160, "rounds": 2, "seed": 3,
              "model": {"latency_s": 0.02, "seed": 6}, "game": {"block": 40, "turns": 6}}


@pytest.mark.parametrize("base, per_process", [(ULTIMATUM, False), (ULTIMATUM, True), (BARGAINING, False)],
                         ids=["ultimatum-3-hosts", "ultimatum-one-agent-per-process", "bargaining-3-hosts"])
def test_scenes_on_three_hosts_and_one_agent_per_process_equal_one_process(stack, base, per_process):
    data = {**base, **({"agents": 24, "game": {"block": 8}, "placement": {"agents_per_process": 1}}
                       if per_process else {})}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    local = asyncio.run(run_local(prepared.resolved))
    assert_as_in_one_process(stack.db, out.run_id, local)
    with duckdb.connect(stack.db, read_only=True) as con:
        placed = con.execute("SELECT count(DISTINCT host_id) FROM agents WHERE run_id = ?", [out.run_id]).fetchone()
    assert placed[0] == 3 if not per_process else placed[0] >= 1


def test_activation_records_exactly_the_selected_agents_as_one_process_does(stack):
    data = {"simulation": "vote", "agents": 300, "rounds": 3, "seed": 5, "model": {"latency_s": 0.0, "seed": 1},
            "ballot": {"turnout": 0.2, "show_distribution": True}}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    local = asyncio.run(run_local(prepared.resolved))
    acted = local.rounds["n"]
    assert all(0 < n < 300 for n in acted) and len(set(local.outcomes["agent_id"])) < 300
    assert out.recorded is not None and out.recorded.outcomes == sum(acted)  # rows recorded = agents selected
    assert_as_in_one_process(stack.db, out.run_id, local)


def test_nested_groups_settle_level_by_level_as_in_one_process(stack):
    data = {"simulation": "public-goods-firms", "agents": 107, "rounds": 3, "model": {"latency_s": 0.0, "seed": 3},
            "game": {"group_size": 5}, "firm": {"size": 20, "match": 0.5}}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    local = asyncio.run(run_local(prepared.resolved))
    assert "firm_id" in local.outcomes and max(local.outcomes["firm_id"]) == 5
    assert_as_in_one_process(stack.db, out.run_id, local)


def test_an_agent_host_killed_in_a_round_of_scenes_is_replaced_and_every_table_is_exact(stack):
    """Host 1 is SIGKILLed while round 2's scenes wait on the model: its pairs are placed again
    and replay their whole scenes; every table equals an undisturbed run's."""
    data = {**ULTIMATUM, "agents": 600, "rounds": 3, "model": {"latency_s": 1.0, "seed": 4}, "game": {"block": 50}}

    async def kill_in_round_2(nc):  # inside the round: proposers are waiting on their offers
        await kill_in_round(nc, stack, 2, "agent-host-1", settle_s=0.5)

    prepared, out = fleet(stack, data, during=kill_in_round_2)
    try:
        assert out.status == "completed", out.reason
        with duckdb.connect(stack.db, read_only=True) as con:
            shares = con.execute("SELECT count(*) FROM _shares WHERE run_id = ?", [out.run_id]).fetchone()[0]
        assert shares >= 4, "the lost host's agents should have been placed again, in a new share"
        assert_as_in_one_process(stack.db, out.run_id, asyncio.run(run_local(prepared.resolved)))
    finally:
        stack.restart("agent-host-1")


# -- worlds, views and partial columns ------------------------------------------------------------
SCHELLING = {"simulation": "schelling", "agents": 600, "rounds": 4, "seed": 7, "model": {"latency_s": 0.0},
             "grid": {"width": 30, "height": 30}, "rule": {"threshold": 0.5}}


# nearby moves by claims, and only the unhappy take a turn (selected from the world)
CLAIMED = {"move": "nearby", "radius": 2, "ask": "unhappy"}


@pytest.mark.parametrize(("per_process", "rule"), [(False, {}), (False, CLAIMED), (True, CLAIMED)],
                         ids=["3-hosts", "3-hosts-claims", "one-agent-per-process-claims"])
def test_a_world_and_its_views_on_three_hosts_and_one_agent_per_process_equal_one_process(stack, per_process, rule):
    data = {**SCHELLING, "rule": {**SCHELLING["rule"], **rule},
            **({"agents": 40, "grid": {"width": 8, "height": 8}, "placement": {"agents_per_process": 1}}
               if per_process else {})}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    local = asyncio.run(run_local(prepared.resolved))
    assert sum(local.rounds["moved"]) > 0  # the world changed between rounds
    if rule:  # only the unhappy acted, and movers claimed cells (granted or not)
        assert sum(local.rounds["n"]) < data["agents"] * data["rounds"]
        assert any(t is not None for t in local.outcomes["target"])
    assert_as_in_one_process(stack.db, out.run_id, local)


def test_the_living_that_wake_claim_patches_on_three_hosts_and_one_agent_per_process_as_in_one_process(stack):
    """`select(state, round, world)` (the living), `wakes(obs, view)`, ranked claims and invariants
    (tests/e2e/sims/meadow_sim.py), on the fleet."""
    for extra in ({}, {"agents": 24, "placement": {"agents_per_process": 1}}):
        data = {"simulation": "meadow_sim:Grazing", "agents": 90, "rounds": 5, "seed": 3,
                "model": {"latency_s": 0.0}, **extra}
        prepared, out = fleet(stack, data)
        assert out.status == "completed", out.reason
        local = asyncio.run(run_local(prepared.resolved))
        assert local.rounds["alive"][-1] < data["agents"] and sum(local.rounds["hungry"]) > 0
        assert_as_in_one_process(stack.db, out.run_id, local)


def test_a_grid_of_800_by_800_cells_with_per_cell_state_completes_on_the_fleet(tmp_path):
    """Per-cell state no longer travels in round messages: 640,000 cells and 200,000 agents,
    whose movers (a partial column over the message limit) travel by reference. Its own stack,
    with the default host-loss window: a busy 2-core machine needs it for 100,000 agents a host;
    its services in one process (nothing here kills or measures one)."""
    data = {**SCHELLING, "agents": 200_000, "rounds": 2, "grid": {"width": 800, "height": 800},
            "rule": {"threshold": 0.6}}
    stack = Stack(hosts=2, db=str(tmp_path / "populace.duckdb"), env={"POPULACE_STORAGE": "memory"},
                  one_process=True)
    with stack.up(timeout=120):
        prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == 400_000
    local = asyncio.run(run_local(prepared.resolved))
    recorded_rounds = [{k: v for k, v in r.items() if k not in ("prompt_tokens", "completion_tokens")}
                       for r in table(stack.db, "schelling_rounds", out.run_id, "round")]
    assert recorded_rounds == [{k: v for k, v in r.items() if k not in ("prompt_tokens", "completion_tokens")}
                               for r in rows(local.rounds)]
    assert local.rounds["moved"][0] > 40_000
