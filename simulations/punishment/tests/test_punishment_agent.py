"""The agent and its group's scene, played by the platform's own round player with a scripted
model: every member contributes (all at once), then every member punishes (all at once) seeing
the others' contributions; what is recorded (acts, outcomes — invalid answers and agent bugs
too); who is grouped with whom each round; what each agent remembers."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable
from fractions import Fraction

import pytest
from populace_punishment import Move, Player, Punishment
from populace_punishment import prompts as text
from populace_punishment.rules import Counts, Terms

from populace.core.contracts import RunConfig
from populace.sdk import Cast, InferError, ModelUnavailable, Persona, ScriptedLLM, resolve
from populace.sdk.hosting import host_run
from populace.sdk.play import OutcomeSink
from populace.sdk.registry import Resolved

TERMS = Terms(20, Fraction(8, 5), 1, 3)
TEXTS = text.Texts(TERMS, group_size=4, max_points=10, cot=False)
STAGE_2 = "Stage 2:"
LETTERS = re.compile(r'"([A-Z])": n')
Answer = str | BaseException


def config(agents: int, **game) -> RunConfig:
    return RunConfig.model_validate({"simulation": "punishment", "agents": agents, "seed": 4,
                                     "game": {"block": 4, **game}})


def share(agents: int = 4, cast: Cast | None = None, ranges: list[tuple[int, int]] | None = None,
          resolved: Resolved | None = None, **game):
    return host_run(resolved or resolve(config(agents, **game)), "r", ranges or [(0, agents)], cast, freeze=False)


def script(contribute: Answer | Callable[[int], Answer],
           punish: Answer | Callable[[int, str], Answer] = '{"A": 0, "B": 0, "C": 0}') -> ScriptedLLM:
    """Answers stage 1 with `contribute` (or `contribute(key)`), stage 2 with `punish` (or
    `punish(key, prompt)`)."""
    def answer(key: int, prompt: str) -> Answer:
        if STAGE_2 not in prompt:
            return contribute(key) if callable(contribute) else contribute
        return punish(key, prompt) if callable(punish) else punish
    return ScriptedLLM(answer)


def no_points(key: int, prompt: str) -> str:
    return json.dumps(dict.fromkeys(LETTERS.findall(prompt), 0))


def rows_of(columns: dict[str, list] | None) -> list[dict]:
    return [dict(zip(columns, values)) for values in zip(*columns.values())] if columns else []


async def play(run, llm, round_: int = 1, batch_size: int = 1000):
    """One round: (the share's result, outcome rows by agent id, act rows in order)."""
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=batches.append, grouped=True)
    await run.player.play(run.observation(round_, None), llm, sink)
    result = sink.close()
    outcomes, acts = {}, []
    for b in batches:
        for i, aid in enumerate(b.agent_ids):
            outcomes[aid] = {"group": b.group_ids[i], "valid": b.valid[i], "raw": b.raws[i], "error": b.errors[i],
                             **{name: col[i] for name, col in b.columns.items()}}
        acts += [{k: v for k, v in r.items() if k != "latency_ms"} for r in rows_of(b.acts)]
        assert not b.lines  # the game says nothing besides its acts
    return result, outcomes, sorted(acts, key=lambda a: (a["group_id"], a["seq"]))


def groups(run, round_: int = 1) -> list[tuple[int, ...]]:
    return [g.members for g in run.player.groups(round_, None)]


def act(group: int, seq: int, agent: int, phase: str, raw: str, contribution=None, targets=None, points=None,
        valid=True, error=None):
    return {"group_id": group, "seq": seq, "agent_id": agent, "phase": phase, "contribution": contribution,
            "targets": targets, "points": points, "valid": valid, "raw": raw, "error": error}


def result(contribution, total, size, given, antisocial, received, payoff, punish_valid, raw, valid=True,
           group=0, error=None):
    return {"group": group, "valid": valid, "raw": raw, "error": error, "contribution": contribution,
            "group_total": total, "group_size": size, "points_given": given, "points_antisocial": antisocial,
            "points_received": received, "payoff": payoff, "punish_valid": punish_valid}


# seat i of the drawn group contributes CONTRIBUTED[i] and answers PUNISHED[i] in stage 2
CONTRIBUTED = [20, 10, 0, 10]
PUNISHED = ['{"A": 0, "B": 4, "C": 0}', '{"A": 1, "B": 2, "C": 0}', '{"A": 3, "B": 0, "C": 0}', "No points."]


async def test_every_member_contributes_then_punishes_seeing_the_others_contributions():
    run = share()
    ((a, b, c, d),) = groups(run)
    seat = {a: 0, b: 1, c: 2, d: 3}
    llm = script(lambda key: json.dumps({"contribution": CONTRIBUTED[seat[key]]}),
                 lambda key, prompt: PUNISHED[seat[key]])
    res, outcomes, acts = await play(run, llm)
    # stage 1 of every member before any stage 2, each stage in the group's order
    assert [(x.key, STAGE_2 in x.prompt) for x in llm.asked] == [(a, False), (b, False), (c, False), (d, False),
                                                                  (a, True), (b, True), (c, True), (d, True)]
    assert llm.asked[0].prompt == TEXTS.contribute(None, "", 4)
    assert llm.asked[0].schema is run.sim.contribute_schema and llm.asked[4].schema is run.sim.punish_schemas[3]
    # each member sees the others, lettered in the group's order without itself
    assert llm.asked[5].prompt == TEXTS.punish(None, "", 10, [20, 0, 10])
    assert llm.asked[6].prompt == TEXTS.punish(None, "", 0, [20, 10, 10])
    assert all(x.system is None and x.prefix_chars == 0 for x in llm.asked)
    assert acts == [act(0, 0, a, "contribute", '{"contribution": 20}', contribution=20),
                    act(0, 1, b, "contribute", '{"contribution": 10}', contribution=10),
                    act(0, 2, c, "contribute", '{"contribution": 0}', contribution=0),
                    act(0, 3, d, "contribute", '{"contribution": 10}', contribution=10),
                    act(0, 4, a, "punish", PUNISHED[0], targets=[b, c, d], points=[0, 4, 0]),
                    act(0, 5, b, "punish", PUNISHED[1], targets=[a, c, d], points=[1, 2, 0]),
                    act(0, 6, c, "punish", PUNISHED[2], targets=[a, b, d], points=[3, 0, 0]),
                    act(0, 7, d, "punish", PUNISHED[3], targets=[a, b, c], valid=False)]
    # pot 40, share 16; given [4, 3, 3, 0], received [4, 0, 6, 0]; d's invalid answer punishes nobody
    assert outcomes[a] == result(20, 40, 4, 4, 0, 4, 0.0, True, '{"contribution": 20}')
    assert outcomes[b] == result(10, 40, 4, 3, 1, 0, 23.0, True, '{"contribution": 10}')
    assert outcomes[c] == result(0, 40, 4, 3, 3, 6, 15.0, True, '{"contribution": 0}')
    assert outcomes[d] == result(10, 40, 4, 0, 0, 0, 26.0, False, '{"contribution": 10}')
    assert res.partial == Counts(n=4, n_valid=4, total=40, free_riders=1, punish_answers=3, punishers=3, points=10,
                                 antisocial=4)
    assert (res.n, res.n_valid) == (4, 4)


class Gate:
    """A model that answers no call until `n` calls wait together: a scene that asked its
    members one after the other would never get an answer."""

    def __init__(self, n: int, contribute: str = '{"contribution": 5}') -> None:
        self.n, self.contribute = n, contribute
        self.waiting: list[tuple[asyncio.Future, str]] = []
        self.stages: list[list[bool]] = []  # per release: which calls were stage 2

    async def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system=None, schema=None) -> str:
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append((fut, prompt))
        if len(self.waiting) == self.n:
            self.stages.append([STAGE_2 in p for _, p in self.waiting])
            for f, p in self.waiting:
                f.set_result(no_points(0, p) if STAGE_2 in p else self.contribute)
            self.waiting = []
        return await fut


async def test_the_acts_of_a_stage_run_at_once_so_a_round_waits_on_two_model_latencies():
    run = share(8, block=8)  # two groups of four: eight calls in flight per stage
    gate = Gate(8)
    res, _, acts = await asyncio.wait_for(play(run, gate), timeout=10)
    assert gate.stages == [[False] * 8, [True] * 8]  # every contribution together, then every punishment
    assert len(acts) == 16 and res.partial.punish_answers == 8


@pytest.mark.parametrize("raw", ["I give 5.", '{"contribution": 21}', '{"contribution": -1}',
                                 '{"contribution": 4.5}', '{"contribution": true}', '{"amount": 4}'])
async def test_an_invalid_contribution_counts_as_zero_is_shown_as_such_and_is_recorded_invalid(raw):
    run = share()
    ((a, b, _, _),) = groups(run)
    llm = script(lambda key: raw if key == a else '{"contribution": 8}', no_points)
    _, outcomes, acts = await play(run, llm)
    assert acts[0] == act(0, 0, a, "contribute", raw, valid=False)  # nothing invented
    assert outcomes[a] == result(None, 24, 4, 0, 0, 0, 20 + 9.6, True, raw, valid=False)
    assert outcomes[b]["payoff"] == 12 + 9.6  # 1.6 · 24 / 4: the invalid member put in nothing
    seen = next(x.prompt for x in llm.asked if x.key == b and STAGE_2 in x.prompt)
    assert "the others contributed: A no valid answer (counted as 0), B 8, C 8." in seen
    mine = next(x.prompt for x in llm.asked if x.key == a and STAGE_2 in x.prompt)
    assert "you gave no valid answer (counted as 0); the others contributed: A 8, B 8, C 8." in mine


@pytest.mark.parametrize("raw", ['{"A": 0, "B": 11, "C": 0}', '{"A": 0, "B": 3}', '{"A": 1, "B": "2", "C": 0}',
                                 '{"A": 1, "B": 2, "C": -3}', "[1, 2, 3]", "Punish B."])
async def test_an_invalid_punishment_assigns_no_points_and_is_recorded_invalid(raw):
    run = share()
    ((a, b, c, d),) = groups(run)
    llm = script('{"contribution": 5}', lambda key, prompt: raw if key == a else no_points(key, prompt))
    res, outcomes, acts = await play(run, llm)
    assert acts[4] == act(0, 4, a, "punish", raw, targets=[b, c, d], valid=False)
    assert outcomes[a] == result(5, 20, 4, 0, 0, 0, 15 + 8.0, False, '{"contribution": 5}')  # its contribution is valid
    assert all(outcomes[x]["points_received"] == 0 for x in (b, c, d))
    assert res.partial.punish_answers == 3 and res.partial.points == 0
    assert res.n_valid == 4  # `valid` is the contribution's; the punishment's is `punish_valid`


async def test_an_agent_bug_is_its_acts_error_and_every_scene_goes_on():
    run = share(8, block=8)
    (a, b, _, _), (_, f, _, _) = groups(run)
    llm = script(lambda key: ValueError(f"bug {key}") if key == a else '{"contribution": 4}',
                 lambda key, prompt: ValueError(f"bug {key}") if key == f else no_points(key, prompt))
    res, outcomes, acts = await play(run, llm)
    bug_a, bug_f = f"ValueError: bug {a}", f"ValueError: bug {f}"
    assert acts[0] == act(0, 0, a, "contribute", f"<agent error: {bug_a}>", valid=False, error=f"agent: {bug_a}")
    assert outcomes[a] == result(None, 12, 4, 0, 0, 0, 20 + 4.8, True, f"<agent error: {bug_a}>", valid=False,
                                 error=f"agent: {bug_a}")
    assert outcomes[b]["error"] is None
    punished_f = [x for x in acts if x["agent_id"] == f and x["phase"] == "punish"]
    assert punished_f == [act(1, 5, f, "punish", f"<agent error: {bug_f}>", valid=False, error=f"agent: {bug_f}")]
    assert outcomes[f]["error"] == f"agent: {bug_f}" and outcomes[f]["punish_valid"] is False
    assert outcomes[f]["valid"] is True and outcomes[f]["raw"] == '{"contribution": 4}'
    assert len(acts) == 16 and (res.n, res.n_valid) == (8, 7)


@pytest.mark.parametrize("at", ["contribute", "punish"])
async def test_an_outage_is_never_recorded_as_an_answer_and_leaves_no_act_running(at):
    run = share(8, block=8)
    down = InferError("gateway down")
    llm = script(down, no_points) if at == "contribute" else script('{"contribution": 5}', down)
    before = asyncio.all_tasks()
    with pytest.raises(ModelUnavailable, match="gateway down"):
        await play(run, llm)
    await asyncio.sleep(0)
    assert asyncio.all_tasks() == before  # every member's act finished: none left running unobserved


async def test_each_member_remembers_its_round_and_reads_it_in_the_next_rounds_prompts():
    run = share()
    ((a, b, c, d),) = groups(run)
    seat = {a: 0, b: 1, c: 2, d: 3}
    await play(run, script(lambda key: json.dumps({"contribution": CONTRIBUTED[seat[key]]}),
                           lambda key, prompt: PUNISHED[seat[key]]))
    assert [run.agents[x].memory for x in (a, b, c, d)] == [
        ((1, 20, 40, 4, 4, 4),), ((1, 10, 40, 4, 3, 0),), ((1, 0, 40, 4, 3, 6),), ((1, 10, 40, 4, 0, 0),)]
    recalled = ("Your last rounds:\n- round 1: you contributed 0, your group of 4 put in 40 in all; you assigned "
                "3 points and received 6; your payoff was 15.\n")
    assert run.agents[c].context() == recalled.rstrip("\n")  # what an interview reads
    llm = script('{"contribution": 1}', no_points)
    await play(run, llm, round_=2)
    mine = [x.prompt for x in llm.asked if x.key == c]
    assert len(mine) == 2 and all(p.startswith(recalled) for p in mine)


async def test_memory_keeps_the_last_five_rounds_of_six_small_integers():
    run = share()
    for r in range(1, 8):
        await play(run, script(json.dumps({"contribution": r}), no_points), round_=r)
    memory = run.agents[0].memory
    assert [m[0] for m in memory] == [3, 4, 5, 6, 7]
    assert all(len(m) == 6 and all(type(v) is int for v in m) for m in memory)


async def test_without_history_the_prompt_recalls_nothing():
    run = share(show_history=False)
    await play(run, script('{"contribution": 3}', no_points))
    llm = script('{"contribution": 3}', no_points)
    await play(run, llm, round_=2)
    assert all(x.prompt.startswith("Stage 1") for x in llm.asked)
    assert all(run.agents[i].memory for i in range(4))  # remembered, only not shown


async def test_smaller_groups_share_among_their_members_and_a_lone_member_punishes_nobody():
    run = share(7)  # blocks of 4: a group of 4, then the last block's 3
    assert [len(g) for g in groups(run)] == [4, 3]
    run = share(5)  # a group of 4 and one agent alone
    (_, (alone,)) = groups(run)
    llm = script('{"contribution": 10}', no_points)
    res, outcomes, acts = await play(run, llm)
    assert [x.prompt for x in llm.asked if x.key == alone] == [TEXTS.contribute(None, "", 1)]
    assert [x["phase"] for x in acts if x["agent_id"] == alone] == ["contribute"]
    assert outcomes[alone] == result(10, 10, 1, 0, 0, 0, 20 - 10 + 16.0, None, '{"contribution": 10}', group=1)
    assert res.partial.punish_answers == 4
    pair_run = share(6)
    (_, (p, _)) = groups(pair_run)
    llm = script('{"contribution": 10}', '{"A": 2}')
    _, outcomes, _ = await play(pair_run, llm)
    assert [x.schema for x in llm.asked if x.key == p and x.schema is not pair_run.sim.contribute_schema] == [
        pair_run.sim.punish_schemas[1]]
    assert outcomes[p]["payoff"] == 20 - 10 + 16.0 - 2 - 6  # share 1.6 · 20 / 2; two points each way


async def test_without_a_punishment_stage_each_member_acts_once():
    run = share(max_points=0)
    llm = script('{"contribution": 6}')
    res, outcomes, acts = await play(run, llm)
    assert [x["phase"] for x in acts] == ["contribute"] * 4 and len(llm.asked) == 4
    assert all(o == result(6, 24, 4, 0, 0, 0, 14 + 9.6, None, '{"contribution": 6}') for o in outcomes.values())
    assert res.partial.punish_answers == 0


async def test_groups_are_drawn_again_each_round_within_blocks_never_across():
    run = share(40, block=20)
    seen = []
    for r in range(1, 6):
        _, outcomes, acts = await play(run, script('{"contribution": 1}', no_points), round_=r)
        drawn = groups(run, r)
        assert len(drawn) == 10 and sorted(m for g in drawn for m in g) == list(range(40))
        for gid, members in enumerate(drawn):
            assert len({m // 20 for m in members}) == 1 and members[0] // 20 == gid // 5  # inside its block
            assert [x["agent_id"] for x in acts if x["group_id"] == gid] == list(members) * 2
            assert all(outcomes[m]["group"] == gid for m in members)
        seen.append({frozenset(g) for g in drawn})
    assert all(seen[i] != seen[i + 1] for i in range(4))  # strangers
    part = share(40, block=20, ranges=[(20, 20)])  # a host holding only the second block
    assert groups(part, 3) == [g for g in groups(run, 3) if g[0] >= 20]


@pytest.mark.parametrize("batch_size", [1, 3, 1000])
async def test_batches_that_cut_groups_give_the_same_round(batch_size):
    run = share(10, block=4)
    llm = script(lambda key: json.dumps({"contribution": key}),
                 lambda key, prompt: json.dumps({x: (key + i) % 3 for i, x in enumerate(LETTERS.findall(prompt))}))
    res, outcomes, acts = await play(run, llm, batch_size=batch_size)
    p = res.partial
    assert (res.n, p.total, len(acts)) == (10, 45, 20)
    assert p.points == sum(o["points_given"] for o in outcomes.values()) == sum(
        o["points_received"] for o in outcomes.values())


class Rogue(Player):
    """An author's agent that breaks the rules: it contributes more than it has and punishes
    agents outside its group, or more than the maximum."""

    __slots__ = ()

    async def act(self, phase, view, llm):
        if phase == "contribute":
            return Move(contribution=99)
        if view.seat == 0:
            return Move(targets=[7, 8, 9], points=[1, 1, 1])
        return Move(targets=view.targets, points=[0, 50, 0] if view.seat == 1 else [0, 1])


class RoguePunishment(Punishment):
    Agent = Rogue


async def test_an_act_that_breaks_the_rules_is_recorded_as_it_came_and_counts_as_nothing():
    base = resolve(config(4))
    run = share(resolved=Resolved(base.config, RoguePunishment, base.params))
    res, outcomes, acts = await play(run, ScriptedLLM(""))
    assert [x["contribution"] for x in acts[:4]] == [99] * 4 and acts[4]["targets"] == [7, 8, 9]
    assert all(o["contribution"] is None and o["valid"] is False and o["points_given"] == 0
               and o["punish_valid"] is False and o["payoff"] == 20.0 for o in outcomes.values())
    assert res.partial == Counts(n=4)


async def test_the_persona_leads_each_prompt_and_is_its_cacheable_prefix():
    cast = Cast([Persona(i, f"You are Person {i}, a farmer.", {"occupation": "farmer"}) for i in range(4)])
    run = share(cast=cast)
    llm = script('{"contribution": 4}', no_points)
    await play(run, llm)
    for x in llm.asked:
        persona = f"You are Person {x.key}, a farmer."
        assert x.prompt.startswith(persona + "\n") and x.prefix_chars == len(persona)
    assert run.sim.user_example() == TEXTS.contribute("You are Person 0, a farmer.", "", 4)


async def test_chain_of_thought_asks_with_the_reasoning_schemas():
    cot = resolve(RunConfig.model_validate({"simulation": "punishment", "agents": 4, "game": {"block": 4},
                                            "prompt": {"answer": "cot"}}))
    llm = script('{"reasoning": "fair", "contribution": 20}',
                 lambda key, prompt: json.dumps({"reasoning": "x", **dict.fromkeys(LETTERS.findall(prompt), 1)}))
    _, outcomes, _ = await play(share(resolved=cot), llm)
    assert [list(x.schema["properties"]) for x in llm.asked] == [["reasoning", "contribution"]] * 4 + [
        ["reasoning", "A", "B", "C"]] * 4
    assert all(o["payoff"] == 32 - 3 - 9 for o in outcomes.values())  # 1.6 · 80 / 4; a point to and from each other member


def test_an_agent_is_a_small_object():
    assert Player.__slots__ == ()
    agent = share().agents[0]
    assert isinstance(agent, Player) and not hasattr(agent, "__dict__")
