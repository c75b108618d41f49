"""Populations that change (issue 37): agents die, leave, are born or arrive, from the
environment's `decide` (`Changes`) or a scenario's schedule (`population: changes:`). The pure
parts (what a change may be, who is alive after it, its bytes, the schedule's draw, where
newcomers are placed) and a whole run in one process: one host equals three, a resume after any
round equals the uninterrupted run, a departed agent never plays, is never recorded nor asked
again, and a bad change stops the run naming the field, round and agent."""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.placement import PlacementError, birth_block, place_births
from populace.population.living import ChangeError, Population, scheduled
from populace.sdk import Birth, Changes
from populace.sdk.engine import DecideFailed, PopulationRefused
from populace.sdk.local import interview_local, run_local
from populace.sdk.registry import resolve
from populace.sdk.testing import check_resume

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
from lifecycle_sims import BadBirths, ForageEnv, Forager, Foragers, Wanderers

SURVEY = {"id": "mood", "questions": [{"id": "mood", "kind": "likert", "text": "How are you?", "points": 5}]}


def departures(result) -> dict[int, int]:
    """agent id -> the round after which it departed (table population)."""
    p = result.population
    return {a: r for r, a, e in zip(p["round"], p["agent_id"], p["event"]) if e in ("died", "left")}


# -- what a change is ---------------------------------------------------------------------------
def test_changes_take_ids_or_reasons_by_agent_and_newcomers_by_count_or_birth():
    c = Changes(died=np.array([4, 2]), left={7: "moved", 9: ""}, reason="starved",
                born=[Birth(state={"age": 0}, reason="child of 4")], arrived=2)
    assert c.departed.tolist() == [4, 2, 7, 9] and c.births == 3 and bool(c)
    assert [c.reasons[r] for r in c.departed_reasons] == ["starved", "starved", "moved", "starved"]
    assert [c.reasons[r] for r in c.birth_reasons] == ["child of 4", "starved", "starved"]
    both = c + Changes(died=[1], reason="old age")
    assert both.departed.tolist() == [4, 2, 7, 9, 1]
    assert both.reasons[both.departed_reasons[-1]] == "old age" and both.birth_states[0] == {"age": 0}
    assert not Changes()


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"died": [1.5]}, "died: agent ids are whole numbers, not 1.5"),
    ({"left": "7"}, "left: agent ids (a list or array)"),
    ({"died": np.array([True])}, "died: agent ids are whole numbers, not an array of bool"),
    ({"born": -1}, "born: -1 newcomers"),
    ({"born": [{"age": 0}]}, "born.0: a populace.sdk.Birth, not dict"),
    ({"arrived": [Birth(state=[1])]}, "arrived.0.state: a mapping of state fields, not list"),
    ({"reason": "x" * 201}, "reason: a reason of 201 characters"),
])
def test_a_change_that_is_not_one_is_named(kwargs, says):
    with pytest.raises(ChangeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        Changes(**kwargs)


# -- who is alive -------------------------------------------------------------------------------
def test_the_population_after_changes_gives_newcomers_the_next_ids_and_keeps_the_departed_s():
    p = Population.start(10)
    after = p.after(Changes(died=[3], left=[8, 1], born=2, arrived=[Birth(state={"age": 4})]), round_=2,
                    state_fields=("memory", "age"))
    assert (after.size, after.count, after.round, after.initial) == (13, 10, 2, 10)
    assert after.ids().tolist() == [0, 2, 4, 5, 6, 7, 9, 10, 11, 12]
    d = after.delta
    assert d.departed.tolist() == [1, 3, 8] and d.born_first == 10 and d.born_state(12) == {"age": 4}
    assert d.rows() == {"round": [2] * 6, "agent_id": [1, 3, 8, 10, 11, 12],
                        "event": ["left", "died", "left", "born", "born", "arrived"], "reason": [""] * 6}
    # who played round 2: the living before its changes (the departed then too, the newcomers not)
    assert np.flatnonzero(after.played(2)).tolist() == list(range(10))
    assert after.played(3) is after.alive
    assert p.after(Changes(), 2) is p  # nothing changed: the same population


@pytest.mark.parametrize(("changes", "says"), [
    (Changes(died=[10]), "round 5, agent 10: departs but is not in the run (ids 0..9 so far)"),
    (Changes(died=[-1]), "round 5, agent -1: departs but is not in the run"),
    (Changes(died=[3], left=[3]), "round 5, agent 3: departs twice"),
    (Changes(left=[2]), "round 5, agent 2: departs but departed already"),
    (Changes(born=[Birth(state={"agee": 1})]), "round 5, agent 10: births.0.state: 'agee' is not one of the "
                                               "agent's state_fields (age, memory)"),
    (Changes(born=[Birth(state={"age": object()})]), "round 5, agent 10: births.0.state cannot travel as JSON"),
])
def test_a_change_that_cannot_apply_names_the_round_and_agent(changes, says):
    p = Population.start(10).after(Changes(died=[2]), 4)
    with pytest.raises(ChangeError, match=says.replace("(", r"\(").replace(")", r"\)")):
        p.after(changes, 5, state_fields=("memory", "age"))


def test_a_newcomer_needs_a_persona_when_the_agents_have_them():
    p = Population.start(10)
    assert p.after(Changes(born=3), 1, personas=13).size == 13
    with pytest.raises(ChangeError, match="round 1, agent 13: born without a persona: population.newcomers"):
        p.after(Changes(born=4), 1, personas=13)


def test_a_population_comes_back_from_its_bytes_whole():
    p = Population.start(100_000).after(Changes(died=np.arange(0, 100_000, 7), left={5: "moved"},
                                                born=[Birth(state={"age": 1}), Birth()], reason="r"), 3)
    back = Population.from_bytes(p.to_bytes())
    assert (back.initial, back.size, back.count, back.round) == (p.initial, p.size, p.count, 3)
    assert np.array_equal(back.alive, p.alive) and back.delta.rows() == p.delta.rows()
    assert back.delta.birth_states == [{"age": 1}, None]
    assert len(p.to_bytes()) < 4_000  # the living as a bitmap and the departed by their steps, compressed
    plain = Population.from_bytes(Population.start(5).to_bytes())
    assert plain.delta is None and plain.count == 5
    with pytest.raises(ChangeError, match="not a population object"):
        Population.from_bytes(b"nothing")


def test_the_schedule_draws_a_seeded_share_of_the_living_not_already_leaving():
    c = RunConfig.model_validate({"population": {"changes": [{"after": "every", "died": 0.1, "arrived": 3},
                                                             {"after": [2], "left": 0.5, "reason": "moved"}]}})
    plan = c.population.changes
    p = Population.start(1000).after(Changes(died=np.arange(100)), 1)
    a = scheduled(plan, p, 2, seed=7, leaving=np.arange(100, 200))
    assert a.departed.tolist() == scheduled(plan, p, 2, seed=7, leaving=np.arange(100, 200)).departed.tolist()
    assert a.departed.tolist() != scheduled(plan, p, 2, seed=8, leaving=np.arange(100, 200)).departed.tolist()
    assert a.births == 3 and a.departed.min() >= 200 and len(set(a.departed.tolist())) == a.departed.size
    events = Counter(int(e) for e in a.departed_events)
    assert 50 < events[2] < 110 and 300 < events[3] < 500  # ~10% die, then ~50% of the rest leave
    assert {a.reasons[r] for r in a.birth_reasons} == {"scheduled"}
    assert scheduled(plan, p, 3, seed=7).departed_events.tolist().count(3) == 0  # `left` only after round 2


# -- where newcomers go -------------------------------------------------------------------------
def test_newcomers_fill_blocks_a_share_at_a_time_the_emptiest_share_first():
    shares = {"a@0": [(0, 60)], "b@0": [(60, 40)]}
    one = place_births(shares, 100, 30, base=100, block=50)
    assert one == {"a@0": [(0, 60)], "b@0": [(60, 70)]}  # b holds fewer: its range grows
    two = place_births(one, 130, 40, base=100, block=50)  # the block goes on with b, the next to a
    assert two == {"a@0": [(0, 60), (150, 20)], "b@0": [(60, 90)]}
    assert place_births(two, 170, 0, base=100, block=50) == two
    assert birth_block(10_000_000) == 312_500 and birth_block(100) == 256
    with pytest.raises(PlacementError):
        place_births({}, 100, 1, base=100, block=50)


# -- scenarios that cannot have newcomers -------------------------------------------------------
@pytest.mark.parametrize(("data", "says"), [
    ({"population": {}}, "population: give one of `personas`"),
    ({"population": {"newcomers": 5, "changes": [{"after": [1], "born": 1}]}}, "population.newcomers: newcomers'"),
    ({"rounds": 3, "population": {"changes": [{"after": [4], "died": 0.1}]}},
     "population.changes.0.after: round 4 is after the run's last round (3)"),
    ({"population": {"changes": [{"after": [1]}]}}, "give what changes"),
    ({"population": {"changes": [{"after": [1], "died": 1.5}]}}, "less than or equal to 1"),
])
def test_a_schedule_that_cannot_be_is_refused_naming_the_field(data, says):
    with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
        RunConfig.model_validate(data)


def test_scheduled_newcomers_a_simulation_cannot_take_are_refused_before_the_run():
    births = {"population": {"changes": [{"after": "every", "born": 2}]}}
    with pytest.raises(ValidationError, match="population.changes.0.born: simulation 'foragers' keeps a world "
                                              "column per agent"):
        resolve(RunConfig.model_validate({**births, "agents": 10}), Foragers)
    with pytest.raises(ValidationError, match="population.changes.0.born: simulation 'public-goods' has groups"):
        resolve(RunConfig.model_validate({**births, "simulation": "public-goods", "agents": 12}))
    resolve(RunConfig.model_validate({**births, "agents": 10}), Wanderers)  # no world: it can


# -- a whole run in one process -----------------------------------------------------------------
def play(sim, hosts: int = 1, **data):
    return asyncio.run(run_local(resolve(RunConfig.model_validate({"agents": 60, "rounds": 8, **data}), sim),
                                 hosts=hosts))


def test_decide_s_births_and_deaths_are_the_same_on_one_host_as_on_three():
    one, three = play(Foragers), play(Foragers, hosts=3)
    drop = ("latency_ms",)
    assert {k: v for k, v in one.outcomes.items() if k not in drop} == \
           {k: v for k, v in three.outcomes.items() if k not in drop}
    assert one.population == three.population and one.rounds["living"] == three.rounds["living"]
    events = Counter(one.population["event"])
    assert events["born"] == sum(one.rounds["born"]) > 0 and events["died"] == sum(one.rounds["died"]) > 0
    assert set(one.population["reason"]) >= {"starved"}
    # a newcomer's id is the next one: ids are never reused, and every newcomer plays
    born = [a for a, e in zip(one.population["agent_id"], one.population["event"]) if e == "born"]
    assert born == list(range(60, 60 + len(born)))
    gone = departures(one)
    late = [(r, a) for r, a in zip(one.outcomes["round"], one.outcomes["agent_id"]) if a in gone and r > gone[a]]
    assert late == []
    assert set(one.outcomes["agent_id"]) & set(born[:5])
    # a newcomer starts from its birth state: its first outcome says it is one round old
    first = {}
    for a, age in zip(one.outcomes["agent_id"], one.outcomes["age"]):
        first.setdefault(a, age)
    assert {first[a] for a in born if a in first} == {1}


def test_a_resumed_or_forked_run_has_the_living_of_its_round():
    check_resume(Foragers, {"agents": 40, "rounds": 6}, hosts=2)


class Heir(Forager):
    """Keeps a tuple in its state: a newcomer's, given by its birth, must stay a tuple."""

    __slots__ = ("lineage",)
    state_fields = ("age", "lineage")

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.lineage = ()

    async def turn(self, obs, llm):
        if type(self.lineage) is not tuple:
            raise TypeError(f"lineage came back as a {type(self.lineage).__name__}")
        return await super().turn(obs, llm)


class HeirEnv(ForageEnv):
    def births(self, parents):
        return [Birth(state={"age": 0, "lineage": (p, "child")}) for p in parents.tolist()]


class Heirs(Foragers):
    name = "heirs"
    Agent = Heir
    Env = HeirEnv


def test_a_newcomer_s_state_comes_back_as_it_was_born_locally_resumed_and_one_per_process():
    """A birth state travels as a checkpoint keeps a state (populace.sdk.statejson): a tuple stays
    a tuple for the newcomer made from it, in one process, after a resume and in a process of its own."""
    run = play(Heirs, hosts=2)
    assert sum(run.rounds["born"]) > 0
    assert not [e for e in run.outcomes["error"] if e], "a newcomer's tuple came back as something else"
    check_resume(Heirs, {"agents": 40, "rounds": 6}, hosts=2)
    alone = asyncio.run(run_local(resolve(RunConfig.model_validate({"agents": 12, "rounds": 5}), Heirs),
                                  one_per_process=True))
    assert not [e for e in alone.outcomes["error"] if e]


def test_a_schedule_changes_any_simulation_and_resumes_exactly():
    data = {"population": {"changes": [{"after": "every", "died": 0.05, "arrived": 4},
                                       {"after": [2], "left": 0.2, "reason": "moved"}]}}
    a, b = play(Wanderers, **data), play(Wanderers, hosts=2, **data)
    assert a.population == b.population and a.rounds["n"] == b.rounds["n"]
    # who lived in a round: those of the round before, less its departures, with its newcomers
    assert a.rounds["living"][:2] == [60, 60 - departures_in(a, 1) + 4]
    check_resume(Wanderers, {"agents": 40, "rounds": 4, **data}, hosts=2)


def test_one_agent_per_process_plays_the_same_changes():
    """Each newcomer gets a process of its own when it first acts; the departed's stop."""
    data = {"population": {"changes": [{"after": "every", "died": 0.2, "arrived": 2}]}}
    config = resolve(RunConfig.model_validate({"agents": 10, "rounds": 3, **data}), Wanderers)
    many, alone = asyncio.run(run_local(config)), asyncio.run(run_local(config, one_per_process=True, hosts=2))
    drop = ("latency_ms",)
    assert {k: v for k, v in many.outcomes.items() if k not in drop} == \
           {k: v for k, v in alone.outcomes.items() if k not in drop}
    assert many.population == alone.population and max(many.outcomes["agent_id"]) >= 10


def departures_in(result, round_: int) -> int:
    p = result.population
    return sum(1 for r, e in zip(p["round"], p["event"]) if r == round_ and e in ("died", "left"))


def test_a_bad_birth_stops_the_run_naming_the_field_round_and_agent():
    with pytest.raises(PopulationRefused, match=r"simulation 'bad-births': BadBirthEnv.decide: round \d+, agent "
                                                r"\d+: births.0.state: 'agee' is not one of the agent's state_fields"):
        play(BadBirths)


def test_decide_may_end_with_changes_only():
    class Odd(ForageEnv):
        def decide(self, state, round, total, world):
            s, summary, w, _ = super().decide(state, round, total, world)
            return s, summary, w, "changes"

    class OddSim(Foragers):
        name = "odd"
        Env = Odd

    with pytest.raises(DecideFailed, match=r"Odd.decide returned 1 value\(s\) after its state, summary and world "
                                           r"\(str\); only a populace.sdk.Changes may follow them"):
        play(OddSim)


def test_only_those_who_played_a_round_answer_after_it():
    data = {"population": {"changes": [{"after": "every", "died": 0.2, "arrived": 3}]},
            "interviews": [{**SURVEY, "after": [2, 3]}]}
    run = asyncio.run(run_local(resolve(RunConfig.model_validate({"agents": 40, "rounds": 3, **data}), Wanderers)))
    gone = departures(run)
    born = {a: r for r, a, e in zip(run.population["round"], run.population["agent_id"], run.population["event"])
            if e == "arrived"}
    for k in (2, 3):
        asked = {a for r, a in zip(run.interviews["after_round"], run.interviews["agent_id"]) if r == k}
        played = {a for r, a in zip(run.outcomes["round"], run.outcomes["agent_id"]) if r == k}
        assert played <= asked  # everyone who acted answers (and the living who did not act)
        assert not {a for a in asked if a in gone and gone[a] < k}
        assert not {a for a in asked if a in born and born[a] >= k}
        assert {a for a in asked if a in born}  # newcomers of the rounds before answer
    later = asyncio.run(interview_local(run, 3, _survey()))
    assert set(later["agent_id"]) == {a for r, a in zip(run.interviews["after_round"], run.interviews["agent_id"])
                                      if r == 3}


def _survey():
    from populace.core.contracts import Survey

    return Survey.model_validate({**SURVEY, "id": "later"})


# -- newcomers' personas ------------------------------------------------------------------------
ROOT = Path(__file__).resolve().parents[2]


def test_newcomers_take_the_personas_kept_for_them_and_one_past_them_stops_the_run():
    from populace.client.prepare import prepare
    from populace.core.scenario import ScenarioError

    def prepared(newcomers: int, arrived: int):
        pop = {"config": "examples/population/education.yaml", "newcomers": newcomers,
               "changes": [{"after": "every", "arrived": arrived}]}
        return prepare(RunConfig.model_validate({"simulation": "vote", "agents": 20, "rounds": 3,
                                                 "population": pop}), base=ROOT, agents_given=True)

    p = prepared(6, 2)
    assert len(p.cast) == 26 and p.config.agents == 20  # the first agents' personas, then the newcomers'
    # drawn apart: the first 20 are who they are without newcomers
    alone = prepare(RunConfig.model_validate({"simulation": "vote", "agents": 20, "rounds": 3,
                                              "population": {"config": "examples/population/education.yaml"}}),
                    base=ROOT, agents_given=True)
    assert [x.profile for x in p.cast.personas[:20]] == [x.profile for x in alone.cast.personas]
    run = asyncio.run(run_local(p.resolved, cast=p.cast))
    assert run.population["agent_id"] == [20, 21, 22, 23, 24, 25]  # after rounds 1, 2, 3
    with pytest.raises(PopulationRefused, match=r"simulation 'vote': population.changes: round 2, agent 24: born "
                                                r"without a persona: population.newcomers: the run has 24 personas"):
        asyncio.run(run_local(prepared(4, 3).resolved, cast=prepared(4, 3).cast))
    with pytest.raises(ScenarioError, match=r"population.changes.0.arrived: the agents have personas, and the "
                                            r"newcomers would have none: declare population.newcomers"):
        prepared(0, 2)
