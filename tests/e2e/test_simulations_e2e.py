"""End to end, the seam's promises on real processes: every built-in simulation plays on the
fleet and records one outcome per agent per round; on the dummy model the fleet's rounds and
outcomes (and a scene's acts) equal a run in one process (the SDK's local runner), with agents many per process
or one per process; group payoffs recomputed from the recorded contributions equal the
recorded ones; an agent's bug is that agent's invalid outcome, an environment's bug and a
simulation a service cannot import fail the run at once with a reason that names them."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import duckdb
import pytest

from populace.client.prepare import prepare, prepare_fork
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import Restore, RunConfig, Usage
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

SIMS = Path(__file__).with_name("sims")  # faulty_sims: importable by the services through PYTHONPATH
COMPAT = Path(__file__).parents[1] / "compat" / "packages"  # packages written against an earlier SDK
sys.path[:0] = [str(SIMS), str(COMPAT)]  # … and by this process, which prepares the runs


@pytest.fixture(scope="module")
def stack(stacks):
    """Two hosts in one process with the other services (the one-agent-per-process test's agents
    still get their own processes): what the fleet gives is compared, not how it is split into
    processes."""
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory", "PYTHONPATH": os.pathsep.join((str(SIMS), str(COMPAT)))},
                  one_process=True)


def fleet(stack: Stack, data: dict, fork: Restore | None = None):
    prepared = prepare(RunConfig.model_validate(data))

    async def go():
        nc = await bus.connect(stack.url, "e2e-sims")
        try:
            return await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120, fork=fork)
        finally:
            await nc.close()

    return prepared, asyncio.run(go())


def fork_of(stack: Stack, prepared, parent_run_id: str, after: int):
    """A fork of a run played here, after round `after`, with nothing changed: played on the stack."""
    forked = prepare_fork(prepared.config, after, {}, prepared.manifest, parent_run_id)

    async def go():
        nc = await bus.connect(stack.url, "e2e-sims-fork")
        try:
            return await play(nc, forked.config, manifest=forked.manifest, stall_s=120,
                              fork=Restore(run_id=parent_run_id, round=after))
        finally:
            await nc.close()

    return asyncio.run(go())


def recorded(db: str, table: str, run_id: str, drop: tuple[str, ...], order: str = "round, agent_id") -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{table}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, row) if k not in drop} for row in cur.fetchall()]


def local_rows(columns: dict[str, list], drop: tuple[str, ...]) -> list[dict]:
    keys = [k for k in columns if k not in drop]
    return [dict(zip(keys, row)) for row in zip(*(columns[k] for k in keys))]


def json_values(rows: list[dict]) -> list[dict]:
    """DuckDB returns JSON columns as text; the local runner keeps Python values."""
    import json

    return [{k: json.loads(v) if isinstance(v, str) and v[:1] in ("{", "[") else v for k, v in r.items()}
            for r in rows]


CASES = {
    "ratio-game": {"agents": 300, "rounds": 3},
    "public-goods": {"agents": 203, "rounds": 3, "game": {"group_size": 5}},  # the last group has 3
    "vote": {"agents": 150, "rounds": 3, "ballot": {"show_distribution": True}},
    # a scene of 4 members and two ordered acts: 203 = 10 blocks of 20 and one of 3 (a group of 3)
    "punishment": {"agents": 203, "rounds": 3, "game": {"block": 20}},
    # chain of thought as the platform's section (model.answer), on a simulation that writes none
    "public-goods, model.answer: cot": {"simulation": "public-goods", "agents": 53, "rounds": 2,
                                        "game": {"group_size": 5},
                                        "model": {"latency_s": 0.0, "seed": 9, "answer": "cot"}},
}
CALLS = {"punishment": 2}  # model calls per agent per round (default 1)


@pytest.mark.parametrize("simulation", sorted(CASES))
def test_the_fleet_gives_exactly_what_one_process_gives(stack, simulation):
    data = {"simulation": simulation, "seed": 4, "model": {"latency_s": 0.0, "seed": 9}, **CASES[simulation]}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    tables = prepared.resolved.simulation.tables()
    agents, rounds = data["agents"], data["rounds"]
    assert out.recorded is not None and out.recorded.outcomes == agents * rounds
    outcomes = recorded(stack.db, tables.outcomes, out.run_id, ("run_id", "latency_ms"))
    # one outcome per agent per round
    assert sorted((r["round"], r["agent_id"]) for r in outcomes) == [
        (n, a) for n in range(1, rounds + 1) for a in range(agents)]
    summary = recorded(stack.db, tables.rounds, out.run_id, ("run_id", "closed_at"), order="round")
    # the fleet counts each round's LLM work: one call per agent, no retries, and no tokens on
    # the dummy model (it runs no model); the local run counts the same
    usage = [{k: r[k] for k in Usage.RECORDED} for r in summary]
    calls = agents * CALLS.get(simulation, 1)
    assert usage == [{"llm_calls": calls, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                      "cached_tokens": 0, "dollars": 0.0}] * rounds

    if data["model"].get("answer") == "cot":  # every answer thought first, and still parsed
        assert all(r["raw"].startswith('{"reasoning": ') and r["valid"] for r in outcomes)
    local = asyncio.run(run_local(prepared.resolved))
    assert json_values(outcomes) == json_values(local_rows(local.outcomes, ("run_id", "latency_ms")))
    assert json_values(summary) == json_values(local_rows(local.rounds, ("run_id", "closed_at")))
    if tables.acts is not None:  # scenes: every act too, one per model call here
        acts = recorded(stack.db, tables.acts, out.run_id, ("run_id", "latency_ms"), order="round, group_id, seq")
        assert len(acts) == calls * rounds
        assert json_values(acts) == json_values(local_rows(local.acts, ("run_id", "latency_ms")))


def test_one_agent_per_process_on_the_fleet_gives_the_same_groups_and_payoffs(stack):
    data = {"simulation": "public-goods", "agents": 12, "rounds": 2, "seed": 1,
            "model": {"latency_s": 0.0, "seed": 2}, "game": {"group_size": 5},
            "placement": {"agents_per_process": 1}}
    prepared, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    tables = prepared.resolved.simulation.tables()
    outcomes = recorded(stack.db, tables.outcomes, out.run_id, ("run_id", "latency_ms"))
    local = asyncio.run(run_local(prepared.resolved))
    assert outcomes == local_rows(local.outcomes, ("run_id", "latency_ms"))


def test_group_payoffs_recomputed_from_recorded_contributions_match(stack):
    data = {"simulation": "public-goods", "agents": 103, "rounds": 3, "model": {"latency_s": 0.0, "seed": 5},
            "game": {"group_size": 4, "endowment": 20, "multiplier": 1.6}}
    _, out = fleet(stack, data)
    assert out.status == "completed", out.reason
    with duckdb.connect(stack.db, read_only=True) as con:
        # payoff = endowment - contribution + multiplier * (group total) / (group size); an
        # invalid answer contributes 0 and is still paid
        mismatches = con.execute("""
            WITH o AS (SELECT round, group_id, agent_id, payoff,
                              CASE WHEN valid THEN contribution ELSE 0 END AS c
                       FROM public_goods_outcomes WHERE run_id = ?),
                 g AS (SELECT round, group_id, sum(c) AS total, count(*) AS k FROM o GROUP BY 1, 2)
            SELECT count(*) FROM o JOIN g USING (round, group_id)
            WHERE abs(o.payoff - (20 - o.c + 1.6 * g.total / g.k)) > 1e-9""", [out.run_id]).fetchone()[0]
        sizes = con.execute("SELECT group_id, count(*) FROM public_goods_outcomes WHERE run_id = ? AND round = 1 "
                            "GROUP BY 1 ORDER BY 1", [out.run_id]).fetchall()
    assert mismatches == 0
    assert len(sizes) == 26 and sizes[-1] == (25, 3)  # 103 = 25 groups of 4 + one of 3, none dropped


def test_an_agents_bug_is_its_invalid_outcome_and_the_run_goes_on(stack):
    _, out = fleet(stack, {"simulation": "faulty_sims:Flaky", "agents": 100, "rounds": 2,
                                  "model": {"latency_s": 0.0}})
    assert out.status == "completed", out.reason
    with duckdb.connect(stack.db, read_only=True) as con:
        bad = con.execute("SELECT agent_id, valid, value, raw, error FROM flaky_guesses WHERE run_id = ? "
                          "AND round = 1 AND NOT valid ORDER BY agent_id", [out.run_id]).fetchall()
    assert [b[0] for b in bad] == list(range(3, 100, 10))
    assert bad[0][1:] == (False, None, "<agent error: ValueError: agent 3 has a bug>",
                          "agent: ValueError: agent 3 has a bug")
    assert all(r.n_valid == 90 and r.n == 100 for r in out.results)
    # the simulation's own errors, apart from the model's invalid answers (issue 25), on the fleet too
    assert all(r.n_simulation_errors == 10 for r in out.results)


def test_an_environments_bug_fails_the_run_naming_the_simulation_and_round(stack):
    _, out = fleet(stack, {"simulation": "faulty_sims:EnvBoom", "agents": 50, "rounds": 3,
                           "model": {"latency_s": 0.0}})
    assert out.status == "failed"
    assert "simulation 'env-boom': its environment failed to decide round 2" in out.reason
    assert "ZeroDivisionError: the environment's own bug" in out.reason
    assert [r.round for r in out.results] == [1]  # the round it decided stays recorded


def test_a_simulation_the_services_cannot_import_fails_the_run_at_once(stack, tmp_path):
    (tmp_path / "only_here.py").write_text("from populace_ratio_game import RatioGame\n\n"
                                          "class Local(RatioGame):\n    name = 'only-here'\n")
    sys.path.insert(0, str(tmp_path))  # this process can import it; the services cannot
    try:
        _, out = fleet(stack, {"simulation": "only_here:Local", "agents": 10, "rounds": 2})
    finally:
        sys.path.remove(str(tmp_path))
    assert out.status == "failed" and out.results == []
    assert out.reason.startswith("the orchestrator cannot run it: simulation 'only_here:Local' (import path): "
                                 "cannot import: ModuleNotFoundError"), out.reason


def test_the_strangers_package_forks_and_resumes_exactly_on_the_fleet(stack):
    """Issue 25: a package whose agents declare `state_fields = ("score",)` lost their memory in
    every checkpoint, so a fork from round k with nothing changed (as a resume, or a re-placed
    host) played different rows and reported completed. Memory is now always saved."""
    data = {"simulation": "stranger_sims:Walk", "agents": 300, "rounds": 4, "seed": 2,
            "model": {"latency_s": 0.0, "seed": 11}}
    prepared, parent = fleet(stack, data)
    assert parent.status == "completed", parent.reason
    table = prepared.resolved.simulation.tables().outcomes
    whole = recorded(stack.db, table, parent.run_id, ("run_id", "latency_ms"))
    assert len(whole) == 300 * 4 and any(r["score"] != r["round"] for r in whole if r["move"] == "go")
    for after in (1, 2):
        out = fork_of(stack, prepared, parent.run_id, after)
        assert out.status == "completed", out.reason
        assert recorded(stack.db, table, out.run_id, ("run_id", "latency_ms")) == \
            [r for r in whole if r["round"] > after]


@pytest.mark.parametrize("package", ["compat_negotiation:Negotiation", "compat_feedpool:FeedPool"])
def test_a_package_written_against_an_earlier_sdk_plays_and_forks_exactly_on_the_fleet(stack, package):
    """Issue 37: a negotiation and a feed pool written a month before failed after round 1 — a
    tuple in the environment's partial came back from JSON as a list (unhashable in `decide`), a
    frozenset in an agent's state as a list (`seen | …` raised on a restored agent). On the
    fleet they play what one process plays, and a fork after round 2 (every agent and the
    environment restored from their checkpoints) plays the parent's rows again."""
    data = {"simulation": package, "agents": 24, "rounds": 4, "seed": 3, "model": {"latency_s": 0.0, "seed": 5}}
    prepared, parent = fleet(stack, data)
    assert parent.status == "completed", parent.reason
    table = prepared.resolved.simulation.tables().outcomes
    whole = recorded(stack.db, table, parent.run_id, ("run_id", "latency_ms"))
    assert len(whole) == 24 * 4 and not any(r["error"] for r in whole)
    local = asyncio.run(run_local(prepared.resolved))
    assert json_values(whole) == json_values(local_rows(local.outcomes, ("run_id", "latency_ms")))
    out = fork_of(stack, prepared, parent.run_id, 2)
    assert out.status == "completed", out.reason
    assert recorded(stack.db, table, out.run_id, ("run_id", "latency_ms")) == [r for r in whole if r["round"] > 2]


def test_state_no_checkpoint_can_keep_pauses_the_run_naming_the_field_and_agent(stack):
    """Issue 37: a value no checkpoint rebuilds (a random.Random in `state_fields`) used to fail the
    run with pydantic's 'Unable to serialize unknown type'; it now pauses it at the first checkpoint,
    naming the class, the field and an agent, resumable once the simulation is fixed."""
    data = {"simulation": "stranger_sims:Rolling", "agents": 30, "rounds": 3, "seed": 2,
            "model": {"latency_s": 0.0, "seed": 1}}
    _, out = fleet(stack, data)
    assert out.status == "paused", (out.status, out.reason)
    assert "round 1: its agents' state cannot be checkpointed: RollingWalker.rng: agent " in out.reason
    assert "'s value: a random.Random" in out.reason


SUGARSCAPE = {"simulation": "sugarscape", "agents": 300, "rounds": 5, "seed": 4, "model": {"latency_s": 0.0, "seed": 9},
              "grid": {"width": 30, "height": 30}, "traits": {"endowment": [1, 8]},
              "rule": {"decider": "llm", "replacement": True}}


def test_sugarscape_on_the_fleet_keeps_its_rules_and_gives_exactly_what_one_process_gives(stack):
    """Issue 37's Done-when: the built-in Sugarscape (the model choosing among the cells in sight,
    the starved replaced) records on 2 hosts the rows one process gives — outcomes, rounds and table
    `population` — and in the fleet's DuckDB no two living agents share a cell in any round, no
    departed agent appears in a later round, and every death is there, after the round whose row
    shows the agent starving."""
    prepared, out = fleet(stack, SUGARSCAPE)
    assert out.status == "completed", out.reason
    local = asyncio.run(run_local(prepared.resolved))
    drop = ("run_id", "latency_ms")
    outcomes = recorded(stack.db, "sugarscape_outcomes", out.run_id, drop)
    assert json_values(outcomes) == json_values(local_rows(local.outcomes, drop))
    summary = recorded(stack.db, "sugarscape_rounds", out.run_id, ("run_id", "closed_at"), order="round")
    assert summary == local_rows(local.rounds, ("run_id", "closed_at"))
    people = recorded(stack.db, "population", out.run_id, ("run_id",), order="round, agent_id")
    assert people == sorted(local_rows(local.population, ("run_id",)), key=lambda r: (r["round"], r["agent_id"]))
    with duckdb.connect(stack.db, read_only=True) as con:
        def one(sql: str) -> int:
            return con.execute(sql, [out.run_id]).fetchone()[0]

        assert one("SELECT count(*) FROM (SELECT round, cell FROM sugarscape_outcomes WHERE run_id = ? "
                   "GROUP BY 1, 2 HAVING count(*) > 1)") == 0
        assert one("SELECT count(*) FROM sugarscape_outcomes o JOIN population p USING (run_id, agent_id) "
                   "WHERE o.run_id = ? AND p.event IN ('died', 'left') AND o.round > p.round") == 0
        died = one("SELECT count(*) FROM population WHERE run_id = ? AND event = 'died'")
        assert died == sum(r["died"] for r in summary) > 0
        assert one("SELECT count(*) FROM population p JOIN sugarscape_outcomes o USING (run_id, agent_id, round) "
                   "WHERE p.run_id = ? AND p.event = 'died' AND o.sugar <= 0") == died
        assert one("SELECT count(*) FROM population WHERE run_id = ? AND event = 'born'") == died  # replaced
        assert one("SELECT count(DISTINCT round) FROM sugarscape_outcomes WHERE run_id = ? AND NOT valid") > 0


def test_an_environment_keeping_5_mb_between_rounds_plays_and_forks_on_two_hosts_as_in_one_process(stack):
    """Issue 40: the environment's state stays with the environment and its checkpoint object of
    each round; round opens, KV `runs` and the hosts carry a reference. A ledger of 5 MB (20 times
    what a round's messages could carry) plays what one process plays, every round's checksum of
    the whole ledger included, and a fork after round 2, whose environment reads its parent's
    state from the object store by reference, plays the parent's rows again."""
    data = {"simulation": "archive_sim:Archive", "agents": 60, "rounds": 4, "seed": 8,
            "model": {"latency_s": 0.0, "seed": 2}, "megabytes": 5}
    prepared, parent = fleet(stack, data)
    assert parent.status == "completed", parent.reason
    tables = prepared.resolved.simulation.tables()
    whole = recorded(stack.db, tables.outcomes, parent.run_id, ("run_id", "latency_ms"))
    rounds = recorded(stack.db, tables.rounds, parent.run_id, ("run_id", "closed_at"), order="round")
    local = asyncio.run(run_local(prepared.resolved))
    assert len(whole) == 60 * 4 and json_values(whole) == json_values(local_rows(local.outcomes, ("run_id", "latency_ms")))
    assert json_values(rounds) == json_values(local_rows(local.rounds, ("run_id", "closed_at")))
    first = int(5 * 1024 * 1024 / 11)
    assert [r["length"] for r in rounds] == [first + n for n in (1, 2, 3, 4)]
    assert len({r["checksum"] for r in rounds}) == 4
    out = fork_of(stack, prepared, parent.run_id, 2)
    assert out.status == "completed", out.reason
    assert recorded(stack.db, tables.outcomes, out.run_id, ("run_id", "latency_ms")) == \
        [r for r in whole if r["round"] > 2]
    assert recorded(stack.db, tables.rounds, out.run_id, ("run_id", "closed_at"), order="round") == \
        [r for r in rounds if r["round"] > 2]
