"""The agent and its group env, played by the platform's own round player with a scripted
model: what each agent asks, what is recorded (invalid answers too, with their payoff), and
what each one remembers after its group settled."""

from __future__ import annotations

import json

import pytest
from populace_public_goods import Contribution, Contributor, Group, GroupNews, PublicGoodsEnv
from populace_public_goods.params import MEMORY_ROUNDS

from populace.core.contracts import RunConfig
from populace.sdk import Cast, InferError, ModelUnavailable, Persona, ScriptedLLM, resolve
from populace.sdk.hosting import host_run
from populace.sdk.play import OutcomeSink

REQUEST = "How many tokens do you contribute this round?"


def share(agents: int, cast: Cast | None = None, **game):
    config = RunConfig.model_validate({"simulation": "public-goods", "agents": agents,
                                       "game": {"group_size": 5, "endowment": 20, "multiplier": 1.6, **game}})
    return host_run(resolve(config), "r", [(0, agents)], cast, freeze=False)


async def play(run, llm, round_: int = 1, batch_size: int = 1000):
    """One round on the run's agents: (the share's round result, its rows by agent id)."""
    batches = []
    sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=batches.append, grouped=True)
    await run.player.play(run.observation(round_, None), llm, sink)
    result = sink.close()
    rows = {}
    for b in batches:
        for i, aid in enumerate(b.agent_ids):
            rows[aid] = {"group": b.group_ids[i], "valid": b.valid[i], "raw": b.raws[i], "error": b.errors[i],
                         **{name: col[i] for name, col in b.columns.items()}}
    return result, rows


def says(contributions: dict[int, int]) -> ScriptedLLM:
    return ScriptedLLM({k: json.dumps({"contribution": v}) for k, v in contributions.items()})


async def test_each_agent_asks_once_with_its_own_prompt_under_the_runs_system_prompt_and_schema():
    run = share(10)
    llm = ScriptedLLM('{"contribution": 3}')
    await play(run, llm)
    assert sorted(a.key for a in llm.asked) == list(range(10))
    for a in llm.asked:
        assert a.prompt == f"You are player {a.key}. {REQUEST}"
        assert a.system is None and a.schema is None  # the run's system prompt and schema apply
        assert a.prefix_chars == 0
    assert "public-goods game in groups of 5" in run.sim.system_prompt()
    assert run.sim.answer_schema()["properties"]["contribution"]["maximum"] == 20


async def test_the_persona_leads_the_prompt_and_is_its_cacheable_prefix():
    cast = Cast([Persona(i, f"You are Person {i}, a nurse.", {"occupation": "nurse"}) for i in range(5)])
    run = share(5, cast)
    llm = ScriptedLLM('{"contribution": 3}')
    await play(run, llm)
    for a in llm.asked:
        persona = f"You are Person {a.key}, a nurse."
        assert a.prompt == f"{persona} {REQUEST}" and a.prefix_chars == len(persona)
    assert run.sim.user_example() == f"You are Person 0, a nurse. {REQUEST}"


async def test_payoffs_are_recorded_and_every_member_remembers_its_round():
    run = share(5)
    result, rows = await play(run, says({0: 20, 1: 10, 2: 5, 3: 0, 4: 0}))
    # pot 35 · 1.6 / 5 = 11.2 each
    assert [rows[i]["payoff"] for i in range(5)] == [11.2, 21.2, 26.2, 31.2, 31.2]
    assert [rows[i]["contribution"] for i in range(5)] == [20, 10, 5, 0, 0]
    assert {rows[i]["group"] for i in range(5)} == {0}
    assert run.agents[1].memory == ((1, 10, 21.2, 7.0),)
    assert (result.partial.total, result.partial.free_riders, result.partial.full) == (35, 2, 1)

    llm = says({0: 0, 1: 0, 2: 0, 3: 0, 4: 0})
    await play(run, llm, round_=2)
    prompt = next(a.prompt for a in llm.asked if a.key == 1)
    assert prompt == ("You are player 1. Your previous rounds: round 1: you contributed 10, your payoff was 21.2, "
                      f"your group's average contribution was 7. {REQUEST}")
    assert run.agents[1].memory == ((1, 10, 21.2, 7.0), (2, 0, 20.0, 0.0))


async def test_an_unparseable_answer_is_invalid_with_its_text_counts_as_zero_and_still_pays():
    run = share(5)
    llm = ScriptedLLM({0: '{"contribution": 10}', 1: "I would rather keep my tokens, thanks.",
                       2: '{"contribution": 25}', 3: '{"contribution": 10}', 4: '{"contribution": 0}'})
    result, rows = await play(run, llm)
    for i, raw in ((1, "I would rather keep my tokens, thanks."), (2, '{"contribution": 25}')):
        assert rows[i]["valid"] is False and rows[i]["contribution"] is None
        assert rows[i]["raw"] == raw and rows[i]["error"] is None  # the model's answer, not a failure
        assert rows[i]["payoff"] == 20 + 6.4  # kept everything; 1.6 · 20 / 5
    assert rows[0]["payoff"] == 10 + 6.4
    assert (result.n, result.n_valid, result.partial.total) == (5, 3, 20)
    assert run.agents[1].memory == ((1, None, 26.4, 4.0),)
    await play(run, llm, round_=2)
    assert "round 1: you gave no valid answer (counted as 0), your payoff was 26.4" in next(
        a.prompt for a in llm.asked if a.key == 1 and "round 1" in a.prompt)


async def test_an_agent_bug_is_recorded_as_such_and_the_member_still_gets_its_share():
    run = share(5)
    llm = ScriptedLLM({0: '{"contribution": 20}', 1: '{"contribution": 0}', 2: ValueError("bug"),
                       3: '{"contribution": 0}', 4: '{"contribution": 0}'})
    _, rows = await play(run, llm)
    assert rows[2]["error"] == "agent: ValueError: bug" and rows[2]["valid"] is False
    assert rows[2]["payoff"] == 20 + 6.4  # counted as giving nothing: keeps the endowment
    assert rows[0]["payoff"] == 6.4


async def test_an_outage_is_never_recorded_as_an_answer_the_round_stops():
    """No model answered agent 1 (after the port's retries): nothing of the round counts;
    on the fleet the run pauses and the round is played again once a model answers."""
    run = share(5)
    llm = ScriptedLLM({0: '{"contribution": 20}', 1: InferError("gateway down"), 2: '{"contribution": 0}',
                       3: '{"contribution": 0}', 4: '{"contribution": 0}'})
    with pytest.raises(ModelUnavailable, match="gateway down"):
        await play(run, llm)


async def test_the_smaller_last_group_is_told_its_size_and_shares_among_its_members():
    run = share(7)  # groups: 0-4 and 5-6
    llm = says(dict.fromkeys(range(7), 10))
    result, rows = await play(run, llm)
    assert [rows[i]["group"] for i in range(7)] == [0, 0, 0, 0, 0, 1, 1]
    assert rows[0]["payoff"] == 10 + 16.0  # 1.6 · 50 / 5
    assert rows[5]["payoff"] == rows[6]["payoff"] == 10 + 16.0  # 1.6 · 20 / 2 (had k been 5: 6.4)
    prompts = {a.key: a.prompt for a in llm.asked}
    assert "Your group has only 2 players" in prompts[5] and "only" not in prompts[4]
    assert result.partial.groups == 2
    assert run.agents[6].memory == ((1, 10, 26.0, 10.0),)  # the group's average over its 2 members
    _, rows = await play(run, says({0: 10, 1: 10, 2: 10, 3: 10, 4: 10, 5: 10, 6: 0}), round_=2)
    assert rows[6]["payoff"] == 20 + 8.0 and rows[4]["payoff"] == 10 + 16.0  # 1.6 · 10 / 2 vs 1.6 · 50 / 5


def test_the_group_env_counts_only_valid_answers():
    # an agent (e.g. a user's subclass) may return a value with valid=False: it still counts as 0
    sim = share(5).sim
    outcomes = [Contribution(contribution=5, valid=False, raw="5?"), Contribution(contribution=5),
                Contribution(valid=False, raw="<agent error>"), Contribution(contribution=0),
                Contribution(contribution=20)]
    news = Group(sim).settle(1, 0, range(5), outcomes)
    assert news == GroupNews(round=1, total=25, size=5)
    assert [o.payoff for o in outcomes] == [28.0, 23.0, 28.0, 28.0, 8.0]  # share 1.6 · 25 / 5 = 8
    p = PublicGoodsEnv(sim).reduce(range(5), outcomes)
    assert (p.n, p.n_valid, p.total) == (5, 3, 25)


@pytest.mark.parametrize("batch_size", [1, 3, 4, 1000])
async def test_batches_that_cut_groups_give_the_same_round(batch_size):
    run = share(23)  # 5 groups, the last of 3
    llm = ScriptedLLM(lambda key, _: "no" if key % 7 == 3 else json.dumps({"contribution": key % 21}))
    result, _ = await play(run, llm, batch_size=batch_size)
    p = result.partial
    assert (p.n, p.n_valid, p.groups) == (23, 20, 5)
    assert p.total == sum(k % 21 for k in range(23) if k % 7 != 3)


async def test_memory_is_bounded_and_the_prompt_shows_the_window():
    run = share(5, history_window=3)
    for r in range(1, MEMORY_ROUNDS + 4):
        llm = says(dict.fromkeys(range(5), r % 21))
        await play(run, llm, round_=r)
    agent = run.agents[0]
    assert len(agent.memory) == MEMORY_ROUNDS and agent.memory[-1][0] == MEMORY_ROUNDS + 3
    last = llm.asked[0].prompt  # asked in the last round, before it settled
    shown = [r for r in range(1, MEMORY_ROUNDS + 4) if f"round {r}:" in last]
    assert shown == [MEMORY_ROUNDS, MEMORY_ROUNDS + 1, MEMORY_ROUNDS + 2]


def test_an_agent_is_a_small_object():
    assert Contributor.__slots__ == ()
    agent = share(5).agents[0]
    assert isinstance(agent, Contributor) and not hasattr(agent, "__dict__")
