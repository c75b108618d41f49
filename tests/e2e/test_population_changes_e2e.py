"""End to end (issue 37), populations that change on real processes, 2 agent-hosts: foragers die
and have children from their environment's `decide` (a world that grows by every birth, newcomers
placed on the hosts between rounds), and a panel loses and gains respondents by a scenario's
schedule with a planned interview. Each run records what one process records — every outcome and
round row, table `population` — no departed agent appears in a later round, every newcomer is in
table `agents` and plays; a fork after round k with nothing changed plays the parent's rounds
after k exactly (who was alive comes back with the checkpoint), and so does a cancelled run
resumed; a newcomer born with a state its class does not declare pauses the run naming the
field, round and agent."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import duckdb
import pytest

from populace.client.prepare import prepare, prepare_fork
from populace.client.run import cancel, new_run_id, play, resume
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import Restore, RoundOpen, RunConfig
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

SIMS = Path(__file__).with_name("sims")  # lifecycle_sims: importable by the services through PYTHONPATH
sys.path.insert(0, str(SIMS))  # … and by this process, which prepares the runs and plays the reference
DROP = ("run_id", "latency_ms", "closed_at")
FORAGERS = {"simulation": "lifecycle_sims:Foragers", "agents": 300, "rounds": 5, "seed": 3,
            "model": {"latency_s": 0.0, "seed": 5}}
SURVEY = {"id": "mood", "after": [2, 4], "questions": [{"id": "mood", "kind": "likert", "text": "How are you?",
                                                        "points": 5}]}
PANEL = {"simulation": "lifecycle_sims:Wanderers", "agents": 200, "rounds": 4, "seed": 1,
         "model": {"latency_s": 0.0}, "interviews": [SURVEY],
         "population": {"changes": [{"after": "every", "left": 0.05, "reason": "moved", "arrived": 6},
                                    {"after": [2], "died": 0.1}]}}


@pytest.fixture(scope="module")
def stack(stacks):
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory", "PYTHONPATH": str(SIMS)}, one_process=True)


def fleet(stack: Stack, config: RunConfig, manifest: dict | None = None, fork: Restore | None = None):
    async def go():
        nc = await bus.connect(stack.url, "e2e-population")
        try:
            return await play(nc, config, manifest=manifest, stall_s=120, fork=fork)
        finally:
            await nc.close()

    return asyncio.run(go())


def table(db: str, name: str, run_id: str, order: str = "round, agent_id") -> list[dict]:
    with duckdb.connect(db, read_only=True) as con:
        cur = con.execute(f'SELECT * FROM "{name}" WHERE run_id = ? ORDER BY {order}', [run_id])
        names = [d[0] for d in cur.description]
        return [{k: v for k, v in zip(names, row) if k not in DROP} for row in cur.fetchall()]


def rows(columns: dict[str, list], order: tuple[str, ...] = ("round", "agent_id")) -> list[dict]:
    keys = [k for k in columns if k not in DROP]
    out = [dict(zip(keys, r)) for r in zip(*(columns[k] for k in keys))]
    return sorted(out, key=lambda r: tuple(r[k] for k in order))


def check_as_in_one_process(db: str, run_id: str, prepared) -> dict[int, int]:
    """The fleet's outcomes, rounds and population rows equal one process's; returns the
    departed (agent -> the round after which it went)."""
    local = asyncio.run(run_local(prepared.resolved))
    t = local.tables
    assert table(db, t.outcomes, run_id) == rows(local.outcomes)
    fleet_rounds = [{k: v for k, v in r.items() if k in local.rounds} for r in table(db, t.rounds, run_id, "round")]
    assert fleet_rounds == [{k: v for k, v in r.items() if k in fleet_rounds[0]} for r in rows(local.rounds, ("round",))]
    population = table(db, "population", run_id, "round, event, agent_id")
    assert population == rows(local.population, ("round", "event", "agent_id")) and population
    gone = {r["agent_id"]: r["round"] for r in population if r["event"] in ("died", "left")}
    late = [r for r in table(db, t.outcomes, run_id) if r["agent_id"] in gone and r["round"] > gone[r["agent_id"]]]
    assert late == []
    # every newcomer is placed on a host for the round after it came (the last round's never play)
    last = prepared.config.rounds
    newcomers = {r["agent_id"] for r in population if r["event"] in ("born", "arrived") and r["round"] < last}
    placed = {r["agent_id"] for r in table(db, "agents", run_id, "agent_id")}
    assert newcomers <= placed and max(newcomers) == max(placed)
    return gone


def test_births_and_deaths_from_decide_on_two_hosts_equal_one_process_and_a_fork_resumes_them(stack):
    prepared = prepare(RunConfig.model_validate(FORAGERS))
    parent = fleet(stack, prepared.config, prepared.manifest)
    assert parent.status == "completed", parent.reason
    check_as_in_one_process(stack.db, parent.run_id, prepared)
    whole = table(stack.db, "foragers_outcomes", parent.run_id)
    after = 2
    forked = prepare_fork(prepared.config, after, {}, prepared.manifest, parent.run_id)
    out = fleet(stack, forked.config, forked.manifest, fork=Restore(run_id=parent.run_id, round=after))
    assert out.status == "completed", out.reason
    assert table(stack.db, "foragers_outcomes", out.run_id) == [r for r in whole if r["round"] > after]
    assert table(stack.db, "population", out.run_id) == \
        [r for r in table(stack.db, "population", parent.run_id) if r["round"] > after]


def test_a_scheduled_panel_asks_only_those_who_played_each_round(stack):
    prepared = prepare(RunConfig.model_validate(PANEL))
    out = fleet(stack, prepared.config, prepared.manifest)
    assert out.status == "completed", out.reason  # every answer it owed (of those who played) is in
    gone = check_as_in_one_process(stack.db, out.run_id, prepared)
    asked = table(stack.db, "interviews", out.run_id, "after_round, agent_id")
    for k in (2, 4):
        who = {r["agent_id"] for r in asked if r["after_round"] == k}
        assert who and not {a for a in who if a in gone and gone[a] < k}


def test_a_cancelled_run_resumes_with_the_living_of_its_last_round(stack):
    """Cancelled in round 3 (its agents wait on the model), resumed: rounds 3 and 4 are played by
    the living after round 2, newcomers included, as if it never stopped."""
    prepared = prepare(RunConfig.model_validate({**PANEL, "interviews": [], "model": {"latency_s": 0.5}}))
    rid = new_run_id()

    async def go():
        nc = await bus.connect(stack.url, "e2e-population-resume")
        try:
            async def on_event(kind, model):
                if isinstance(model, RoundOpen) and model.round == 3:
                    await cancel(nc, rid, "a pause")

            pending: list[asyncio.Task] = []
            first = await play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=120,
                               on_event=lambda k, m: pending.append(asyncio.ensure_future(on_event(k, m))))
            await asyncio.gather(*pending)
            return first, await resume(nc, rid, stall_s=120)
        finally:
            await nc.close()

    first, out = asyncio.run(go())
    assert first.status == "cancelled" and out.status == "completed", out.reason
    check_as_in_one_process(stack.db, rid, prepared)


def test_a_newcomer_with_a_state_its_class_does_not_declare_pauses_the_run_naming_it(stack):
    prepared = prepare(RunConfig.model_validate({**FORAGERS, "simulation": "lifecycle_sims:BadBirths"}))
    out = fleet(stack, prepared.config, prepared.manifest)
    assert out.status == "paused"
    assert "BadBirthEnv.decide: round 1, agent 300: births.0.state: 'agee' is not one of the agent's " \
           "state_fields (age, memory)" in out.reason, out.reason
