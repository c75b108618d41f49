"""Choosing a replica for one LLM request. Pure: no I/O, no asyncio, deterministic given a seed.

Policies (`make_router(name)`):
- `round-robin`      cycles over the eligible replicas.
- `least-loaded`     power of two choices: samples two distinct eligible replicas with a seeded
                     `random.Random` and takes the one with the lower load (ties: either).
- `prefix-affinity`  consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam
                     2018): a request goes to the first eligible replica clockwise from its prefix
                     key's point on a hash ring whose load is below
                     `ceil(load_factor * (total_load + 1) / n_eligible)`. Requests sharing a
                     prompt prefix therefore land on the replica that already holds that prefix in
                     its KV cache, but no replica takes more than ~`load_factor` x the mean load: a
                     single shared system prompt (100% of traffic on one key) overflows along the
                     ring instead of landing on one replica.

A replica is *eligible* when it is healthy, not full (`in_flight < max_concurrency`, if capped)
and not in `exclude` (replicas already tried by a retry). No eligible replica -> `None`; the
caller queues or errors.

Routers keep small mutable state (a cycle position, a seeded RNG, a cached ring) and are meant
to be used from one thread / event loop. Replica ids are assumed unique within one call.
"""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_right
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, runtime_checkable

__all__ = [
    "ROUTER_NAMES", "DEFAULT_VNODES", "ReplicaLoad", "Router", "RoundRobinRouter",
    "LeastLoadedRouter", "PrefixAffinityRouter", "make_router", "prefix_key", "eligible_replicas",
]

ROUTER_NAMES = ("round-robin", "least-loaded", "prefix-affinity")
DEFAULT_VNODES = 128  # virtual nodes per replica on the prefix-affinity ring
_MAX_CACHED_RINGS = 16  # one gateway may route several backends, each with its own replica set


@dataclass(slots=True)
class ReplicaLoad:
    replica_id: str
    in_flight: int = 0  # requests this gateway has outstanding on the replica (never reset by health checks)
    waiting: int = 0  # replica-reported queue (vLLM num_requests_waiting / llama.cpp requests_deferred), may be stale
    max_concurrency: int = 0  # per-replica cap in this gateway; 0 = unlimited
    healthy: bool = True

    @property
    def load(self) -> int:
        return self.in_flight + self.waiting

    @property
    def full(self) -> bool:
        return self.max_concurrency > 0 and self.in_flight >= self.max_concurrency


@runtime_checkable
class Router(Protocol):
    name: str

    def choose(self, prefix_key: str, replicas: Sequence[ReplicaLoad],
               exclude: Collection[str] = ()) -> ReplicaLoad | None: ...


def eligible_replicas(replicas: Sequence[ReplicaLoad], exclude: Collection[str] = ()) -> list[ReplicaLoad]:
    """The replicas a request may go to now: healthy, not full, not excluded (in input order)."""
    if exclude:
        return [r for r in replicas if r.healthy and not r.full and r.replica_id not in exclude]
    return [r for r in replicas if r.healthy and not r.full]


# -- round-robin ---------------------------------------------------------------------------
class RoundRobinRouter:
    """Cycles over the replicas in the given order, skipping ineligible ones: with all eligible,
    r0 r1 r2 r3 r0 ...; with r1 down, r0 r2 r3 r0 .... The position is an index into the
    sequence, so pass the replicas in a stable order."""

    name = "round-robin"
    __slots__ = ("_next",)

    def __init__(self) -> None:
        self._next = 0

    def choose(self, prefix_key: str, replicas: Sequence[ReplicaLoad],
               exclude: Collection[str] = ()) -> ReplicaLoad | None:
        n = len(replicas)
        if n == 0:
            return None
        i = self._next % n
        for _ in range(n):
            r = replicas[i]
            if r.healthy and not r.full and not (exclude and r.replica_id in exclude):
                self._next = i + 1
                return r
            i += 1
            if i == n:
                i = 0
        return None


# -- least-loaded (power of two choices) ---------------------------------------------------
class LeastLoadedRouter:
    """Power of two choices: two distinct eligible replicas sampled uniformly at random (seeded),
    the one with the lower `load` wins; on a tie the first sample (itself random) wins. The most
    loaded eligible replica is therefore only chosen when it ties with its sampled rival."""

    name = "least-loaded"
    __slots__ = ("_rng",)

    def __init__(self, seed: int = 0) -> None:
        self._rng = random.Random(seed)

    def choose(self, prefix_key: str, replicas: Sequence[ReplicaLoad],
               exclude: Collection[str] = ()) -> ReplicaLoad | None:
        cands = eligible_replicas(replicas, exclude)
        m = len(cands)
        if m < 2:
            return cands[0] if m else None
        rng = self._rng
        i = rng.randrange(m)
        j = rng.randrange(m - 1)
        if j >= i:
            j += 1
        a, b = cands[i], cands[j]
        return b if b.load < a.load else a


# -- prefix-affinity (consistent hashing with bounded loads) -------------------------------
def _hash64(text: str) -> int:
    """Stable across processes and platforms (unlike the salted built-in `hash`)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")


class _Ring:
    """Sorted ring points for one set of replica ids, independent of their order."""

    __slots__ = ("hashes", "owners")

    def __init__(self, ids: frozenset[str], vnodes: int) -> None:
        points = sorted((_hash64(f"{rid}#{v}"), rid) for rid in ids for v in range(vnodes))
        self.hashes = [h for h, _ in points]
        self.owners = [rid for _, rid in points]


class PrefixAffinityRouter:
    """Consistent hashing with bounded loads.

    The ring has `vnodes` points per replica (blake2b of "<replica_id>#<i>"), built over every
    replica passed in (healthy or not), so health flapping and load changes never rebuild it and
    a replica going down only moves its own keys (to the next replica clockwise). Rings are
    cached per replica-id set; a call with the same ids in the same order as the previous call
    does no rebuilding at all.

    For a key, walk clockwise from blake2b(key) and take the first eligible replica whose load is
    below `capacity = ceil(load_factor * (total_load + 1) / n_eligible)` (total over eligible
    replicas). Since the least-loaded eligible replica is always below capacity (load_factor >= 1),
    the walk always succeeds. After placement, no replica's load exceeds that capacity.
    """

    name = "prefix-affinity"
    __slots__ = ("load_factor", "vnodes", "_num", "_den", "_rings", "_last_ids", "_hashes", "_walk")

    def __init__(self, load_factor: float = 1.25, vnodes: int = DEFAULT_VNODES) -> None:
        if not load_factor >= 1.0:  # also rejects NaN
            raise ValueError(f"load_factor must be >= 1 (got {load_factor!r})")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1 (got {vnodes!r})")
        self.load_factor = float(load_factor)
        self.vnodes = int(vnodes)
        # exact integer ceil: 1.25 -> 5/4, 1.1 -> 11/10 (no float rounding at exact multiples)
        frac = Fraction(self.load_factor).limit_denominator(1_000_000)
        self._num, self._den = frac.numerator, frac.denominator
        self._rings: dict[frozenset[str], _Ring] = {}
        self._last_ids: tuple[str, ...] | None = None
        self._hashes: list[int] = []
        self._walk: list[int] = []  # ring position -> index into replicas, doubled to walk without modulo

    def _sync(self, replicas: Sequence[ReplicaLoad]) -> None:
        ids = tuple(r.replica_id for r in replicas)
        if ids == self._last_ids:
            return
        key = frozenset(ids)
        ring = self._rings.get(key)
        if ring is None:
            if len(self._rings) >= _MAX_CACHED_RINGS:
                del self._rings[next(iter(self._rings))]  # oldest first
            ring = self._rings[key] = _Ring(key, self.vnodes)
        index = {rid: i for i, rid in enumerate(ids)}
        walk = [index[rid] for rid in ring.owners]
        self._hashes, self._walk, self._last_ids = ring.hashes, walk + walk, ids

    def capacity(self, total_load: int, n_eligible: int) -> int:
        """ceil(load_factor * (total_load + 1) / n_eligible), in exact integer arithmetic."""
        return -(-self._num * (total_load + 1) // (self._den * n_eligible))

    def choose(self, prefix_key: str, replicas: Sequence[ReplicaLoad],
               exclude: Collection[str] = ()) -> ReplicaLoad | None:
        if not replicas:
            return None
        loads: list[int | None] = []  # per input position; None = not eligible
        total = m = 0
        last = None
        for r in replicas:
            if r.healthy and not r.full and not (exclude and r.replica_id in exclude):
                load = r.in_flight + r.waiting
                loads.append(load)
                total += load
                m += 1
                last = r
            else:
                loads.append(None)
        if m <= 1:
            return last
        self._sync(replicas)
        cap = -(-self._num * (total + 1) // (self._den * m))
        walk = self._walk
        start = bisect_right(self._hashes, _hash64(prefix_key))
        for k in range(start, start + len(self._hashes)):
            i = walk[k]
            load = loads[i]
            if load is not None and load < cap:
                return replicas[i]
        # Unreachable for non-negative loads; defensive for odd inputs (e.g. negative `waiting`).
        return min((r for r, load in zip(replicas, loads) if load is not None), key=lambda r: r.load)


# -- factory and keys ----------------------------------------------------------------------
def make_router(name: str, *, seed: int = 0, load_factor: float = 1.25) -> Router:
    """A router by policy name (case-insensitive; '_' accepted for '-'). `seed` drives the
    least-loaded sampler; `load_factor` bounds prefix-affinity (>= 1). The prefix-affinity ring
    does not depend on the seed, so every gateway instance maps a key to the same replica."""
    norm = name.strip().lower().replace("_", "-") if isinstance(name, str) else name
    if norm == "round-robin":
        return RoundRobinRouter()
    if norm == "least-loaded":
        return LeastLoadedRouter(seed=seed)
    if norm == "prefix-affinity":
        return PrefixAffinityRouter(load_factor=load_factor)
    raise ValueError(f"unknown router {name!r}; valid routers: {', '.join(ROUTER_NAMES)}")


def prefix_key(system: str, prompt: str = "", chars: int = 256) -> str:
    """Stable key (32 hex chars, same in every process) of a request's shared prefix: the whole
    system prompt plus the first `chars` characters of the user prompt. The system prompt is
    length-delimited, so ("ab", "c") and ("a", "bc") differ."""
    if chars < 0:
        raise ValueError(f"chars must be >= 0 (got {chars!r})")
    h = hashlib.blake2b(digest_size=16)
    h.update(b"%d:" % len(system))
    h.update(system.encode("utf-8", "surrogatepass"))
    h.update(prompt[:chars].encode("utf-8", "surrogatepass"))
    return h.hexdigest()
