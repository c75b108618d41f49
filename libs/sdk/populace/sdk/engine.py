"""The round engine: the one place a round is played and decided. Transport-agnostic: the local
runner (`populace.sdk.local`), the agent-host and the environment service only drive it — they
hand it what a round's announcement says and an LLM port, and move what it returns.

- `ShareEngine.play` plays one share's part of a round: its observation (and mailbox), who acts
  (activation), their turns or their groups' scenes, group settlement level by level, and the
  share's outcome batches and partial.
- `RoundDecider` decides a round from the shares' partials: merge (in share order), decide,
  the next round's observation and selection, each checked against what a round's messages
  can carry (and the state against what a round keeps), so one too large fails the run naming
  it instead of hanging the fleet.
"""

from __future__ import annotations

import functools
import json
import operator
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from populace.core.contracts import DecideProfile
from populace.sdk import rules, select
from populace.sdk.agent import Agent, wakes_with_view
from populace.sdk.claims import ClaimError
from populace.sdk.edges import EdgeBook, EdgeError
from populace.sdk.env import Env, Partial
from populace.sdk.hosting import HostedRun
from populace.sdk.llm import LLM
from populace.sdk.play import OutcomeRows, OutcomeSink, RoundFailed, RoundPaused, RoundShare
from populace.sdk.population import ChangeError, Changes, Population, scheduled
from populace.sdk.process import AgentRaised
from populace.sdk.profile import VIEW_BUDGET_BYTES, Budget, RoundCost, decide_profile, sampled, size_of, wire_size
from populace.sdk.prototypes import HostRound
from populace.sdk.registry import Resolved
from populace.sdk.shown import ShownBook
from populace.sdk.statejson import StateTypeError, encode, from_wire, to_wire
from populace.sdk.world import World, WorldError

# What one round's messages may carry of the environment (a round open and a round result hold
# them, under NATS's 1 MB payload): the observation, the selection and the summary. The state
# travels in no message (round opens name its checkpoint object), so its bound is only what one
# round's checkpoint of it may hold in memory and in the store; per-agent data still belongs to
# agents (declared state) and columns to a world.
LIMITS = {"state": 64 * 1024 * 1024, "observation": 256 * 1024, "selection": 200 * 1024, "summary": 64 * 1024}


class DecideFailed(RuntimeError):
    """The simulation's environment raised while deciding a round, or gave what a round cannot carry."""


class WorldRefused(DecideFailed, RoundPaused):
    """The environment built a world its declaration refuses (a column of the wrong type or
    length, a size that is not the run's): the simulation's bug, named; the run pauses, and
    resumes from its last round once the simulation is fixed."""


class PopulationRefused(DecideFailed, RoundPaused):
    """The round's population changes cannot apply (an agent departing that is not alive, a
    newcomer without a persona or with a state its class does not declare …): named, the run
    pauses, and resumes from its last round once the simulation (or the scenario) is fixed."""


class RuleBroken(DecideFailed, RoundPaused):
    """One of the world's rules did not hold where the round was decided: an invariant the
    environment declares broke (or raised), or a claim named a target that does not exist. The
    simulation's bug, named with the round and a witness; the run pauses, and a resume after the
    fix replays the round."""


@dataclass(frozen=True)
class Decision:
    """A decided round, as JSON: what the recorder stores and the next round is announced with."""

    state: dict
    summary: dict
    observation: dict
    selection: dict | None  # who acts next round (None: everyone)
    world: World | None = None  # the simulation's bulk state after the round (a World's)
    profile: DecideProfile | None = None  # where deciding it went (table round_profile)
    # who is alive after the round (None: the run's first agents, as ever); its `delta` is this
    # round's changes when `population.round` is the round's
    population: Population | None = None


def _size_check(sim_name: str, round_: int, what: str, value: Any) -> int:
    """The value's bytes as a round's messages carry it; DecideFailed past its limit."""
    size = len(json.dumps(value, separators=(",", ":")))
    if size > LIMITS[what]:
        hint = {"state": "per-agent data belongs to agents (declared state), columns to a World (docs/worlds.md)",
                "observation": "what every agent sees must be small; put bulk data in a World and give each "
                               "agent its own view of it (docs/worlds.md)",
                "selection": "select by rate, ids, where(…) or a world column (select.column(name)) rather than "
                             "a mask this large",
                "summary": "a summary holds a round's figures, not per-agent data"}[what]
        verb = "keep" if what == "state" else "carry"
        raise DecideFailed(f"simulation {sim_name!r}: its environment's {what} after round {round_} is {size:,} "
                           f"bytes as JSON, over the {LIMITS[what]:,} a round can {verb} ({hint})")
    return size


class RoundDecider:
    """Decides a run's rounds (pure: no I/O). One per run, wherever the run is decided."""

    def __init__(self, resolved: Resolved, env: Env | None = None, run_id: str = "",
                 budget_bytes: int = VIEW_BUDGET_BYTES) -> None:
        self.resolved = resolved
        self.env = env if env is not None else resolved.simulation.Env(resolved.instance(run_id))
        self.name = resolved.simulation.name
        c = resolved.config
        self.agents = c.agents
        self.budget = Budget(budget_bytes)  # the observation every agent sees: said once per run when over
        self.schedule = c.population.changes if c.population is not None else []
        # how many agents can have a persona (the first agents' and the newcomers'); None: none has one
        self.personas = c.agents + c.population.newcomers if c.has_personas else None  # type: ignore[union-attr]
        self.no_births = births_refused(resolved, self.env.sim)
        # `select(state, round, world)` sees the round's world; `select(state, round)` (older packages) does not
        self._select_world = select.takes(self.env.select, 3)

    def selection(self, state: Any, round_: int, world: World | None = None) -> dict | None:
        """Who acts in `round_`, from the state before it and the world it is played in."""
        env = self.env
        if self._select_world:
            where = f"{type(env).__name__}.select(state, {round_}, world)"
            sel = env.select(state, round_, world)
        else:
            where = f"{type(env).__name__}.select(state, {round_})"
            sel = env.select(state, round_)
        return select.to_wire(select.checked(sel, env.population.size, where, world))

    def _rules(self, state: Any, world: World | None, round_: int) -> None:
        """The environment's invariants on the state and world after `round_` (0: as it starts)."""
        when = f"after round {round_}" if round_ else "before round 1 (start_world)"
        try:
            rules.check(self.env, state, world, when)
        except rules.InvariantError as err:
            raise RuleBroken(f"simulation {self.name!r}: {err}") from err

    def opening(self) -> Decision:
        """Before round 1: the state the environment starts with, round 1's observation and
        selection, and its world (a simulation that declares one)."""
        env = self.env
        env.population = Population.start(self.agents)
        try:
            state = env.start()
            observation = to_wire(env.observe(state, 1), strict=False)
            world = self._world(env.start_world(state), "start_world()") if env.World is not None else None
            self._rules(state, world, 0)
            selection = self.selection(state, 1, world)
        except DecideFailed:
            raise
        except WorldError as err:
            raise WorldRefused(f"simulation {self.name!r}: its world before round 1 is refused: {err}") from err
        except Exception as err:
            raise DecideFailed(f"simulation {self.name!r}: its environment failed to start: "
                               f"{type(err).__name__}: {err}") from err
        _size_check(self.name, 0, "observation", observation)
        return Decision(self._state_wire(state, 0), {}, observation, selection, world)

    def _state_wire(self, state: Any, round_: int) -> dict:
        """The environment's state as it travels and is checkpointed: given back exactly by
        `from_wire` (a tuple in a field typed `Any` stays a tuple), or refused naming the field."""
        try:
            return to_wire(state)
        except StateTypeError as err:
            after = f"after round {round_}" if round_ else "before round 1"
            raise DecideFailed(f"simulation {self.name!r}: its environment's state {after} cannot be kept: "
                               f"{err}") from None

    def _world(self, world: Any, where: str) -> World:
        cls = self.env.World
        if not isinstance(world, cls):  # type: ignore[arg-type]
            raise WorldRefused(f"simulation {self.name!r}: {type(self.env).__name__}.{where} returned "
                               f"{type(world).__name__}, not its World {cls.__name__}")  # type: ignore[union-attr]
        agents = world.sizes.get("agents")
        ids = self.env.population.size
        if agents is not None and agents != ids:  # a view would read past (or short of) the run's agents
            given = f"{ids} agent ids (its first {self.agents} and the newcomers so far)" if ids != self.agents \
                else f"{ids} agents"
            raise WorldRefused(f"simulation {self.name!r}: {type(self.env).__name__}.{where} gave a world whose size "
                               f"'agents' is {agents}, but the run has {given}")
        return world

    def decide(self, round_: int, env_state: dict | None, partials: Sequence[Partial],
               world: World | None = None, population: Population | None = None) -> Decision:
        """Round `round_` from its shares' partials (in share order), given the state the rounds
        before left (None: the start), for a simulation with a World the round's world, and who
        is alive in it (None: the run's first agents, as ever)."""
        env = self.env
        sim = type(env.sim)
        clock = time.perf_counter
        before = population if population is not None else Population.start(self.agents)
        env.population = before
        try:
            state = env.start() if env_state is None else from_wire(env.State, env_state)
            t0 = clock()
            total = env.merge(list(partials))
            t1 = clock()
            if env.World is not None:
                state, summary, world, *changed = env.decide(state, round_, total, world)
            else:
                state, summary, *changed = env.decide(state, round_, total)
            after = self._population(before, round_, changed)
            if after.changed and self.resolved.config.prototypes is not None:
                raise DecideFailed(f"prototypes: simulation {self.name!r} changed who is alive after round {round_} "
                                   "(its decide returned Changes); a prototype run's agents are fixed: its "
                                   "representatives and draws cover the run's first agents")
            env.population = after
            if env.World is not None:
                world = self._world(world, f"decide(…) after round {round_}")
            self._rules(state, world, round_)
            observation = to_wire(env.observe(state, round_ + 1), strict=False)
            summary = sim.Summary.model_validate(summary.model_dump()).model_dump(mode="json")
            selection = self.selection(state, round_ + 1, world)
            state = self._state_wire(state, round_)
            t2 = clock()
        except DecideFailed:
            raise
        except ClaimError as err:  # a claim on a target that does not exist: the agent and target are named
            raise RuleBroken(f"simulation {self.name!r}: round {round_}: claims: {err}") from err
        except WorldError as err:  # e.g. world.replace(cell=floats): the column and why are in its message
            raise WorldRefused(f"simulation {self.name!r}: its world after round {round_} is refused: {err}") from err
        except Exception as err:
            raise DecideFailed(f"simulation {self.name!r}: its environment failed to decide round {round_}: "
                               f"{type(err).__name__}: {err}") from err
        sizes = {what: _size_check(self.name, round_, what, value)
                 for what, value in (("state", state), ("observation", observation), ("selection", selection),
                                     ("summary", summary))}
        note = self.budget.over(f"{type(env).__name__}.observe", sizes["observation"],
                                f"for round {round_ + 1} (every agent sees it)")
        return Decision(state, summary, observation, selection, world,
                        decide_profile(t1 - t0, t2 - t1, sizes["observation"], note),
                        after if after.changed else None)

    def _population(self, before: Population, round_: int, changed: list) -> Population:
        """Who is alive after round `round_`: `before`, with what `decide` returned after its
        other values (a Changes, or nothing) and then the scenario's scheduled changes."""
        hook = f"{type(self.env).__name__}.decide"
        if len(changed) > 1 or (changed and changed[0] is not None and not isinstance(changed[0], Changes)):
            raise DecideFailed(f"simulation {self.name!r}: {hook} returned {len(changed)} value(s) after its "
                               f"{'state, summary and world' if self.env.World is not None else 'state and summary'}"
                               f" ({', '.join(type(v).__name__ for v in changed)}); only a populace.sdk.Changes may "
                               "follow them")
        changes = changed[0] if changed and changed[0] is not None else Changes()
        where = hook if changes else "population.changes"  # whose changes these are, for a refusal
        if self.schedule:
            planned = scheduled(self.schedule, before, round_, self.env.sim.seed, changes.departed)
            if changes and planned:
                where = f"{hook} and population.changes"
            changes = changes + planned
        if changes.births and self.no_births:
            raise PopulationRefused(f"simulation {self.name!r}, round {round_}: {changes.births} newcomer(s): "
                                    f"{self.no_births}")
        states = changes.birth_states
        if states is not None:  # as a checkpoint holds a state (a tuple stays a tuple, local = fleet)
            changes = changes + Changes()  # the author's object stays as it was
            changes.birth_states = [_born_state(st, f"simulation {self.name!r}: {where}, round {round_}, agent "
                                                    f"{before.size + i}: births.{i}.state")
                                    for i, st in enumerate(states)]
        try:
            return before.after(changes, round_, state_fields=self.env.sim.Agent.state_fields,
                                personas=self.personas)
        except ChangeError as err:
            raise PopulationRefused(f"simulation {self.name!r}: {where}: {err}") from None


class ShareEngine:
    """Plays one share's part of each round (see the module's docstring)."""

    def __init__(self, run: HostedRun, budget_bytes: int = VIEW_BUDGET_BYTES) -> None:
        self.run = run
        self._profiles = [p.profile for p in run.sim.cast.personas] if run.sim.cast is not None else None
        cls = type(run.sim).Agent
        self._wakes = cls.wakes is not Agent.wakes
        self._wakes_view = self._wakes and wakes_with_view(cls)  # wakes(obs, view): sees its own view
        self.budget = Budget(budget_bytes)  # its views: said once per run when one is over
        self.cost: RoundCost | None = None  # the round in play's
        _time_folds(run.env, self)

    def selected(self, round_: int, selection: dict | None, obs: Any, world: World | None = None,
                 view: Callable[[int], Any] | None = None) -> list[int] | None:
        """Indices (into the share's agents) of those who act this round; None: all of them. The
        departed never act (nor cost anything but a bit here).
        `world`: the round's (a selector may read its columns); `view`: agent id -> its own view
        (what `wakes(obs, view)` sees; None: the environment gives none)."""
        sel = select.from_wire(selection)
        picked: np.ndarray | None = None
        living = self.run.living
        if sel is not None:
            mask = sel.pick(self.run.ids, seed=self.run.sim.seed, round_=round_, profiles=self._profiles,
                            world=world)
            picked = np.flatnonzero(mask if living is None else mask & living)
        elif living is not None:
            picked = np.flatnonzero(living)
        self.run.made(picked)  # newcomers not made yet, made now they act (None: every one)
        if not self._wakes:
            return None if picked is None else picked.tolist()
        agents = self.run.agents
        candidates = range(len(agents)) if picked is None else picked.tolist()
        if self._wakes_view:
            return [i for i in candidates if _wakes(agents[i], obs, view(agents[i].id) if view is not None else None,
                                                     with_view=True)]
        return [i for i in candidates if _wakes(agents[i], obs)]

    async def play(self, round_: int, observation: dict | None, selection: dict | None, llm: LLM, *,
                   emit: Callable[[OutcomeRows], None], batch_size: int = 1000,
                   world: World | None = None, prototypes: dict[str, float] | None = None) -> RoundShare:
        """Play round `round_` (its announcement's observation and selection, and the world it
        names; observation None: the run's first round, derived here from the environment's
        start, as every share does). A prototype run: only the share's representatives play
        (`prototypes`: the shares its guard raised), beside its audits (populace.sdk.prototypes)."""
        run = self.run
        t0 = time.perf_counter()
        cost = self.cost = RoundCost()
        if observation is None:
            opening = RoundDecider(run.resolved, run.env).opening()
            observation, selection, world = opening.observation, opening.selection, opening.world
        cost.observation_bytes = wire_size(observation)
        obs = run.observation(round_, observation)
        record_posts = None
        room = run.mailroom
        if room is not None:
            reading = room.reading(round_)
            obs._mailbox = reading
            record_posts = functools.partial(room.record, round_, reading)
        book = run.sim.edges
        edits = functools.partial(_record_edits, book, round_, type(run.sim).name) if book is not None \
            else functools.partial(_refuse_edits, round_, type(run.sim).name)
        view = shown = None
        if run.env.World is not None and type(run.env).view is not Env.view:
            if world is None:
                raise RoundFailed(f"round {round_}: the simulation has a World but the round names none")
            shown = self._shown_book(world, round_)
            view = self._viewer(world, round_, cost, shown)
        sink = OutcomeSink(type(run.sim), run.env, batch_size=batch_size, emit=emit, grouped=run.tables.grouped,
                           round_=round_, posts=record_posts, levels=run.player.level_names, edits=edits,
                           shown=shown.take if shown is not None else None)
        drawn = None
        if run.prototypes is not None:
            if selection is not None:  # refused before the run (populace.sdk.prototypes.check): a bug if here
                raise RoundPaused(f"round {round_}: a prototype run's environment selected who acts")
            drawn = HostRound(run.prototypes, run.ids, round_, prototypes)
            sink._emit = drawn.capture(emit)
            selected = drawn.selected
        else:
            selected = self.selected(round_, selection, obs, world, view)
        run.acted(selected)  # before they play: a round cut short may have changed some of them
        run.env._shown_book = shown  # what its views `show` this round
        try:
            audits = drawn.start_audits(run, obs, llm) if drawn is not None else None
            try:
                await run.player.play(obs, llm, sink, selected, view=view, cost=cost)
            except BaseException:
                if audits is not None:
                    audits.cancel()
                raise
            share = sink.close()
            if drawn is not None:
                rows = await drawn.finish_audits(audits, sink, sink.seq)
                if rows is not None:
                    emit(rows)
                played = share.n
                share.prototypes = drawn.evidence(run.tables.measure or "")
                share.n = len(run.agents)  # every agent of the share has a row: its own answer or a drawn one
                cost.turns = played
        finally:
            self.cost = None
            run.env._shown_book = None
        cost.agents = len(selected) if drawn is not None else share.n
        cost.model_wait_s = getattr(llm, "model_wait_s", 0.0)  # the ports that count it (the fleet's, the dummy's)
        cost.wall_s = time.perf_counter() - t0
        share.cost = cost
        return share

    def _shown_book(self, world: World, round_: int) -> ShownBook | None:
        """The round's records of what views show (a simulation that declares `shown_items`)."""
        env = self.run.env
        column = type(env).shown_items
        if column is None:
            return None
        return ShownBook(type(env.sim).name, round_, f"{type(world).__name__}.{column}", getattr(world, column))

    def _viewer(self, world: World, round_: int, cost: RoundCost,
                shown: ShownBook | None = None) -> Callable[[int], Any]:
        """agent id -> its own observation (the environment's view), made on this host: timed
        whole, its bytes measured on a sample (said once per run when over the budget); what it
        `show`s the agent goes to `shown`."""
        env = self.run.env
        clock = time.perf_counter
        hook = f"{type(env).__name__}.view"

        def view(agent_id: int) -> Any:
            i = cost.views
            cost.views = i + 1
            t = clock()
            if shown is not None:
                shown.viewing = agent_id
            try:
                seen = env.view(world, round_, agent_id)
            except Exception as err:  # the simulation's view: the round cannot go on; a fix resumes it
                raise RoundPaused(f"simulation {type(env.sim).name!r}: {type(env).__name__}.view raised in round "
                                  f"{round_} for agent {agent_id}: {type(err).__name__}: {err}") from err
            finally:
                cost.view_s += clock() - t
                if shown is not None:
                    shown.viewing = None
            if sampled(i):
                size = size_of(seen)
                if size is not None:
                    cost.views_sized += 1
                    cost.view_bytes_sized += size
                    cost.view_max_bytes = max(cost.view_max_bytes, size)
                    note = self.budget.over(hook, size, f"for agent {agent_id} in round {round_}")
                    if note is not None:
                        cost.note = note
            return seen

        return view


def _born_state(state: Any, where: str) -> dict | None:
    """A newcomer's state, each field encoded as an agent-host encodes a checkpoint's
    (populace.sdk.statejson); one no checkpoint keeps is refused, naming it."""
    if state is None or not hasattr(state, "items"):
        return state  # none given; or not a mapping, which the population refuses by name
    out = {}
    for name, value in state.items():
        try:
            out[name] = encode(value)
        except StateTypeError as err:
            raise PopulationRefused(f"{where}.{name}: {err}") from None
    return out


def births_refused(resolved: Resolved, sim: Any) -> str | None:
    """Why a run cannot have newcomers (None: it can): their ids would be outside its groups'
    layout or its graph, both fixed before the run."""
    if sim.group_layout() is not None:
        return "a simulation with groups cannot have newcomers (its groups are laid out over the first agents)"
    if resolved.config.graph is not None or resolved.simulation.edge_kinds:
        return "a run with a graph cannot have newcomers (its graph is built over the first agents)"
    return None


def _time_folds(env: Env, engine: ShareEngine) -> None:
    """The share's env reduces each outcome batch and merges them (OutcomeSink): their seconds
    go to the round in play's `merge_s`. Its own methods, wrapped on the instance (its class, and
    so every message naming it, stays the simulation's); outside a round (a local run decides
    with the same env) they are not counted."""
    clock = time.perf_counter
    for name in ("reduce", "merge"):
        method = getattr(env, name)

        def timed(*args: Any, _method: Callable = method) -> Any:
            cost = engine.cost
            if cost is None:
                return _method(*args)
            t = clock()
            try:
                return _method(*args)
            finally:
                cost.merge_s += clock() - t

        setattr(env, name, timed)


def _record_edits(book: EdgeBook, round_: int, name: str, ids: list[int], outs: list) -> dict[str, list] | None:
    """A batch's edge edits, checked and applied to the host's edge book (agent order is the
    batch's, but each agent edits only its own in-edges: the book is the same in any order)."""
    rows: dict[str, list] = {"follower": [], "author": [], "kind": [], "op": []}
    for aid, out in zip(ids, outs):
        edits = out.edits
        if edits is None:
            continue
        checked = book.check(aid, edits, name, round_)
        book.apply(round_, aid, checked)
        for e in checked:
            rows["follower"].append(aid)
            rows["author"].append(e.author)
            rows["kind"].append(e.kind)
            rows["op"].append(e.op)
    return rows if rows["follower"] else None


_EDITS = operator.attrgetter("edits")


def _refuse_edits(round_: int, name: str, ids: list[int], outs: list) -> None:
    """A simulation that declares no edge kinds: an outcome's edits would be dropped unseen, so
    they are its bug (EdgeError: the run pauses naming the agent)."""
    edits = list(map(_EDITS, outs))
    if edits.count(None) != len(edits):  # in C: the hot path of every simulation without edges
        aid = next(aid for aid, e in zip(ids, edits) if e is not None)
        raise EdgeError(f"simulation {name!r}, round {round_}, agent {aid}: outcome.edits: the simulation declares "
                        "no edge kinds (set `edge_kinds` on the Simulation to edit the graph)")
    return None


def _wakes(agent: Agent, obs: Any, view: Any = None, with_view: bool = False) -> bool:
    """The agent's own say in whether it acts (a ProcessAgent asks its process): `wakes(obs)`,
    or `wakes(obs, view)` for a class whose hook takes its view too."""
    try:
        return bool(agent.wakes(obs, view) if with_view else agent.wakes(obs))
    except Exception as err:
        raise RoundFailed(f"{type(agent).__name__}.wakes raised for agent {agent.id} in round {obs.round}: "
                          f"{err if isinstance(err, AgentRaised) else f'{type(err).__name__}: {err}'}") from err
