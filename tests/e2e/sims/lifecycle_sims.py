"""A population that changes from the environment's `decide` (populace.sdk.population): foragers
spend energy every round and gather some when they act; the starving die, the well fed have a
child (born with a state of its own), and the world keeps each agent's energy by id, so it
grows with every birth. Agents count their own age (declared state): a resume that lost it, or
gave a newcomer the wrong state, changes what they ask and so the rows.

`Wanderers` is the same with a scenario's schedule instead (`population: changes:`), no births
in decide; `BadBirths` gives a newcomer a state its class does not declare (the run pauses,
naming the field, round and agent). Given to the services by import path
(`lifecycle_sims:Foragers`) with this folder on their PYTHONPATH."""

from __future__ import annotations

import numpy as np

from populace.sdk import (
    LLM,
    Agent,
    Birth,
    Changes,
    Env,
    Observation,
    Outcome,
    Partial,
    Simulation,
    State,
    Summary,
    answer_field,
    select,
)
from populace.sdk.env import Ints
from populace.sdk.world import World, column

START, METABOLISM, CHILD_AT, CHILD_COST = 5, 2, 12, 6


class Forage(Outcome):
    measure = "effort"
    effort: int | None = None
    age: int | None = None


class Gathered(Partial):
    ids: Ints = np.empty(0, dtype=np.int64)
    effort: Ints = np.empty(0, dtype=np.int64)


class Land(World):
    energy = column("int32", "agents")


class Tribe(State):
    born: int = 0
    died: int = 0


class TribeSummary(Summary):
    living: int = 0
    born: int = 0
    died: int = 0


class Forager(Agent):
    __slots__ = ("age",)
    state_fields = ("age",)

    def __init__(self, agent_id, persona=None, sim=None) -> None:
        super().__init__(agent_id, persona, sim)
        self.age = 0

    async def turn(self, obs: Observation, llm: LLM) -> Forage:
        self.age += 1
        raw = await llm.ask(f"You are {self.age} rounds old. How hard do you forage (0-9)?", key=self.id)
        effort = answer_field(raw, "effort")
        if not isinstance(effort, int) or not 0 <= effort <= 9:
            return Forage(raw=raw, valid=False, age=self.age)
        return Forage(effort=effort, age=self.age, raw=raw)


class ForageEnv(Env[Tribe, Gathered]):
    State = Tribe
    Partial = Gathered
    World = Land

    def start_world(self, state: Tribe) -> Land:
        return Land(sizes={"agents": self.population.size}, energy=np.full(self.population.size, START))

    def select(self, state: Tribe, round: int):
        return select.rate(0.6)

    def reduce(self, agent_ids, outcomes) -> Gathered:
        ok = [(a, o.effort) for a, o in zip(agent_ids, outcomes) if o.valid and o.effort is not None]
        return Gathered(ids=np.asarray([a for a, _ in ok], dtype=np.int64),
                        effort=np.asarray([e for _, e in ok], dtype=np.int64))

    def merge(self, partials) -> Gathered:
        if not partials:
            return Gathered()
        return Gathered(ids=np.concatenate([p.ids for p in partials]),
                        effort=np.concatenate([p.effort for p in partials]))

    def births(self, parents: np.ndarray) -> list[Birth]:
        return [Birth(state={"age": 0}, reason=f"child of {p}") for p in parents.tolist()]

    def decide(self, state: Tribe, round: int, total: Gathered, world: Land):
        pop = self.population
        energy = world.energy.astype(np.int64)
        living = pop.alive
        energy[living] -= METABOLISM
        np.add.at(energy, total.ids, total.effort)  # in any order: a sum
        dead = np.flatnonzero(living & (energy <= 0))
        parents = np.flatnonzero(living & (energy >= CHILD_AT))
        energy[parents] -= CHILD_COST
        born = self.births(parents)
        energy = np.concatenate([energy, np.full(len(born), START)])
        state = Tribe(born=state.born + len(born), died=state.died + dead.size)
        summary = TribeSummary(living=pop.count - dead.size + len(born), born=len(born), died=int(dead.size))
        world = Land(sizes={"agents": pop.size + len(born)}, energy=energy.astype(np.int32))
        return state, summary, world, Changes(died=dead, reason="starved", born=born)


class Foragers(Simulation):
    name = "foragers"
    Agent = Forager
    Env = ForageEnv
    Outcome = Forage
    Summary = TribeSummary

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"effort": {"type": "integer", "minimum": 0, "maximum": 9}},
                "required": ["effort"]}


class WanderEnv(ForageEnv):
    World = None

    def decide(self, state: Tribe, round: int, total: Gathered):
        return state, TribeSummary(living=self.population.count)


class Wanderers(Foragers):
    """No world, no changes of its own: a scenario's `population: changes:` schedule them."""

    name = "wanderers"
    Env = WanderEnv


class BadBirthEnv(ForageEnv):
    def births(self, parents: np.ndarray) -> list[Birth]:
        return [Birth(state={"agee": 0}) for _ in parents.tolist()]


class BadBirths(Foragers):
    name = "bad-births"
    Env = BadBirthEnv
