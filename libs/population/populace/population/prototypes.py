"""Prototypes: who stands for whom when only some agents call the model (a scenario's
`prototypes:` section). Pure and vectorised (numpy), seeded by the run and never by arrival
order or placement: every agent-host, the environment, the recorder and the local runner draw
the same thing from the same inputs.

- **Membership.** An agent's prototype is the values of the persona attributes `by` names
  (`education=phd`); no attributes: one prototype, `all`. Labels are sorted, so prototype
  indices are the same wherever they are computed.
- **Representatives.** In each prototype of `n` agents, `k = min(n, max(minimum, ceil(share · n)))`
  agents call the model: those with the `k` smallest seeded hashes of (seed, agent) — or of
  (seed, round, agent) when they are drawn again every round. Raising a share keeps the
  representatives there were and adds others (the same order, a longer prefix).
- **Draws.** Every other agent of a prototype copies the answer of one of its representatives:
  `reps[floor(u · k)]`, `u` a seeded uniform of (seed, round, agent) and `reps` the prototype's
  representatives by id. A representative whose answer is invalid is never copied: its draws go
  to the next valid representative of its prototype (by id, wrapping round); a prototype with no
  valid representative has nothing to copy (`NO_SOURCE`).
- **Audits.** In each prototype, the `audits` non-representatives with the smallest hashes of
  (seed, round, agent) also call the model, on a copy of their state: their answers measure the
  error of the draws and never change the run.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

ALL = "all"  # the label of the one prototype of a run whose `by` names no attribute
NO_SOURCE = -2  # a drawn agent whose prototype has no valid representative to copy
REPRESENTATIVE = -1  # sources(): the agent answered itself

_MASK = (1 << 64) - 1


def _salt(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


SALT_REPRESENTATIVES = _salt("prototypes.representatives")
SALT_DRAWS = _salt("prototypes.draws")
SALT_AUDITS = _salt("prototypes.audits")


class PrototypeError(ValueError):
    """A `prototypes:` section the run's agents cannot have (its message starts with the field)."""


def hashes(seed: int, salt: int, round_: int, ids: np.ndarray) -> np.ndarray:
    """A uint64 per agent id: splitmix64 of (seed, salt, round, agent), vectorised."""
    with np.errstate(over="ignore"):
        base = np.uint64((seed * 0x9E3779B97F4A7C15 + salt * 0xD6E8FEB86659FD93 + round_ * 0xA24BAED4963EE407
                          + 0x2545F4914F6CDD1D) & _MASK)
        z = np.asarray(ids).astype(np.uint64)  # a copy, then every step in place: ten million at a time
        z *= np.uint64(0x94D049BB133111EB)
        z += base
        t = z >> np.uint64(30)
        z ^= t
        z *= np.uint64(0xBF58476D1CE4E5B9)
        np.right_shift(z, np.uint64(27), out=t)
        z ^= t
        z *= np.uint64(0x94D049BB133111EB)
        np.right_shift(z, np.uint64(31), out=t)
        z ^= t
        return z


def uniforms(seed: int, salt: int, round_: int, ids: np.ndarray) -> np.ndarray:
    """A uniform in [0, 1) per agent id (the top 53 bits of its hash)."""
    z = hashes(seed, salt, round_, ids)
    z >>= np.uint64(11)
    u = z.astype(np.float64)
    u *= 1.0 / float(1 << 53)
    return u


def _value_text(value: Any) -> str:
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


@dataclass(frozen=True)
class Membership:
    """Who is in which prototype: `of[agent]` indexes `labels`; `members` lists the agent ids
    prototype by prototype (ascending ids in each), `starts[p]:starts[p + 1]` being prototype p's."""

    of: np.ndarray  # int32, one per agent
    labels: tuple[str, ...]
    members: np.ndarray  # int64 agent ids, grouped by prototype
    starts: np.ndarray  # int64, len(labels) + 1

    @property
    def agents(self) -> int:
        return int(self.of.size)

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    def of_prototype(self, p: int) -> np.ndarray:
        return self.members[self.starts[p]:self.starts[p + 1]]

    def index(self, label: str) -> int | None:
        try:
            return self.labels.index(label)
        except ValueError:
            return None


def membership(agents: int, by: Sequence[str] = (), profiles: Sequence[Mapping[str, Any]] | None = None
               ) -> Membership:
    """Each of `agents` agents' prototype, from the persona attributes `by` names (`profiles`:
    agent i's persona profile at i). PrototypeError (`prototypes.by: …`) when a persona lacks one."""
    if not by:
        of = np.zeros(agents, dtype=np.int32)
        return Membership(of, (ALL,), np.arange(agents, dtype=np.int64), np.array([0, agents], dtype=np.int64))
    if profiles is None:
        raise PrototypeError(f"prototypes.by: {list(by)} names persona attributes, but the run has no population "
                             "(add `population:`, or drop `by` for one prototype of every agent)")
    if len(profiles) < agents:
        raise PrototypeError(f"prototypes.by: {len(profiles)} personas for {agents} agents")
    keys: dict[tuple[str, ...], int] = {}
    raw = np.empty(agents, dtype=np.int32)
    for i in range(agents):
        profile = profiles[i]
        try:
            key = tuple(_value_text(profile[a]) for a in by)
        except KeyError:
            missing = next(a for a in by if a not in profile)
            known = ", ".join(sorted(map(str, profile))) or "none"
            raise PrototypeError(f"prototypes.by: {missing!r} is not an attribute of agent {i}'s persona "
                                 f"(its attributes: {known})") from None
        raw[i] = keys.setdefault(key, len(keys))
    labels = [", ".join(f"{a}={v}" for a, v in zip(by, key)) for key in keys]
    order = sorted(range(len(labels)), key=labels.__getitem__)
    rank = np.empty(len(labels), dtype=np.int32)
    rank[order] = np.arange(len(labels), dtype=np.int32)
    of = rank[raw]
    members = np.argsort(of, kind="stable").astype(np.int64)
    starts = np.zeros(len(labels) + 1, dtype=np.int64)
    np.cumsum(np.bincount(of, minlength=len(labels)), out=starts[1:])
    return Membership(of, tuple(labels[i] for i in order), members, starts)


def representative_counts(sizes: np.ndarray, shares: np.ndarray, minimum: int) -> np.ndarray:
    """Representatives per prototype: min(size, max(minimum, ceil(share · size)))."""
    want = np.ceil(np.asarray(shares, dtype=np.float64) * sizes - 1e-9).astype(np.int64)
    return np.minimum(np.asarray(sizes, dtype=np.int64), np.maximum(minimum, want))


def _smallest(ids: np.ndarray, keys: np.ndarray, k: int) -> np.ndarray:
    """The `k` of `ids` with the smallest keys (ties: the smaller id), ascending ids."""
    if k >= ids.size:
        return ids
    if k <= 0:
        return ids[:0]
    cut = np.partition(keys, k - 1)[k - 1]
    below = ids[keys < cut]
    at = ids[keys == cut]  # ids ascend within a prototype: the smallest go first
    return np.sort(np.concatenate([below, at[:k - below.size]]))


def representatives(m: Membership, shares: np.ndarray | float, minimum: int, seed: int,
                    round_: int | None = None) -> np.ndarray:
    """A boolean per agent: whether it calls the model. `shares`: per prototype (or one for
    all); `round_`: None keeps the same representatives every round (raised shares add to them),
    a round draws them again for that round."""
    shares = np.broadcast_to(np.asarray(shares, dtype=np.float64), (len(m.labels),))
    counts = representative_counts(m.sizes, shares, minimum)
    keys = hashes(seed, SALT_REPRESENTATIVES, -1 if round_ is None else round_, np.arange(m.agents))
    out = np.zeros(m.agents, dtype=bool)
    if len(m.labels) == 1:  # one prototype: its ids are every agent's, in order
        out[_smallest(m.members, keys, int(counts[0]))] = True
        return out
    for p, k in enumerate(counts.tolist()):
        ids = m.of_prototype(p)
        out[_smallest(ids, keys[ids], k)] = True
    return out


def audited(m: Membership, is_rep: np.ndarray, per_prototype: int, seed: int, round_: int) -> np.ndarray:
    """A boolean per agent: whether it is audited in `round_` (`per_prototype` non-representatives
    of each prototype, fewer when it has fewer)."""
    out = np.zeros(m.agents, dtype=bool)
    if per_prototype <= 0:
        return out
    keys = hashes(seed, SALT_AUDITS, round_, np.arange(m.agents))
    keys[is_rep] = np.iinfo(np.uint64).max  # never audited: the last of any order
    for p in range(len(m.labels)):
        ids = m.of_prototype(p)
        k = min(per_prototype, int((~is_rep[ids]).sum()))
        out[_smallest(ids, keys if len(m.labels) == 1 else keys[ids], k)] = True
    return out


@dataclass(frozen=True)
class Pools:
    """Each prototype's representatives by id, all prototypes in one array: prototype p's are
    `reps[starts[p]:starts[p + 1]]`. A draw is an index into `reps` (a pool position)."""

    reps: np.ndarray  # int64 agent ids
    starts: np.ndarray  # int64, prototypes + 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.starts)

    def prototype_of(self) -> np.ndarray:
        """The prototype of each pool position."""
        return np.repeat(np.arange(self.sizes.size, dtype=np.int32), self.sizes)


def pools(m: Membership, is_rep: np.ndarray) -> Pools:
    reps = m.members[is_rep[m.members]]  # grouped by prototype, ascending ids within each
    starts = np.zeros(len(m.labels) + 1, dtype=np.int64)
    np.cumsum(np.bincount(m.of[reps], minlength=len(m.labels)), out=starts[1:])
    return Pools(reps, starts)


def draw_positions(m: Membership, pool: Pools, ids: np.ndarray, seed: int, round_: int) -> np.ndarray:
    """The pool position each (non-representative) agent of `ids` draws in `round_`; -1 for an
    agent whose prototype has no representative at all."""
    ids = np.asarray(ids, dtype=np.int64)
    u = uniforms(seed, SALT_DRAWS, round_, ids)
    if pool.sizes.size == 1:  # one prototype: no per-agent lookups
        size = int(pool.sizes[0])
        if size == 0:
            return np.full(ids.size, -1, dtype=np.int64)
        u *= size
        return np.minimum(u.astype(np.int64), size - 1)
    protos = m.of[ids]
    size = pool.sizes[protos]
    u *= size
    j = np.minimum(u.astype(np.int64), np.maximum(size - 1, 0))
    j += pool.starts[protos]
    j[size == 0] = -1
    return j


def stand_ins(pool: Pools, valid: np.ndarray) -> np.ndarray:
    """For each pool position, the position whose answer a draw of it copies: itself when its
    answer is valid, else the next valid one of its prototype (by id, wrapping round); -1 when
    the prototype has no valid answer."""
    valid = np.asarray(valid, dtype=bool)
    out = np.full(pool.reps.size, -1, dtype=np.int64)
    for p in range(pool.sizes.size):
        lo, hi = int(pool.starts[p]), int(pool.starts[p + 1])
        ok = np.flatnonzero(valid[lo:hi])
        if ok.size == 0:
            continue
        nxt = np.searchsorted(ok, np.arange(hi - lo))
        nxt[nxt == ok.size] = 0  # past the last valid one: the first
        out[lo:hi] = lo + ok[nxt]
    return out


def sources(m: Membership, is_rep: np.ndarray, valid_reps: np.ndarray, seed: int, round_: int) -> np.ndarray:
    """Per agent of the run, whose answer it records in `round_`: REPRESENTATIVE (its own), the
    id of the representative it copies, or NO_SOURCE. `valid_reps`: per agent, whether its own
    answer is valid (read for representatives only)."""
    pool = pools(m, is_rep)
    stand = stand_ins(pool, np.asarray(valid_reps, dtype=bool)[pool.reps])
    out = np.full(m.agents, REPRESENTATIVE, dtype=np.int64)
    drawn = np.flatnonzero(~is_rep)
    pos = draw_positions(m, pool, drawn, seed, round_)
    final = np.where(pos >= 0, stand[np.maximum(pos, 0)], -1)
    out[drawn] = np.where(final >= 0, pool.reps[np.maximum(final, 0)], NO_SOURCE)
    return out


def tally_draws(positions: np.ndarray, ids: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(how many of `ids` drew each pool position, the smallest id that did: -1 for none)."""
    ok = positions >= 0
    positions, ids = positions[ok], np.asarray(ids, dtype=np.int64)[ok]
    counts = np.bincount(positions, minlength=size).astype(np.int64)
    first = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first, positions, ids)
    first[counts == 0] = -1
    return counts, first


def shares_of(m: Membership, base: float, raised: Mapping[str, float] | None) -> np.ndarray:
    """Per prototype, its share of representatives: `base`, or what the guard raised it to."""
    out = np.full(len(m.labels), float(base))
    for label, share in (raised or {}).items():
        p = m.index(label)
        if p is not None:
            out[p] = share
    return out


def smallest_prototype(m: Membership) -> tuple[str, int]:
    sizes = m.sizes
    p = int(np.argmin(sizes))
    return m.labels[p], int(sizes[p])


def expected_calls(m: Membership, shares: np.ndarray, minimum: int, audits: int) -> tuple[int, int]:
    """(representatives, audits) a round asks the model for, at these shares."""
    reps = representative_counts(m.sizes, shares, minimum)
    return int(reps.sum()), int(np.minimum(audits, m.sizes - reps).sum())


def calls_per_round(sizes: Sequence[int], share: float, minimum: int, audits: int) -> tuple[int, int]:
    """(representatives, audits) a round asks the model for, given each prototype's agents, at
    the configured share (before any guard raises one)."""
    n = np.asarray(list(sizes), dtype=np.int64)
    reps = representative_counts(n, np.full(n.size, float(share)), minimum)
    return int(reps.sum()), int(np.minimum(audits, n - reps).sum())


def share_needed(sizes: Sequence[int], share: float, minimum: int) -> float:
    """The overall share of agents calling the model (representatives only)."""
    n = int(sum(sizes))
    return sum(min(s, max(minimum, math.ceil(share * s - 1e-9))) for s in sizes) / n if n else 0.0


__all__ = ["ALL", "NO_SOURCE", "REPRESENTATIVE", "Membership", "Pools", "PrototypeError", "audited",
           "calls_per_round", "draw_positions", "expected_calls", "hashes", "membership", "pools",
           "representative_counts", "representatives", "shares_of", "sources", "stand_ins", "tally_draws", "uniforms"]
