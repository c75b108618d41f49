"""Agents whose answers are their memory, for the checkpoint tests: each round an agent records
how many numbers it remembers and their sum, then remembers its id times the round. An agent
restored from a checkpoint that someone changed records other numbers than it would have;
one restored from its own checkpoint, the very same."""

from __future__ import annotations

from populace.sdk import Agent, Env, Outcome, Partial, Simulation, Summary


class Recalled(Outcome):
    remembered: int = 0
    total: int = 0


class Tot(Partial):
    n: int = 0
    total: int = 0


class Sum(Summary):
    total: int = 0


class Keeper(Agent):
    __slots__ = ()
    memory_size = 100

    async def turn(self, obs, llm):
        raw = await llm.ask(f"agent {self.id}, round {obs.round}", key=self.id)  # the model's latency paces it
        out = Recalled(remembered=len(self.memory), total=sum(self.memory), raw=raw)
        self.remember(self.id * obs.round)
        return out


class KeeperEnv(Env):
    Partial = Tot

    def reduce(self, ids, outs):
        return Tot(n=len(ids), total=sum(o.total for o in outs))

    def merge(self, ps):
        return Tot(n=sum(p.n for p in ps), total=sum(p.total for p in ps))

    def decide(self, state, r, t):
        return state, Sum(total=t.total)


class Memory(Simulation):
    name = "memory"
    Agent = Keeper
    Env = KeeperEnv
    Outcome = Recalled
    Summary = Sum
