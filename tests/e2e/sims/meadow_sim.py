"""A small simulation that uses every world rule at once, for the tests of activation with the world
and of claims and invariants (issue 37): grazers on a meadow of patches.

- Activation from the world: only the living act — `select(state, round, world)` returns
  `select.column("alive")` — and among them an agent wakes when its view says it is hungry, or
  on its own seeded whim (`wakes(obs, view)`).
- Claims: a grazer ranks the patches it can see by their grass and claims them best first; the
  platform's rule gives each patch to one of them (`Claims.ranked`, `grant`).
- Invariants: no two grazers on one patch, and nobody alive without energy.

A grazer that got a patch eats its grass (which then regrows); one that got none, or slept, burns
one unit of energy; at zero it dies and never acts again."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from pydantic import Field

from populace.sdk import Agent, Claims, Env, Outcome, Partial, Simulation, State, Summary, invariant, select
from populace.sdk.rules import distinct
from populace.sdk.world import World, column

SEES = 4  # patches a grazer can see


class Meadow(World):
    energy = column("int32", "agents")
    alive = column("bool", "agents")
    grazing = column("int32", "agents")  # the patch it ate on last round (-1: none)
    grass = column("int32", "patches")


@dataclass(frozen=True, slots=True)
class Sight:
    round: int
    energy: int
    patches: tuple[int, ...]  # the patches it sees, the most grass first
    grass: tuple[int, ...]


class Graze(Outcome):
    energy: int = 0
    choices: list | None = None  # the patches it claims, best first
    measure = "energy"


class Eaten(Partial):
    agents: int = 0
    claims: Claims = Field(default_factory=Claims)


class Day(Summary):
    alive: int = 0
    fed: int = 0
    hungry: int = 0  # claimed, got nothing


class Grazer(Agent):
    __slots__ = ()

    def wakes(self, obs, view: Sight) -> bool:  # the agent's own say, from its own view
        return view.energy < 4 or self.sim.rng("whim", obs.round, self.id).random() < 0.5

    async def turn(self, obs: Sight, llm) -> Graze:
        raw = await llm.ask(f"grass {obs.grass}", key=self.id)
        return Graze(energy=obs.energy, choices=list(obs.patches[:3]), raw=raw)


class MeadowEnv(Env[State, Eaten]):
    Partial = Eaten
    World = Meadow

    @property
    def patches(self) -> int:
        return self.sim.agents // 2 + 3

    def start_world(self, state: State) -> Meadow:
        n, p = self.sim.agents, self.patches
        rng = np.random.default_rng(self.sim.rng("meadow").getrandbits(64))
        return Meadow({"agents": n, "patches": p}, energy=rng.integers(2, 7, n).astype(np.int32),
                      alive=np.ones(n, dtype=bool), grazing=np.full(n, -1, dtype=np.int32),
                      grass=rng.integers(0, 5, p).astype(np.int32))

    def select(self, state: State, round: int, world: Meadow):
        return select.column("alive")  # the dead never act again (read on each host from the world)

    def view(self, world: Meadow, round: int, agent_id: int) -> Sight:
        seen = (agent_id * 7 + round * 3 + np.arange(SEES) * 5) % world.sizes["patches"]
        seen = np.unique(seen)
        best = seen[np.lexsort((seen, -world.grass[seen]))]
        return Sight(round, int(world.energy[agent_id]), tuple(best.tolist()), tuple(world.grass[best].tolist()))

    @invariant("no two grazers on one patch")
    def one_each(self, state: State, world: Meadow):
        return distinct(world.grazing, where=world.grazing >= 0, what="patch", who="agents")

    @invariant("nobody alive without energy")
    def fed_or_dead(self, state: State, world: Meadow):
        return np.flatnonzero(world.alive & (world.energy <= 0))

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Graze]) -> Eaten:
        return Eaten(agents=len(outcomes), claims=Claims.ranked(agent_ids, [o.choices if o.valid else None
                                                                            for o in outcomes]))

    def merge(self, partials: Sequence[Eaten]) -> Eaten:
        return Eaten(agents=sum(p.agents for p in partials), claims=Claims.merge(p.claims for p in partials))

    def decide(self, state: State, round: int, total: Eaten, world: Meadow):
        won = total.claims.grant(world.sizes["patches"], seed=self.sim.seed, round=round, what="patch")
        energy = world.energy.astype(np.int64)
        energy[world.alive] -= 1  # a day burns one unit
        energy[won.agent] += world.grass[won.target]
        grass = np.minimum(world.grass + 1, 6)  # regrows
        grass[won.target] = 0
        grazing = np.full(self.sim.agents, -1, dtype=np.int32)
        grazing[won.agent] = won.target
        alive = world.alive & (energy > 0)
        energy = np.where(alive, energy, 0)
        summary = Day(alive=int(alive.sum()), fed=len(won), hungry=int(won.lost.size))
        return state, summary, world.replace(energy=energy.astype(np.int32), alive=alive, grazing=grazing,
                                             grass=grass.astype(np.int32))


class Grazing(Simulation):
    name = "grazing"
    Agent = Grazer
    Env = MeadowEnv
    Outcome = Graze
    Summary = Day

    def world_sizes(self) -> dict[str, int]:
        return {"agents": self.agents, "patches": self.agents // 2 + 3}
