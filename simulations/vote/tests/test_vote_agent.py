"""The voter's turn with a scripted model: what it asks, what it records, what it remembers."""

from __future__ import annotations

import json

import pytest
from populace_vote import Choice, LastRound, Vote, Voter, prompts

from populace.core.contracts import RunConfig
from populace.population.cast import cast_from_records
from populace.sdk import InferError, ScriptedLLM, resolve

CAST = cast_from_records([
    {"profile": {"education": "Ph.D.", "age": 61, "gender": "female"}, "persona": {"name": "Ana Lima"}},
    {"profile": {"education": "high school", "age": 19, "gender": "male"}, "persona": {"name": "Tom Berg"}},
])
BALLOT = {"question": "Lower the voting age to 16?", "options": ["Yes", "No", "Undecided"]}


def sim(*, cast=CAST, show=False, **sections) -> Vote:
    config = {"simulation": "vote", "agents": 2, "ballot": {**BALLOT, "show_distribution": show}, **sections}
    if cast is not None:
        config["population"] = {"personas": "personas.jsonl"}  # only named: the cast is passed in
    return resolve(RunConfig.model_validate(config)).instance(cast=cast)


def voter(s: Vote, agent_id: int = 0) -> Voter:
    return Voter(agent_id, s.cast.personas[agent_id] if s.cast is not None else None, s)


async def play(agent: Voter, s: Vote, llm: ScriptedLLM, round_: int = 1, last: dict | None = None) -> Choice:
    env = type(s).Env(s)
    return await agent.turn(env.observe(LastRound(counts=last or {}), round_), llm)


async def test_the_agent_speaks_from_its_persona():
    s = sim()
    agent = voter(s, 1)
    llm = ScriptedLLM('{"choice": "No"}')
    out = await play(agent, s, llm)
    assert out == Choice(choice="No", raw='{"choice": "No"}', valid=True)
    asked = llm.asked[0]
    persona = CAST.personas[1].text
    assert persona.startswith("You are Tom Berg, 19 years old, male.") and "Education: high school." in persona
    assert asked.prompt.startswith(persona) and asked.prompt.endswith("Which option do you choose?")
    # the persona is the cacheable prefix; the agent's id routes and seeds it
    assert (asked.key, asked.prefix_chars) == (1, len(persona))
    assert prompts.SPEAK_AS_PERSONA in s.system_prompt()


@pytest.mark.parametrize("case", ["persona off", "no population"])
async def test_without_persona_the_prompt_is_only_the_request(case):
    s = sim(prompt={"persona": False}) if case == "persona off" else sim(cast=None)
    llm = ScriptedLLM('{"choice": "Yes"}')
    await play(voter(s), s, llm)
    assert llm.asked[0].prompt == "Which option do you choose?" and llm.asked[0].prefix_chars == 0
    assert "Ana" not in llm.asked[0].prompt and prompts.SPEAK_AS_PERSONA not in s.system_prompt()


async def test_the_population_note_is_in_the_system_prompt_only_when_asked():
    assert "The participants are 2 people." not in sim().system_prompt()
    note = sim(prompt={"population_note": True}).system_prompt()
    assert "The participants are 2 people. Education: 50% Ph.D., 50% high school." in note


@pytest.mark.parametrize("show", [True, False])
async def test_last_rounds_distribution_is_heard_only_when_the_ballot_shows_it(show):
    s = sim(show=show)
    llm = ScriptedLLM('{"choice": "Yes"}')
    await play(voter(s), s, llm, round_=2, last={"Yes": 3, "No": 1, "Undecided": 0})
    heard = 'In the last round, 4 people answered validly: "Yes" 75%, "No" 25%, "Undecided" 0%.'
    assert (heard in llm.asked[0].prompt) is show
    assert (prompts.REPEATED in s.system_prompt()) is show


async def test_round_one_hears_no_distribution_even_when_shown():
    s = sim(show=True)
    llm = ScriptedLLM('{"choice": "Yes"}')
    await play(voter(s), s, llm, round_=1)
    assert "last round" not in llm.asked[0].prompt


@pytest.mark.parametrize("raw", ['{"choice": "Maybe"}', "I would vote yes", '{"choice": "Yes"', ""])
async def test_an_invalid_answer_is_kept_with_its_raw_text_and_no_choice(raw):
    s = sim()
    out = await play(voter(s), s, ScriptedLLM(raw))
    assert out == Choice(choice=None, raw=raw, valid=False)


async def test_a_choice_is_recorded_as_the_scenario_spells_it():
    s = sim()
    out = await play(voter(s), s, ScriptedLLM('{"choice": " undecided "}'))
    assert out == Choice(choice="Undecided", raw='{"choice": " undecided "}', valid=True)


async def test_the_agent_remembers_its_own_choices_round_after_round():
    s = sim(cast=None)
    agent = voter(s)
    llm = ScriptedLLM({0: ['{"choice": "yes"}', "no idea", '{"choice": "No"}', '{"choice": "No"}']})
    for r in (1, 2, 3, 4):
        await play(agent, s, llm, round_=r)
    assert agent.memory == ((1, "Yes"), (2, None), (3, "No"), (4, "No"))
    assert [a.prompt for a in llm.asked[1:]] == [
        'Your answers in earlier rounds: round 1 "Yes". Which option do you choose?',
        'Your answers in earlier rounds: round 1 "Yes". Which option do you choose?',  # round 2 was invalid
        'Your answers in earlier rounds: round 1 "Yes", round 3 "No". Which option do you choose?',
    ]


async def test_memory_survives_a_checkpoint_through_json():
    s = sim(cast=None)
    agent = voter(s)
    await play(agent, s, ScriptedLLM('{"choice": "Yes"}'), round_=1)
    restored = voter(s)
    restored.restore(json.loads(json.dumps(agent.state())))
    llm = ScriptedLLM('{"choice": "No"}')
    await play(restored, s, llm, round_=2)
    assert llm.asked[0].prompt.startswith('Your answers in earlier rounds: round 1 "Yes".')


async def test_no_model_is_not_an_answer():
    s = sim()
    with pytest.raises(InferError):  # the platform records an infrastructure failure, never a vote
        await play(voter(s), s, ScriptedLLM({0: InferError("no replica")}))


async def test_chain_of_thought_asks_for_reasoning_then_a_choice():
    s = sim(prompt={"answer": "cot"})
    llm = ScriptedLLM('{"reasoning": "At 19 I would like to vote.", "choice": "Yes"}')
    out = await play(voter(s, 1), s, llm)
    assert out.choice == "Yes" and out.valid
    assert llm.asked[0].prompt.endswith("Think step by step, then choose one option.")
    assert list(s.answer_schema()["properties"]) == ["reasoning", "choice"]


async def test_the_manifests_user_example_is_agent_zeros_first_prompt():
    s = sim()
    llm = ScriptedLLM('{"choice": "Yes"}')
    await play(voter(s), s, llm)
    assert s.user_example() == llm.asked[0].prompt


def test_a_voter_is_a_small_object():
    agent = voter(sim())
    assert not hasattr(agent, "__dict__")  # __slots__ = (): a million of them stay small
