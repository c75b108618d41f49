"""A run's share on one process: its agents (built once, for the whole run), the root env
used to reduce their outcomes, and the round player. Built the same way by the agent-host
service and by the local runner, so both play the very same code."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from populace.graph.csr import Graph
from populace.population.cast import Cast
from populace.population.model_assignment import assignment
from populace.sdk.agent import Agent
from populace.sdk.edges import EdgeBook
from populace.sdk.env import Env
from populace.sdk.mailroom import Mailroom
from populace.sdk.play import RoundPlayer
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

    def __post_init__(self) -> None:
        from populace.sdk.engine import ShareEngine  # the engine drives a HostedRun: it imports this module

        self.engine = ShareEngine(self)

    @property
    def tables(self):
        return type(self.sim).tables()

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

    async def snapshot(self) -> list[tuple[int, int, dict[str, list]]]:
        """Each range's agents' declared state, columnar: [(first, count, {field: values})]."""
        out = []
        i = 0
        for first, count in self.ranges:
            out.append((first, count, await self._columns(self.agents[i:i + count])))
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

    async def snapshot_of(self, indices: set[int]) -> list[tuple[int, int, list[int], dict[str, list]]]:
        """The declared state of the agents at `indices` only, per range, columnar:
        [(first, count, offsets in the range, {field: values})] (ranges with none of them too)."""
        out = []
        i = 0
        for first, count in self.ranges:
            picked = sorted(j - i for j in indices if i <= j < i + count)
            out.append((first, count, picked, await self._columns([self.agents[i + o] for o in picked])))
            i += count
        return out

    def restore(self, states: dict[int, dict]) -> None:
        """Set every agent's declared state (by agent id) from a checkpoint."""
        self.changed = None  # the next checkpoint is a full one
        missing = [a.id for a in self.agents if a.id not in states]
        if missing:
            raise ValueError(f"run {self.run_id}: the checkpoint has no state for agents {missing[:5]}"
                             f"{' …' if len(missing) > 5 else ''}")
        cls = type(self.sim).Agent
        for a in self.agents:
            a.restore(decode_state(states[a.id], cls))
        book = self.sim.edges
        if book is not None:
            for a in self.agents:
                book.restore(a.id, states[a.id].get(EDGES))

    def stop(self) -> None:
        for a in self.agents:
            if isinstance(a, ProcessAgent):
                a.stop()


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
                    ranges=list(ranges), epoch=epoch,
                    mailroom=room, models=assignment(c, cast))
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
