"""Choosing a replica for one LLM request. Pure: no I/O, no asyncio, deterministic given a seed.

Policies (`make_router(name)`):
- `round-robin`      cycles over the eligible replicas.
- `least-loaded`     power of two choices: samples two distinct eligible replicas with a seeded
                     `random.Random` and takes the one with the lower load (ties: either).
- `prefix-affinity`  sticky prefix homes with bounded loads over *keys* (consistent hashing with
                     bounded loads, Mirrokni, Thorup, Zadimoghaddam 2018, applied to the
                     assignment of prefix keys to replicas rather than to single requests): every
                     request of a key goes to the key's home replica, which holds that prefix in
                     its KV cache; a replica whose assigned traffic over a sliding window exceeds
                     `load_factor` x the mean has a key moved away whole, a key too hot for one
                     replica (a single shared system prompt) gets more homes, and single
                     requests spill only when their home is full or far behind in flight. No
                     replica takes much more than `load_factor` x the mean share, yet a replica's
                     cache sees only its own keys (see `PrefixAffinityRouter`).

A replica is *eligible* when it is healthy, not full (`in_flight < max_concurrency`, if capped)
and not in `exclude` (replicas already tried by a retry). No eligible replica -> `None`; the
caller queues or errors.

Routers keep small mutable state (a cycle position, a seeded RNG; for prefix-affinity a ring
cache, the key table and a window of recent choices) and are meant to be used from one thread /
event loop. Replica ids are assumed unique within one call.
"""

from __future__ import annotations

import hashlib
import random
from bisect import bisect_right
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Protocol, runtime_checkable

__all__ = [
    "DEFAULT_VNODES",
    "ROUTER_NAMES",
    "LeastLoadedRouter",
    "PrefixAffinityRouter",
    "ReplicaLoad",
    "RoundRobinRouter",
    "Router",
    "RoutingStats",
    "affinity_keys",
    "eligible_replicas",
    "make_router",
    "prefix_key",
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


# -- prefix-affinity (sticky keys with bounded loads over keys) ----------------------------
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


class _Key:
    """What the router remembers about one prefix key."""

    __slots__ = ("dropped", "homes", "last", "weight")

    def __init__(self) -> None:
        self.homes: list[str] = []  # replicas that hold this prefix; homes[0] is its primary home
        self.weight = 0  # requests for this key among the last `window` routed
        self.last = 0  # tick of the last request
        self.dropped = False  # forgotten (idle or table full); its window entries no longer count


@dataclass(slots=True)
class RoutingStats:
    """What a prefix-affinity router did, for benchmarks and metrics (counts of requests or keys)."""

    routed: int = 0  # requests routed
    home: int = 0  # ... to one of their key's homes
    spilled: int = 0  # ... elsewhere, once, because every home was full, excluded or far too busy
    new_keys: int = 0  # keys given a home (first sight, or every home went away)
    moved: int = 0  # keys moved to another replica because their home carried too much traffic
    rebalanced: int = 0  # keys moved back toward their ring position, onto an underused replica
    replicated: int = 0  # homes added to a key too hot for the homes it had
    forgotten: int = 0  # idle keys dropped from the table


class PrefixAffinityRouter:
    """Sticky prefix homes with bounded loads over keys.

    Every prefix key has a *home*: the replica that holds its prefix in the KV cache. A request
    goes to its key's home, so a replica's cache only ever sees the prefixes homed on it. Load is
    bounded on *keys*, not on momentary in-flight counts: each replica's assigned traffic (the
    requests among the last `window` whose key is homed there; a key with h homes counts 1/h on
    each) stays at most `load_factor` x the mean over healthy replicas (+ `slack` requests, so a
    cold start does not react to noise). Placement follows consistent hashing with bounded loads
    (Mirrokni, Thorup, Zadimoghaddam 2018): a key goes to the first replica clockwise from its
    point on a hash ring (`vnodes` points per replica) that is under its bounds.

    - A new key is homed on the first replica on its ring walk that holds fewer than
      `ceil(key_factor * (keys + 1) / n)` keys and whose assigned traffic is under the bound:
      cache footprint (keys per replica) and traffic both stay even.
    - When a key's home carries more than the bound, the key *moves*, as a whole, to the next
      replica on its walk with room for its traffic (one cache miss there, then sticky again).
      Since a move shifts the key's whole window of traffic at once, one move is enough; no
      herd of keys leaves a replica that is over the bound only in the window's memory.
    - A *hot* key (at least `hot_min` requests in the window and, per home, at least
      `hot_fraction` of a replica's mean traffic) gets one more home instead of moving, when its
      homes are over the bound, or merely above the mean while it would stay hot on one more
      home. Its requests go to whichever home has the fewest in flight. One shared system
      prompt (100% of traffic) is thus homed, and cached, on every replica and spread evenly.
    - A replica well under the mean (below `mean / load_factor - slack`: it just joined, or came
      back) *pulls* cold keys whose ring walk reaches it before their home, from homes above the
      mean, until it is near the mean: it gets back the keys it had, with their caches.
    - A single request *spills* (goes elsewhere, nothing moves) when every home is full,
      excluded by a retry, or holds at least `ceil(spill_factor * (in-flight total + 1) / n)
      + slack` requests in flight (`load_capacity`): a safety valve for a replica that is slow or
      stuck, not a balancing mechanism. A replica batches many sequences, so a few more in flight
      than its neighbours is no reason to pay a cache miss elsewhere.
    - Homes that become unhealthy or leave the replica list are dropped; the key is placed
      again. Keys idle for `4 * window` requests are forgotten (and `max_keys` bounds the table).

    `stats` counts what the router did (`RoutingStats`).

    State is per router instance (one per gateway process): two gateways place a new key the same
    way when they have seen the same keys, but they do not share their tables.
    """

    name = "prefix-affinity"
    __slots__ = (
        "_assigned",
        "_hashes",
        "_keys",
        "_last_ids",
        "_nkeys",
        "_owners",
        "_rings",
        "_routed",
        "_sden",
        "_snum",
        "_tick",
        "_win",
        "hot_fraction",
        "hot_min",
        "key_factor",
        "load_factor",
        "max_keys",
        "slack",
        "spill_factor",
        "stats",
        "vnodes",
        "window",
    )

    def __init__(self, load_factor: float = 1.25, vnodes: int = DEFAULT_VNODES, *, window: int = 1024,
                 key_factor: float = 1.0, spill_factor: float = 2.0, slack: float = 4.0,
                 hot_fraction: float = 0.5, hot_min: int = 8, max_keys: int = 100_000) -> None:
        for name, value in (("load_factor", load_factor), ("key_factor", key_factor), ("spill_factor", spill_factor)):
            if not value >= 1.0:  # also rejects NaN
                raise ValueError(f"{name} must be >= 1 (got {value!r})")
        if vnodes < 1:
            raise ValueError(f"vnodes must be >= 1 (got {vnodes!r})")
        if window < 1 or max_keys < 1 or hot_min < 1:
            raise ValueError(f"window, hot_min and max_keys must be >= 1 (got {window!r}, {hot_min!r}, {max_keys!r})")
        if not slack >= 0 or not hot_fraction > 0:
            raise ValueError(f"slack must be >= 0 and hot_fraction > 0 (got {slack!r}, {hot_fraction!r})")
        self.load_factor, self.vnodes, self.window = float(load_factor), int(vnodes), int(window)
        self.key_factor, self.spill_factor, self.slack = float(key_factor), float(spill_factor), float(slack)
        self.hot_fraction, self.hot_min, self.max_keys = float(hot_fraction), int(hot_min), int(max_keys)
        self.stats = RoutingStats()
        # exact integer ceil for the in-flight bound: 2.0 -> 2/1, 1.1 -> 11/10
        frac = Fraction(self.spill_factor).limit_denominator(1_000_000)
        self._snum, self._sden = frac.numerator, frac.denominator
        self._rings: dict[frozenset[str], _Ring] = {}
        self._last_ids: tuple[str, ...] | None = None
        self._hashes: list[int] = []
        self._owners: list[str] = []
        self._keys: OrderedDict[str, _Key] = OrderedDict()  # least recently used first
        self._win: deque[tuple[_Key, str]] = deque()  # (key, replica) of the last `window` routed requests
        self._assigned: defaultdict[str, float] = defaultdict(float)  # replica -> sum of weight/len(homes)
        self._routed: Counter[str] = Counter()  # replica -> requests in the window routed to it
        self._nkeys: Counter[str] = Counter()  # replica -> keys whose primary home it is
        self._tick = 0

    # -- ring ------------------------------------------------------------------------------
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
        self._hashes, self._owners, self._last_ids = ring.hashes, ring.owners, ids

    def ring_order(self, prefix_key: str, replicas: Sequence[ReplicaLoad]) -> list[str]:
        """The replica ids clockwise from the key's point, each once: the order placement tries."""
        self._sync(replicas)
        owners, n = self._owners, len(self._owners)
        start = bisect_right(self._hashes, _hash64(prefix_key))
        seen: dict[str, None] = {}
        want = len(set(self._last_ids or ()))
        for k in range(start, start + n):
            seen.setdefault(owners[k % n])
            if len(seen) == want:
                break
        return list(seen)

    # -- bounds ----------------------------------------------------------------------------
    def load_capacity(self, total_load: int, n_eligible: int) -> int:
        """In-flight load at which a home spills a request: ceil(spill_factor * (total_load + 1) / n)
        + slack (a replica batches many sequences at once: a few more in flight is no queue)."""
        return -(-self._snum * (total_load + 1) // (self._sden * n_eligible)) + int(self.slack)

    def traffic_bound(self, total_assigned: float, n_healthy: int) -> float:
        """Most assigned traffic a replica may carry: load_factor * mean + slack."""
        return self.load_factor * (total_assigned + 1) / n_healthy + self.slack

    def assigned(self, replica_id: str) -> float:
        """Requests among the last `window` whose key is homed on the replica (split over homes)."""
        return self._assigned.get(replica_id, 0.0)

    def homes(self, prefix_key: str) -> list[str]:
        st = self._keys.get(prefix_key)
        return list(st.homes) if st else []

    # -- bookkeeping -----------------------------------------------------------------------
    def _set_homes(self, st: _Key, homes: list[str]) -> None:
        old = st.homes
        if old == homes:
            return
        a = self._assigned
        if st.weight:
            if old:
                share = st.weight / len(old)
                for h in old:
                    a[h] -= share
            if homes:
                share = st.weight / len(homes)
                for h in homes:
                    a[h] += share
        if old:
            self._nkeys[old[0]] -= 1
        if homes:
            self._nkeys[homes[0]] += 1
        st.homes = homes

    def _record(self, key: str, st: _Key, replica_id: str) -> None:
        a, stats = self._assigned, self.stats
        stats.routed += 1
        st.weight += 1
        if st.homes:
            share = 1 / len(st.homes)
            for h in st.homes:
                a[h] += share
        self._routed[replica_id] += 1
        win = self._win
        win.append((st, replica_id))
        if len(win) > self.window:
            old, rid = win.popleft()
            self._routed[rid] -= 1
            if not old.dropped:
                old.weight -= 1
                if old.homes:
                    share = 1 / len(old.homes)
                    for h in old.homes:
                        a[h] -= share
        # forget idle keys (never one with requests in the window) and keep the table bounded
        keys = self._keys
        if len(keys) <= self.max_keys and self._tick % 32:
            return
        idle_before = self._tick - 4 * self.window
        while keys:
            k0, s0 = next(iter(keys.items()))
            if not (len(keys) > self.max_keys or (s0.weight == 0 and s0.last < idle_before)):
                break
            del keys[k0]
            self._set_homes(s0, [])
            s0.dropped = True
            stats.forgotten += 1

    # -- routing ---------------------------------------------------------------------------
    def choose(self, prefix_key: str, replicas: Sequence[ReplicaLoad],
               exclude: Collection[str] = ()) -> ReplicaLoad | None:
        by_id: dict[str, ReplicaLoad] = {}
        healthy: list[str] = []
        total_load = 0
        for r in replicas:
            if r.healthy:
                rid = r.replica_id
                healthy.append(rid)
                full = r.max_concurrency > 0 and r.in_flight >= r.max_concurrency
                if not full and not (exclude and rid in exclude):
                    by_id[rid] = r
                    total_load += r.in_flight + r.waiting
        if not by_id:
            return None
        self._tick += 1
        keys = self._keys
        st = keys.get(prefix_key)
        if st is None:
            st = keys[prefix_key] = _Key()
        else:
            keys.move_to_end(prefix_key)
        st.last = self._tick
        choice = self._route(prefix_key, st, replicas, by_id, healthy, total_load)
        self._record(prefix_key, st, choice.replica_id)
        return choice

    def _route(self, key: str, st: _Key, replicas: Sequence[ReplicaLoad], by_id: dict[str, ReplicaLoad],
               healthy: list[str], total_load: int) -> ReplicaLoad:
        stats, a = self.stats, self._assigned
        n = len(healthy)
        if any(h not in by_id for h in st.homes):
            healthy_set = set(healthy)
            if any(h not in healthy_set for h in st.homes):  # down, deregistered or another backend's
                self._set_homes(st, [h for h in st.homes if h in healthy_set])
        get = a.get
        total = 0.0
        for h in healthy:
            total += get(h, 0.0)
        bound = self.traffic_bound(total, n)
        load_cap = self.load_capacity(total_load, len(by_id))

        def load(rid: str) -> int:
            r = by_id[rid]
            return r.in_flight + r.waiting

        if not st.homes:  # place the key
            stats.new_keys += 1
            target = self._place(key, replicas, by_id, healthy, st.weight + 1, bound, load_cap, exclude_homes=())
            self._set_homes(st, [target])
            stats.home += 1
            return by_id[target]

        usable = [h for h in st.homes if h in by_id]
        w = st.weight + 1
        mean = total / n
        hot = w >= self.hot_min and w / len(st.homes) >= self.hot_fraction * mean
        if hot and usable and len(st.homes) < n:
            # One more home for a hot key when its homes are over the bound (without slack: its own
            # traffic is no noise), or merely above the mean while the key would stay hot on one
            # more home (a prompt shared by everyone ends up homed, and cached, everywhere).
            above = min(a.get(h, 0.0) for h in usable)
            if above > bound - self.slack or (above > mean and w / (len(st.homes) + 1) >= self.hot_fraction * mean):
                target = self._place(key, replicas, by_id, healthy, w / (len(st.homes) + 1), bound, load_cap,
                                     exclude_homes=st.homes, count_keys=False)
                if target is not None:
                    self._set_homes(st, [*st.homes, target])
                    stats.replicated += 1
                    stats.home += 1
                    return by_id[target]
        fine = [h for h in usable if a.get(h, 0.0) <= bound and load(h) < load_cap]
        if fine:
            if not hot and len(fine) == 1 and len(st.homes) == 1:
                target = self._pull(key, replicas, by_id, healthy, fine[0], w, mean, load_cap)
                if target is not None:
                    self._set_homes(st, [target])
                    stats.rebalanced += 1
                    stats.home += 1
                    return by_id[target]
            stats.home += 1
            return by_id[min(fine, key=lambda h: (load(h), self._routed[h]))]
        if usable and all(a.get(h, 0.0) > bound for h in usable):
            # the homes have carried too much traffic for a while (the window): move the key whole
            if not hot:
                target = self._place(key, replicas, by_id, healthy, w, bound, load_cap, exclude_homes=st.homes)
                if target is not None:
                    self._set_homes(st, [target])
                    stats.moved += 1
                    stats.home += 1
                    return by_id[target]
            ok = [h for h in usable if load(h) < load_cap]
            if ok:  # nowhere better: stay home
                stats.home += 1
                return by_id[min(ok, key=lambda h: (load(h), self._routed[h]))]
        # spill this one request: every home is full, excluded or far too busy right now
        stats.spilled += 1
        for rid in self.ring_order(key, replicas):
            if rid in by_id and rid not in st.homes and load(rid) < load_cap and a.get(rid, 0.0) <= bound:
                return by_id[rid]
        return min(by_id.values(), key=lambda r: (r.in_flight + r.waiting, self._routed[r.replica_id]))

    def _pull(self, key: str, replicas: Sequence[ReplicaLoad], by_id: dict[str, ReplicaLoad], healthy: list[str],
              home: str, weight: int, mean: float, load_cap: int) -> str | None:
        """An underused replica (assigned traffic below `mean / load_factor - slack`: one that just
        joined or came back) that comes before `home` on the key's ring walk and can take the
        key's traffic without going over the mean, when `home` is above the mean; else None.
        Keys thus drift back to their ring position, so a returning replica gets back the keys
        it had (and may still hold in its cache), and only as many as bring it near the mean."""
        a = self._assigned
        low = mean / self.load_factor - self.slack
        if a.get(home, 0.0) <= mean or not any(a.get(rid, 0.0) < low for rid in by_id):
            return None
        for rid in self.ring_order(key, replicas):
            if rid == home:
                return None
            r = by_id.get(rid)
            if (r is not None and a.get(rid, 0.0) < low and a.get(rid, 0.0) + weight <= mean
                    and r.in_flight + r.waiting < load_cap):
                return rid
        return None

    def _place(self, key: str, replicas: Sequence[ReplicaLoad], by_id: dict[str, ReplicaLoad], healthy: list[str],
               weight: float, bound: float, load_cap: int, *, exclude_homes: Collection[str],
               count_keys: bool = True) -> str | None:
        """The first replica on the key's ring walk (not one of `exclude_homes`) with room for
        `weight` more traffic, fewer than its share of keys (when `count_keys`) and in-flight
        load under the spill bound; failing that, one with room for the traffic; failing that,
        None when some homes exist (stay), else the least-assigned eligible replica (under the
        in-flight bound if any is)."""
        a, nk = self._assigned, self._nkeys
        order = [rid for rid in self.ring_order(key, replicas) if rid in by_id and rid not in exclude_homes]
        key_cap = -(-self.key_factor * (sum(nk.get(h, 0) for h in healthy) + 1) // len(healthy))
        room = [rid for rid in order if a.get(rid, 0.0) + weight <= bound
                and by_id[rid].in_flight + by_id[rid].waiting < load_cap]
        for rid in room:
            if not count_keys or nk.get(rid, 0) < key_cap:
                return rid
        if room:
            return room[0]
        if exclude_homes:
            return None
        calm = [rid for rid in order if by_id[rid].in_flight + by_id[rid].waiting < load_cap] or order
        return min(calm, key=lambda rid: a.get(rid, 0.0))


# -- factory and keys ----------------------------------------------------------------------
def make_router(name: str, *, seed: int = 0, load_factor: float = 1.25) -> Router:
    """A router by policy name (case-insensitive; '_' accepted for '-'). `seed` drives the
    least-loaded sampler; `load_factor` bounds prefix-affinity (>= 1). Prefix-affinity does not
    depend on the seed: gateway instances that see the same keys place them the same way."""
    norm = name.strip().lower().replace("_", "-") if isinstance(name, str) else name
    if norm == "round-robin":
        return RoundRobinRouter()
    if norm == "least-loaded":
        return LeastLoadedRouter(seed=seed)
    if norm == "prefix-affinity":
        return PrefixAffinityRouter(load_factor=load_factor)
    raise ValueError(f"unknown router {name!r}; valid routers: {', '.join(ROUTER_NAMES)}")


def _system_hasher(system: str) -> hashlib.blake2b:
    # The system prompt is length-delimited, so ("ab", "c") and ("a", "bc") differ.
    h = hashlib.blake2b(digest_size=16)
    h.update(b"%d:" % len(system))
    h.update(system.encode("utf-8", "surrogatepass"))
    return h


def prefix_key(system: str, prompt: str = "", chars: int = 256) -> str:
    """Stable key (32 hex chars, same in every process) of a request's shared prefix: the whole
    system prompt plus the first `chars` characters of the user prompt."""
    if chars < 0:
        raise ValueError(f"chars must be >= 0 (got {chars!r})")
    h = _system_hasher(system)
    h.update(prompt[:chars].encode("utf-8", "surrogatepass"))
    return h.hexdigest()


def affinity_keys(system: str, prompts: Sequence[str], prefix_chars: Sequence[int] | None) -> list[str]:
    """Each prompt's routing key (`prefix_key`): the system prompt the batch shares, plus the
    prompt's stable start (its agent's persona) when the agents declare one. Per-round parts
    (history, memory) never enter the key, so an agent's key is the same every round and its
    persona stays in one replica's prefix cache. Without `prefix_chars`, every prompt has the
    batch's key. The shared system prompt is hashed once per batch, not once per prompt."""
    base = _system_hasher(system)
    if not prefix_chars:
        return [base.hexdigest()] * len(prompts)
    keys = []
    for prompt, chars in zip(prompts, prefix_chars):
        h = base.copy()
        h.update(prompt[:max(0, chars)].encode("utf-8", "surrogatepass"))
        keys.append(h.hexdigest())
    return keys
