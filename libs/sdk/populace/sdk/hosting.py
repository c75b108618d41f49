"""A run's share on one process: its agents (built once, for the whole run), the root env
used to reduce their outcomes, and the round player. Built the same way by the agent-host
service and by the local runner, so both play the very same code."""

from __future__ import annotations

import gc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from populace.graph.csr import Graph
from populace.population.cast import Cast
from populace.population.model_assignment import assignment
from populace.sdk.agent import Agent
from populace.sdk.edges import EdgeBook
from populace.sdk.env import Env
from populace.sdk.mailroom import Mailroom
from populace.sdk.play import RoundFailed, RoundPlayer
from populace.sdk.population import FRESH, Population
from populace.sdk.process import ProcessAgent
from populace.sdk.profile import VIEW_BUDGET_BYTES
from populace.sdk.registry import Resolved
from populace.sdk.simulation import Observation, Simulation
from populace.sdk.slicing import SLICE_S
from populace.sdk.statejson import decode_state, encode_column, from_wire

if TYPE_CHECKING:
    from populace.sdk.engine import ShareEngine
    from populace.sdk.prototypes import Plan


EDGES = "__edges__"  # an agent's edge edits in its checkpoint (no state field starts with "__")


class _Unmade:
    """In a share's `agents`, a newcomer not made yet: it was born as its agent class makes one
    and has not acted; it is made when it is first selected (a million newcomers cost a million
    references to this object, not a million agents, until they act)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNMADE"


UNMADE = _Unmade()


class RangeState(NamedTuple):
    """One range's agents' declared state, as a checkpoint stores it (populace.core.checkpoints
    .save_agents): `full`, every agent of the range (else those that changed only); `rows`, the
    offsets of the agents whose state is in `columns`, in order (None: every agent of the range);
    `marks`, the offsets of those without a state of their own: "gone" (departed before the
    round), "fresh" (newcomers not made yet)."""

    first: int
    count: int
    full: bool
    rows: list[int] | None
    columns: dict[str, list]
    marks: dict[str, list[int] | dict[str, list[list[int]]]]  # as stored: a list, or its runs

    def value(self) -> dict:
        """As a checkpoint object holds it (a full one; see save_agents for a delta)."""
        held = {"held": self.rows} if self.rows is not None else {}
        return {"first": self.first, "count": self.count, "fields": self.columns, **held, **self.marks}


@dataclass
class HostedRun:
    run_id: str
    resolved: Resolved
    sim: Simulation
    env: Env
    agents: list[Agent]
    player: RoundPlayer
    ranges: list[tuple[int, int]] = field(default_factory=list)
    epoch: int = 0
    rounds_played: set[int] = field(default_factory=set)
    mailroom: Mailroom | None = None  # a run with a graph: the posts its agents read and write
    # round -> (epoch, share key -> ranges) of the newest announcement of that round: where its posts go
    placements: dict[int, tuple[int, dict[str, list[tuple[int, int]]]]] = field(default_factory=dict)
    engine: ShareEngine = field(init=False, repr=False)  # plays this share's rounds
    # Indices (into `agents`) of those whose state may have changed since the last checkpoint
    # took them (the agents that acted; None: any of them, e.g. before the first, after a
    # restore or a round everyone played): what an incremental checkpoint saves.
    changed: set[int] | None = None
    # Per agent id, the index of its model in the run's `models:` (populace.population.model_assignment);
    # None: the run has one model. Computed for every agent (pure, seeded), so a call keyed to any
    # agent of the run finds its model.
    models: np.ndarray | None = None
    # a prototype run: who stands for whom (populace.sdk.prototypes.Plan); None: every agent plays
    prototypes: Plan | None = None
    # Populations that change (populace.sdk.population): the agent id at each position of `agents`
    # (its ranges in order); which of them are alive (None: all), a departed agent's place in
    # `agents` being None; and who is alive as of the last population this share applied.
    ids: np.ndarray = field(init=False, repr=False)
    living: np.ndarray | None = None
    population: Population | None = None
    cast: Cast | None = None  # the run's personas (newcomers' too), as its agents hold them
    one_per_process: bool = False  # each agent in its own process (ProcessAgent): its newcomers too
    unmade: int = 0  # newcomers not made yet (UNMADE in `agents`), and where (a bool per place, once any was)
    _unmade: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool), repr=False)

    def __post_init__(self) -> None:
        from populace.sdk.engine import ShareEngine  # the engine drives a HostedRun: it imports this module

        self.ids = _ids_of(self.ranges) if self.ranges else np.fromiter(
            (a.id for a in self.agents), dtype=np.int64, count=len(self.agents))
        self.engine = ShareEngine(self)

    @property
    def tables(self):
        return type(self.sim).tables()

    @property
    def count(self) -> int:
        """The living agents this share holds."""
        return len(self.agents) if self.living is None else int(np.count_nonzero(self.living))

    def positions(self, agent_ids: np.ndarray) -> np.ndarray:
        """Each id's position in `agents` (-1: not one of this share's)."""
        ids = np.asarray(agent_ids, dtype=np.int64)
        if not self.ranges or ids.size == 0:
            return np.full(ids.size, -1, dtype=np.int64)
        firsts = np.fromiter((f for f, _ in self.ranges), dtype=np.int64, count=len(self.ranges))
        counts = np.fromiter((c for _, c in self.ranges), dtype=np.int64, count=len(self.ranges))
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        at = np.searchsorted(firsts, ids, side="right") - 1
        ok = at >= 0
        at = np.where(ok, at, 0)
        ok &= ids < firsts[at] + counts[at]
        return np.where(ok, starts[at] + ids - firsts[at], -1)

    def apply(self, population: Population, ranges: list[tuple[int, int]]) -> None:
        """Who is alive now (the population after the round before) and the ranges this share
        holds now (the orchestrator's placement, newcomers included): the departed go (their
        place kept, their agent let go), the newcomers placed here are made with the state they
        were born with. Once per population: applied again, it changes nothing."""
        held = self.population.round if self.population is not None else 0
        if population.round <= held:
            return
        d = population.delta
        if d is not None and d.prior == held:  # the next changes: its departures, where they are here
            gone = self.positions(d.departed)
            gone = gone[gone >= 0]
        else:  # changes since more rounds than one (never in sequence): whoever is no longer alive
            known = self.ids < population.size
            alive = np.ones(self.ids.size, dtype=bool)
            alive[known] = population.alive[self.ids[known]]
            gone = np.flatnonzero(~alive & (self.living if self.living is not None else True))
        if gone.size:
            self._depart(gone)
        held = sum(c for _, c in self.ranges)
        new = _grown(self.ranges, ranges)
        for first, count in new:
            self._arrive(first, count, population)
        if new and self.changed is not None:
            self.changed.update(range(held, len(self.agents)))  # newcomers' state: in the next checkpoint
        self.population = population
        self.env.population = population

    def _depart(self, gone: np.ndarray) -> None:
        agents = self.agents
        places = gone.tolist()
        if self.one_per_process:
            for p in places:
                if isinstance(agents[p], ProcessAgent):
                    agents[p].stop()  # type: ignore[union-attr]
        if self.unmade:
            self.unmade -= int(np.count_nonzero(self._unmade[gone]))
            self._unmade[gone] = False
        for p in places:
            agents[p] = None  # type: ignore[call-overload]
        if self.living is None:
            self.living = np.ones(len(agents), dtype=bool)
        self.living[gone] = False
        if self.changed is not None:
            self.changed.update(places)  # their checkpoint says they are gone

    def made(self, indices: Sequence[int] | np.ndarray | None = None) -> None:
        """Make the newcomers not made yet at `indices` (None: all of them): before they act."""
        if not self.unmade:
            return
        at = np.flatnonzero(self._unmade) if indices is None else np.asarray(indices, dtype=np.int64)
        at = at[self._unmade[at]]
        agents, ids = self.agents, self.ids
        for i in at.tolist():
            agents[i] = self._make(int(ids[i]), None)
        self._unmade[at] = False
        self.unmade -= int(at.size)

    def _make(self, agent_id: int, state: Mapping[str, Any] | None) -> Agent:
        personas = self.cast.personas if self.cast is not None else None
        agent = type(self.sim).Agent(agent_id, personas[agent_id] if personas is not None and agent_id < len(personas)
                                     else None, self.sim)
        if state:  # as a checkpoint holds it (populace.sdk.statejson), like a restored agent's
            agent.restore(decode_state(dict(state), type(self.sim).Agent))
        return ProcessAgent(agent) if self.one_per_process else agent

    def _arrive(self, first: int, count: int, population: Population) -> None:
        """Agents first..first+count-1 join this share: made as the run's agents are, with the
        state the population gives them (born in its round) or, restored, `restore` sets."""
        d = population.delta
        if d is None or first < d.born_first or first + count > population.size:
            raise RoundFailed(f"run {self.run_id}: agents {first}..{first + count - 1} are placed here, but the "
                              f"population of round {population.round} has no newcomers with those ids")
        held = len(self.agents)
        if d.birth_states is None:  # every one as its class makes it: made when first selected
            self.agents.extend([UNMADE] * count)
            if self._unmade.size < held:
                self._unmade = np.concatenate([self._unmade, np.zeros(held - self._unmade.size, dtype=bool)])
            self._unmade = np.concatenate([self._unmade, np.ones(count, dtype=bool)])
            self.unmade += count
        else:
            self.agents.extend([self._make(aid, d.born_state(aid)) for aid in range(first, first + count)])
            if self._unmade.size:
                self._unmade = np.concatenate([self._unmade, np.zeros(count, dtype=bool)])
        if self.ranges and self.ranges[-1][0] + self.ranges[-1][1] == first:
            last = self.ranges[-1]
            self.ranges[-1] = (last[0], last[1] + count)
        else:
            self.ranges.append((first, count))
        self.ids = np.concatenate([self.ids, np.arange(first, first + count, dtype=np.int64)])
        if self.living is not None:
            self.living = np.concatenate([self.living, np.ones(count, dtype=bool)])

    def observation(self, round_: int, payload: dict | None) -> Observation:
        """The round's observation: the environment's (from the round open), or for round 1,
        the one the simulation's env starts with (pure, so every host computes the same)."""
        cls = type(self.sim).Observation
        if payload is None:
            return self.env.observe(self.env.start(), round_).model_copy(update={"round": round_})
        return from_wire(cls, {**payload, "round": round_})

    async def _columns(self, agents: Sequence[Agent]) -> dict[str, list]:
        """`agents`' declared state, columnar ({field: values}) as JSON gives it back exactly
        (populace.sdk.statejson: a tuple stays a tuple), with their edge edits."""
        cls = type(self.sim).Agent
        fields = cls.state_fields
        apart = bool(agents) and isinstance(agents[0], ProcessAgent)
        if apart:
            states = [await a.fetch_state() for a in agents]  # type: ignore[attr-defined]
            columns = {f: [s.get(f) for s in states] for f in fields}
        else:
            columns = {f: [getattr(a, f) for a in agents] for f in fields}
        columns = {f: encode_column(f, values, lambda i: agents[i].id, cls, every=apart)
                   for f, values in columns.items()}
        book = self.sim.edges
        if book is not None:  # the agents' edits: their in-edges are theirs, saved with them
            columns[EDGES] = [book.state(a.id) for a in agents]
        return columns

    async def _part(self, first: int, count: int, at: int, offsets: np.ndarray | None, full: bool) -> RangeState:
        """The range (first, count) at place `at` of `agents`: the agents at `offsets` (None:
        all), their rows, and the offsets of those without one (departed, newcomers not made)."""
        places = np.arange(at, at + count, dtype=np.int64) if offsets is None else at + offsets
        marks: dict[str, list[int] | dict[str, list[list[int]]]] = {}
        keep = None
        for key, mask in (("gone", None if self.living is None else ~self.living),
                          ("fresh", self._unmade if self.unmade else None)):
            if mask is None:
                continue
            hit = mask[places]
            if hit.any():
                marks[key] = _stored(places[hit] - at)
                keep = ~hit if keep is None else keep & ~hit
        if keep is not None:
            places = places[keep]
        rows = None if offsets is None and keep is None else (places - at).tolist()
        agents = self.agents[at:at + count] if rows is None else [self.agents[p] for p in places.tolist()]
        return RangeState(first, count, full, rows, await self._columns(agents), marks)

    async def snapshot(self) -> list[RangeState]:
        """Each range's agents' declared state, whole."""
        out = []
        i = 0
        for first, count in self.ranges:
            out.append(await self._part(first, count, i, None, True))
            i += count
        return out

    def acted(self, indices: list[int] | None) -> None:
        """The agents at `indices` (None: all) play a round: their state may change."""
        if indices is None or self.changed is None:
            self.changed = None
        else:
            self.changed.update(indices)

    def take_changed(self) -> set[int] | None:
        """The agents whose state may have changed since the last call (None: any of them)."""
        changed, self.changed = self.changed, set()
        return changed

    async def snapshot_of(self, indices: set[int], full: set[int] | frozenset[int] = frozenset()
                          ) -> list[RangeState]:
        """The declared state of the agents at `indices` only, per range (ranges with none of
        them too); the ranges whose first agent is in `full`, whole."""
        out: list[RangeState] = []
        i = 0
        ordered = np.fromiter(indices, dtype=np.int64, count=len(indices))
        ordered.sort()
        for first, count in self.ranges:
            if first in full:
                out.append(await self._part(first, count, i, None, True))
            else:
                lo, hi = np.searchsorted(ordered, [i, i + count])
                out.append(await self._part(first, count, i, ordered[lo:hi] - i, False))
            i += count
        return out

    def restore(self, states: dict[int, dict], population: Population | None = None, after: int = 0) -> None:
        """Set every agent's declared state (by agent id) from a checkpoint; with `population`
        (who is alive after the checkpoint's round `after`, when the run's population changed),
        the departed go and the agents born at that round's end take the state they were born
        with (its checkpoint was taken before they were)."""
        self.changed = None  # the next checkpoint is a full one
        d = population.delta if population is not None else None
        born = None
        if population is not None:
            born = d.born_first if d is not None and d.round == after else population.size
            ids = self.ids
            if ids.size and int(ids.max()) >= population.size:
                raise ValueError(f"run {self.run_id}: agents up to {int(ids.max())} are placed here, but the "
                                 f"population after round {after} has ids up to {population.size - 1}")
            dead = np.flatnonzero(~population.alive[ids])
            if dead.size:
                self._depart(dead)
            self.population = population
            self.env.population = population
        agents = [a for a in self.agents if isinstance(a, Agent)]
        missing = [a.id for a in agents if a.id not in states and (born is None or a.id < born)]
        if missing:
            raise ValueError(f"run {self.run_id}: the checkpoint has no state for agents {missing[:5]}"
                             f"{' …' if len(missing) > 5 else ''}")
        cls = type(self.sim).Agent
        for a in agents:
            state = states.get(a.id) if born is None or a.id < born else d.born_state(a.id)  # type: ignore[union-attr]
            if state and not state.get(FRESH):  # a newcomer that never acted: as its class made it
                a.restore(decode_state(state, cls))
        book = self.sim.edges
        if book is not None:
            for a in agents:
                book.restore(a.id, states[a.id].get(EDGES))

    def stop(self) -> None:
        for a in self.agents:
            if isinstance(a, ProcessAgent):
                a.stop()

    def made_agents(self) -> list[Agent]:
        """The agents made (not departed, and not newcomers still unmade)."""
        return [a for a in self.agents if isinstance(a, Agent)]


def _stored(offsets: np.ndarray) -> list[int] | dict[str, list[list[int]]]:
    """Sorted offsets as a checkpoint stores a mark (populace.core.checkpoints.as_runs): a list,
    or {"runs": [[first, count], …]} when they come in runs (newcomers none of which acted)."""
    cuts = np.flatnonzero(np.diff(offsets) != 1) + 1
    if 2 * (cuts.size + 1) >= offsets.size:
        return offsets.tolist()
    starts = offsets[np.concatenate([[0], cuts])]
    counts = np.diff(np.concatenate([[0], cuts, [offsets.size]]))
    return {"runs": np.stack([starts, counts], axis=1).tolist()}


def _ids_of(ranges: Sequence[tuple[int, int]]) -> np.ndarray:
    return np.concatenate([np.arange(f, f + c, dtype=np.int64) for f, c in ranges]) if ranges \
        else np.empty(0, dtype=np.int64)


def _grown(held: Sequence[tuple[int, int]], placed: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ids in `placed` (a share's ranges now) beyond `held` (its ranges so far: a share only
    grows, by newcomers, whose ids come after every id before them)."""
    top = max((f + c for f, c in held), default=0)
    out = []
    for first, count in sorted(placed):
        end = first + count
        if end > top:
            start = max(first, top)
            out.append((start, end - start))
    return out


def host_run(resolved: Resolved, run_id: str, ranges: list[tuple[int, int]], cast: Cast | None = None, *,
             one_per_process: bool = False, max_in_flight: int = 1_000_000, freeze: bool = True,
             scene_idle_s: float = 60.0, epoch: int = 0, graph: Graph | None = None, slice_s: float = SLICE_S,
             view_budget_bytes: int = VIEW_BUDGET_BYTES) -> HostedRun:
    """Create this process's agents for a run (persona i is agent i's, by reference). A run
    with a `graph:` needs its graph (over the run's agent ids). `slice_s`: the most its code holds
    the event loop at a time (populace.sdk.slicing); `view_budget_bytes`: a view larger is said
    once per run (populace.sdk.profile)."""
    c = resolved.config
    if c.graph is not None and graph is None:
        raise ValueError(f"run {run_id}: its scenario has a graph, but no graph was given to host it")
    if graph is not None and graph.n != c.agents:
        raise ValueError(f"run {run_id}: the graph has {graph.n} agents, the run {c.agents}")
    if cast is not None and ranges:
        last = max(first + count for first, count in ranges)
        if last > len(cast):
            raise ValueError(f"run {run_id}: {len(cast)} personas for agent ids up to {last - 1}")
    sim = resolved.instance(run_id, cast)
    if type(sim).edge_kinds:
        sim.edges = EdgeBook(c.agents, type(sim).edge_kinds, graph)
    personas = cast.personas if cast is not None else None
    make = type(sim).Agent
    agents: list[Agent] = [make(aid, personas[aid] if personas is not None else None, sim)
                           for first, count in ranges for aid in range(first, first + count)]
    if one_per_process:
        agents = [ProcessAgent(a) for a in agents]
    room = Mailroom(graph, type(sim).Post, ranges, c.broadcasts, sim.edges) if graph is not None else None
    run = HostedRun(run_id, resolved, sim, type(sim).Env(sim), agents,
                    RoundPlayer(sim, agents, max_in_flight=max_in_flight, scene_idle_s=scene_idle_s, slice_s=slice_s),
                    ranges=[tuple(r) for r in ranges], epoch=epoch,  # type: ignore[misc]
                    mailroom=room, models=assignment(c, cast), cast=cast, one_per_process=one_per_process)
    if c.prototypes is not None:
        from populace.sdk.prototypes import Plan

        run.prototypes = Plan(c, cast)
    run.engine.budget.limit = view_budget_bytes
    if freeze:
        # Agents live for the whole run: move them out of the cyclic GC's generations so
        # each collection during a round does not walk a million long-lived objects.
        gc.collect()
        gc.freeze()
    return run
