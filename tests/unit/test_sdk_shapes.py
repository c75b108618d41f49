"""The SDK's shapes of study, in one process (the engine the fleet drives too): activation
(selectors, `wakes`), groups (nested levels, groups drawn again in blocks), scenes (acts in
order, transcripts, and every rule a scene can break), and the small rules that come with them
(a call's key across the pipe, each call seeded apart, `sim.rng`, what a round can carry)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import Sequence

import numpy as np
import pytest
from pydantic import ValidationError

from populace.core.contracts import MAX_ACTS_PER_MEMBER, MAX_LINES_PER_MEMBER, RunConfig
from populace.sdk import (
    LLM,
    Agent,
    DummyLLM,
    Env,
    GroupEnv,
    Outcome,
    Partial,
    ScriptedLLM,
    Simulation,
    State,
    Summary,
    engine,
    select,
)
from populace.sdk.engine import DecideFailed
from populace.sdk.groups import GroupError, GroupLayout
from populace.sdk.local import run_local
from populace.sdk.play import SceneFailed
from populace.sdk.registry import resolve
from populace.sdk.rng import stable_seed
from populace.sdk.scene import Scene

HERE = __name__


# -- selectors ----------------------------------------------------------------------------------
def test_a_rate_is_seeded_per_round_and_agent_and_the_same_for_any_subset():
    ids = np.arange(100_000, dtype=np.int64)
    a = select.rate(0.1).pick(ids, seed=3, round_=2, profiles=None)
    assert 9_500 < a.sum() < 10_500
    part = select.rate(0.1).pick(ids[40_000:41_000], seed=3, round_=2, profiles=None)
    assert (part == a[40_000:41_000]).all()  # a host picks for its share what one process picks
    assert not (a == select.rate(0.1).pick(ids, seed=3, round_=3, profiles=None)).all()  # drawn again
    assert not (a == select.rate(0.1, salt=1).pick(ids, seed=3, round_=2, profiles=None)).all()


def test_ids_masks_and_profile_predicates_pick_exactly():
    ids = np.arange(10, dtype=np.int64)
    assert np.flatnonzero(select.ids([7, 2, 2]).pick(ids, seed=0, round_=1, profiles=None)).tolist() == [2, 7]
    mask = [i % 3 == 0 for i in range(10)]
    assert select.mask(mask).pick(ids, seed=0, round_=1, profiles=None).tolist() == mask
    profiles = [{"level": "phd" if i % 2 else "school", "age": i} for i in range(10)]
    got = select.where(level="phd", age=[1, 3, 4]).pick(ids, seed=0, round_=1, profiles=profiles)
    assert np.flatnonzero(got).tolist() == [1, 3]
    assert not select.where(level="phd").pick(ids, seed=0, round_=1, profiles=None).any()  # no population


def test_selectors_travel_as_small_json_and_come_back_the_same():
    for sel in (select.rate(0.25, salt=2), select.ids([1, 5]), select.mask([True, False] * 8),
                select.where(region=["north", "east"])):
        assert select.from_wire(select.to_wire(sel)) == sel
    assert select.to_wire(None) is None and select.to_wire(select.everyone()) is None
    assert len(str(select.to_wire(select.mask(np.ones(1_000_000, dtype=bool))))) < 200_000


def test_a_selector_the_run_cannot_have_is_refused_naming_why():
    with pytest.raises(ValidationError):
        select.rate(1.5)
    with pytest.raises(select.SelectionError, match="agent 12 does not exist"):
        select.checked(select.ids([3, 12]), 10, "Env.select")
    with pytest.raises(select.SelectionError, match="mask: 9 values for the run's 10 agents"):
        select.checked(select.mask([True] * 9), 10, "Env.select")
    with pytest.raises(select.SelectionError, match="not a selector"):
        select.checked([1, 2], 10, "Env.select")


# -- group layouts --------------------------------------------------------------------------------
def test_fixed_groups_and_nested_levels():
    layout = GroupLayout((5, 20), agents=47)
    groups = layout.groups(1, np.arange(47, dtype=np.int64))
    assert [g.id for g in groups] == list(range(10)) and groups[-1].members == (45, 46)  # the last is smaller
    assert [g.outer for g in groups] == [(i // 4,) for i in range(10)]
    assert layout.unit == 20
    picked = layout.groups(1, np.array([1, 3, 22], dtype=np.int64))  # only those who act
    assert [(g.id, g.members) for g in picked] == [(0, (1, 3)), (4, (22,))]


def test_groups_drawn_again_each_round_within_blocks_are_seeded():
    layout = GroupLayout((2,), agents=30, seed=5, block=10)
    ids = np.arange(30, dtype=np.int64)
    r1, r2 = layout.groups(1, ids), layout.groups(2, ids)
    assert r1 == layout.groups(1, ids) and r1 != r2  # the same draw everywhere, a new one each round
    for groups in (r1, r2):
        assert sorted(m for g in groups for m in g.members) == list(range(30))
        assert all(len({m // 10 for m in g.members}) == 1 for g in groups)  # a pair never leaves its block
    assert sorted(g.id for g in r1) == list(range(15))


@pytest.mark.parametrize("sizes, block, message", [
    ((5, 12), None, "12 is not a multiple of 5"), ((0,), None, "whole numbers >= 1"),
    ((2, 4), 8, "one level only"), ((2,), 7, "a multiple of the group size 2")])
def test_a_layout_that_cannot_work_says_why(sizes, block, message):
    with pytest.raises(GroupError, match=message):
        GroupLayout(sizes, agents=10, block=block)


# -- test simulations ----------------------------------------------------------------------------
class Said(Outcome):
    value: int | None = None
    measure = "value"


class Count(Partial):
    n: int = 0
    total: int = 0


class Totals(Summary):
    n: int = 0
    total: int = 0


class Mean(Summary):
    total: int = 0


class Counting(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids, outcomes):
        return Count(n=len(outcomes), total=sum(o.value or 0 for o in outcomes))

    def merge(self, partials):
        return Count(n=sum(p.n for p in partials), total=sum(p.total for p in partials))

    def decide(self, state, round, total):
        return state, Mean(total=total.total)


class Asker(Agent):
    """Asks twice per round: once for itself, once on its partner's behalf (the partner's key)."""

    __slots__ = ()

    async def turn(self, obs, llm: LLM) -> Said:
        mine = await llm.ask(f"me {self.id}", key=self.id, schema=NUMBER)
        again = await llm.ask(f"again {self.id}", key=self.id, schema=NUMBER)
        await llm.ask(f"for {self.id ^ 1}", key=self.id ^ 1, schema=NUMBER)
        return Said(value=int(mine) * 1000 + int(again), raw=mine)


NUMBER = {"type": "integer", "minimum": 0, "maximum": 999}


class AskTwice(Simulation):
    name = "ask-twice"
    Agent = Asker
    Env = Counting
    Outcome = Said
    Summary = Mean


def test_a_call_on_another_agents_behalf_keeps_its_key_in_one_process_and_across_the_pipe():
    for per_process in (False, True):
        seen: list[tuple[int, str]] = []

        def llm(run, n, seen=seen):
            port = ScriptedLLM(lambda key, prompt: str(key))
            original = port.ask

            async def ask(prompt, **kw):
                seen.append((kw["key"], prompt))
                return await original(prompt, **kw)

            port.ask = ask
            return port

        res = asyncio.run(run_local(RunConfig(simulation=f"{HERE}:AskTwice", agents=4, rounds=1), llm=llm,
                                    one_per_process=per_process, hosts=2 if per_process else 1))
        assert sorted(p for k, p in seen if p.startswith("for")) == [f"for {i}" for i in range(4)]
        assert all(k == int(p.split()[1]) for k, p in seen if p.startswith("for")), seen
        assert res.outcomes["value"] == [i * 1000 + i for i in range(4)]


def test_each_call_of_an_agent_in_a_round_is_seeded_apart_and_the_first_as_before():
    one = DummyLLM(seed=7, round_=3, schema=NUMBER)
    first, second = asyncio.run(one.ask("x", key=5)), asyncio.run(one.ask("x", key=5))
    assert first != second
    assert first == asyncio.run(DummyLLM(seed=7, round_=3, schema=NUMBER).ask("y", key=5))
    res = [asyncio.run(run_local(RunConfig(simulation=f"{HERE}:AskTwice", agents=6, rounds=2), hosts=h,
                                 one_per_process=p)).outcomes["value"] for h, p in ((1, False), (3, False), (2, True))]
    assert res[0] == res[1] == res[2] and len(set(res[0])) > 1


def test_sim_rng_is_the_same_in_every_process_whatever_its_hash_seed():
    code = ("from populace.sdk.rng import seeded, stable_seed; "
            "print(stable_seed(3, 'partner', 7), seeded(3, 'x').random())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2, 99)}
    assert len(outs) == 1 and str(stable_seed(3, "partner", 7)) in outs.pop()
    sim = AskTwice(Simulation.Params(), agents=2, seed=3)
    assert sim.rng("x").random() == sim.rng("x").random() != sim.rng("y").random()
    with pytest.raises(TypeError, match="salt"):
        stable_seed(object())


# -- activation ----------------------------------------------------------------------------------
class Sometimes(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        return Said(value=self.id, raw=str(self.id))

    def wakes(self, obs):
        return (self.id + obs.round) % 3 != 0  # its own say, on top of the environment's selection


class HalfEnv(Counting):
    def select(self, state, round):
        return select.rate(0.5)


class Activation(Simulation):
    name = "activation"
    Agent = Sometimes
    Env = HalfEnv
    Outcome = Said
    Summary = Mean


def test_only_the_selected_agents_that_wake_play_and_every_placement_picks_the_same():
    config = RunConfig(simulation=f"{HERE}:Activation", agents=60, rounds=3, seed=4)
    one = asyncio.run(run_local(config))
    ids = np.arange(60, dtype=np.int64)
    for n in (1, 2, 3):
        chosen = np.flatnonzero(select.rate(0.5).pick(ids, seed=4, round_=n, profiles=None)).tolist()
        expect = [i for i in chosen if (i + n) % 3 != 0]
        assert [a for a, r in zip(one.outcomes["agent_id"], one.outcomes["round"]) if r == n] == expect
        assert one.rounds["n"][n - 1] == len(expect)
    for other in (asyncio.run(run_local(config, hosts=3)), asyncio.run(run_local(config, hosts=2,
                                                                                  one_per_process=True))):
        assert other.outcomes["agent_id"] == one.outcomes["agent_id"]
        assert other.rounds["total"] == one.rounds["total"]


class BadIdsEnv(Counting):
    def select(self, state, round):
        return select.ids([1, 99])


class BadRateEnv(Counting):
    def select(self, state, round):
        return select.rate(self.params.model_config and 2.0)


class BadIds(Activation):
    Env = BadIdsEnv


class BadRate(Activation):
    Env = BadRateEnv


@pytest.mark.parametrize("sim, message", [
    ("BadIds", r"select: BadIdsEnv.select\(state, 1\): ids: agent 99 does not exist \(the run has 10 agents"),
    ("BadRate", r"select: BadRateEnv.select\(state, 1\) built a Rate with p 2.0: Input should be less than")])
def test_a_selection_the_run_cannot_have_is_refused_when_the_run_is_checked(sim, message):
    with pytest.raises(ValidationError, match=message):
        resolve(RunConfig(simulation=f"{HERE}:{sim}", agents=10))


# -- scenes ----------------------------------------------------------------------------------------
class Line(Outcome):
    value: int | None = None


class Talker(Agent):
    __slots__ = ()

    async def act(self, phase, view, llm):
        if phase == "bug":
            raise ValueError("my bug")
        if phase == "wrong":
            return Said(value=1)
        raw = await llm.ask(f"{phase} {view}", key=self.id, schema=NUMBER)
        return Line(value=int(raw), raw=raw)


class Rules(GroupEnv):
    """Plays a conversation, or breaks one rule, as the simulation's `mode` says."""

    kept: Scene | None = None

    async def scene(self, scene: Scene):
        mode = self.sim.mode
        a, *rest = scene.members
        if mode == "raise":
            raise KeyError("no such rule")
        if mode == "twice" and rest:
            await asyncio.gather(a.act("speak", 1), a.act("speak", 2))
        if mode == "outsider":
            if Rules.kept is not None and Rules.kept is not scene:
                await Rules.kept.members[0].act("speak", 0)
            Rules.kept = scene
        if mode == "stuck" and scene.group == 0:
            await asyncio.Event().wait()
        if mode == "chatty":  # one line more than a round allows
            for _ in range(MAX_LINES_PER_MEMBER * len(scene.members) + 1):
                scene.say(None, "and another thing")
        if mode == "busy":  # one act more than a round allows
            for i in range(MAX_ACTS_PER_MEMBER * len(scene.members) + 1):
                await scene.members[i % len(scene.members)].act("speak", i)
        said = []
        for i, m in enumerate((*scene.members, *scene.members)):
            act = await m.act("bug" if mode == "bug" and i == 0 else "wrong" if mode == "wrong" and i == 1
                              else "speak", i)
            scene.say(m, f"I say {act.value}", value=act.value)
            said.append(act.value)
        if mode != "forgetful":
            for m in scene.members:
                scene.outcome(m, Said(value=sum(v or 0 for v in said)))
        return None


class Conversation(Simulation):
    name = "conversation"
    Agent = Talker
    Env = Counting
    GroupEnv = Rules
    Act = Line
    Outcome = Said
    Summary = Mean
    mode = "talk"

    def group_size(self):
        return 2


def conversation(mode: str) -> str:
    cls = type(f"Conversation_{mode}", (Conversation,), {"mode": mode, "__module__": HERE})
    globals()[cls.__name__] = cls
    return f"{HERE}:{cls.__name__}"


def test_a_scene_records_its_acts_and_lines_in_order_the_same_on_every_placement():
    config = RunConfig(simulation=conversation("talk"), agents=5, rounds=2, seed=1)
    one = asyncio.run(run_local(config))
    r1 = [i for i, r in enumerate(one.acts["round"]) if r == 1]
    assert [one.acts["group_id"][i] for i in r1] == [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    assert [one.acts["seq"][i] for i in r1] == [0, 2, 4, 6, 0, 2, 4, 6, 0, 2]  # a line after every act
    assert [one.acts["agent_id"][i] for i in r1[:4]] == [0, 1, 0, 1]  # turns alternate, in order
    assert one.transcripts["seq"][:4] == [1, 3, 5, 7] and one.transcripts["speaker"][:4] == [0, 1, 0, 1]
    values = [one.acts["value"][i] for i in r1[:4]]
    assert one.transcripts["text"][:4] == [f"I say {v}" for v in values]
    assert len(set(values)) > 1  # each of an agent's acts in a round is its own draw
    assert one.outcomes["value"][:2] == [sum(values)] * 2
    for other in (asyncio.run(run_local(config, hosts=3)), asyncio.run(run_local(config, hosts=2,
                                                                                  one_per_process=True))):
        for name in ("outcomes", "acts", "transcripts"):
            mine, theirs = getattr(one, name), getattr(other, name)
            assert {k: v for k, v in mine.items() if k != "latency_ms"} == \
                   {k: v for k, v in theirs.items() if k != "latency_ms"}, name


def test_an_acts_bug_and_a_wrong_type_are_that_agents_act_errors_and_the_scene_goes_on():
    for mode, message in (("bug", "agent: ValueError: my bug"), ("wrong", "agent: TypeError: act returned Said, "
                                                                           "not Line")):
        res = asyncio.run(run_local(RunConfig(simulation=conversation(mode), agents=2, rounds=1)))
        bad = [i for i, e in enumerate(res.acts["error"]) if e]
        assert len(bad) == 1 and res.acts["error"][bad[0]] == message and not res.acts["valid"][bad[0]]
        assert res.acts["raw"][bad[0]].startswith("<agent error:")
        assert len(res.acts["seq"]) == 4 and res.outcomes["error"] == [message if mode == "bug" else None,
                                                                       None if mode == "bug" else message]


@pytest.mark.parametrize("mode, message", [
    ("raise", r"Rules.scene failed: KeyError: 'no such rule'"),
    ("twice", r"agent 0 was asked to act while its previous act was still running"),
    ("outsider", r"agent \d+ is not a member of group \d+"),
    ("forgetful", r"the scene gave no outcome to agent\(s\) \[0, 1\]"),
])
def test_a_scene_that_breaks_a_rule_fails_the_round_naming_simulation_round_and_group(mode, message):
    Rules.kept = None
    slow = lambda run, n: DummyLLM(seed=0, round_=n, latency_s=0.01)  # noqa: E731 - acts overlap in time
    with pytest.raises(SceneFailed, match=rf"simulation 'conversation', round 1, group \d+: .*{message}"):
        asyncio.run(run_local(RunConfig(simulation=conversation(mode), agents=6, rounds=1), llm=slow))


@pytest.mark.parametrize("mode, message", [
    ("chatty", r"more than 100 lines per member \(2\) in a round"),
    ("busy", r"more than 100 acts per member \(2\) in a round"),
])
def test_a_scene_acts_and_says_at_most_so_much_per_member_in_a_round(mode, message):
    """Issue 41: the recorder refuses a group with more acts or lines than its members may have
    in a round; a scene that would have more stops at once, naming it."""
    with pytest.raises(SceneFailed, match=rf"simulation 'conversation', round 1, group 0: .*{message}"):
        asyncio.run(run_local(RunConfig(simulation=conversation(mode), agents=2, rounds=1)))


def test_a_scene_that_never_finishes_fails_once_it_waits_on_nothing_it_was_given():
    from populace.sdk.hosting import host_run
    from populace.sdk.play import OutcomeSink

    run = host_run(resolve(RunConfig(simulation=conversation("stuck"), agents=4, rounds=1)), "r", [(0, 4)],
                   freeze=False, scene_idle_s=0.4)
    sink = OutcomeSink(type(run.sim), run.env, emit=lambda b: None, grouped=True)
    with pytest.raises(SceneFailed, match=r"group 0: Rules.scene did not finish: for 0.4s it waited on neither"):
        asyncio.run(asyncio.wait_for(run.player.play(run.observation(1, None), DummyLLM(seed=0, round_=1), sink),
                                     20))


# -- nested groups ---------------------------------------------------------------------------------
class Firm(GroupEnv):
    level = "firm"
    seen: dict = {}

    def settle(self, round, group, agent_ids, outcomes):
        Firm.seen[(round, group)] = [o.value for o in outcomes]  # the teams' settlement is in
        return ("firm", group)


class Team(GroupEnv):
    Parent = Firm

    def settle(self, round, group, agent_ids, outcomes):
        total = sum(o.value or 0 for o in outcomes)
        for o in outcomes:
            o.value = total
        return ("team", group)


class Worker(Agent):
    __slots__ = ()
    heard: dict = {}

    async def turn(self, obs, llm):
        return Said(value=self.id)

    def settled(self, outcome, news):
        Worker.heard.setdefault(self.id, []).append(news)


class Nested(Simulation):
    name = "nested"
    Agent = Worker
    Env = Counting
    GroupEnv = Team
    Outcome = Said
    Summary = Mean

    def group_sizes(self):
        return 3, 6


def test_nested_groups_settle_inner_level_first_and_record_a_column_per_level():
    Firm.seen, Worker.heard = {}, {}
    res = asyncio.run(run_local(RunConfig(simulation=f"{HERE}:Nested", agents=14, rounds=1)))
    assert res.outcomes["group_id"] == [i // 3 for i in range(14)]
    assert res.outcomes["firm_id"] == [i // 6 for i in range(14)]
    assert Firm.seen[(1, 0)] == [3, 3, 3, 12, 12, 12]  # the firm saw its teams' settled outcomes
    assert Firm.seen[(1, 2)] == [25, 25]  # the last firm and team are smaller, never dropped
    assert Worker.heard[4] == [("team", 1), ("firm", 0)]
    assert Nested.tables().levels == ["firm"]


# -- what a round can carry -------------------------------------------------------------------------
class Hoard(State):
    items: list[int] = []


class HoardingEnv(Counting):
    State = Hoard

    def decide(self, state, round, total):
        return Hoard(items=[*state.items, *range(40_000)]), Mean(total=total.total)


class Hoarding(Simulation):
    name = "hoarding"
    Agent = Sometimes
    Env = HoardingEnv
    Outcome = Said
    Summary = Mean


def test_a_state_over_what_messages_carry_plays_and_one_over_its_bound_fails_the_run_naming_it(monkeypatch):
    """The state travels in no message (round opens name its checkpoint object): 3 rounds of 40,000
    items each (about 0.6 MB, over the 256 KiB a message part may carry) play; over the state's own
    bound (what a round keeps in memory and in the store) the run fails naming it."""
    result = asyncio.run(run_local(RunConfig(simulation=f"{HERE}:Hoarding", agents=3, rounds=3)))
    assert result.rounds["round"] == [1, 2, 3]
    monkeypatch.setitem(engine.LIMITS, "state", 256 * 1024)
    with pytest.raises(DecideFailed, match=r"simulation 'hoarding': its environment's state after round 2 is "
                                           r"[\d,]+ bytes as JSON, over the 262,144 a round can keep"):
        asyncio.run(run_local(RunConfig(simulation=f"{HERE}:Hoarding", agents=3, rounds=3)))


def test_a_local_run_keeps_json_columns_whatever_shapes_their_values_have():
    from populace.client.api import simulate

    result = simulate(RunConfig(simulation=f"{HERE}:Shapes", agents=4, rounds=1), local=True)
    assert result.outcomes.column("data").to_pylist() == ['{"a": 1}', '{"a": "x"}', '{"b": [1, {}]}', None]


class Shaped(Outcome):
    data: dict | None = None


class ShapesAgent(Agent):
    __slots__ = ()

    async def turn(self, obs, llm):
        return Shaped(data=[{"a": 1}, {"a": "x"}, {"b": [1, {}]}, None][self.id])


class ShapesEnv(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids: Sequence[int], outcomes):
        return Count(n=len(outcomes))

    def merge(self, partials):
        return Count(n=sum(p.n for p in partials))

    def decide(self, state, round, total):
        return state, Mean(total=total.n)


class Shapes(Simulation):
    name = "shapes"
    Agent = ShapesAgent
    Env = ShapesEnv
    Outcome = Shaped
    Summary = Mean


def test_a_port_that_raises_fails_the_same_act_in_its_own_process_as_in_this_one():
    """A port's own exception (a scripted error) is the act's error under either placement, and
    the agent's next acts go on (the child used to read the next message as its answer)."""
    config = RunConfig.model_validate({"simulation": "ultimatum", "agents": 2, "rounds": 3, "game": {"block": 2}})

    def llm(run, round_):
        return ScriptedLLM(lambda key, prompt: ValueError("boom") if round_ == 1 else
                           ('{"offer": 5}' if "You are the proposer" in prompt else '{"accept": true}'))

    here = asyncio.run(run_local(config, llm=llm))
    apart = asyncio.run(run_local(config, llm=llm, one_per_process=True))
    assert here.outcomes["error"][0] == "agent: ValueError: boom"
    assert apart.outcomes["error"] == here.outcomes["error"] and apart.outcomes["payoff"] == here.outcomes["payoff"]
