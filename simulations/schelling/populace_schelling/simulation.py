"""Schelling's segregation model on a grid. The town is the run's world: each agent's cell and
kind, each cell's occupant, and who is unhappy in it. Every round each agent sees its Moore
neighbourhood (its view, made on its host from the world): how many of its occupied neighbours are
of its kind. An agent with a like share under the threshold wants to move (the classic rule; or
the LLM decides).

Where movers go (`rule.move`): anywhere — the environment moves every agent that wants to, in agent
order, to empty cells drawn with a seeded generator (the classic model); nearby — each mover claims
the empty cell within `rule.radius` where it would have the largest share of its kind (shown in its
view), and the platform grants each cell to one claimant (populace.sdk.claims): a mover whose cell
went to a claimant drawn before it stays, and looks again next round. Who takes a turn
(`rule.ask`): everyone, or only the residents under the threshold in the town as it stands
(selected from the world: `select(state, round, world)`). Either way the town keeps one rule,
checked after every round: each resident on its own cell (an invariant).

Outcomes (table `schelling_outcomes`): each acting agent's cell and kind, like and occupied
neighbours, whether it wanted to move and the cell it claimed (`target`, nearby moves). Summary
(table `schelling_rounds`): the mean like-neighbour share over every resident (segregation), the
share of unhappy answers, how many moved."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from pydantic import Field

from populace.sdk import LLM, Agent, Claims, Env, Outcome, RunConfig, Simulation, State, Summary, invariant, select
from populace.sdk.env import Ints, Partial
from populace.sdk.space import EMPTY, Grid, distances
from populace.sdk.world import World, column
from populace_schelling.params import SchellingParams

PROMPT_VERSION = "schelling-1"
SCALE = 840  # the least common multiple of 1..8: a like share k/m (m <= 8 neighbours) is exact in 840ths


class Town(World):
    cell = column("int32", "agents")  # where each agent lives
    kind = column("int8", "agents")
    unhappy = column("bool", "agents")  # under the threshold in this town (who acts with `ask: unhappy`)
    occupant = column("int32", "cells")  # who lives in each cell (-1: empty)


@dataclass(frozen=True, slots=True)
class Seen:
    """What one agent sees this round: its own view of the town (small: one per acting agent)."""

    round: int
    cell: int
    kind: int
    like: int  # occupied neighbours of its kind
    occupied: int  # occupied neighbours
    option: int = EMPTY  # nearby moves: the empty cell within its radius it would claim (-1: none)


class Stay(Outcome):
    cell: int | None = None
    kind: int | None = None
    like: int | None = None
    occupied: int | None = None
    move: bool | None = None  # wants to move (None: no valid answer; it stays)
    target: int | None = None  # nearby moves: the cell it claimed (None: it claimed none)
    measure = "move"


class Counts(Partial):
    agents: int = 0
    unhappy: int = 0  # valid answers that want to move
    movers: Ints = np.zeros(0, dtype=np.int64)  # anywhere: who wants to move
    claims: Claims = Field(default_factory=Claims)  # nearby: the cells movers claim


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
            return Stay(**base, move=not content, target=_claimed(sim, obs, not content), raw="")
        persona = self.persona.text + "\n" if sim.use_persona and self.persona is not None else ""
        prompt = (f"{persona}Of your {obs.occupied} neighbours, {obs.like} are like you and "
                  f"{obs.occupied - obs.like} are not. Do you move to another neighbourhood? "
                  'Answer {"move": true} or {"move": false}.')
        raw = await llm.ask(prompt, key=self.id, prefix_chars=len(persona))
        move = _boolean(raw, "move")
        return Stay(**base, move=move, target=_claimed(sim, obs, bool(move)), raw=raw, valid=move is not None)


def _claimed(sim: Schelling, obs: Seen, move: bool) -> int | None:
    """The cell a mover claims (nearby moves, when it sees one), else None."""
    return obs.option if sim.nearby and move and obs.option != EMPTY else None


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
        r = sim.params.rule
        self.grid = Grid(g.width, g.height, g.torus)
        self.kinds = g.kinds
        self.radius = r.radius
        # (the world, each agent's like and occupied neighbours in it): computed once per world, vectorised
        self._hood: tuple[Town, np.ndarray, np.ndarray] | None = None
        self._options: tuple[Town, np.ndarray] | None = None  # (the world, each agent's nearby option)

    def start_world(self, state: State) -> Town:
        n, cells = self.sim.agents, self.grid.cells
        rng = np.random.default_rng(self.sim.rng("town").getrandbits(64))
        cell = rng.permutation(cells)[:n].astype(np.int32)
        occupant = np.full(cells, EMPTY, dtype=np.int32)
        occupant[cell] = np.arange(n, dtype=np.int32)
        kind = (np.arange(n) % self.kinds).astype(np.int8)
        return self._town({"agents": n, "cells": cells}, cell, kind, occupant)

    def _town(self, sizes: dict[str, int], cell: np.ndarray, kind: np.ndarray, occupant: np.ndarray) -> Town:
        """A town with its unhappy residents marked (exactly as a resident's turn judges itself)."""
        like, occupied = self.grid.like_neighbours(cell, kind, occupant)
        unhappy = (occupied > 0) & (like < self.sim.threshold * occupied)
        town = Town(sizes, cell=cell, kind=kind, unhappy=unhappy, occupant=occupant)
        self._hood = (town, like, occupied)
        return town

    def _neighbours(self, world: Town) -> tuple[np.ndarray, np.ndarray]:
        """Every agent's (like, occupied) neighbours in `world`, the first time it is asked (vectorised)."""
        if self._hood is None or self._hood[0] is not world:
            like, occupied = self.grid.like_neighbours(world.cell, world.kind, world.occupant)
            self._hood = (world, like, occupied)
        return self._hood[1], self._hood[2]

    def select(self, state: State, round: int, world: Town):
        # who takes a turn: everyone, or only the residents unhappy in the town this round is played
        # in (a world column, read on each host: a few bytes on the wire for any number of agents)
        return select.column("unhappy") if self.sim.ask_unhappy else None

    @invariant("each resident on its own cell")
    def own_cell(self, state: State, world: Town) -> str | None:
        return self.grid.misplaced(world.cell, world.occupant)

    def view(self, world: Town, round: int, agent_id: int) -> Seen:
        like, occupied = self._neighbours(world)
        option = int(self._nearby(world)[agent_id]) if self.sim.nearby else EMPTY
        return Seen(round, int(world.cell[agent_id]), int(world.kind[agent_id]), int(like[agent_id]),
                    int(occupied[agent_id]), option)

    def _nearby(self, world: Town) -> np.ndarray:
        """Per agent, the empty cell within its radius where the share of its kind among the
        neighbours would be largest (then the nearest, then row by row); -1: none in sight. Only
        for the agents that may move (by the rule: the unhappy; asked, anyone). Once per world, in
        chunks (a million agents' candidates at once would take gigabytes)."""
        if self._options is not None and self._options[0] is world:
            return self._options[1]
        grid, kinds = self.grid, self.kinds
        # each cell's occupied Moore neighbours of each kind
        hoods = grid.neighbourhoods(np.arange(grid.cells))
        who = np.where(hoods == EMPTY, EMPTY, np.asarray(world.occupant)[np.maximum(hoods, 0)])
        kind_of = np.where(who == EMPTY, -1, np.asarray(world.kind)[np.maximum(who, 0)])
        by_kind = np.stack([(kind_of == k).sum(axis=1) for k in range(kinds)], axis=1).astype(np.int64)
        occupied = by_kind.sum(axis=1)
        adjacent = distances(self.radius, "moore") == 1  # a cell next to the mover counts it as a neighbour now
        free = np.asarray(world.occupant) == EMPTY
        agents = np.arange(self.sim.agents) if self.sim.llm_decides else np.flatnonzero(world.unhappy)
        option = np.full(self.sim.agents, EMPTY, dtype=np.int64)
        for chunk in np.array_split(agents, max(1, agents.size // 50_000)):
            mine = np.asarray(world.kind)[chunk].astype(np.int64)

            def share(candidates: np.ndarray, mine: np.ndarray = mine) -> np.ndarray:
                c = np.maximum(candidates, 0)
                like = by_kind[c, mine[:, None]] - adjacent
                occ = occupied[c] - adjacent
                return np.where(occ > 0, like * SCALE // np.maximum(occ, 1), SCALE)  # exact, in 840ths

            ranked = grid.ranked(np.asarray(world.cell)[chunk], share, self.radius, "moore", free=free)
            if ranked.shape[1]:
                option[chunk] = ranked[:, 0]
        self._options = (world, option)
        return option

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Stay]) -> Counts:
        unhappy = 0
        movers, targets = [], []
        for aid, o in zip(agent_ids, outcomes):
            if o.valid and o.move:
                unhappy += 1
                movers.append(aid)
                targets.append(o.target)
        return Counts(agents=len(outcomes), unhappy=unhappy, movers=np.asarray(movers, dtype=np.int64),
                      claims=Claims.of(movers, targets) if self.sim.nearby else Claims())

    def merge(self, partials: Sequence[Counts]) -> Counts:
        return Counts(agents=sum(p.agents for p in partials), unhappy=sum(p.unhappy for p in partials),
                      movers=np.concatenate([p.movers for p in partials]) if partials else np.zeros(0, np.int64),
                      claims=Claims.merge(p.claims for p in partials))

    def decide(self, state: State, round: int, total: Counts, world: Town) -> tuple[State, RoundSummary, Town]:
        like, occupied = self._neighbours(world)  # the town the round was played in: every resident counts
        seen = occupied > 0
        with_neighbours = int(seen.sum())
        like_840 = int((like[seen].astype(np.int64) * SCALE // occupied[seen]).sum())
        if self.sim.nearby:  # each claimed cell to one mover, in a seeded order (the others stay)
            won = total.claims.grant(self.grid.cells, seed=self.sim.seed, round=round, holder=world.occupant,
                                     what="cell")
            cell, occupant = self.grid.move(world.cell, world.occupant, won.agent, won.target)
        else:
            movers = np.sort(total.movers)  # merged in no particular order: moved in agent order
            rng = np.random.default_rng(self.sim.rng("moves", round).getrandbits(64))
            occupant, cell = self.grid.move_to_empty(movers, world.cell, world.occupant, rng)
        moved = int((cell != world.cell).sum())
        summary = RoundSummary(
            like_share=float(Fraction(like_840, SCALE * with_neighbours)) if with_neighbours else None,
            unhappy_share=total.unhappy / total.agents if total.agents else None,
            moved=moved, empty_cells=self.grid.cells - self.sim.agents)
        return state, summary, self._town(world.sizes, cell, world.kind, occupant)


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
        self.nearby = params.rule.move == "nearby"
        self.ask_unhappy = params.rule.ask == "unhappy"
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
        g, r = params.grid, params.rule
        cells = g.width * g.height
        if config.agents >= cells:
            raise ValueError(f"agents: {config.agents} agents need more than the grid's {cells} cells "
                             "(some must be empty to move to)")
        if r.move == "nearby" and g.torus and 2 * r.radius + 1 > min(g.width, g.height):
            raise ValueError(f"rule.radius: {r.radius} is too far on a {g.width}×{g.height} torus (it would wrap onto "
                             f"itself: 2 × radius + 1 must not exceed the width or height)")

    @classmethod
    def grid(cls, params: SchellingParams) -> Grid:
        g = params.grid
        return Grid(g.width, g.height, g.torus)

    @classmethod
    def describe(cls, params: SchellingParams) -> str:
        g, r = params.grid, params.rule
        moves = "to any empty cell" if r.move == "anywhere" else f"by claims on empty cells within {r.radius}"
        asked = "" if r.ask == "everyone" else ", only the unhappy take a turn"
        return (f"Schelling on a {g.width}×{g.height} {'torus' if g.torus else 'grid'}, {g.kinds} kinds, "
                f"threshold {r.threshold:g}, decided by {'the classic rule' if r.decider == 'rule' else 'the LLM'}, "
                f"moving {moves}{asked}")
