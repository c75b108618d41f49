"""Environments are special agents: they own state, fold what agents did, decide the round
and fire triggers to their listeners. They nest: a group env settles its members' round
before the root env sees it.

Their logic is pure (decide, never do), like a Temporal workflow: the platform calls these
methods and does the I/O around them, so the same environment runs in a notebook and on the
fleet, and is unit-tested without a broker.

On the fleet:
- `reduce` runs on every agent-host, once per batch of ~1,000 outcomes, and `merge` folds
  the batches into one partial per host: the root env never receives one message per agent.
- `merge` and `decide` run in the environment service, once per round.
- A `GroupEnv` runs on the host that holds the group (a group's members are placed together).

`merge` must be associative and commutative, and reduce+merge exact (counts, integer sums,
Fractions), for a run to give identical results on one host and on several.
"""

from __future__ import annotations

import asyncio
import inspect
import typing
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Generic, TypeVar

import numpy as np
from pydantic import BaseModel, ConfigDict, PlainSerializer, PlainValidator

from populace.sdk.population import Population
from populace.sdk.shown import ShownBook, ShownError
from populace.sdk.shown import checked as checked_shown

if TYPE_CHECKING:
    from populace.sdk.outcome import Outcome
    from populace.sdk.scene import Scene
    from populace.sdk.simulation import Observation, Simulation, Summary
    from populace.sdk.world import World

Listener = Callable[[str, Any], Any]


class Listeners:
    """Triggers in process: `listen(event, fn)`, then `await emit(event, payload)` runs every
    listener of that event (and of '*'); coroutine listeners run concurrently."""

    def __init__(self) -> None:
        self._listeners: dict[str, list[Listener]] = defaultdict(list)

    def listen(self, event: str, listener: Listener) -> Callable[[], None]:
        """Register a listener for an event ('*' for all). Returns an unsubscribe function."""
        self._listeners[event].append(listener)
        return lambda: self._listeners[event].remove(listener)

    async def emit(self, event: str, payload: Any) -> None:
        pending = []
        for fn in (*self._listeners.get(event, ()), *self._listeners.get("*", ())):
            out = fn(event, payload)
            if inspect.isawaitable(out):
                pending.append(out)
        if pending:
            await asyncio.gather(*pending)


class State(BaseModel):
    """An environment's state between rounds. Keep it small (aggregates, a history of
    round results): it travels with every round open. Per-agent state belongs to agents."""

    model_config = ConfigDict(extra="forbid")


class Partial(BaseModel):
    """What a host's (or group's) reduction of outcomes tells the root env. Besides counts and
    integer sums, a partial may carry columns (`Ints`, `Floats`: numpy arrays, e.g. the agents
    that want to move); `merge` concatenates them in the order it gets them (on a host, batches
    as they left; in the environment, shares by key: docs/simulations.md says exactly), which
    another placement changes, so `decide` sorts what it uses (by agent id)."""

    model_config = ConfigDict(extra="forbid")


# A partial's column: a 1-D numpy array, a JSON list on the wire (a large partial travels by reference).
Ints = Annotated[np.ndarray, PlainValidator(lambda v: np.asarray(v, dtype=np.int64).reshape(-1)),
                 PlainSerializer(lambda a: a.tolist(), when_used="json")]
Floats = Annotated[np.ndarray, PlainValidator(lambda v: np.asarray(v, dtype=np.float64).reshape(-1)),
                   PlainSerializer(lambda a: a.tolist(), when_used="json")]


StateT = TypeVar("StateT", bound=State)
PartialT = TypeVar("PartialT", bound=Partial)


class Env(Generic[StateT, PartialT]):
    """The root environment of a run. Subclasses name their state and partial once, as the
    generic's arguments (`class MyEnv(Env[Past, Counts])`; setting `State` and `Partial` as class
    attributes works too, and wins), and implement `reduce` and `decide`; `merge` has a default
    for a partial of whole numbers (their sums), `start` and `observe` have defaults."""

    State: ClassVar[type[State]] = State
    Partial: ClassVar[type[Partial]] = Partial
    # bulk state as typed columns (populace.sdk.world): with a World, decide takes and returns it
    World: ClassVar[type[World] | None] = None
    # who saw what (populace.sdk.shown): the World's column whose values `show` records a view showing
    shown_items: ClassVar[str | None] = None
    _shown_book: ShownBook | None = None  # the round's records on this host (set by the round engine)
    last_shown: tuple[int, list[int], list[int]] | None = None  # outside a round: the last `show`, for tests

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # Env[Past, Counts]: State and Partial from the generic's arguments, where the class (or
        # a parent of its) did not set them by hand
        for base in cls.__dict__.get("__orig_bases__", ()):
            if typing.get_origin(base) is not None and issubclass(typing.get_origin(base), Env):
                for attr, default, arg in zip(("State", "Partial"), (State, Partial), typing.get_args(base)):
                    if (getattr(cls, attr) is default and isinstance(arg, type) and issubclass(arg, default)
                            and attr not in cls.__dict__):
                        setattr(cls, attr, arg)

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.params = sim.params
        # who is alive (populace.sdk.population), set by the platform before each hook runs: the
        # run's first agents until a round changes them
        self.population: Population = Population.start(sim.agents)

    def start(self) -> StateT:
        """The state before round 1."""
        return self.State()  # type: ignore[return-value]

    def observe(self, state: StateT, round: int) -> Observation:
        """What every agent sees in `round`, given the state the previous rounds left."""
        return self.sim.Observation(round=round)

    def start_world(self, state: StateT) -> World:  # pragma: no cover - declared with a World
        """The world before round 1 (a simulation that declares `World`). Pure and seeded
        (`self.sim.rng(...)`): every host and the environment build the same one."""
        raise NotImplementedError(f"{type(self).__name__} declares World = {self.World!r} but no start_world()")

    def view(self, world: World, round: int, agent_id: int) -> Observation | None:
        """One agent's own observation this round, from the world (a personal feed, its
        neighbourhood), made on the agent's host just before its turn (and for `wakes(obs, view)`,
        before selection). None (the default): every agent sees the round's shared observation."""
        return None

    def show(self, agent_id: int, items: Sequence[int] | np.ndarray, ranks: Sequence[int] | None = None) -> None:
        """Record, from `view`, what agent `agent_id` is shown this round: `items` (values of the
        world column `shown_items`, in the order shown) and their `ranks` (1 = the best; default:
        the order shown). One row of table `shown` per acting agent (populace.sdk.shown); a
        second call for the same agent replaces the first. Outside a round (a unit test of the
        view) the record is checked and kept in `last_shown`."""
        if self.shown_items is None:
            raise ShownError(f"{type(self).__name__}.show: declare `shown_items` (the World column whose "
                             "values a view shows) to record what agents are shown")
        book = self._shown_book
        if book is None:
            self.last_shown = (agent_id, *checked_shown(items, ranks))
            return
        book.add(agent_id, items, ranks)

    def select(self, state: StateT, round: int) -> Any:
        """Who acts in `round` (activation): a selector of `populace.sdk.select` (rate, rate_by,
        ids, mask, where, column), or None for everyone. Pure: it runs where the round is decided,
        and only the agents it picks play, are reduced and are recorded (of the living: a departed agent is
        never picked; a mask covers every id given so far, `self.population.size`).

        Declared with a third argument, `select(self, state, round, world)`, it also gets the
        world `round` is played in (the one `decide` of the round before returned, or
        `start_world`'s for round 1; None for a simulation without a World)."""
        return None

    def reduce(self, agent_ids: Sequence[int], outcomes: Sequence[Outcome]) -> PartialT:  # pragma: no cover
        """Fold a batch of outcomes (on the host that played them) into a partial."""
        raise NotImplementedError

    def reduce_drawn(self, agent_ids: Sequence[int], outcomes: Sequence[Outcome], counts: Sequence[int]) -> PartialT:
        """A prototype run (docs/prototypes.md): fold the answers agents drew instead of calling the
        model. `outcomes[i]` stands for `counts[i]` agents, the smallest of whose ids is
        `agent_ids[i]`; it runs in the environment, once per round. The default reduces each
        outcome `counts[i]` times, every copy under that smallest id, in batches: exact for a
        `reduce` that reads an agent's id only to break ties towards the smallest (or not at all),
        and one Python call per drawn agent. Override it to fold a count per answer (the ratio
        game does): exact, and as fast for ten million agents as for a thousand."""
        parts = []
        batch_ids: list[int] = []
        batch: list[Outcome] = []
        for aid, out, n in zip(agent_ids, outcomes, counts):
            batch_ids.extend([aid] * n)
            batch.extend([out] * n)
            if len(batch) >= 100_000:
                parts.append(self.reduce(batch_ids, batch))
                batch_ids, batch = [], []
        if batch:
            parts.append(self.reduce(batch_ids, batch))
        return self.merge(parts)

    def merge(self, partials: Sequence[PartialT]) -> PartialT:
        """Fold partials (of batches, hosts or groups) into one: associative and commutative.
        `partials` may be empty (a round in which no agent answered): return the empty partial.
        On a host they come in the order the batches left (turns finish as the model answers);
        in the environment one per share, in the text order of the share keys (`host@epoch`):
        the same on one placement, different on another.

        The default, for a partial whose fields are all whole numbers (`int`: counts and
        integer sums), adds them field by field: exact in any order. Any other partial (floats,
        columns, Fractions, nested models) writes its own."""
        summed = _int_fields(self.Partial)
        if summed is None:
            raise NotImplementedError(f"{type(self).__name__}.merge: the default adds a partial's whole-number "
                                      f"fields; {self.Partial.__name__} has others, so write merge yourself")
        return self.Partial(**{f: sum(getattr(p, f) for p in partials) for f in summed})  # type: ignore[return-value]

    def decide(self, state: StateT, round: int, total: PartialT) -> tuple[StateT, Summary]:  # pragma: no cover
        """Close a round: the state after it and the round's summary (its recorded columns).
        With a `World`: `decide(state, round, total, world) -> (state, summary, world)`. Either
        may end with the round's population changes (`populace.sdk.Changes`: who dies or leaves,
        who is born or arrives; see populace.sdk.population)."""
        raise NotImplementedError


def _int_fields(partial: type[Partial]) -> tuple[str, ...] | None:
    """The fields of a partial whose every field is declared `int` (None when one is not)."""
    try:
        hints = typing.get_type_hints(partial)
    except Exception:  # an annotation only a type checker resolves: not a plain partial
        return None
    names = tuple(partial.model_fields)
    return names if all(hints.get(n) is int for n in names) else None


class GroupEnv:
    """An environment one level down: it settles each group's round on the host that holds
    the group, before anything leaves the host. One instance serves every group of a run on
    that host (keep per-group state keyed by `group`).

    Either `settle` (every member plays its own turn, then the group's outcomes are settled)
    or `async scene` (the group's round is a sequence of its members' acts; see
    `populace.sdk.scene`). Nested groups: `Parent` is the GroupEnv of the level above (teams in
    firms), which settles once all its groups did; the simulation's `group_sizes()` gives each
    level's size. Outer levels' group ids are recorded as `<level>_id` columns."""

    level: ClassVar[str] = "group"  # this level's name (an outer level's column is `<level>_id`)
    Parent: ClassVar[type[GroupEnv] | None] = None  # the level above, settled after this one

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.params = sim.params

    @classmethod
    def plays_scenes(cls) -> bool:
        return cls.scene is not GroupEnv.scene

    async def scene(self, scene: Scene) -> Any:  # pragma: no cover - declared by scene simulations
        """Play the group's round as ordered acts (see populace.sdk.scene): await members' acts,
        give each member its outcome with `scene.outcome(member, outcome)`, and return what the
        members hear (passed to each member's `Agent.settled`), or None."""
        raise NotImplementedError

    def settle(self, round: int, group: int, agent_ids: Sequence[int],
               outcomes: Sequence[Outcome]) -> Any:  # pragma: no cover
        """Every member of `group` has played `round`: fill in what depends on the whole group
        (e.g. payoffs) on the members' outcomes, in place, and return what the members hear
        (passed to each member's `Agent.settled`), or None."""
        raise NotImplementedError
