"""Tests of the dictator game, as its author would write them: the pure parts directly, the
agent with a scripted model (`ScriptedLLM`: no NATS, no model), and whole runs in this
process (`run_local`: the same round player, reduce, merge and decide as on the fleet).

Plain functions with `asyncio.run`, so they need pytest alone: `pytest path/to/this/package`.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from dictator_game import (
    Dictator,
    DictatorEnv,
    DictatorGame,
    DictatorParams,
    Gift,
    Gifts,
    Heard,
    Past,
    RoundSummary,
    parse_gift,
)
from pydantic import ValidationError

from populace.sdk import Cast, InferError, ModelUnavailable, Persona, RunConfig, ScriptedLLM, load_simulation, resolve
from populace.sdk.local import run_local
from populace.sdk.testing import check_resume

SCENARIO = Path(__file__).parent.parent / "scenario.yaml"


def sim(agents: int = 10, cast: Cast | None = None, **game) -> DictatorGame:
    """One run of the game (what every agent of a process shares)."""
    return DictatorGame(DictatorParams.model_validate({"game": game}), agents=agents, cast=cast)


def config(agents: int = 23, rounds: int = 3, **sections: dict) -> RunConfig:
    """A scenario as `populace run` reads it; the simulation is found by its entry point."""
    return RunConfig.model_validate({"simulation": DictatorGame.name, "agents": agents, "rounds": rounds,
                                     "model": {"seed": 4}, "game": {"endowment": 10}, **sections})


# -- the package is wired up -----------------------------------------------------------------
def test_the_entry_point_finds_this_class_and_the_declaration_is_valid():
    assert load_simulation(DictatorGame.name) is DictatorGame  # pyproject's entry point = name
    DictatorGame.check()  # raises SimulationError listing what is wrong
    # declared once: the outcome, observation and summary are read from the agent's turn and decide
    assert (DictatorGame.Outcome, DictatorGame.Observation, DictatorGame.Summary) == (Gift, Heard, RoundSummary)
    assert (DictatorEnv.State, DictatorEnv.Partial) == (Past, Gifts)  # from Env[Past, Gifts]
    tables = DictatorGame.tables()
    assert (tables.outcomes, tables.rounds, tables.measure) == ("dictator_outcomes", "dictator_rounds", "given")
    assert [c.name for c in tables.summary_columns] == ["mean_given", "given_pct", "zero_pct", "half_pct"]


def test_the_example_scenario_is_valid():
    resolved = resolve(RunConfig.model_validate(yaml.safe_load(SCENARIO.read_text())))
    assert resolved.simulation is DictatorGame
    assert resolved.params.game.endowment == 10


# -- params: errors name the field --------------------------------------------------------------
@pytest.mark.parametrize("game, field", [
    ({"endowment": 0}, "game.endowment"),
    ({"endowment": True}, "game.endowment"),  # YAML's `yes` is not a number
    ({"endowment": "lots"}, "game.endowment"),
    ({"endowmnet": 10}, "game.endowmnet"),  # a typo is an unknown key, not a silent default
])
def test_bad_params_name_the_field(game, field):
    with pytest.raises(ValidationError) as err:
        DictatorParams.model_validate({"game": game})
    assert [".".join(map(str, e["loc"])) for e in err.value.errors()] == [field]


def test_chain_of_thought_is_the_platforms_with_room_to_think_unless_the_scenario_says_otherwise():
    """`model: {answer: cot}` is the platform's: it puts "reasoning" first in the run's schema,
    adds its sentence to the system prompt and asks for 256 tokens unless `model.max_tokens` is set."""
    plain = resolve(config())
    thinking = resolve(config(model={"seed": 4, "answer": "cot"}))
    told = resolve(config(model={"seed": 4, "answer": "cot", "max_tokens": 100}))
    assert plain.config.model.max_tokens == RunConfig().model.max_tokens  # the platform's default
    assert thinking.config.model.max_tokens == 256
    assert told.config.model.max_tokens == 100
    direct, cot = plain.instance(), thinking.instance()
    assert list(direct.request_schema()["properties"]) == ["give"]
    assert list(cot.request_schema()["properties"]) == ["reasoning", "give"]
    assert cot.request_schema()["required"] == ["reasoning", "give"]
    assert cot.request_system_prompt().startswith(direct.request_system_prompt() + " Think step by step")
    assert parse_gift('{"reasoning": "fair is fair", "give": 5}', 10) == 5  # the parser reads "give" only


# -- parsing never invents an answer -----------------------------------------------------------
@pytest.mark.parametrize("text, given", [
    ('{"give": 3}', 3), (' {"give": 0} ', 0), ('{"give": 10}', 10), ('{"give": 4.0}', 4),
    ('{"reasoning": "fair is fair", "give": 5}', 5), ("7", 7),
    ('{"give": 11}', None), ('{"give": -1}', None), ('{"give": 2.5}', None), ('{"give": "3"}', 3),
    ('{"give": true}', None), ('{"gift": 3}', None), ("[3]", None), ('{"give": 3', None),
    ("I give 3 coins.", None), ("three", None), ("", None), ("3.5", None),
])
def test_parse_gift_takes_only_a_whole_number_in_range(text, given):
    assert parse_gift(text, 10) == given


# -- the agent, with a scripted model ------------------------------------------------------------
def test_the_agent_asks_once_with_its_persona_first_and_remembers_its_gift():
    cast = Cast([Persona(0, "You are Ana, a nurse.", {"occupation": "nurse"})])
    agent = Dictator(0, cast.personas[0], sim(1, cast, endowment=10))
    llm = ScriptedLLM({0: ['{"give": 4}', "no idea"]})

    first = asyncio.run(agent.turn(Heard(round=1), llm))
    assert first == Gift(given=4, raw='{"give": 4}', valid=True)
    second = asyncio.run(agent.turn(Heard(round=2, last_average=3.25), llm))
    assert second == Gift(given=None, raw="no idea", valid=False)  # kept as said, never guessed

    asked = llm.asked
    assert [a.key for a in asked] == [0, 0]
    assert asked[0].prompt == "You are Ana, a nurse. How many coins do you give?"
    assert asked[1].prompt == ("You are Ana, a nurse. Last round, participants gave 3.2 coins on average. "
                               "Your earlier gifts: 4. How many coins do you give?")
    assert asked[0].prefix_chars == len("You are Ana, a nurse.")  # the part that never changes
    assert asked[0].system is None and asked[0].schema is None  # the run's system prompt and schema apply
    assert agent.memory == ((1, 4), (2, None))


def test_without_a_population_the_agent_is_a_numbered_participant():
    agent = Dictator(7, None, sim(10))
    llm = ScriptedLLM('{"give": 1}')
    asyncio.run(agent.turn(Heard(round=1), llm))
    assert llm.asked[0].prompt == "You are participant 7. How many coins do you give?"
    assert llm.asked[0].prefix_chars == 0


# -- the environment: exact, in any order --------------------------------------------------------
def gifts(*given: int | None) -> list[Gift]:
    return [Gift(given=g, valid=g is not None) for g in given]


def test_reduce_counts_valid_gifts_only_and_merge_is_exact_in_any_order():
    env = DictatorEnv(sim(endowment=9))  # odd: 4 and 5 are both equal splits
    outs = gifts(0, 4, 5, 9, None, 0, 3)
    whole = env.reduce(range(7), outs)
    assert whole == Gifts(n=6, total=21, zero=2, half=2)
    parts = [env.reduce(range(2), outs[:2]), env.reduce(range(2, 5), outs[2:5]), env.reduce(range(5, 7), outs[5:])]
    assert env.merge(parts) == env.merge(parts[::-1]) == env.merge([env.merge(parts[:2]), parts[2]]) == whole


def test_decide_summarises_the_round_and_tells_the_next_one_the_average():
    env = DictatorEnv(sim(endowment=10))
    state, summary = env.decide(env.start(), 1, Gifts(n=4, total=10, zero=1, half=2))
    assert summary.model_dump() == {"mean_given": 2.5, "given_pct": 25.0, "zero_pct": 25.0, "half_pct": 50.0}
    assert env.observe(state, 2) == Heard(round=2, last_average=2.5)
    assert DictatorEnv(sim(show_average=False)).observe(state, 2).last_average is None
    # a round without one valid answer: no average, and the next round hears none
    state, summary = env.decide(state, 2, Gifts())
    assert summary.mean_given is None and env.observe(state, 3).last_average is None
    assert state == Past()


# -- whole runs in this process -------------------------------------------------------------------
def scripted(key: int, prompt: str) -> str:
    """An answer that depends on the whole prompt (what the agent heard and remembers), so a
    placement that lost an average or a memory would change it; some answers are invalid."""
    h = sum(prompt.encode()) + 31 * key
    return "Keep it all, I say." if h % 7 == 0 else json.dumps({"give": h % 11})


def play(cfg: RunConfig, **kw):
    result = asyncio.run(run_local(cfg, llm=lambda run, round_: ScriptedLLM(scripted), **kw))
    rounds = {k: v for k, v in result.rounds.items() if k != "closed_at"}  # wall clock
    outcomes = {k: v for k, v in result.outcomes.items() if k != "latency_ms"}
    return rounds, outcomes


def test_one_host_three_hosts_and_one_process_per_agent_play_identical_rounds():
    one = play(config())
    assert one[0]["round"] == [1, 2, 3] and len(one[1]["agent_id"]) == 69
    assert 0 < sum(one[0]["n_valid"]) < 69  # some answers were invalid
    assert play(config(), hosts=3) == one
    assert play(config(), one_per_process=True) == one


def test_the_dummy_model_gives_identical_rounds_on_any_placement():
    one = asyncio.run(run_local(config(agents=40)))
    three = asyncio.run(run_local(config(agents=40), hosts=3))
    assert {k: v for k, v in three.rounds.items() if k != "closed_at"} == \
        {k: v for k, v in one.rounds.items() if k != "closed_at"}
    assert one.rounds["n_valid"] == [40, 40, 40]  # the dummy answers the schema: always valid


def test_the_round_summary_agrees_with_the_recorded_rows():
    rounds, outcomes = play(config(agents=23, rounds=2), hosts=2)
    rows = [dict(zip(outcomes, values)) for values in zip(*outcomes.values())]
    for i, rnd in enumerate(rounds["round"]):
        given = [r["given"] for r in rows if r["round"] == rnd and r["valid"]]
        assert rounds["n_valid"][i] == len(given)
        assert rounds["mean_given"][i] == sum(given) / len(given)
        assert rounds["zero_pct"][i] == 100 * given.count(0) / len(given)
        assert rounds["half_pct"][i] == 100 * given.count(5) / len(given)
    assert all((r["given"] is None) == (not r["valid"]) for r in rows)


def test_a_run_resumed_after_any_round_is_the_uninterrupted_run():
    """`populace resume`, `populace fork` and a re-placed host rebuild each agent from its class
    and its checkpoint: `memory`, plus whatever `state_fields` lists. check_resume plays the run,
    then again stopped and restored after each round, and compares every row; an attribute a
    turn changes that no checkpoint saves is named (add it to `state_fields`)."""
    check_resume(DictatorGame, {"agents": 23, "rounds": 3, "model": {"seed": 4}, "game": {"endowment": 10}})
    check_resume(DictatorGame, {"agents": 23, "rounds": 3, "game": {"endowment": 9}}, hosts=3)


def test_a_model_that_cannot_be_reached_stops_the_round_and_is_never_an_answer():
    """When no model answers (after the port's retries), nothing of the round is recorded: on
    the fleet the run pauses with the reason, and `populace resume` plays the round again."""
    def down_for_agent_3(key: int, prompt: str) -> str:
        if key == 3:
            raise InferError("no replica")
        return '{"give": 2}'

    with pytest.raises(ModelUnavailable, match="no replica"):
        asyncio.run(run_local(config(agents=5, rounds=1), llm=lambda run, n: ScriptedLLM(down_for_agent_3)))
