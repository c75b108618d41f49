"""What a checkpoint keeps of an agent (issue 25): `memory` always, plus what `state_fields`
adds; an attribute a turn changes that is not saved is refused by name (populace.sdk.statecheck)
in local runs and in `check_resume`, which also compares a run resumed after each round with the
uninterrupted one, row by row."""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path

import pytest

from populace.core.contracts import RunConfig
from populace.sdk import Agent, SimulationError
from populace.sdk.local import run_local
from populace.sdk.registry import resolve
from populace.sdk.statecheck import StateCheck, UnsavedState, check_agents, problems
from populace.sdk.testing import ResumeMismatch, check_resume, prompt_seeded

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
from stranger_sims import Forgetful, ForgetfulWalker, Walk, Walker

SCENARIO = {"agents": 24, "rounds": 4, "model": {"seed": 3}}


def test_state_fields_add_to_memory_and_never_replace_it():
    """The stranger's `state_fields = ("score",)` used to replace the default that saves
    `memory`; a resumed agent then played without its memory."""
    assert Walker.state_fields == ("memory", "score")
    agent = Walker(0, None, None)
    agent.remember((1, "go"))
    agent.score = 2
    state = json.loads(json.dumps(agent.state()))
    again = Walker(0, None, None)
    again.restore(state)
    assert (again.memory, again.score) == (((1, "go"),), 2)


def test_a_class_that_lists_memory_itself_still_works():
    class Old(Agent):
        __slots__ = ("score",)
        state_fields = ("memory", "score")

    class Older(Agent):
        __slots__ = ("score",)
        state_fields = ["score", "memory"]

    assert Old.state_fields == ("memory", "score") and Older.state_fields == ("memory", "score")
    assert Agent.state_fields == ("memory",)


def test_a_bare_string_for_state_fields_is_named_when_the_simulation_is_checked():
    class Slip(Walker):
        __slots__ = ()
        state_fields = ("score")  # the slip itself: a string, not a tuple

    class Slipped(Walk):
        name = "slipped"
        Agent = Slip

    with pytest.raises(SimulationError, match=r"`Agent.state_fields` must be a tuple of attribute names.*'score'"):
        Slipped.check()


def test_the_strangers_package_resumes_exactly_after_every_round():
    check_resume(Walk, SCENARIO)
    check_resume(Walk, SCENARIO, hosts=3, after=2)


def test_an_attribute_a_turn_changes_and_nobody_saves_is_refused_by_name():
    with pytest.raises(UnsavedState, match=r"'streak' changed \(0 when built, 1 now\) but is not saved.*"
                                            r"state_fields = \('streak',\)"):
        check_resume(Forgetful, SCENARIO)


def test_a_local_run_refuses_it_too_checking_a_sample_between_rounds():
    check = StateCheck(lambda run, n: prompt_seeded(run, n), size=8)
    with pytest.raises(UnsavedState, match=r"after round 1 .*'streak'"):
        asyncio.run(run_local(resolve(RunConfig.model_validate({**SCENARIO, "simulation": "stranger_sims:Forgetful"})),
                              llm=check))


def test_transient_fields_are_left_alone_and_declared_state_passes():
    class Cached(ForgetfulWalker):
        __slots__ = ()
        transient_fields = ("streak",)

    class Saved(ForgetfulWalker):
        __slots__ = ()
        state_fields = ("score", "streak")

    for cls in (Cached, Saved):
        agent = cls(5, None, None)
        agent.streak = 3
        assert problems(agent) == []


def test_a_memory_set_deeper_than_remember_keeps_it_comes_back_exactly_and_what_cannot_be_kept_is_named():
    class Nested(Walker):
        __slots__ = ()

    agent = Nested(1, None, None)
    agent.memory = ((1, ("go", 2)),)  # a tuple inside a memory item used to come back as a list (issue 37)
    assert problems(agent) == []

    class Holding(Walker):
        __slots__ = ()

    odd = Holding(2, None, None)
    odd.score = random.Random(2)  # a saved field holding what no checkpoint can rebuild
    [(name, text)] = problems(odd)
    assert name == "state_fields" and "Holding.score: agent 2's value: a random.Random" in text


def test_objects_without_equality_compare_by_value_and_a_moved_generator_is_caught():
    class Rolling(Walker):
        __slots__ = ("rng",)

        def __init__(self, agent_id, persona=None, sim=None):
            super().__init__(agent_id, persona, sim)
            self.rng = random.Random(agent_id)

    agent = Rolling(2, None, None)
    assert problems(agent) == []  # two generators in the same state are the same
    agent.rng.random()
    assert [n for n, _ in problems(agent)] == ["rng"]  # a resume would draw the same numbers again
    with pytest.raises(UnsavedState, match="'rng' changed"):
        check_agents([agent])


class Shared(Walker):
    """Keeps a tally on the simulation instance every agent of a process shares: a new
    process (a resume) starts it again, so the rows differ — no agent attribute shows it."""

    __slots__ = ()

    async def turn(self, obs, llm):
        out = await super().turn(obs, llm)
        tally = self.sim.__dict__.setdefault("tally", [0])
        tally[0] += 1
        out.score = tally[0] % 7
        return out


class SharedWalk(Walk):
    name = "shared-walk"
    Agent = Shared


def test_rows_a_resume_changes_are_counted_and_the_first_is_named():
    with pytest.raises(ResumeMismatch, match=r"resumed after round 2 is not the uninterrupted run: \d+ of 32 "
                                             r"outcome rows differ \(first: round 3, agent 0: score"):
        check_resume(SharedWalk, {**SCENARIO, "agents": 8}, after=2)


def test_check_resume_needs_two_rounds_and_a_round_to_resume_after():
    with pytest.raises(ValueError, match="rounds: needs 2 or more"):
        check_resume(Walk, {**SCENARIO, "rounds": 1})
    with pytest.raises(ValueError, match="after: 4 is not a round"):
        check_resume(Walk, SCENARIO, after=4)


def test_an_agent_sees_its_own_in_degree_on_the_graph_and_zero_without_one():
    """Issue 25: an agent could not see how many agents it hears (obs.in_degree)."""
    from populace.sdk.local import local_graph

    config = RunConfig.model_validate({"simulation": "gossip_sim:Gossip", "agents": 30, "rounds": 2,
                                       "graph": {"generator": "scale-free", "m": 2}})
    graph = local_graph(config, None)
    result = asyncio.run(run_local(resolve(config), hosts=3, graph=graph))
    degrees = graph.in_degree().tolist()
    assert len(set(degrees)) > 1 and result.outcomes["in_degree"] == degrees * 2
    plain = asyncio.run(run_local(resolve(RunConfig.model_validate({"simulation": "gossip_sim:Gossip", "agents": 4,
                                                                     "rounds": 1}))))
    assert plain.outcomes["in_degree"] == [0] * 4
