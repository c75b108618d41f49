"""Populations that change: agents die, leave, are born or arrive during a run (the SDK's
`populace.sdk.population` gives authors these; the platform's services read a population's
bytes from here).

An environment's `decide` may return, after its other values, the round's `Changes`:

    from populace.sdk import Birth, Changes

    def decide(self, state, round, total, world):
        starving = ...                                   # agent ids
        return state, summary, world, Changes(died=starving, reason="starved",
                                              born=[Birth(state={"sugar": 5})])

Departures take effect after the round that decides them: a departed agent never plays, is
never selected, reduced, recorded or interviewed again, and costs its host nothing. Newcomers
get the next ids in the order given (`born` first, then `arrived`): the i-th gets
`self.population.size + i`; ids are never reused. A scenario can schedule changes too
(`population: changes:`), applied after the environment's own. Who is alive is the platform's:
every hook of the environment reads it as `self.population` (a `Population`).

Everything here is pure and seeded by (run seed, round), never by placement or arrival order:
one process, the fleet and a resumed run draw the same departures and give the same ids.
"""

from __future__ import annotations

import functools
import json
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from pydantic_core import from_json, to_json

from populace.core.checkpoint_rows import FRESH as FRESH_MARK
from populace.core.checkpoint_rows import GONE as GONE_MARK

# The events of table `population`, in the order their codes are stored.
EVENTS = ("born", "arrived", "died", "left")
BORN, ARRIVED, DIED, LEFT = range(4)
REASON_CHARS = 200
MAX_IDS = 100_000_000  # an agent id is below this on every wire (populace.core.contracts.AgentId)
# In a checkpoint, True for an agent that departed before its round (its other fields None): the
# agents it keeps are those that played the round, who answer an interview after it; and for a
# newcomer that has not acted yet, born as its agent class makes one (its other fields None): it
# is made again as its class makes it, never from those Nones
GONE, FRESH = GONE_MARK, FRESH_MARK


class ChangeError(ValueError):
    """Changes that cannot apply to the population, or bytes that are not a population's (the
    message names the field, round and agent)."""


@dataclass(frozen=True)
class Birth:
    """One newcomer: its declared state as a checkpoint holds it (`Agent.state_fields`, e.g.
    {"sugar": 5}; fields not given keep what the agent class starts with) and why it came."""

    state: Mapping[str, Any] = field(default_factory=dict)
    reason: str = ""


def _reason(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ChangeError(f"{where}: a reason is text, not {type(value).__name__}")
    if len(value) > REASON_CHARS:
        raise ChangeError(f"{where}: a reason of {len(value)} characters (at most {REASON_CHARS})")
    return value


class Changes:
    """What a round changes in the population (see the module's docstring).

    `died`, `left`: agent ids (a list, a numpy array) or {agent id: reason}; `born`, `arrived`:
    how many (each starts as its agent class makes it) or `Birth`s; `reason`: for every entry
    that gives none. Changes add up: `Changes(died=a) + Changes(born=3)`."""

    __slots__ = ("birth_events", "birth_reasons", "birth_states", "departed", "departed_events",
                 "departed_reasons", "reasons")

    def __init__(self, *, died: Iterable[int] | Mapping[int, str] = (), left: Iterable[int] | Mapping[int, str] = (),
                 born: int | Iterable[Birth] = 0, arrived: int | Iterable[Birth] = 0, reason: str = "") -> None:
        reasons: dict[str, int] = {}

        def code(text: str) -> int:
            return reasons.setdefault(text, len(reasons))

        default = code(_reason(reason, "reason"))
        ids: list[np.ndarray] = []
        events: list[np.ndarray] = []
        why: list[np.ndarray] = []
        for name, event, given in (("died", DIED, died), ("left", LEFT, left)):
            if isinstance(given, Mapping):
                arr = np.fromiter((_agent_id(k, name) for k in given), dtype=np.int64, count=len(given))
                codes = np.fromiter((code(_reason(v, f"{name}.{k}") or reason) for k, v in given.items()),
                                    dtype=np.int32, count=len(given))
            else:
                arr = _ids(given, name)
                codes = np.full(arr.size, default, dtype=np.int32)
            ids.append(arr)
            events.append(np.full(arr.size, event, dtype=np.uint8))
            why.append(codes)
        self.departed = np.concatenate(ids)
        self.departed_events = np.concatenate(events)
        self.departed_reasons = np.concatenate(why)
        b_events: list[int] = []
        b_reasons: list[int] = []
        states: list[Mapping[str, Any] | None] = []
        for name, event, given in (("born", BORN, born), ("arrived", ARRIVED, arrived)):
            if isinstance(given, bool) or not isinstance(given, (int, Iterable)) or isinstance(given, (str, bytes)):
                raise ChangeError(f"{name}: how many newcomers (an int) or Birth objects, not {given!r}")
            if isinstance(given, int):
                if given < 0:
                    raise ChangeError(f"{name}: {given} newcomers (at least 0)")
                b_events += [event] * given
                b_reasons += [default] * given
                states += [None] * given
                continue
            for i, b in enumerate(given):
                if not isinstance(b, Birth):
                    raise ChangeError(f"{name}.{i}: a populace.sdk.Birth, not {type(b).__name__}")
                if not isinstance(b.state, Mapping):
                    raise ChangeError(f"{name}.{i}.state: a mapping of state fields, not {type(b.state).__name__}")
                b_events.append(event)
                b_reasons.append(code(_reason(b.reason, f"{name}.{i}.reason") or reason))
                states.append(dict(b.state) if b.state else None)
        self.birth_events = np.asarray(b_events, dtype=np.uint8)
        self.birth_reasons = np.asarray(b_reasons, dtype=np.int32)
        # None: every newcomer as its class makes it (a count, or Births without a state)
        self.birth_states: list[Mapping[str, Any] | None] | None = \
            states if any(st is not None for st in states) else None
        self.reasons: tuple[str, ...] = tuple(reasons)

    @property
    def births(self) -> int:
        return int(self.birth_events.size)

    def __bool__(self) -> bool:
        return bool(self.departed.size or self.birth_events.size)

    def __add__(self, other: Changes) -> Changes:
        if not isinstance(other, Changes):
            return NotImplemented
        out = Changes()
        table = {r: i for i, r in enumerate(self.reasons)}
        remap = np.asarray([table.setdefault(r, len(table)) for r in other.reasons] or [0], dtype=np.int32)
        out.reasons = tuple(table)
        out.departed = np.concatenate([self.departed, other.departed])
        out.departed_events = np.concatenate([self.departed_events, other.departed_events])
        out.departed_reasons = np.concatenate([self.departed_reasons, remap[other.departed_reasons]])
        out.birth_events = np.concatenate([self.birth_events, other.birth_events])
        out.birth_reasons = np.concatenate([self.birth_reasons, remap[other.birth_reasons]])
        if self.birth_states is None and other.birth_states is None:
            out.birth_states = None
        else:
            out.birth_states = [*(self.birth_states or [None] * self.births),
                                *(other.birth_states or [None] * other.births)]
        return out

    def __repr__(self) -> str:
        counts = [f"{EVENTS[e]}={int(n)}" for e, n in zip(*np.unique(np.concatenate(
            [self.departed_events, self.birth_events]), return_counts=True))]
        return f"Changes({', '.join(counts)})"


def _agent_id(value: object, where: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ChangeError(f"{where}: agent ids are whole numbers, not {value!r}")
    return int(value)


def _ids(values: Iterable[int], where: str) -> np.ndarray:
    if isinstance(values, np.ndarray):
        if values.dtype == bool or not np.issubdtype(values.dtype, np.integer):
            raise ChangeError(f"{where}: agent ids are whole numbers, not an array of {values.dtype}")
        return values.astype(np.int64, copy=False).reshape(-1)
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ChangeError(f"{where}: agent ids (a list or array), not {values!r}")
    return np.fromiter((_agent_id(v, where) for v in values), dtype=np.int64)


@dataclass(frozen=True)
class Delta:
    """The changes one round made, as applied: departures sorted by agent id, newcomers from
    `born_first` on in the order given (what table `population` records for the round)."""

    round: int
    departed: np.ndarray  # int64, sorted
    departed_events: np.ndarray  # uint8 codes of EVENTS
    departed_reasons: np.ndarray  # int32 codes of `reasons`
    born_first: int
    birth_events: np.ndarray
    birth_reasons: np.ndarray
    birth_states: list[Mapping[str, Any] | None] | None  # None: every newcomer as its class makes it
    reasons: tuple[str, ...]
    prior: int = 0  # the round of the population these changes were made to (0: the run's first agents)

    @property
    def births(self) -> int:
        return int(self.birth_events.size)

    def born_state(self, agent_id: int) -> Mapping[str, Any] | None:
        if self.birth_states is None:
            return None
        return self.birth_states[agent_id - self.born_first]

    def rows(self) -> dict[str, list]:
        """Table `population`'s columns for this round (run_id left out): departures, then births."""
        ids = [*self.departed.tolist(), *range(self.born_first, self.born_first + self.births)]
        events = [EVENTS[e] for e in (*self.departed_events.tolist(), *self.birth_events.tolist())]
        reasons = [self.reasons[r] for r in (*self.departed_reasons.tolist(), *self.birth_reasons.tolist())]
        return {"round": [self.round] * len(ids), "agent_id": ids, "event": events, "reason": reasons}


class Population:
    """Who is alive (the platform's, read by the environment as `self.population`): the run's
    first `initial` agents, every id given so far (`size`: the next newcomer's id), and a mask
    of the living. `delta`: the changes of round `round`, the last that changed anything."""

    __slots__ = ("_alive", "count", "delta", "initial", "size")

    def __init__(self, initial: int, alive: np.ndarray, delta: Delta | None = None, count: int | None = None) -> None:
        alive = np.asarray(alive, dtype=bool)
        alive.flags.writeable = False
        self.initial, self.size, self._alive, self.delta = initial, int(alive.size), alive, delta
        self.count = int(np.count_nonzero(alive)) if count is None else count  # how many are alive

    @classmethod
    def start(cls, agents: int) -> Population:
        """The run's first `agents`, all alive (one shared read-only object per size: every
        environment holds one, and a run that never changes decides every round with it)."""
        return _start(agents)

    @property
    def round(self) -> int:
        """The last round that changed the population (0: none)."""
        return self.delta.round if self.delta is not None else 0

    @property
    def alive(self) -> np.ndarray:
        """One bool per id given so far (read-only)."""
        return self._alive

    @property
    def changed(self) -> bool:
        return self.delta is not None

    def ids(self) -> np.ndarray:
        """The living agents' ids (int64, sorted)."""
        return np.flatnonzero(self._alive)

    def is_alive(self, agent_id: int) -> bool:
        return 0 <= agent_id < self.size and bool(self._alive[agent_id])

    def played(self, round_: int) -> np.ndarray:
        """The mask (over ids up to `size`) of the agents that played round `round_` had they
        been selected: the living before its changes (those who departed after it included,
        those born after it not)."""
        d = self.delta
        if d is None or d.round != round_:
            return self._alive
        mask = self._alive.copy()
        mask[d.departed] = True
        mask[d.born_first:] = False
        return mask

    def after(self, changes: Changes, round_: int, *, state_fields: Sequence[str] | None = None,
              personas: int | None = None) -> Population:
        """The population after `changes` in round `round_` (self, when they change nothing).
        ChangeError names the first change that cannot apply: an agent that is not alive
        (or not in the run) departing, one departing twice, a newcomer's state naming a field
        its class does not declare (`state_fields`) or that cannot travel as JSON, a newcomer
        without a persona (`personas`: how many the run has; None: the run has none)."""
        if not changes:
            return self
        where = f"round {round_}"
        ids = changes.departed
        if ids.size:
            bad = ids[(ids < 0) | (ids >= self.size)]
            if bad.size:
                raise ChangeError(f"{where}, agent {int(bad[0])}: departs but is not in the run (ids 0.."
                                      f"{self.size - 1} so far)")
            order = np.argsort(ids, kind="stable")
            ids = ids[order]
            twice = ids[1:][ids[1:] == ids[:-1]]
            if twice.size:
                raise ChangeError(f"{where}, agent {int(twice[0])}: departs twice (in `died` and `left`, or listed "
                                      "twice)")
            gone = ids[~self._alive[ids]]
            if gone.size:
                raise ChangeError(f"{where}, agent {int(gone[0])}: departs but departed already")
            events, reasons = changes.departed_events[order], changes.departed_reasons[order]
        else:
            events, reasons = changes.departed_events, changes.departed_reasons
        born = changes.births
        size = self.size + born
        if size > MAX_IDS:
            raise ChangeError(f"{where}: {born:,} newcomers would take agent ids past {MAX_IDS - 1:,}")
        states = changes.birth_states
        if states is not None:
            _check_states(states, self.size, where, state_fields)
        if personas is not None and size > personas:
            first = max(self.size, personas)
            raise ChangeError(f"{where}, agent {first}: born without a persona: population.newcomers: the run has "
                                  f"{personas:,} personas for agents 0..{personas - 1}; declare more newcomers")
        alive = np.concatenate([self._alive, np.ones(born, dtype=bool)]) if born else self._alive.copy()
        alive[ids] = False
        delta = Delta(round_, ids, events, reasons, self.size, changes.birth_events, changes.birth_reasons, states,
                      changes.reasons, self.round)
        return Population(self.initial, alive, delta, count=self.count - int(ids.size) + born)

    # -- as a checkpoint object holds it ----------------------------------------------------------
    def to_bytes(self) -> bytes:
        d = self.delta
        parts = [("alive", zlib.compress(np.packbits(self._alive).tobytes(), 1))]
        header: dict[str, Any] = {"initial": self.initial, "size": self.size}
        if d is not None:
            header.update(round=d.round, born_first=d.born_first, reasons=list(d.reasons), prior=d.prior)
            # sorted ids as their steps, and codes that repeat: a few bytes per departure once compressed
            steps = np.diff(d.departed, prepend=np.int64(0)).astype("<i8")
            parts += [(name, zlib.compress(data, 1)) for name, data in (
                ("departed", steps.tobytes()), ("departed_events", d.departed_events.tobytes()),
                ("departed_reasons", d.departed_reasons.astype("<i4").tobytes()),
                ("birth_events", d.birth_events.tobytes()),
                ("birth_reasons", d.birth_reasons.astype("<i4").tobytes()))]
            if d.birth_states is not None:
                parts.append(("birth_states", to_json(d.birth_states)))
        header["parts"] = [[name, len(data)] for name, data in parts]
        head = json.dumps(header, separators=(",", ":")).encode()
        return b"".join([_MAGIC, struct.pack("<I", len(head)), head, *(data for _, data in parts)])

    @classmethod
    def from_bytes(cls, data: bytes) -> Population:
        """ChangeError when `data` is not a population's bytes."""
        try:
            if not data.startswith(_MAGIC):
                raise ValueError("not a population object")
            at = len(_MAGIC)
            (n,) = struct.unpack_from("<I", data, at)
            header = json.loads(data[at + 4:at + 4 + n])
            at += 4 + n
            parts: dict[str, bytes] = {}
            for name, length in header["parts"]:
                parts[name] = data[at:at + length]
                at += length
            size = int(header["size"])
            alive = np.unpackbits(np.frombuffer(zlib.decompress(parts["alive"]), dtype=np.uint8),
                                  count=size).astype(bool)
            delta = None
            if "round" in header:
                states = from_json(parts["birth_states"]) if "birth_states" in parts else None

                def arr(name: str, dtype: str) -> np.ndarray:
                    return np.frombuffer(zlib.decompress(parts[name]), dtype=dtype)

                delta = Delta(int(header["round"]), np.cumsum(arr("departed", "<i8")).astype(np.int64),
                              arr("departed_events", "u1").astype(np.uint8),
                              arr("departed_reasons", "<i4").astype(np.int32), int(header["born_first"]),
                              arr("birth_events", "u1").astype(np.uint8), arr("birth_reasons", "<i4").astype(np.int32),
                              states, tuple(header["reasons"]), int(header.get("prior", 0)))
            return cls(int(header["initial"]), alive, delta)
        except (ValueError, KeyError, TypeError, struct.error, zlib.error) as err:
            raise ChangeError(f"not a population object: {err}") from None


_MAGIC = b"POPULACE-POPULATION1\n"


@functools.lru_cache(maxsize=8)
def _start(agents: int) -> Population:
    return Population(agents, np.ones(agents, dtype=bool))


def _check_states(states: list[Mapping[str, Any] | None], first: int, where: str,
                  state_fields: Sequence[str] | None) -> None:
    declared = set(state_fields) if state_fields is not None else None
    for i, state in enumerate(states):
        if state is None:
            continue
        strange = [k for k in state if not isinstance(k, str) or (declared is not None and k not in declared)]
        if strange:
            listed = ", ".join(sorted(declared or ()))
            raise ChangeError(f"{where}, agent {first + i}: births.{i}.state: {strange[0]!r} is not one of the "
                                  f"agent's state_fields ({listed})")
        try:
            to_json(state)
        except ValueError as err:  # pydantic-core's: what cannot travel as JSON
            raise ChangeError(f"{where}, agent {first + i}: births.{i}.state cannot travel as JSON: "
                                  f"{err}") from None


def scheduled(changes: Sequence[Any], population: Population, round_: int, seed: int,
              leaving: np.ndarray | None = None) -> Changes:
    """The scenario's scheduled changes after round `round_` (`population.changes` entries: `after`,
    `died`/`left` shares of the living, `born`/`arrived` counts, `reason`), drawn among the living
    not already `leaving` (ids departing this round by the environment's own changes): each of
    them departs with the share's probability, one seeded draw each in id order (numpy's PCG64,
    seeded by (run seed, round, entry))."""
    out = Changes()
    taken = np.zeros(population.size, dtype=bool)
    if leaving is not None and leaving.size:
        taken[leaving] = True
    for k, entry in enumerate(changes):
        if not entry.applies(round_):
            continue
        rng = np.random.default_rng([seed, round_, k, 0x504F50])  # "POP": a stream of its own
        died = left = np.empty(0, dtype=np.int64)
        for name in ("died", "left"):
            share = getattr(entry, name)
            if not share:
                continue
            pool = np.flatnonzero(population.alive & ~taken)
            picked = pool[bernoulli(rng, pool.size, share)]
            taken[picked] = True
            if name == "died":
                died = picked
            else:
                left = picked
        out = out + Changes(died=died, left=left, born=entry.born or 0, arrived=entry.arrived or 0,
                            reason=entry.reason)
    return out


def bernoulli(rng: np.random.Generator, n: int, p: float) -> np.ndarray:
    """The sorted indices below `n` of successes in n Bernoulli(p) trials, drawn as the gaps
    between them (geometric): about n·p draws, not n (1% of 10 million agents: 100,000)."""
    if p >= 1:
        return np.arange(n)
    if p <= 0 or n == 0:
        return np.empty(0, dtype=np.int64)
    out, at = [], -1
    while True:
        k = int((n - at) * p * 1.1) + 64
        pos = at + np.cumsum(rng.geometric(p, size=k))
        out.append(pos[pos < n])
        if pos[-1] >= n:
            return np.concatenate(out).astype(np.int64)
        at = int(pos[-1])


def combined_rows(deltas: Iterable[Delta], run_id: str) -> dict[str, list]:
    """Table `population` (run_id, round, agent_id, event, reason) from rounds' deltas, in order."""
    out: dict[str, list] = {"run_id": [], "round": [], "agent_id": [], "event": [], "reason": []}
    for d in deltas:
        rows = d.rows()
        out["run_id"].extend([run_id] * len(rows["agent_id"]))
        for key, values in rows.items():
            out[key].extend(values)
    return out
