"""Activation: who acts in a round. An environment's `select(state, round)` — or, to see the
round's world, `select(state, round, world)` — returns one of these selectors (None: everyone);
only the agents it picks play, are reduced and recorded, and the others keep their state and
cost nothing.

    from populace.sdk import select
    select.rate(0.1)                       # a seeded 10% of the agents, drawn again every round
    select.ids([3, 17, 42])                # exactly these agents
    select.mask(unhappy)                   # a boolean per agent (numpy array or list)
    select.where(activity=["high"])        # agents whose persona profile has one of these values
    select.column("alive")                 # agents whose per-agent world column is true (non-zero)

Selection is pure and seeded by (run seed, round, agent, salt) — never by arrival order or by
placement — so every host picks the same agents, one process picks what the fleet picks, and a
resumed run picks what it would have. Selectors are small pydantic models: they travel with the
round (a mask of a million agents packs into 125 kB; `column` names a column of the world every
host reads anyway, so it is a few bytes for any number of agents)."""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Annotated, Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

if TYPE_CHECKING:
    from populace.sdk.world import World

_MASK64 = np.uint64((1 << 64) - 1)


class SelectionError(ValueError):
    """A selector that cannot apply to the run (its message names what and why)."""


class _Selector(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    def pick(self, ids: np.ndarray, *, seed: int, round_: int, profiles: Sequence[Mapping] | None,
             world: World | None = None) -> np.ndarray:
        """Of the agent ids `ids` (int64, sorted), the mask of those selected (`world`: the
        round's, on the host that plays it)."""
        raise NotImplementedError  # pragma: no cover

    def check(self, agents: int, world: World | None = None) -> None:
        """Raise SelectionError when this selector names what the run (or its world) does not have."""


class Everyone(_Selector):
    kind: Literal["all"] = "all"

    def pick(self, ids, *, seed, round_, profiles, world=None):
        return np.ones(ids.size, dtype=bool)


class Rate(_Selector):
    """Each agent acts with probability `p`, drawn per (run seed, round, agent, salt)."""

    kind: Literal["rate"] = "rate"
    p: float = Field(ge=0.0, le=1.0, allow_inf_nan=False)
    salt: int = 0  # another stream of draws (e.g. two rates in one run)

    def pick(self, ids, *, seed, round_, profiles, world=None):
        return uniform(seed, round_, ids, self.salt) < self.p


class Ids(_Selector):
    """Exactly these agents."""

    kind: Literal["ids"] = "ids"
    ids: list[Annotated[int, Field(ge=0)]]

    @field_validator("ids")
    @classmethod
    def _sorted(cls, v: list[int]) -> list[int]:
        return sorted(set(v))

    def pick(self, ids, *, seed, round_, profiles, world=None):
        return np.isin(ids, np.asarray(self.ids, dtype=np.int64))

    def check(self, agents: int, world: World | None = None) -> None:
        if self.ids and self.ids[-1] >= agents:
            raise SelectionError(f"ids: agent {self.ids[-1]} does not exist (the run has {agents} agents, "
                                 f"0..{agents - 1})")


class Mask(_Selector):
    """One bit per agent of the run (packed, base64 on the wire)."""

    kind: Literal["mask"] = "mask"
    size: int = Field(ge=0)
    bits: str  # base64 of numpy.packbits(mask)

    def array(self) -> np.ndarray:
        packed = np.frombuffer(base64.b64decode(self.bits), dtype=np.uint8)
        return np.unpackbits(packed, count=self.size).astype(bool)

    def pick(self, ids, *, seed, round_, profiles, world=None):
        full = self.array()
        out = np.zeros(ids.size, dtype=bool)
        inside = ids < full.size
        out[inside] = full[ids[inside]]
        return out

    def check(self, agents: int, world: World | None = None) -> None:
        if self.size != agents:
            raise SelectionError(f"mask: {self.size} values for the run's {agents} agents")


class Where(_Selector):
    """Agents whose persona profile has, for every attribute named, one of the values given
    (a run without a population selects nobody)."""

    kind: Literal["where"] = "where"
    attributes: dict[str, list[Any]] = Field(min_length=1)

    def pick(self, ids, *, seed, round_, profiles, world=None):
        if profiles is None:
            return np.zeros(ids.size, dtype=bool)
        wanted = {k: set(map(_hashable, v)) for k, v in self.attributes.items()}
        return np.fromiter((all(_hashable(profiles[i].get(k)) in vals for k, vals in wanted.items())
                            for i in ids.tolist()), dtype=bool, count=ids.size)


class RateBy(_Selector):
    """Each agent acts with a probability set by one attribute of its persona profile (an
    activity level): `rates[value]`, else `default`; drawn per (run seed, round, agent, salt)."""

    kind: Literal["rate-by"] = "rate-by"
    attribute: str = Field(min_length=1)
    rates: dict[str, Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)]]
    default: float = Field(0.0, ge=0.0, le=1.0, allow_inf_nan=False)
    salt: int = 0

    def pick(self, ids, *, seed, round_, profiles, world=None):
        if profiles is None:
            p = np.full(ids.size, self.default)
        else:
            rates, default, attr = self.rates, self.default, self.attribute
            p = np.fromiter((rates.get(str(profiles[i].get(attr)), default) for i in ids.tolist()),
                            dtype=np.float64, count=ids.size)
        return uniform(seed, round_, ids, self.salt) < p


class Column(_Selector):
    """Agents whose value in a per-agent column of the round's world is true (non-zero): read on
    each host from the world it plays the round in, so it costs a few bytes on the wire for any
    number of agents (a mask of 10 million would not fit a round's message)."""

    kind: Literal["column"] = "column"
    name: str = Field(min_length=1)

    def pick(self, ids, *, seed, round_, profiles, world=None):
        if world is None:  # refused by check() where the round is decided; a host never plays one
            raise SelectionError(f"column {self.name!r}: the round has no world to read it from")
        return np.asarray(getattr(world, self.name))[ids] != 0

    def check(self, agents: int, world: World | None = None) -> None:
        if world is None:
            raise SelectionError(f"column {self.name!r}: the simulation has no World (declare one, or select "
                                 "with mask(...))")
        col = type(world).columns.get(self.name)
        if col is None:
            raise SelectionError(f"column {self.name!r} is not a column of {type(world).__name__} "
                                 f"({', '.join(type(world).columns) or 'none'})")
        if col.size != "agents" or col.dtype == "string":
            raise SelectionError(f"column {self.name!r} is a {col.dtype} column of size {col.size!r}: select reads "
                                 "a bool or number per agent (size 'agents')")


Selector = Annotated[Everyone | Rate | RateBy | Ids | Mask | Where | Column, Field(discriminator="kind")]
_ADAPTER: TypeAdapter = TypeAdapter(Selector)


def _hashable(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def uniform(seed: int, round_: int, ids: np.ndarray, salt: int = 0) -> np.ndarray:
    """A uniform draw in [0, 1) per agent id, from splitmix64 of (seed, round, agent, salt):
    vectorised, and the same on every process (numpy's uint64 arithmetic wraps like C's)."""
    with np.errstate(over="ignore"):
        base = np.uint64((seed * 0x9E3779B97F4A7C15 + round_ * 0xBF58476D1CE4E5B9
                          + salt * 0xD6E8FEB86659FD93 + 0x5851F42D4C957F2D) & ((1 << 64) - 1))
        z = base + ids.astype(np.uint64) * np.uint64(0x94D049BB133111EB)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53)


# -- what an author writes --------------------------------------------------------------------
def everyone() -> Everyone:
    return Everyone()


def rate(p: float, salt: int = 0) -> Rate:
    return Rate(p=p, salt=salt)


def rate_by(attribute: str, rates: Mapping[str, float], default: float = 0.0, salt: int = 0) -> RateBy:
    """`rate_by("activity", {"high": 0.5, "low": 0.02}, default=0.1)`: per-persona activity."""
    return RateBy(attribute=attribute, rates={str(k): v for k, v in rates.items()}, default=default, salt=salt)


def ids(agent_ids: Iterable[int]) -> Ids:
    return Ids(ids=[int(i) for i in agent_ids])


def mask(values: Sequence[bool] | np.ndarray) -> Mask:
    arr = np.asarray(values, dtype=bool)
    return Mask(size=int(arr.size), bits=base64.b64encode(np.packbits(arr).tobytes()).decode())


def column(name: str) -> Column:
    """`column("alive")`: the agents whose value in the world's per-agent column `alive` is true
    (non-zero) in the round they would play (from `select(state, round, world)`)."""
    return Column(name=name)


def where(**attributes: Any) -> Where:
    """`where(education=["PhD", "Master"], region="north")`: a single value or a list per attribute."""
    return Where(attributes={k: list(v) if isinstance(v, (list, tuple, set)) else [v] for k, v in attributes.items()})


# -- for the platform -------------------------------------------------------------------------
def to_wire(selector: _Selector | None) -> dict | None:
    """JSON for the round's announcement (None: everyone)."""
    if selector is None or isinstance(selector, Everyone):
        return None
    return selector.model_dump(mode="json")


def from_wire(data: dict | None) -> _Selector | None:
    return None if data is None else _ADAPTER.validate_python(data)


def checked(selector: Any, agents: int, where_: str, world: World | None = None) -> _Selector | None:
    """The environment's selector, refused with SelectionError (naming `where_`) when it is not
    one or names what the run (or the round's world) does not have."""
    if selector is None:
        return None
    if not isinstance(selector, _Selector):
        raise SelectionError(f"{where_} returned {type(selector).__name__}, not a selector of populace.sdk.select "
                             "(rate, rate_by, ids, mask, where, column, everyone) or None")
    try:
        selector.check(agents, world)
    except SelectionError as err:
        raise SelectionError(f"{where_}: {err}") from None
    return selector


def takes(method: Any, n: int) -> bool:
    """Whether a hook (a bound method, or a function with `self` first) accepts `n` positional
    arguments: how the engine tells `select(state, round)` from `select(state, round, world)` and
    `wakes(obs)` from `wakes(obs, view)`, so packages written for the older hook keep working."""
    import inspect

    try:
        params = list(inspect.signature(method).parameters.values())
    except (TypeError, ValueError):  # a builtin or C callable: the older hook
        return False
    if not inspect.ismethod(method) and params and params[0].name == "self":
        params = params[1:]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= n
