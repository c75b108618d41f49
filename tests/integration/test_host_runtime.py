"""The agent-host runtime without a broker: spawning any simulation by name in both placement
modes, personas by reference, and turns played through a scripted LLM port."""

from __future__ import annotations

import asyncio
import os

import pytest
from populace_ratio_game import Player
from populace_ratio_game.parsing import parse_guess

from populace.agent_host.runtime import HostRuntime
from populace.core.contracts import ConfigRef, RunConfig, SpawnBatch
from populace.core.settings import Settings
from populace.population.cast import cast_from_records
from populace.sdk import ScriptedLLM
from populace.sdk.process import ProcessAgent
from populace.sdk.simulation import SimulationError


def answers(key: int, prompt: str) -> str:
    return f'{{"guess": {key % 101}}}'


def spawn(settings: Settings, config: RunConfig, ranges=((10, 3),), cast=None):
    rt = HostRuntime(None, None, settings)  # type: ignore[arg-type] - spawn touches no bus
    return rt, rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=list(ranges), config_ref=ConfigRef.of(config)),
                        config, cast)


def test_host_flag_forces_one_agent_per_process():
    rt, run = spawn(Settings(host_id="h", one_agent_per_process=True), RunConfig(agents=13))
    try:
        assert [a.id for a in run.agents] == [10, 11, 12]
        assert all(isinstance(a, ProcessAgent) for a in run.agents)
        assert len({a.pid for a in run.agents} | {os.getpid()}) == 4  # three processes of their own
    finally:
        rt.forget("r")
    assert all(not a.proc.is_alive() for a in run.agents)


def test_many_agents_per_process_by_default():
    rt, run = spawn(Settings(host_id="h"), RunConfig(agents=13))
    assert all(type(a) is Player for a in run.agents) and all(a.sim is run.sim for a in run.agents)
    rt.forget("r")


def test_a_replayed_spawn_is_a_no_op():
    rt, run = spawn(Settings(host_id="h"), RunConfig(agents=13))
    config = RunConfig(agents=13)
    again = rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(10, 3)], config_ref=ConfigRef.of(config)), config)
    assert again is run and rt.agent_count == 3
    rt.forget("r")


def test_an_unknown_simulation_or_bad_params_refuse_the_spawn_with_the_reason():
    with pytest.raises(SimulationError, match="unknown simulation 'chess'"):
        spawn(Settings(host_id="h"), RunConfig(simulation="chess"))
    with pytest.raises(ValueError, match="game.ratio"):
        spawn(Settings(host_id="h"), RunConfig(game={"ratio": "zero"}))


async def test_process_agents_run_their_own_turns_and_remember():
    rt, run = spawn(Settings(host_id="h", one_agent_per_process=True), RunConfig(agents=13))
    llm = ScriptedLLM(answers)
    try:
        for rnd, history in ((1, None), (2, {"history": [33.0]})):
            obs = run.observation(rnd, history)
            outs = await asyncio.gather(*(a.turn(obs, llm) for a in run.agents))
            assert [o.value for o in outs] == [10.0, 11.0, 12.0]
            assert all(parse_guess(o.raw, 100) == o.value for o in outs)
        # round 2's prompt, built in the child process, carries the winning number and own memory
        prompt = [a.prompt for a in llm.asked if a.key == 11][-1]
        assert "Winning numbers of previous rounds: 33." in prompt and "Your previous numbers: 11." in prompt
    finally:
        rt.forget("r")


def _cast():
    return cast_from_records([{"profile": {"education": ["Ph.D.", "high school"][i % 2]},
                               "persona": {"name": f"Agent{i}", "age": 30 + i}} for i in range(13)])


def test_agents_speak_from_their_persona_and_the_system_prompt_has_the_variant():
    config = RunConfig(agents=13, prompt={"system": "rational", "answer": "cot", "population_note": True},
                       population={"personas": "p.jsonl"})
    rt, run = spawn(Settings(host_id="h"), config, cast=_cast())
    assert [a.persona.text.split(",")[0] for a in run.agents] == ["You are Agent10", "You are Agent11", "You are Agent12"]
    system = run.sim.system_prompt()
    assert "All players are rational" in system and "The players are 13 people." in system
    assert run.sim.answer_schema()["required"] == ["reasoning", "guess"]
    rt.forget("r")


async def test_persona_false_keeps_anonymous_players():
    rt, run = spawn(Settings(host_id="h"), RunConfig(agents=13, prompt={"persona": False}), ((0, 2),), _cast())
    llm = ScriptedLLM(answers)
    await run.agents[0].turn(run.observation(1, None), llm)
    assert llm.asked[0].prompt.startswith("You are player 0.") and llm.asked[0].prefix_chars == 0
    assert "The players are" not in run.sim.system_prompt()  # population_note is off by default
    rt.forget("r")


def test_too_few_personas_is_an_error_not_a_silent_default():
    with pytest.raises(ValueError, match="13 personas for agent ids up to 19"):
        spawn(Settings(host_id="h"), RunConfig(agents=20), ((10, 10),), _cast())


async def test_process_agents_carry_their_persona_and_answer_style():
    config = RunConfig(agents=13, prompt={"answer": "cot"})
    rt, run = spawn(Settings(host_id="h", one_agent_per_process=True), config, ((4, 1),), _cast())
    llm = ScriptedLLM(answers)
    try:
        await run.agents[0].turn(run.observation(1, None), llm)
        asked = llm.asked[0]
        assert asked.prompt.startswith("You are Agent4, 34 years old.")
        # the persona is declared as the prompt's stable prefix (routing key across rounds)
        assert asked.prompt[:asked.prefix_chars] == run.agents[0].persona.text
        assert asked.prompt.endswith("Think step by step, then report your number.")
    finally:
        rt.forget("r")
