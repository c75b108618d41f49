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

    def ask(self, key: int, prompt: str) -> asyncio.Future:
        self.prompts[key] = prompt
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
