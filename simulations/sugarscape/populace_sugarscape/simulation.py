"""Epstein & Axtell's (1996) Sugarscape. The landscape is the run's world: each cell's sugar and
occupant; each agent's cell, sugar, vision and metabolism, and whether it is alive. Sugar grows
back every round up to each cell's capacity (two mountains, by default).

A round, for each living agent (all of them take a turn: selected from the world's `alive`
column): it stands on its cell all round — it harvests that cell's sugar and burns its
metabolism there, and that is the cell it ends the round on (outcome column `cell`); and it
looks, along the four lattice directions as far as its vision, for the free cells that will
hold more sugar next round than its own, and claims them, best first (the rule: the most sugar,
the nearest on a tie, at most `rule.choices`; or the model picks one of them). The environment's
`decide` then settles the round: the harvests and metabolism, the deaths (an agent left with no
sugar starves: table `population`), the growback, and the moves — each claimed cell granted to
one claimant by the platform's seeded rule (populace.sdk.claims), a claimant beaten to all its
cells staying where it is — and, with `rule.replacement`, a newcomer for each agent that starved.
The world that comes out is the next round's: a move claimed in round r is where the agent stands
(its `cell`) in round r + 1. One rule is checked after every round: each living agent on its own
cell (an invariant).

Outcomes (table `sugarscape_outcomes`, one row per living agent per round): its cell, the sugar
it harvested there, its sugar at the round's end (0 or less: it starves), its vision and
metabolism, and the cells it claimed for its next move (`target`, its first; its own: it stays).
Summary (table `sugarscape_rounds`): who lives after the round, who died and was born, who moved
or was beaten to a cell, the living's mean sugar and its Gini coefficient, their mean vision and
metabolism (selection at work), and the sugar left on the landscape."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
from pydantic import Field

from populace.sdk import LLM, Agent, Changes, Claims, Env, Outcome, RunConfig, Simulation, State, Summary, invariant
from populace.sdk import select as selectors
from populace.sdk.env import Partial
from populace.sdk.space import EMPTY, Grid
from populace.sdk.world import World, column
from populace_sugarscape import rules
from populace_sugarscape.params import SugarscapeParams

PROMPT_VERSION = "sugarscape-1"


class Landscape(World):
    cell = column("int32", "agents")  # where each agent stands (-1: departed)
    alive = column("bool", "agents")
    wealth = column("int32", "agents")  # its sugar
    vision = column("int8", "agents")
    metabolism = column("int8", "agents")
    level = column("int16", "cells")  # the sugar on each cell
    occupant = column("int32", "cells")  # who stands there (-1: nobody)


@dataclass(frozen=True, slots=True)
class Sight:
    """What one agent sees this round (its own view of the landscape)."""

    round: int
    cell: int
    level: int  # sugar on its cell: what it harvests this round
    wealth: int  # its sugar before this round
    vision: int
    metabolism: int
    options: tuple[int, ...]  # the free cells it would move to, best first, then its own (staying)
    worth: tuple[int, ...]  # the sugar each option will hold next round


class Forage(Outcome):
    cell: int | None = None  # where it spends the round: harvests there and ends the round there
    harvest: int | None = None
    sugar: int | None = None  # its sugar at the round's end (0 or less: it starves)
    vision: int | None = None
    metabolism: int | None = None
    target: int | None = None  # the cell it claims first for its next move (its own: it stays)
    choices: list[int] | None = None  # every cell it claims, best first (its own last)
    measure = "sugar"


class Claimed(Partial):
    agents: int = 0
    invalid: int = 0
    claims: Claims = Field(default_factory=Claims)


class RoundSummary(Summary):
    living: int = Field(0, title="living")  # after the round's deaths and births
    died: int = Field(0, title="starved")
    born: int = Field(0, title="born")
    moved: int = Field(0, title="moved")
    blocked: int = Field(0, title="beaten to a cell")  # wanted to move, every cell it claimed went to others
    mean_sugar: float | None = Field(None, title="mean sugar")  # of the living, after the round
    gini: float | None = Field(None, title="Gini of sugar")
    mean_vision: float | None = Field(None, title="mean vision")
    mean_metabolism: float | None = Field(None, title="mean metabolism")
    sugar_left: int = Field(0, title="sugar on the landscape")


class Forager(Agent):
    __slots__ = ()

    async def turn(self, obs: Sight, llm: LLM) -> Forage:
        sim: Sugarscape = self.sim  # type: ignore[assignment]
        base = {"cell": obs.cell, "harvest": obs.level, "sugar": obs.wealth + obs.level - obs.metabolism,
                "vision": obs.vision, "metabolism": obs.metabolism}
        if not sim.llm_decides or len(obs.options) == 1:  # the rule; or nothing better than staying in sight
            return Forage(**base, target=obs.options[0], choices=list(obs.options), raw="")
        persona = self.persona.text + "\n" if sim.use_persona and self.persona is not None else ""
        raw = await llm.ask(persona + sim.prompt(obs), key=self.id, prefix_chars=len(persona))
        pick = _index(raw)
        if pick is None or pick >= len(obs.options):  # not one of the cells it was offered: it stays
            return Forage(**base, raw=raw, valid=False)
        chosen = obs.options[pick]
        mine = obs.options[-1]
        return Forage(**base, target=chosen, choices=[chosen] if chosen == mine else [chosen, mine], raw=raw)


def _index(raw: str) -> int | None:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return None
    v = value.get("move") if isinstance(value, dict) else None
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


class SugarscapeEnv(Env[State, Claimed]):
    Partial = Claimed
    World = Landscape

    def __init__(self, sim: Sugarscape) -> None:
        super().__init__(sim)
        p = sim.params
        self.grid = Grid(p.grid.width, p.grid.height, p.grid.torus)
        self.rate = p.sugar.rate
        self.choices = p.rule.choices
        self.traits = {"vision": p.traits.vision, "metabolism": p.traits.metabolism, "wealth": p.traits.endowment}
        self._capacity: np.ndarray | None = None
        self._seen: tuple[Landscape, np.ndarray, np.ndarray] | None = None  # (the world, options, worth)

    @property
    def capacity(self) -> np.ndarray:
        """Each cell's capacity: a pure function of the parameters (not in the world: it never changes)."""
        if self._capacity is None:
            s = self.sim.params.sugar
            self._capacity = rules.capacity(self.grid, list(s.peaks), s.max, s.reach)
        return self._capacity

    def start_world(self, state: State) -> Landscape:
        n, cells = self.sim.agents, self.grid.cells
        rng = np.random.default_rng(self.sim.rng("sugarscape").getrandbits(64))
        cell = rng.permutation(cells)[:n].astype(np.int32)
        occupant = np.full(cells, EMPTY, dtype=np.int32)
        occupant[cell] = np.arange(n, dtype=np.int32)
        drawn = {name: rng.integers(low, high + 1, size=n) for name, (low, high) in self.traits.items()}
        return Landscape({"agents": n, "cells": cells}, cell=cell, alive=np.ones(n, dtype=bool),
                         level=self.capacity.copy(), occupant=occupant, **drawn)

    def select(self, state: State, round: int, world: Landscape):
        # the living take a turn: a world column, read on each host (a few bytes on the wire)
        return selectors.column("alive")

    @invariant("each living agent on its own cell")
    def own_cell(self, state: State, world: Landscape) -> str | None:
        return self.grid.misplaced(world.cell, world.occupant, alive=world.alive)

    @invariant("the living of the landscape are the living of the run")
    def living(self, state: State, world: Landscape) -> np.ndarray:
        return np.flatnonzero(np.asarray(world.alive) != self.population.alive)

    @invariant("no living agent without sugar")
    def fed(self, state: State, world: Landscape) -> np.ndarray:
        return np.flatnonzero(np.asarray(world.alive) & (np.asarray(world.wealth) <= 0))

    def _sight(self, world: Landscape) -> tuple[np.ndarray, np.ndarray]:
        """Every living agent's options in `world`, the first time one is asked (vectorised)."""
        if self._seen is None or self._seen[0] is not world:
            living = np.flatnonzero(world.alive)
            options = np.full((world.sizes["agents"], self.choices + 1), EMPTY, dtype=np.int64)
            worth = np.full_like(options, EMPTY)
            options[living], worth[living] = rules.sight(
                self.grid, np.asarray(world.cell)[living], np.asarray(world.vision)[living], np.asarray(world.level),
                self.capacity, np.asarray(world.occupant), self.rate, self.choices)
            self._seen = (world, options, worth)
        return self._seen[1], self._seen[2]

    def view(self, world: Landscape, round: int, agent_id: int) -> Sight:
        options, worth = self._sight(world)
        row = options[agent_id]
        kept = row != EMPTY
        cell = int(world.cell[agent_id])
        return Sight(round, cell, int(world.level[cell]), int(world.wealth[agent_id]), int(world.vision[agent_id]),
                     int(world.metabolism[agent_id]), tuple(row[kept].tolist()), tuple(worth[agent_id][kept].tolist()))

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Forage]) -> Claimed:
        return Claimed(agents=len(outcomes), invalid=sum(1 for o in outcomes if not o.valid),
                       claims=Claims.ranked(agent_ids, [o.choices if o.valid else None for o in outcomes]))

    def merge(self, partials: Sequence[Claimed]) -> Claimed:
        return Claimed(agents=sum(p.agents for p in partials), invalid=sum(p.invalid for p in partials),
                       claims=Claims.merge(p.claims for p in partials))

    def decide(self, state: State, round: int, total: Claimed, world: Landscape):
        n = world.sizes["agents"]
        alive = np.asarray(world.alive).copy()
        cell = np.asarray(world.cell).astype(np.int64)
        occupant = np.asarray(world.occupant).astype(np.int64)
        # where each living agent stands: harvest, metabolism, and the starved
        level, wealth, starved = rules.settle(np.asarray(world.level), cell, np.asarray(world.wealth),
                                              np.asarray(world.metabolism).astype(np.int64), alive)
        occupant[cell[starved]] = EMPTY
        cell[starved] = EMPTY
        alive[starved] = False
        level = rules.regrow(level, self.capacity, self.rate)
        # the survivors' claims: each cell to one claimant, in a seeded order; the others stay
        c = total.claims
        keep = (c.agent >= 0) & (c.agent < n)
        keep[keep] = alive[c.agent[keep]]
        claims = Claims(c.agent[keep], c.target[keep], c.rank[keep])
        won = claims.grant(self.grid.cells, seed=self.sim.seed, round=round, holder=occupant, what="cell")
        before = cell.copy()
        cell, occupant = self.grid.move(cell, occupant, won.agent, won.target)
        first = claims.rank == 0
        wanted = np.unique(claims.agent[first][claims.target[first] != before[claims.agent[first]]])
        moved = int((cell[wanted] != before[wanted]).sum())
        # replacement: a newcomer for each agent that starved, on a free cell, its traits drawn afresh
        born = 0
        columns = {"vision": np.asarray(world.vision), "metabolism": np.asarray(world.metabolism)}
        if self.sim.replacement and starved.size:
            rng = np.random.default_rng(self.sim.rng("births", round).getrandbits(64))
            spots, drawn = rules.newcomers(rng, int(starved.size), occupant, self.traits)
            born = int(spots.size)
            occupant[spots] = np.arange(n, n + born)
            cell = np.concatenate([cell, spots])
            alive = np.concatenate([alive, np.ones(born, dtype=bool)])
            wealth = np.concatenate([wealth, drawn["wealth"]])
            columns = {k: np.concatenate([v, drawn[k]]) for k, v in columns.items()}
        living = np.flatnonzero(alive)
        summary = RoundSummary(
            living=int(living.size), died=int(starved.size), born=born, moved=moved, blocked=int(wanted.size) - moved,
            mean_sugar=_mean(wealth[living]), gini=rules.gini(wealth[living]),
            mean_vision=_mean(columns["vision"][living]), mean_metabolism=_mean(columns["metabolism"][living]),
            sugar_left=int(level.sum(dtype=np.int64)))
        after = Landscape({"agents": n + born, "cells": self.grid.cells}, cell=cell.astype(np.int32), alive=alive,
                          wealth=wealth.astype(np.int32), level=level, occupant=occupant.astype(np.int32), **columns)
        changes = Changes(died=starved, reason="starved")
        if born:
            changes = changes + Changes(born=born, reason="replaces an agent that starved")
        return state, summary, after, changes


def _mean(values: np.ndarray) -> float | None:
    return float(Fraction(int(values.sum(dtype=np.int64)), int(values.size))) if values.size else None


class Sugarscape(Simulation):
    name = "sugarscape"
    Params = SugarscapeParams
    Agent = Forager
    Env = SugarscapeEnv
    Outcome = Forage
    Summary = RoundSummary
    prompt_version = PROMPT_VERSION
    trend_columns = ("living", "gini")
    grid_columns = ("cell", "metabolism")  # reports draw the landscape's agents per round, coloured by metabolism

    def __init__(self, params: SugarscapeParams, **kw) -> None:
        super().__init__(params, **kw)
        self.llm_decides = params.rule.decider == "llm"
        self.replacement = params.rule.replacement
        self.use_persona = params.prompt.persona
        self.space = type(self).grid(params)

    def system_prompt(self) -> str:
        return ("You gather sugar on a landscape. Each round you harvest the sugar of the cell you stand on and burn "
                "some of it; with none left you starve. Then you choose where to go next. Answer with JSON only.")

    def answer_schema(self) -> dict:
        return {"type": "object", "properties": {"move": {"type": "integer", "minimum": 0,
                                                          "maximum": self.params.rule.choices}},
                "required": ["move"], "additionalProperties": False}

    def prompt(self, obs: Sight) -> str:
        """What the model is asked (decider llm): its sugar, and the cells it may go to, numbered."""
        lines = []
        for i, (c, s) in enumerate(zip(obs.options, obs.worth)):
            where = "stay where you are" if c == obs.cell else _direction(self.space, obs.cell, c)
            lines.append(f"{i}: {where}, {s} sugar next round")
        return (f"You have {obs.wealth} sugar and burn {obs.metabolism} each round; this round you harvest "
                f"{obs.level} here. Where do you go next?\n" + "\n".join(lines)
                + '\nAnswer {"move": N} with the number of your choice.')

    def world_sizes(self) -> dict[str, int]:
        """Its landscape's sizes before the run: what the memory check counts."""
        return {"agents": self.agents, "cells": self.params.grid.width * self.params.grid.height}

    @classmethod
    def check_run(cls, params: SugarscapeParams, config: RunConfig) -> None:
        g = params.grid
        cells = g.width * g.height
        if config.agents > cells:
            raise ValueError(f"agents: {config.agents} agents do not fit the grid's {cells} cells (one per cell)")
        far = params.traits.vision[1]
        if g.torus and 2 * far + 1 > min(g.width, g.height):
            raise ValueError(f"traits.vision: {far} is too far on a {g.width}×{g.height} torus (it would see round "
                             "onto itself: 2 × vision + 1 must not exceed the width or height)")

    @classmethod
    def grid(cls, params: SugarscapeParams) -> Grid:
        g = params.grid
        return Grid(g.width, g.height, g.torus)

    @classmethod
    def describe(cls, params: SugarscapeParams) -> str:
        g, s, t, r = params.grid, params.sugar, params.traits, params.rule
        who = "the movement rule" if r.decider == "rule" else "the LLM, among the best cells in sight"
        return (f"Sugarscape on a {g.width}×{g.height} {'torus' if g.torus else 'grid'}, sugar up to {s.max} growing "
                f"back {s.rate} a round; vision {t.vision[0]}-{t.vision[1]}, metabolism {t.metabolism[0]}-"
                f"{t.metabolism[1]}; moves by {who}{', the starved replaced' if r.replacement else ''}")


def _direction(grid: Grid, start: int, end: int) -> str:
    """'3 cells north' (vision is along the lattice: one axis changes), the shorter way round on a torus."""
    (x0, y0), (x1, y1) = (tuple(int(v) for v in grid.xy(c)) for c in (start, end))
    dx, dy = x1 - x0, y1 - y0
    if grid.torus:
        dx = (dx + grid.width // 2) % grid.width - grid.width // 2
        dy = (dy + grid.height // 2) % grid.height - grid.height // 2
    steps, way = (abs(dx), "east" if dx > 0 else "west") if dx else (abs(dy), "south" if dy > 0 else "north")
    return f"{steps} cell{'s' if steps != 1 else ''} {way}"
