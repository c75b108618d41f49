"""Activation with the world (issue 37): `select(state, round, world)` sees the world the round is
played in and `wakes(obs, view)` the agent's own view; both give the same agents in one process, on
several hosts, one agent per process and after a resume. Packages written against the older hooks —
`select(state, round)`, `wakes(obs)` — keep getting what they got (tests/unit/test_sdk_shapes.py
plays them)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from populace.core.contracts import RunConfig
from populace.sdk import Observation, select
from populace.sdk.local import run_local
from populace.sdk.registry import resolve
from populace.sdk.testing import check_resume

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
from meadow_sim import Grazer, Grazing, MeadowEnv, Sight

CONFIG = RunConfig(simulation="meadow_sim:Grazing", agents=40, rounds=6, seed=3)
DROP = ("latency_ms",)


def kept(columns: dict[str, list]) -> dict[str, list]:
    return {k: v for k, v in columns.items() if k not in DROP}


def test_the_living_that_wake_act_the_same_in_one_process_on_three_hosts_and_one_agent_per_process():
    one = asyncio.run(run_local(CONFIG))
    alive = one.rounds["alive"]
    assert alive[0] == 40 and alive[-1] < 40  # some starved: the dead never act again
    acted = {r: {a for a, rr in zip(one.outcomes["agent_id"], one.outcomes["round"]) if rr == r} for r in range(1, 7)}
    for r in range(2, 7):
        assert len(acted[r]) <= alive[r - 2] and len(acted[r]) == one.rounds["n"][r - 1]
    assert sum(one.rounds["n"]) < sum([40, *alive[:-1]])  # the living that did not wake did not act
    assert sum(one.rounds["hungry"]) > 0 and sum(one.rounds["fed"]) > 0  # contested patches: some lost
    for other in (asyncio.run(run_local(CONFIG, hosts=3)), asyncio.run(run_local(CONFIG, hosts=2, one_per_process=True))):
        assert kept(other.outcomes) == kept(one.outcomes)
        assert kept(other.rounds) | {"closed_at": None} == kept(one.rounds) | {"closed_at": None}


def test_a_run_resumed_or_forked_after_any_round_selects_and_grants_as_the_uninterrupted_one():
    check_resume(Grazing, {"agents": 30, "rounds": 5})


def test_select_gets_the_world_the_round_is_played_in_and_wakes_gets_the_shared_observation_and_the_view():
    seen: dict[str, list] = {"select": [], "decided": [], "wakes": []}

    class Spying(MeadowEnv):
        def start_world(self, state):
            world = super().start_world(state)
            seen["decided"].append((0, world.digest))
            return world

        def select(self, state, round, world):
            seen["select"].append((round, world.digest))
            return super().select(state, round, world)

        def decide(self, state, round, total, world):
            out = super().decide(state, round, total, world)
            seen["decided"].append((round, out[2].digest))
            return out

    class Watching(Grazer):
        __slots__ = ()

        def wakes(self, obs, view):
            seen["wakes"].append((type(obs), type(view), obs.round == view.round))
            return super().wakes(obs, view)

    sim = type("Spied", (Grazing,), {"Env": Spying, "Agent": Watching})
    asyncio.run(run_local(resolve(CONFIG.model_copy(update={"rounds": 3}), sim)))
    decided = dict(seen["decided"])
    # round n is selected from the world round n-1's decide left (round 1: start_world's), once
    # where the round is decided (and once more before the run, when its round 1 is checked)
    assert all(digest == decided[r - 1] for r, digest in seen["select"])
    assert {r for r, _ in seen["select"]} == {1, 2, 3, 4}
    assert set(seen["wakes"]) == {(Observation, Sight, True)}


def test_an_agent_with_the_older_wakes_still_gets_the_shared_observation_when_its_environment_gives_views():
    got: list[type] = []

    class Older(Grazer):
        __slots__ = ()

        def wakes(self, obs):  # written before views: obs is the round's shared observation
            got.append(type(obs))
            return obs.round % 2 == 1

    sim = type("Older", (Grazing,), {"Agent": Older})
    out = asyncio.run(run_local(resolve(CONFIG.model_copy(update={"rounds": 2}), sim)))
    assert set(got) == {Observation} and out.rounds["n"][1] == 0  # nobody woke in round 2
    assert np.array_equal(np.unique(out.outcomes["round"]), [1])


def test_a_selection_that_reads_the_world_is_checked_before_the_run_on_the_world_it_starts_with():
    from populace.client.prepare import checked
    from populace.core.scenario import ScenarioError

    class Misnamed(MeadowEnv):
        def select(self, state, round, world):
            return select.column("living")

    sim = type("Misnamed", (Grazing,), {"Env": Misnamed})
    with pytest.raises(ScenarioError, match=r"^select: Misnamed\.select\(state, 1, world\): column 'living' is not a "
                                            r"column of Meadow \(energy, alive, grazing, grass\)$"):
        checked_with(sim, checked)


def checked_with(sim, checked):
    """`populace validate`'s check of a simulation class (not installed: looked up by this name)."""
    from unittest import mock

    with mock.patch("populace.sdk.registry.load_simulation", return_value=sim), \
            mock.patch("populace.client.prepare.load_simulation", return_value=sim):
        return checked(CONFIG)


def test_a_claim_that_is_not_a_whole_number_pauses_the_round_naming_the_agent():
    from populace.sdk.play import RoundPaused

    class Sloppy(Grazer):
        __slots__ = ()

        async def turn(self, obs, llm):
            out = await super().turn(obs, llm)
            if obs.round == 2 and self.id == 7:
                out.choices = [2.5]  # a list column: the outcome's types let it through, the claim does not
            return out

        def wakes(self, obs, view):
            return True

    sim = type("Sloppy", (Grazing,), {"Agent": Sloppy})
    with pytest.raises(RoundPaused, match=r"^simulation 'grazing', round 2: MeadowEnv\.reduce: claims: agent 7 claims "
                                          r"2\.5: a target is a whole number$"):
        asyncio.run(run_local(resolve(CONFIG, sim), hosts=2))


def test_the_claims_example_of_docs_worlds_md_runs_as_written_the_same_on_one_host_and_three():
    import re
    import types

    text = (Path(__file__).parents[2] / "docs" / "worlds.md").read_text()
    code = re.search(r"## Exclusive claims.*?```python\n(.*?)```", text, re.S).group(1)
    module = types.ModuleType("worlds_md_claims")
    sys.modules[module.__name__] = module
    try:
        exec(compile(code, "docs/worlds.md", "exec"), module.__dict__)
        sim = module.SugarSketch
        config = RunConfig(simulation="worlds_md_claims:SugarSketch", agents=300, rounds=4, seed=2)
        one = asyncio.run(run_local(resolve(config, sim)))
        three = asyncio.run(run_local(resolve(config, sim), hosts=3))
    finally:
        del sys.modules[module.__name__]
    assert sum(one.rounds["moved"]) > 0 and sum(one.rounds["blocked"]) == 0  # each may stay: none left with nothing
    firsts = [(r, c[0]) for r, c in zip(one.outcomes["round"], one.outcomes["choices"]) if c]
    assert len(set(firsts)) < len(firsts)  # some wanted the same cell first: one got it, the others their next
    assert kept(three.outcomes) == kept(one.outcomes) and three.rounds["moved"] == one.rounds["moved"]


def test_a_world_that_breaks_an_invariant_from_the_start_stops_the_run_before_round_1():
    from populace.sdk.engine import RuleBroken

    class Crowded(MeadowEnv):
        def start_world(self, state):
            world = super().start_world(state)
            grazing = np.full(world.sizes["agents"], -1, dtype=np.int32)
            grazing[[3, 8]] = 5
            return world.replace(grazing=grazing)

    sim = type("Crowded", (Grazing,), {"Env": Crowded})
    with pytest.raises(RuleBroken, match=r"^simulation 'grazing': invariant 'no two grazers on one patch' is broken "
                                         r"before round 1 \(start_world\): patch 5 is held by agents 3, 8$"):
        asyncio.run(run_local(resolve(CONFIG, sim)))
