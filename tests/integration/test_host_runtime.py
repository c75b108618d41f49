"""The agent-host runtime without a broker: spawning in both placement modes and a full
round of turns through a fake gateway session (a unit-test double of the transport)."""

from __future__ import annotations

import asyncio
import os

from populace.agent_host.process_mode import ProcessAgent
from populace.agent_host.runtime import HostRuntime
from populace.core.contracts import RunConfig, SpawnBatch
from populace.core.settings import Settings
from populace.games.parsing import parse_guess
from populace.games.player import GuessPlayer, Turn


class FakeSession:
    """Answers every prompt with its agent id modulo 101, recording what it was asked."""

    def __init__(self) -> None:
        self.prompts: dict[int, str] = {}
        self.prefix_chars: dict[int, int] = {}

    def ask(self, key: int, prompt: str, prefix_chars: int = 0) -> asyncio.Future:
        self.prompts[key] = prompt
        self.prefix_chars[key] = prefix_chars
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(f'{{"guess": {key % 101}}}')
        return fut

    def flush(self) -> None:
        pass


def spawn(settings: Settings, config: RunConfig) -> HostRuntime:
    rt = HostRuntime(None, None, settings)  # type: ignore[arg-type] - spawn touches no bus
    rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(10, 3)], config=config))
    return rt


def test_host_flag_forces_one_agent_per_process():
    rt = spawn(Settings(host_id="h", one_agent_per_process=True), RunConfig(agents=3))
    try:
        agents = rt.runs["r"].agents
        assert [a.agent_id for a in agents] == [10, 11, 12]
        assert all(isinstance(a, ProcessAgent) for a in agents)
        assert len({a.pid for a in agents} | {os.getpid()}) == 4  # three processes of their own
    finally:
        rt.forget("r")
    assert all(not a.proc.is_alive() for a in agents)


def test_many_agents_per_process_by_default():
    rt = spawn(Settings(host_id="h"), RunConfig(agents=3))
    assert all(type(a) is GuessPlayer for a in rt.runs["r"].agents)
    rt.forget("r")


async def test_process_agents_run_their_own_turns_and_remember():
    rt = spawn(Settings(host_id="h", one_agent_per_process=True), RunConfig(agents=3))
    session = FakeSession()
    try:
        for rnd, history in ((1, ""), (2, "33")):
            turn = Turn(round=rnd, history_text=history, max_value=100, llm=session)  # type: ignore[arg-type]
            answers = await asyncio.gather(*(a.reply(turn) for a in rt.runs["r"].agents))
            assert [v for v, _ in answers] == [10.0, 11.0, 12.0]
            assert all(parse_guess(raw, 100) == v for v, raw in answers)
        # round 2's prompt, built in the child process, carries the winning number and own memory
        assert "Winning numbers of previous rounds: 33." in session.prompts[11]
        assert "Your previous numbers: 11." in session.prompts[11]
    finally:
        rt.forget("r")


def _cast():
    from populace.games.cast import cast_from_records

    return cast_from_records([{"profile": {"education": ["Ph.D.", "high school"][i % 2]},
                               "persona": {"name": f"Agent{i}", "age": 30 + i}} for i in range(13)])


def test_agents_speak_from_their_persona_and_the_system_prompt_has_the_variant():
    config = RunConfig(agents=13, prompt={"system": "rational", "answer": "cot", "population_note": True})
    rt = HostRuntime(None, None, Settings(host_id="h"))  # type: ignore[arg-type]
    run = rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(10, 3)], config=config), _cast())
    assert [a.persona.split(",")[0] for a in run.agents] == ["You are Agent10", "You are Agent11", "You are Agent12"]
    assert "All players are rational" in run.system and "The players are 13 people." in run.system
    assert run.schema["required"] == ["reasoning", "guess"]
    rt.forget("r")


def test_persona_false_keeps_anonymous_players():
    config = RunConfig(agents=13, prompt={"persona": False})
    rt = HostRuntime(None, None, Settings(host_id="h"))  # type: ignore[arg-type]
    run = rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(0, 2)], config=config), _cast())
    assert all(a.persona is None for a in run.agents)
    assert "The players are" not in run.system  # population_note is off by default
    rt.forget("r")


def test_too_few_personas_is_an_error_not_a_silent_default():
    import pytest

    rt = HostRuntime(None, None, Settings(host_id="h"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="13 personas for agent ids up to 19"):
        rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(10, 10)], config=RunConfig(agents=20)), _cast())


async def test_process_agents_carry_their_persona_and_answer_style():
    config = RunConfig(agents=13, prompt={"answer": "cot"})
    rt = HostRuntime(None, None, Settings(host_id="h", one_agent_per_process=True))  # type: ignore[arg-type]
    run = rt.spawn(SpawnBatch(run_id="r", host_id="h", ranges=[(4, 1)], config=config), _cast())
    session = FakeSession()
    try:
        turn = Turn(round=1, history_text="", max_value=100, llm=session, answer="cot")  # type: ignore[arg-type]
        await run.agents[0].reply(turn)
        assert session.prompts[4].startswith("You are Agent4, 34 years old.")
        # the persona is declared as the prompt's stable prefix (routing key across rounds)
        persona = session.prompts[4][:session.prefix_chars[4]]
        assert persona == run.agents[0].persona and persona.startswith("You are Agent4")
        assert session.prompts[4].endswith("Think step by step, then report your number.")
    finally:
        rt.forget("r")
