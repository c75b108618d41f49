"""Schelling's segregation model on a grid. The town is the run's world: each agent's cell and
kind, each cell's occupant. Every round each agent sees its Moore neighbourhood (its view, made on
its host from the world): how many of its occupied neighbours are of its kind. An agent with a
like share under the threshold wants to move (the classic rule; or the LLM decides); the
environment moves every agent that wants to, in agent order, to empty cells drawn with a seeded
generator, and that is the next round's town.

Outcomes (table `schelling_outcomes`): each agent's cell and kind, like and occupied neighbours,
and whether it wanted to move. Summary (table `schelling_rounds`): the mean like-neighbour share
(segregation), the share of unhappy agents, how many moved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from pydantic import Field

from populace.sdk import LLM, Agent, Env, Outcome, RunConfig, Simulation, State, Summary
from populace.sdk.env import Ints, Partial
from populace.sdk.space import EMPTY, Grid
from populace.sdk.world import World, column
from populace_schelling.params import SchellingParams

PROMPT_VERSION = "schelling-1"
SCALE = 840  # the least common multiple of 1..8: a like share k/m (m <= 8 neighbours) is exact in 840ths


class Town(World):
    cell = column("int32", "agents")  # where each agent lives
    kind = column("int8", "agents")
    occupant = column("int32", "cells")  # who lives in each cell (-1: empty)


@dataclass(frozen=True, slots=True)
class Seen:
    """What one agent sees this round: its own view of the town (small: one per acting agent)."""

    round: int
    cell: int
    kind: int
    like: int  # occupied neighbours of its kind
    occupied: int  # occupied neighbours


class Stay(Outcome):
    cell: int | None = None
    kind: int | None = None
    like: int | None = None
    occupied: int | None = None
    move: bool | None = None  # wants to move (None: no valid answer; it stays)
    measure = "move"


class Counts(Partial):
    agents: int = 0
    unhappy: int = 0  # valid answers that want to move
    like_840: int = 0  # Σ over agents with neighbours of like/occupied, in 840ths (exact)
    with_neighbours: int = 0
    movers: Ints = np.zeros(0, dtype=np.int64)


class RoundSummary(Summary):
    like_share: float | None = Field(None, title="like neighbours")  # mean over agents with neighbours
    unhappy_share: float | None = Field(None, title="want to move")
    moved: int = Field(0, title="moved")
    empty_cells: int = Field(0, title="empty cells")


class Resident(Agent):
    __slots__ = ()

    async def turn(self, obs: Seen, llm: LLM) -> Stay:
        sim: Schelling = self.sim  # type: ignore[assignment]
        base = {"cell": obs.cell, "kind": obs.kind, "like": obs.like, "occupied": obs.occupied}
        if not sim.llm_decides:
            content = obs.occupied == 0 or obs.like >= sim.threshold * obs.occupied
            return Stay(**base, move=not content, raw="")
        persona = self.persona.text + "\n" if sim.use_persona and self.persona is not None else ""
        prompt = (f"{persona}Of your {obs.occupied} neighbours, {obs.like} are like you and "
                  f"{obs.occupied - obs.like} are not. Do you move to another neighbourhood? "
                  'Answer {"move": true} or {"move": false}.')
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona))
        move = _boolean(raw, "move")
        return Stay(**base, move=move, raw=raw, valid=move is not None)


def _boolean(raw: str, key: str) -> bool | None:
    import json

    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    v = value.get(key) if isinstance(value, dict) else None
    return v if isinstance(v, bool) else None


class SchellingEnv(Env[State, Counts]):
    Partial = Counts
    World = Town

    def __init__(self, sim: Schelling) -> None:
        super().__init__(sim)
        g = sim.params.grid
        self.grid = Grid(g.width, g.height, g.torus)
        self.kinds = g.kinds
        self._seen: tuple[int, np.ndarray, np.ndarray] | None = None  # (id of the world, like, occupied)

    def start_world(self, state: State) -> Town:
        n, cells = self.sim.agents, self.grid.cells
        rng = np.random.default_rng(self.sim.rng("town").getrandbits(64))
        cell = rng.permutation(cells)[:n].astype(np.int32)
        occupant = np.full(cells, EMPTY, dtype=np.int32)
        occupant[cell] = np.arange(n, dtype=np.int32)
        kind = (np.arange(n) % self.kinds).astype(np.int8)
        return Town({"agents": n, "cells": cells}, cell=cell, kind=kind, occupant=occupant)

    def view(self, world: Town, round: int, agent_id: int) -> Seen:
        # every agent's neighbourhood at once, the first time this host views this world (vectorised)
        if self._seen is None or self._seen[0] != id(world):
            like, occupied = self.grid.like_neighbours(world.cell, world.kind, world.occupant)
            self._seen = (id(world), like, occupied)
        _, like, occupied = self._seen
        return Seen(round, int(world.cell[agent_id]), int(world.kind[agent_id]), int(like[agent_id]),
                    int(occupied[agent_id]))

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Stay]) -> Counts:
        unhappy = like = with_n = 0
        movers = []
        for aid, o in zip(agent_ids, outcomes):
            if o.occupied:
                with_n += 1
                like += o.like * SCALE // o.occupied
            if o.valid and o.move:
                unhappy += 1
                movers.append(aid)
        return Counts(agents=len(outcomes), unhappy=unhappy, like_840=like, with_neighbours=with_n,
                      movers=np.asarray(movers, dtype=np.int64))

    def merge(self, partials: Sequence[Counts]) -> Counts:
        return Counts(agents=sum(p.agents for p in partials), unhappy=sum(p.unhappy for p in partials),
                      like_840=sum(p.like_840 for p in partials),
                      with_neighbours=sum(p.with_neighbours for p in partials),
                      movers=np.concatenate([p.movers for p in partials]) if partials else np.zeros(0, np.int64))

    def decide(self, state: State, round: int, total: Counts, world: Town) -> tuple[State, RoundSummary, Town]:
        movers = np.sort(total.movers)  # merged in no particular order: moved in agent order
        rng = np.random.default_rng(self.sim.rng("moves", round).getrandbits(64))
        occupant, cell = self.grid.move_to_empty(movers, world.cell, world.occupant, rng)
        moved = int((cell != world.cell).sum())
        seen = total.with_neighbours
        summary = RoundSummary(
            like_share=float(Fraction(total.like_840, SCALE * seen)) if seen else None,
            unhappy_share=total.unhappy / total.agents if total.agents else None,
            moved=moved, empty_cells=self.grid.cells - self.sim.agents)
        return state, summary, world.replace(cell=cell, occupant=occupant)


class Schelling(Simulation):
    name = "schelling"
    Params = SchellingParams
    Agent = Resident
    Env = SchellingEnv
    Outcome = Stay
    Summary = RoundSummary
    prompt_version = PROMPT_VERSION
    trend_columns = ("like_share", "unhappy_share")
    grid_columns = ("cell", "kind")  # reports draw the town per round: each agent's cell, coloured by its kind

    def __init__(self, params: SchellingParams, **kw) -> None:
        super().__init__(params, **kw)
        self.threshold = params.rule.threshold
        self.llm_decides = params.rule.decider == "llm"
        self.use_persona = params.prompt.persona

    def system_prompt(self) -> str:
        return ("You live in a town where households of different kinds live side by side. Each round you "
                "decide whether to stay in your home or move to an empty one elsewhere. Answer with JSON only.")

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"move": {"type": "boolean"}}, "required": ["move"],
                "additionalProperties": False}

    def world_sizes(self) -> dict[str, int]:
        """Its town's sizes before the run: what the memory check counts (a grid of 10^10 cells is refused)."""
        return {"agents": self.agents, "cells": self.params.grid.width * self.params.grid.height}

    @classmethod
    def check_run(cls, params: SchellingParams, config: RunConfig) -> None:
        cells = params.grid.width * params.grid.height
        if config.agents >= cells:
            raise ValueError(f"agents: {config.agents} agents need more than the grid's {cells} cells "
                             "(some must be empty to move to)")

    @classmethod
    def grid(cls, params: SchellingParams) -> Grid:
        g = params.grid
        return Grid(g.width, g.height, g.torus)

    @classmethod
    def describe(cls, params: SchellingParams) -> str:
        g, r = params.grid, params.rule
        return (f"Schelling on a {g.width}×{g.height} {'torus' if g.torus else 'grid'}, {g.kinds} kinds, "
                f"threshold {r.threshold:g}, decided by {'the classic rule' if r.decider == 'rule' else 'the LLM'}")
