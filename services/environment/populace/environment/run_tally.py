"""Collecting a round's partials until every live share has one, then deciding it with the
run's simulation environment. Pure: no broker; the service does the I/O around it.

Partials are keyed by share (`host@epoch`), never by host alone: a replayed partial counts
once, a replacement's share replaces the one it was placed for, and a partial from a share
the round's newest announcement does not list never counts. Partials that arrive before
their round's announcement wait for it, and are checked when it comes. Partials are merged
in share order, so the decision does not depend on arrival order. A round announced again
with a new placement (a lost host's agents re-placed) is decided again once the new shares'
partials are in; the survivors' partials are kept for that until the next round opens.

A partial is refused (BadPartial: the service dead-letters it, with the reason) when it is
from a share of the round's epoch that the run never placed, counts other than its share's
agents, is for a round that is not open nor next, or carries a payload that is not the
simulation's partial. A straggler (a replaced share's, a decided round's) is dropped quietly:
it is recovery at work, not an attack; the service refuses a decided round's partial whose
share the run never placed (a host's in no run), whenever it comes.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import time
from dataclasses import dataclass, field

from pydantic import ValidationError

from populace.core import subjects
from populace.core.contracts import (
    LivingRef,
    PrototypeEvidence,
    RoundOpen,
    RoundPartial,
    RoundResult,
    SimulationTables,
    StateRef,
    Usage,
    WorldRef,
    share_key,
)
from populace.sdk import prototypes
from populace.sdk.agent import Agent
from populace.sdk.engine import DecideFailed, RoundDecider
from populace.sdk.env import Env, Partial
from populace.sdk.population import Population
from populace.sdk.profile import VIEW_BUDGET_BYTES
from populace.sdk.registry import Resolved
from populace.sdk.statejson import StateTypeError, from_wire
from populace.sdk.world import World


class EnvironmentFailed(RuntimeError):
    """The simulation's environment raised while deciding a round (or gave what a round cannot carry)."""


class BadPartial(ValueError):
    """A partial whose payload is not the simulation's partial: refused, never counted."""


@dataclass
class Counted:
    """A share's partial as counted: the envelope, its validated payload, and where it came
    from (opaque here: the service's message, to dead-letter it if its round refuses it); a
    prototype run's share: its evidence too (populace.sdk.prototypes)."""

    partial: RoundPartial
    payload: Partial | None
    source: object = None
    evidence: PrototypeEvidence | None = None


@dataclass
class RefusedPartial:
    """A partial that came before its round's announcement and that the announcement refuses."""

    partial: RoundPartial
    reason: str
    source: object = None


@dataclass
class RunTally:
    run_id: str
    resolved: Resolved
    env: Env
    opened: dict[int, RoundOpen] = field(default_factory=dict)  # round -> its newest announcement
    partials: dict[int, dict[str, Counted]] = field(default_factory=dict)
    decided: dict[int, frozenset[str]] = field(default_factory=dict)  # round -> the shares it folded
    refused: list[RefusedPartial] = field(default_factory=list)  # early partials an announcement refused: drain it
    # the environment's states by reference: the one the round in play starts from (kept, or read
    # by the service from its checkpoint object after a restart or on a fork) and the one it
    # decided once the service stored it; a round decided again starts from the same one
    states: dict[StateRef, dict] = field(default_factory=dict)
    # round -> the state it decided (as JSON): stored by the service before the result
    states_out: dict[int, dict] = field(default_factory=dict)
    # a simulation with a World: the world the announced rounds play in (the service loads it, by
    # the reference each announcement carries, before the round is decided) and what it was read as
    world: World | None = None
    world_ref: WorldRef | None = None
    # round -> (the result's world reference, its bytes): stored by the service before the result
    worlds_out: dict[int, tuple[WorldRef, bytes]] = field(default_factory=dict)
    # who is alive in the announced rounds (a run whose population changed: the service loads it by
    # the reference each announcement carries) and what it was read as; None: the first agents
    population: Population | None = None
    population_ref: LivingRef | None = None
    # round -> (the result's population reference, its bytes): stored by the service before the result
    populations_out: dict[int, tuple[LivingRef, bytes]] = field(default_factory=dict)
    budget_bytes: int = VIEW_BUDGET_BYTES  # the observation every agent sees: said once per run when over
    # the service runs a run's steps (open, add: a decision) in a worker thread, one at a time
    steps: asyncio.Lock = field(default_factory=asyncio.Lock, compare=False, repr=False)

    def needs_world(self, opened: RoundOpen) -> WorldRef | None:
        """The world reference the service must load before `opened` can be decided (None: the
        world in hand is the round's, or the run has none, or it starts now: `start_world`)."""
        if self.env.World is None:
            return None
        if opened.world is None:
            if self.world is None or self.world_ref is not None:  # round 1: the world it starts with
                self.world, self.world_ref = self.decider.opening().world, None
            return None
        return None if self.world_ref == opened.world else opened.world

    def set_world(self, ref: WorldRef, data: bytes) -> None:
        self.world, self.world_ref = self.env.World.from_bytes(data), ref  # type: ignore[union-attr]

    def needs_state(self, opened: RoundOpen) -> StateRef | None:
        """The state the service must read before `opened` can be decided (None: the round starts
        from the state in hand, or from the simulation's start)."""
        ref = opened.env_state
        return None if ref is None or ref in self.states else ref

    def keep_state(self, ref: StateRef, state: dict) -> None:
        self.states[ref] = state

    def needs_population(self, opened: RoundOpen) -> LivingRef | None:
        """The population reference the service must load before `opened` can be decided (None:
        the one in hand is the round's, or the run's first agents play it)."""
        if opened.population is None:
            self.population, self.population_ref = None, None
            return None
        return None if self.population_ref == opened.population else opened.population

    def set_population(self, ref: LivingRef, data: bytes) -> None:
        self.population, self.population_ref = Population.from_bytes(data), ref

    @property
    def epoch(self) -> int:
        return max((o.epoch for o in self.opened.values()), default=0)

    def open(self, opened: RoundOpen) -> RoundResult | None:
        """A round's (newest) announcement: the decision if every share's partial is in. The
        partials that came first and that this placement refuses go to `refused`."""
        r = opened.round
        current = self.opened.get(r)
        if current is not None and opened.epoch < current.epoch:
            return None  # an older announcement of a round placed again since
        if r < max(self.opened, default=0):
            return None  # a round before the newest one: long decided
        self.opened[r] = opened
        for old in [n for n in self.opened if n < r]:  # an earlier round is never announced again
            self.opened.pop(old)
            self.partials.pop(old, None)
            self.decided.pop(old, None)
        for n in [n for n in self.partials if n < r]:
            self.partials.pop(n)  # stragglers that waited for a round that was decided elsewhere
        for ref in [ref for ref in self.states if ref != opened.env_state]:
            self.states.pop(ref)  # an earlier round's, or one this round decided before it was placed again
        parts = self.partials.get(r, {})
        for key, counted in list(parts.items()):
            why = self._refusal(opened, key, counted.partial)
            if why is not None or (key not in opened.shares and counted.partial.epoch < opened.epoch):
                parts.pop(key)  # refused, or a share this placement replaced
                if why is not None:
                    self.refused.append(RefusedPartial(counted.partial, why, counted.source))
        return self._maybe_close(r)

    @functools.cached_property
    def decider(self) -> RoundDecider:
        return RoundDecider(self.resolved, self.env, self.run_id, budget_bytes=self.budget_bytes)

    def everyone_acts(self, opened: RoundOpen) -> bool:
        """Whether every agent acts in the announced round (else a share counts those it selected)."""
        if type(self.env.sim).Agent.wakes is not Agent.wakes or opened.population is not None:
            return False  # the agent's say, or the departed: a share counts those who act
        if opened.observation is None:  # the first round: selected as the environment starts
            try:
                return self.decider.opening().selection is None
            except DecideFailed:
                return False  # the hosts fail the round themselves
        return opened.selection is None

    def _refusal(self, opened: RoundOpen, key: str, partial: RoundPartial) -> str | None:
        """Why the round's placement refuses a partial (None: it does not)."""
        if key in opened.shares:
            size = opened.shares[key]
            if partial.n != size and (partial.n > size or self.everyone_acts(opened)):
                return f"share {key} has {size} agents, the partial counts {partial.n}"
            return None
        if partial.epoch == opened.epoch:
            return f"share {key} was never placed in run {opened.run_id} (round {opened.round}, epoch {opened.epoch})"
        return None

    def screen(self, partial: RoundPartial) -> bool | None:
        """What the rounds announced here say of a partial, before its payload is looked at:
        True, it counts; False, a straggler (a replaced share's, a decided round's), dropped
        quietly; None, its round is not announced here yet (the announcement checks it). Raises
        BadPartial when the round's placement refuses it."""
        r, key = partial.round, share_key(partial.host_id, partial.epoch)
        newest = max(self.opened, default=0)
        if newest and r > newest + 1:
            raise BadPartial(f"round {r} is not open in run {self.run_id} (round {newest} is in play)")
        opened = self.opened.get(r)
        if opened is None:
            return False if r < newest else None  # a straggler of a round long decided, or one to come
        why = self._refusal(opened, key, partial)
        if why is not None:
            raise BadPartial(why)
        return not (key not in opened.shares and partial.epoch < opened.epoch)  # a replaced share's straggler

    def add(self, partial: RoundPartial, source: object = None) -> RoundResult | None:
        """Count a share's partial (once); raises BadPartial when the round's placement or
        the simulation refuses it (see the module's docstring)."""
        if self.screen(partial) is False:
            return None
        r, key = partial.round, share_key(partial.host_id, partial.epoch)
        wire, evidence = partial.payload, None
        if self.resolved.config.prototypes is not None and partial.n:
            try:
                wire, evidence = prototypes.evidence_of(partial.payload)
            except ValidationError as err:
                raise BadPartial(f"its prototypes' evidence is refused: {err.errors()[0]['msg']}") from None
            except ValueError as err:
                raise BadPartial(str(err)) from None
        try:
            payload = from_wire(self.env.Partial, wire) if partial.n and wire is not None else None
        except ValidationError as err:
            raise BadPartial(f"payload is not a {self.env.Partial.__name__}: {err.errors()[0]['msg']}") from None
        except StateTypeError as err:
            raise BadPartial(f"payload is not a {self.env.Partial.__name__}: {err}") from None
        self.partials.setdefault(r, {})[key] = Counted(partial, payload, source, evidence)
        return self._maybe_close(r)

    def _maybe_close(self, r: int) -> RoundResult | None:
        opened = self.opened.get(r)
        parts = self.partials.get(r, {})
        if opened is None or not opened.shares or any(k not in parts for k in opened.shares):
            return None
        folded = frozenset(opened.shares)
        if self.decided.get(r) == folded:
            return None  # decided already, with exactly these shares
        result = self.decide(opened, [(parts[k].partial, parts[k].payload) for k in sorted(folded)],
                             [parts[k].evidence for k in sorted(folded) if parts[k].evidence is not None])
        self.decided[r] = folded
        return result

    def decide(self, opened: RoundOpen, parts: list[tuple[RoundPartial, Partial | None]],
               evidence: list[PrototypeEvidence] | None = None) -> RoundResult:
        payloads = [payload for _, payload in parts if payload is not None]
        drawn = None
        if self.resolved.config.prototypes is not None:
            drawn = self.draws(opened, evidence or [])
            if drawn.partial is not None:
                payloads.append(drawn.partial)
        start = None
        if opened.env_state is not None:
            start = self.states.get(opened.env_state)
            if start is None:  # the service reads it before the round opens here (needs_state)
                raise EnvironmentFailed(f"round {opened.round}'s state {opened.env_state.name} was not read")
        try:
            decision = self.decider.decide(opened.round, start, payloads, self.world, self.population)
        except DecideFailed as err:
            raise EnvironmentFailed(str(err)) from err
        self.states_out[opened.round] = decision.state
        living_ref = self._population_out(opened.round, decision.population)
        world_ref = None
        if decision.world is not None:
            if decision.world is self.world and self.world_ref is not None:
                world_ref = self.world_ref  # unchanged: the next round reads the same object
            else:
                data = decision.world.to_bytes()
                world_ref = WorldRef(name=subjects.checkpoint_world(self.run_id, opened.round),
                                     digest=hashlib.sha256(data).hexdigest())
                self.worlds_out[opened.round] = (world_ref, data)
            # the next round plays in it (a round decided again reloads its own world by reference)
            self.world, self.world_ref = decision.world, world_ref
        return RoundResult(
            run_id=self.run_id, round=opened.round, n=sum(p.n for p, _ in parts),
            n_valid=sum(p.n_valid for p, _ in parts) + (drawn.n_valid if drawn is not None else 0),
            summary=decision.summary,
            observation=decision.observation, selection=decision.selection, world=world_ref,
            population=living_ref,
            closed_at=time.time(), epoch=opened.epoch, shares=sorted(opened.shares),
            usage=sum((p.usage for p, _ in parts), Usage()),
            interviews=sum((p.interviews for p, _ in parts), Usage()),
            n_simulation_errors=sum(p.n_simulation_errors for p, _ in parts),
            profile=decision.profile, prototypes=drawn.report if drawn is not None else None,
        )

    def draws(self, opened: RoundOpen, evidence: list[PrototypeEvidence]) -> prototypes.Folded:
        """The drawn agents' part of the round (a prototype run): their partial, and each
        prototype's draws measured against its audits."""
        try:
            return prototypes.fold(self.env, self.resolved.config, self.tables, opened.round, opened.prototypes,
                                   evidence)
        except ValueError as err:  # the shares' evidence does not add up: never decided on
            raise EnvironmentFailed(f"round {opened.round}: the shares' prototype draws cannot be folded: {err}") \
                from err
        except Exception as err:  # the simulation's reduce_drawn
            raise EnvironmentFailed(f"simulation {self.resolved.config.simulation!r}: its environment failed to fold "
                                    f"round {opened.round}'s drawn answers: {type(err).__name__}: {err}") from err

    @functools.cached_property
    def tables(self) -> SimulationTables:
        return self.resolved.tables()

    def _population_out(self, round_: int, population: Population | None) -> LivingRef | None:
        """The reference of who is alive after `round_`: the round's own object when it changed
        anyone (stored by the service before the result), else the one the round was played with."""
        if population is None:
            return None
        if population is self.population or population.round != round_:
            return self.population_ref
        data = population.to_bytes()
        d = population.delta
        first = d.born_first if d is not None else population.size
        ref = LivingRef(name=subjects.checkpoint_population(self.run_id, round_),
                        digest=hashlib.sha256(data).hexdigest(), round=round_, size=population.size, first=first,
                        living=population.count)
        self.populations_out[round_] = (ref, data)
        # a round decided again (a re-placement) loads its own population by reference
        self.population, self.population_ref = population, ref
        return ref

