"""The round engine's hot path stays as cheap as a turn can be (bench/micro/round_hot_path.py
measures it): an agent's turn runs in the context its task was launched from, with no context
variable set per turn (each set costs objects the cyclic GC tracks, per task, at a million tasks),
and the engine's record of whose turn a task plays is gone when the round is."""

from __future__ import annotations

import asyncio
import contextvars

from populace.core.contracts import RunConfig
from populace.sdk import LLM, Agent, Env, Outcome, Partial, Simulation, State, Summary
from populace.sdk.llm import CALLER, TURNS
from populace.sdk.local import run_local

HERE = __name__
NUMBER = {"type": "integer", "minimum": 0, "maximum": 999}


class Said(Outcome):
    value: int | None = None


class Count(Partial):
    total: int = 0


class Mean(Summary):
    total: int = 0


class Counting(Env[State, Count]):
    Partial = Count

    def reduce(self, agent_ids, outcomes):
        return Count(total=sum(o.value or 0 for o in outcomes))

    def merge(self, partials):
        return Count(total=sum(p.total for p in partials))

    def decide(self, state, round, total):
        return state, Mean(total=total.total)


class Looking(Agent):
    """Records whether its turn's context carries a caller variable, then asks for itself and for
    its neighbour (whose draw must still be told apart from the neighbour's own)."""

    __slots__ = ()
    seen: list[bool] = []

    async def turn(self, obs, llm: LLM) -> Said:
        Looking.seen.append(CALLER in contextvars.copy_context())
        mine = await llm.ask(f"me {self.id}", key=self.id, schema=NUMBER)
        await llm.ask(f"for {self.id ^ 1}", key=self.id ^ 1, schema=NUMBER)
        return Said(value=int(mine), raw=mine)


class LookAround(Simulation):
    name = "look-around"
    Agent = Looking
    Env = Counting
    Outcome = Said
    Summary = Mean


def test_a_turn_sets_no_context_variable_and_the_engine_forgets_its_turns():
    Looking.seen.clear()
    res = asyncio.run(run_local(RunConfig(simulation=f"{HERE}:LookAround", agents=8, rounds=2)))
    assert len(Looking.seen) == 16 and not any(Looking.seen)
    assert not TURNS
    assert len(res.outcomes["value"]) == 16
