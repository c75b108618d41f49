"""Replica routing policies (pure): round-robin, least-loaded (power of two choices) and
prefix-affinity (consistent hashing with bounded loads), checked by discrete simulation."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from collections import Counter, defaultdict, deque

import pytest

from populace.gateway.routing import (
    ROUTER_NAMES,
    LeastLoadedRouter,
    PrefixAffinityRouter,
    ReplicaLoad,
    RoundRobinRouter,
    Router,
    eligible_replicas,
    make_router,
    prefix_key,
)

REQUESTS = 20_480  # a multiple of every concurrency used below (see `simulate`)


def replicas(n: int, **kw) -> list[ReplicaLoad]:
    return [ReplicaLoad(f"r{i}", **kw) for i in range(n)]


def zipf_keys(n_keys: int, s: float) -> tuple[list[str], list[float]]:
    keys = [prefix_key(f"system prompt of game {i}") for i in range(n_keys)]
    return keys, [1.0 / (rank + 1) ** s for rank in range(n_keys)]


class Sim:
    """Closed-loop discrete simulation: `concurrency` requests in flight, each held for the next
    `concurrency` arrivals (FIFO completion). Before each arrival the oldest request completes if
    `concurrency` are already in flight, so every choice sees `concurrency - 1` others and the
    in-flight set is always the last `concurrency` assignments: a replica's share of assignments
    equals its time-averaged share of the load."""

    def __init__(self, router: Router, pool: list[ReplicaLoad], concurrency: int, *, seed: int = 1) -> None:
        self.router, self.pool, self.concurrency = router, pool, concurrency
        self.rng = random.Random(seed)
        self.inflight: deque[ReplicaLoad] = deque()
        self.counts: Counter[str] = Counter({r.replica_id: 0 for r in pool})
        self.per_key: dict[str, Counter[str]] = defaultdict(Counter)
        self.rejected = 0
        self.peak: Counter[str] = Counter()

    def run(self, requests: int, keys: list[str], weights: list[float] | None = None) -> Sim:
        for _ in range(requests):
            if len(self.inflight) >= self.concurrency:
                self.inflight.popleft().in_flight -= 1
            key = keys[0] if len(keys) == 1 else self.rng.choices(keys, weights)[0]
            before = eligible_replicas(self.pool)
            choice = self.router.choose(key, self.pool)
            if choice is None:
                self.rejected += 1
                continue
            if isinstance(self.router, PrefixAffinityRouter):  # the in-flight spill bound, every call
                assert choice.load < self.router.load_capacity(sum(r.load for r in before), len(before))
            choice.in_flight += 1
            self.inflight.append(choice)
            self.counts[choice.replica_id] += 1
            self.per_key[key][choice.replica_id] += 1
            self.peak[choice.replica_id] = max(self.peak[choice.replica_id], choice.in_flight)
        return self

    def max_share_ratio(self) -> float:
        """max replica share / mean share (1.0 = perfectly even)."""
        total = sum(self.counts.values())
        return max(self.counts.values()) * len(self.pool) / total

    def key_top_share(self, key: str) -> float:
        c = self.per_key[key]
        return max(c.values()) / sum(c.values())

    def weighted_top_share(self) -> float:
        """Fraction of all requests that went to their key's most frequent replica."""
        return sum(max(c.values()) for c in self.per_key.values()) / sum(self.counts.values())


# -- ReplicaLoad -----------------------------------------------------------------------------
def test_replica_load_properties():
    r = ReplicaLoad("a", in_flight=3, waiting=4)
    assert r.load == 7 and not r.full  # 0 = unlimited
    assert ReplicaLoad("a", in_flight=2, max_concurrency=2).full
    assert not ReplicaLoad("a", in_flight=1, waiting=50, max_concurrency=2).full  # waiting is not ours
    assert eligible_replicas([ReplicaLoad("a"), ReplicaLoad("b", healthy=False),
                              ReplicaLoad("c", in_flight=1, max_concurrency=1), ReplicaLoad("d")],
                             exclude={"d"}) == [ReplicaLoad("a")]


# -- 1. one shared prefix (100% of traffic on one key) must not pin one replica ---------------
@pytest.mark.parametrize("n,concurrency", [(4, 64), (8, 64), (4, 16), (8, 16)])
def test_single_shared_prefix_is_homed_everywhere_and_spread_evenly(n, concurrency):
    router = PrefixAffinityRouter(load_factor=1.25)
    key = prefix_key("the one system prompt")
    sim = Sim(router, replicas(n), concurrency).run(REQUESTS, [key])
    assert sim.max_share_ratio() <= 1.05  # the bound is 1.25; a hot key's homes share it evenly
    assert sorted(router.homes(key)) == sorted(r.replica_id for r in sim.pool)  # cached everywhere
    assert router.stats.replicated == n - 1 and router.stats.moved == 0
    assert router.stats.spilled <= 1  # the in-flight valve, only while the key warms up (`hot_min`)
    loads = [r.in_flight for r in sim.pool]
    assert max(loads) - min(loads) <= 1  # requests go to the home with the fewest in flight


def test_unbounded_affinity_would_pin_one_replica():
    """The bug we avoid: affinity without a load bound (and no hot keys) sends a shared prefix to
    one replica."""
    router = PrefixAffinityRouter(load_factor=1e9, spill_factor=1e9, hot_min=10**9)
    sim = Sim(router, replicas(4), 64).run(5_000, [prefix_key("one")])
    assert sorted(sim.counts.values()) == [0, 0, 0, 5_000]


# -- 2. many prefixes: one home per key, bounded shares ---------------------------------------
def test_uniform_keys_get_one_home_each_and_even_key_counts():
    """128 equally popular prefixes on 4 replicas (the bench's persona workload): every key has
    one home and all its requests go there; every replica is home to exactly 32 keys (even
    cache footprint), and nothing spills or moves."""
    keys = [prefix_key(f"persona {i}") for i in range(128)]
    router = PrefixAffinityRouter()
    sim = Sim(router, replicas(4), 32).run(REQUESTS, keys)
    assert all(len(router.homes(k)) == 1 for k in keys)
    assert all(sim.key_top_share(k) == 1.0 for k in keys)
    assert sorted(Counter(router.homes(k)[0] for k in keys).values()) == [32, 32, 32, 32]
    assert router.stats.spilled == router.stats.moved == router.stats.replicated == 0
    assert sim.max_share_ratio() <= 1.25


@pytest.mark.parametrize("n", [4, 8])
def test_zipf_prefixes_affinity_and_bound(n):
    keys, weights = zipf_keys(50, 1.0)
    router = PrefixAffinityRouter(load_factor=1.25)
    sim = Sim(router, replicas(n), 64).run(REQUESTS, keys, weights)
    blind = Sim(LeastLoadedRouter(seed=3), replicas(n), 64).run(REQUESTS, keys, weights)
    assert sim.max_share_ratio() <= 1.25
    # the most popular keys carry more than a replica's share: they get several homes; the rest one
    assert len(router.homes(keys[0])) >= 2
    single = [k for k in keys if len(router.homes(k)) == 1]
    assert len(single) >= 40
    # the others stay on one replica, but for a rare whole-key move (which halves a rare key's top share)
    assert sum(max(sim.per_key[k].values()) for k in single) >= 0.9 * sum(sum(sim.per_key[k].values()) for k in single)
    assert router.stats.moved + router.stats.rebalanced <= 0.25 * len(keys)
    assert router.stats.spilled <= 0.001 * REQUESTS
    assert sim.weighted_top_share() >= 0.65
    assert sim.weighted_top_share() >= 2 * blind.weighted_top_share()  # prefix-blind: ~1/n


def test_hot_key_among_cold_keys_is_replicated_and_cold_keys_stay():
    hot = prefix_key("the game's system prompt")
    cold = [prefix_key(f"persona {i}") for i in range(100)]
    router = PrefixAffinityRouter()
    sim = Sim(router, replicas(4), 64).run(REQUESTS, [hot, *cold], [100.0] + [1.0] * 100)
    assert sim.max_share_ratio() <= 1.25
    assert 2 <= len(router.homes(hot)) <= 4
    assert all(len(router.homes(k)) == 1 for k in cold)
    assert all(sim.key_top_share(k) >= 0.9 for k in cold)


def test_light_load_never_spills_and_keeps_affinity():
    """One request at a time: the in-flight valve never fires; shares are still bounded, by
    moving or replicating the few keys that need it, not by scattering requests."""
    keys, weights = zipf_keys(50, 1.0)
    router = PrefixAffinityRouter()
    sim = Sim(router, replicas(4), 1).run(5_000, keys, weights)
    assert router.stats.spilled == 0
    assert sim.max_share_ratio() <= 1.25
    assert sim.weighted_top_share() >= 0.75
    assert all(len(router.homes(k)) <= 2 for k in keys)
    assert sum(sim.key_top_share(k) == 1.0 for k in sim.per_key) >= 0.8 * len(sim.per_key)


def test_a_momentary_burst_spills_one_request_and_moves_nothing():
    router, pool = PrefixAffinityRouter(), replicas(4)
    key = prefix_key("sys")
    home = router.choose(key, pool)
    home.in_flight = 5  # busier than the others, but a replica batches: no spill yet
    assert router.choose(key, pool) is home
    cap = router.load_capacity(total_load=12, n_eligible=4)
    home.in_flight = 12  # everything in flight is on the home: ceil(2 * 13 / 4) + 4 = 11 <= 12
    assert cap == 11
    other = router.choose(key, pool)
    assert other is not home and router.stats.spilled == 1
    assert router.homes(key) == [home.replica_id]  # the key stays
    home.in_flight = 0
    assert router.choose(key, pool) is home


def test_prefix_affinity_avoids_a_replica_with_a_long_reported_queue():
    pool = replicas(4)
    key = prefix_key("sys")
    home = PrefixAffinityRouter().choose(key, pool)
    home.waiting = 40  # stale or not, the replica says it is backed up
    assert PrefixAffinityRouter().choose(key, pool) is not home


def test_a_new_replica_takes_over_whole_keys_only_from_overloaded_ones():
    keys = [prefix_key(f"agent {i}") for i in range(200)]
    router, pool = PrefixAffinityRouter(), replicas(4)
    Sim(router, pool, 32).run(10_000, keys)
    before = {k: router.homes(k) for k in keys}
    pool.append(ReplicaLoad("r4"))
    Sim(router, pool, 32, seed=2).run(10_000, keys)
    after = {k: router.homes(k) for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert 0 < len(moved) <= 0.25 * len(keys)  # sticky: keys move only to relieve the bound
    assert all(after[k] == ["r4"] for k in moved)  # whole keys, only to the new replica
    again = Sim(router, pool, 32, seed=3).run(10_000, keys)
    assert again.max_share_ratio() <= 1.25
    assert again.counts["r4"] >= 0.5 * 10_000 / 5


# -- 2b. what affinity buys: simulated vLLM prefix caches -------------------------------------
def test_prefix_affinity_fills_sim_caches_like_a_perfect_partition():
    """64 personas, 4 simulated replicas whose caches hold ~1/4 of them each: prefix-affinity
    scores the hit rate of the best static partition (persona i -> replica i mod 4), which
    round-robin and least-loaded cannot approach (each cache sees every persona)."""
    from populace.replicas.sim import SimConfig, SimModel

    rng = random.Random(5)
    words = ["curious", "careful", "bold", "patient", "analytical", "playful", "stubborn", "generous", "cautious", "witty"]
    people = [f"You are persona {i}. " + " ".join(rng.choice(words) for _ in range(100)) for i in range(64)]
    keys = [prefix_key(p) for p in people]
    order = [rng.randrange(len(people)) for _ in range(3_000)]

    def hit_rate(router: Router | None) -> float:
        models = [SimModel(SimConfig(cache_blocks=260)) for _ in range(4)]
        pool, inflight = replicas(4), deque()
        for j, p in enumerate(order):
            if router is None:
                i = p % 4
            else:
                if len(inflight) >= 16:
                    inflight.popleft().in_flight -= 1
                r = router.choose(keys[p], pool)
                r.in_flight += 1
                inflight.append(r)
                i = int(r.replica_id[1:])
            models[i].plan([{"role": "system", "content": people[p]}, {"role": "user", "content": f"player {j}"}])
        return sum(m.prefix_cache_hits for m in models) / sum(m.prefix_cache_queries for m in models)

    best, affinity = hit_rate(None), hit_rate(PrefixAffinityRouter())
    rr, ll = hit_rate(RoundRobinRouter()), hit_rate(LeastLoadedRouter(seed=1))
    assert best > 0.9
    assert affinity >= 0.99 * best
    assert affinity >= 2.5 * rr and affinity >= 2.5 * ll


# -- 3. round-robin ---------------------------------------------------------------------------
def test_round_robin_exact_cycle():
    router, pool = RoundRobinRouter(), replicas(4)
    assert [router.choose("k", pool).replica_id for _ in range(12)] == ["r0", "r1", "r2", "r3"] * 3


def test_round_robin_skips_unhealthy_full_and_excluded():
    router, pool = RoundRobinRouter(), replicas(5)
    pool[1].healthy = False
    pool[3].max_concurrency, pool[3].in_flight = 2, 2
    got = [router.choose("k", pool, exclude={"r4"}).replica_id for _ in range(6)]
    assert got == ["r0", "r2"] * 3
    pool[1].healthy = True  # back in the cycle
    assert [router.choose("k", pool).replica_id for _ in range(4)] == ["r4", "r0", "r1", "r2"]


def test_round_robin_is_even_in_simulation():
    sim = Sim(RoundRobinRouter(), replicas(4), 16).run(4_000, ["k"])
    assert set(sim.counts.values()) == {1_000}


# -- 4. least-loaded (power of two choices) ---------------------------------------------------
def test_least_loaded_picks_lower_of_two_samples():
    """Loads 0, 5, 10: the busiest is never chosen (it loses to whichever replica it is paired
    with); the middle one wins only when paired with the busiest (1/3 of pairs)."""
    router = LeastLoadedRouter(seed=7)
    pool = [ReplicaLoad("idle"), ReplicaLoad("mid", in_flight=5), ReplicaLoad("busy", in_flight=4, waiting=6)]
    got = Counter(router.choose("k", pool).replica_id for _ in range(3_000))
    assert got["busy"] == 0
    assert 0.28 < got["mid"] / 3_000 < 0.39
    assert 0.61 < got["idle"] / 3_000 < 0.72


def test_least_loaded_rarely_picks_a_heavily_loaded_replica():
    pool = replicas(4)
    pool[2].waiting = 500
    sim = Sim(LeastLoadedRouter(seed=1), pool, 32).run(10_000, ["k"])
    assert sim.counts["r2"] <= 10_000 * 0.01
    assert sim.max_share_ratio() <= 1.4


def test_least_loaded_even_and_deterministic_given_seed():
    def run(seed):
        router, pool = LeastLoadedRouter(seed=seed), replicas(6)
        return Sim(router, pool, 48).run(6_000, ["k"]).counts

    a, b = run(11), run(11)
    assert a == b
    assert run(12) != a or run(13) != a
    assert max(a.values()) * 6 / 6_000 <= 1.1


def test_least_loaded_single_eligible_and_ties():
    router = LeastLoadedRouter()
    pool = [ReplicaLoad("a", healthy=False), ReplicaLoad("b")]
    assert all(router.choose("k", pool).replica_id == "b" for _ in range(20))
    tied = Counter(router.choose("k", replicas(2)).replica_id for _ in range(1_000))
    assert tied["r0"] > 300 and tied["r1"] > 300  # ties go either way


# -- 5. no eligible replica, exclude, max_concurrency -----------------------------------------
ALL = [pytest.param(lambda n=n: make_router(n, seed=1), id=n) for n in ROUTER_NAMES]


@pytest.mark.parametrize("factory", ALL)
def test_none_when_nothing_is_eligible(factory):
    router = factory()
    assert router.choose("k", []) is None
    assert router.choose("k", replicas(3, healthy=False)) is None
    assert router.choose("k", replicas(3, in_flight=4, max_concurrency=4)) is None
    assert router.choose("k", replicas(3), exclude={"r0", "r1", "r2"}) is None
    mixed = [ReplicaLoad("a", healthy=False), ReplicaLoad("b", in_flight=1, max_concurrency=1), ReplicaLoad("c")]
    assert router.choose("k", mixed, exclude={"c"}) is None
    assert router.choose("k", mixed).replica_id == "c"


@pytest.mark.parametrize("factory", ALL)
def test_exclude_retries_elsewhere(factory):
    router, pool = factory(), replicas(4)
    for i in range(50):
        key = prefix_key(f"s{i}")
        first = router.choose(key, pool)
        retry = router.choose(key, pool, exclude={first.replica_id})
        assert retry is not None and retry.replica_id != first.replica_id
        third = router.choose(key, pool, exclude=[first.replica_id, retry.replica_id])
        assert third.replica_id not in {first.replica_id, retry.replica_id}


def test_prefix_affinity_retry_spills_without_moving_the_key():
    router = PrefixAffinityRouter()
    for i in range(100):
        key, pool = prefix_key(f"s{i}"), replicas(5)
        home = router.choose(key, pool)
        retry = router.choose(key, pool, exclude={home.replica_id})
        assert retry is not home
        assert router.homes(key) == [home.replica_id]
        assert router.choose(key, pool) is home


@pytest.mark.parametrize("factory", ALL)
def test_max_concurrency_respected(factory):
    pool = replicas(4, max_concurrency=5)
    keys, weights = zipf_keys(20, 1.0)
    sim = Sim(factory(), pool, 30).run(3_000, keys, weights)  # 30 wanted, 20 slots in total
    assert max(sim.peak.values()) == 5
    assert sim.rejected > 0
    assert all(r.in_flight <= 5 for r in pool)


# -- 6. stability: replicas going and coming, the ring, other processes ------------------------
def test_a_replica_going_down_moves_only_its_keys():
    router = PrefixAffinityRouter()
    keys = [prefix_key(f"agent {i}") for i in range(1_000)]
    pool = replicas(4)
    before = {k: router.choose(k, pool).replica_id for k in keys}
    pool[2].healthy = False
    after = {k: router.choose(k, pool).replica_id for k in keys}
    moved = {k for k in keys if before[k] != after[k]}
    assert moved == {k for k in keys if before[k] == "r2"}
    assert all(router.homes(k) == [after[k]] for k in moved)
    spread = Counter(after[k] for k in moved)
    assert len(spread) == 3 and max(spread.values()) <= 0.5 * len(moved)  # not all onto one neighbour
    pool[2].healthy = True  # back: it is underused, so keys drift back to it along their ring walk
    back = {k: router.choose(k, pool).replica_id for k in keys}
    returned = [k for k in keys if back[k] != after[k]]
    assert all(back[k] == "r2" for k in returned)  # only onto the underused replica ...
    assert 0.6 * 250 <= len(returned) <= 250  # ... until it carries about its share, no more
    assert {k: router.choose(k, pool).replica_id for k in keys} == back  # then everything is sticky


def test_ring_is_cached_and_order_independent():
    router = PrefixAffinityRouter()
    pool = replicas(6)
    keys = [prefix_key(f"k{i}") for i in range(200)]
    first = [router.choose(k, pool).replica_id for k in keys]
    ring = router._hashes
    assert [router.choose(k, list(reversed(pool))).replica_id for k in keys] == first  # order: no matter
    fresh = PrefixAffinityRouter()  # another gateway that sees the same keys places them the same way
    assert [fresh.choose(k, list(reversed(pool))).replica_id for k in keys] == first
    pool[1].healthy, pool[2].in_flight, pool[3].waiting = False, 3, 9
    router.choose(keys[0], pool)
    router.choose(keys[0], list(reversed(pool)))
    assert router._hashes is ring  # health, load and order changes reuse the ring
    router.choose(keys[0], replicas(7))
    assert router._hashes is not ring


def test_routing_is_stable_across_processes():
    """No salted hash(): another interpreter with another PYTHONHASHSEED routes identically."""
    code = (
        "import json\n"
        "from populace.gateway.routing import PrefixAffinityRouter, ReplicaLoad, prefix_key\n"
        "r, pool = PrefixAffinityRouter(), [ReplicaLoad(f'r{i}') for i in range(8)]\n"
        "print(json.dumps([(prefix_key(f'sys {i}', 'hello'), r.choose(prefix_key(f'sys {i}', 'hello'), pool).replica_id)"
        " for i in range(40)]))\n"
    )
    runs = []
    for hashseed in ("1", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    router, pool = PrefixAffinityRouter(), replicas(8)
    here = [[prefix_key(f"sys {i}", "hello"), router.choose(prefix_key(f"sys {i}", "hello"), pool).replica_id]
            for i in range(40)]
    assert runs[0] == runs[1] == here


def check_accounting(router: PrefixAffinityRouter) -> None:
    """The router's running totals equal a recount from its window and key table."""
    live = {id(st): st for st in router._keys.values()}
    weight: Counter[int] = Counter()
    routed: Counter[str] = Counter()
    for st, rid in router._win:
        routed[rid] += 1
        if not st.dropped:
            assert id(st) in live
            weight[id(st)] += 1
    assigned: defaultdict[str, float] = defaultdict(float)
    nkeys: Counter[str] = Counter()
    for st in live.values():
        assert st.weight == weight[id(st)]
        assert len(set(st.homes)) == len(st.homes)
        for h in st.homes:
            assigned[h] += st.weight / len(st.homes)
        if st.homes:
            nkeys[st.homes[0]] += 1
    assert len(router._win) <= router.window and len(router._keys) <= router.max_keys
    assert +router._routed == routed and +router._nkeys == nkeys
    for rid in set(assigned) | set(router._assigned):
        assert router._assigned.get(rid, 0.0) == pytest.approx(assigned[rid], abs=1e-6)


def test_accounting_stays_consistent_under_churn():
    """Health flaps, full replicas, retries, a replica joining, hot and idle keys, a small
    window and a small key table: the totals the bounds use never drift."""
    rng = random.Random(9)
    router = PrefixAffinityRouter(window=64, max_keys=40)
    pool = replicas(5, max_concurrency=12)
    keys = [prefix_key(f"k{i}") for i in range(60)]
    inflight: deque[ReplicaLoad] = deque()
    for step in range(6_000):
        if step == 3_000:
            pool.append(ReplicaLoad("r5", max_concurrency=12))
        if rng.random() < 0.01:
            r = rng.choice(pool)
            r.healthy = not r.healthy
        while len(inflight) > 20 or (inflight and rng.random() < 0.3):
            inflight.popleft().in_flight -= 1
        key = keys[0] if rng.random() < 0.4 else rng.choice(keys[: 10 + step // 100])
        exclude = {rng.choice(pool).replica_id} if rng.random() < 0.05 else ()
        choice = router.choose(key, pool, exclude)
        if choice is not None:
            assert choice.healthy and not choice.full and choice.replica_id not in exclude
            choice.in_flight += 1
            inflight.append(choice)
        if step % 50 == 0:
            check_accounting(router)
    check_accounting(router)
    s = router.stats
    assert s.routed == s.home + s.spilled
    assert s.forgotten > 0 and s.new_keys > 60 and s.replicated > 0


def test_idle_keys_are_forgotten():
    router, pool = PrefixAffinityRouter(window=8), replicas(3)
    old = prefix_key("old")
    router.choose(old, pool)
    for _ in range(100):  # idle for 4 windows; the table is swept every 32 requests
        router.choose(prefix_key("busy"), pool)
    assert router.homes(old) == [] and router.stats.forgotten == 1
    assert router.homes(prefix_key("busy"))
    check_accounting(router)


# -- 7. prefix_key -----------------------------------------------------------------------------
def test_prefix_key_is_stable_and_prefix_based():
    system = "You are a player in a beauty contest game."
    head = "x" * 256
    assert prefix_key(system, head + "round 1") == prefix_key(system, head + "round 2, different tail")
    assert prefix_key(system, "a" + head) != prefix_key(system, "b" + head)
    assert prefix_key(system) == prefix_key(system, "") == prefix_key(system, "anything", chars=0)
    assert prefix_key(system, "abc", chars=2) == prefix_key(system, "abd", chars=2)
    assert prefix_key(system, "hi") != prefix_key(system + " ", "hi")
    assert prefix_key("ab", "c") != prefix_key("a", "bc")  # the system prompt is delimited
    assert prefix_key("", "") != prefix_key("0:", "")
    # pinned: gateways of different versions must agree on keys: blake2b-128 of "3:" + "sys" + "hello"
    assert prefix_key("sys", "hello") == "18e3af465adb3d3d3a5812bb7264ead4"
    assert len(prefix_key("é\ud800", "emoji 😀")) == 32  # any str, even lone surrogates
    with pytest.raises(ValueError):
        prefix_key("s", "p", chars=-1)


# -- 8. make_router ----------------------------------------------------------------------------
def test_make_router_by_name():
    for name, cls in zip(ROUTER_NAMES, (RoundRobinRouter, LeastLoadedRouter, PrefixAffinityRouter)):
        router = make_router(name)
        assert isinstance(router, cls) and isinstance(router, Router)
        assert router.name == name
    assert isinstance(make_router(" Prefix_Affinity "), PrefixAffinityRouter)
    assert make_router("prefix-affinity", load_factor=1.5).load_factor == 1.5


def test_make_router_errors_name_the_choices():
    with pytest.raises(ValueError) as err:
        make_router("random")
    message = str(err.value)
    assert "'random'" in message
    assert all(name in message for name in ("round-robin", "least-loaded", "prefix-affinity"))
    with pytest.raises(ValueError, match="load_factor"):
        make_router("prefix-affinity", load_factor=0.9)


def test_load_capacity_is_exact_integer_ceil_plus_slack():
    router = PrefixAffinityRouter(spill_factor=1.1, slack=0)
    assert router.load_capacity(99, 11) == 10  # 1.1 * 100 / 11 = 10 exactly; a float ceil would say 11
    assert PrefixAffinityRouter(slack=0).load_capacity(63, 4) == 32
    assert PrefixAffinityRouter().load_capacity(64, 4) == 33 + 4
    assert PrefixAffinityRouter().traffic_bound(99, 4) == pytest.approx(1.25 * 100 / 4 + 4)


@pytest.mark.parametrize("kw", [{"load_factor": 0.9}, {"key_factor": 0.5}, {"spill_factor": float("nan")},
                                {"vnodes": 0}, {"window": 0}, {"max_keys": 0}, {"slack": -1},
                                {"hot_fraction": 0}])
def test_prefix_affinity_rejects_bad_parameters(kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        PrefixAffinityRouter(**kw)


def test_affinity_keys_follow_the_persona_not_the_round():
    from populace.gateway.routing import affinity_keys

    persona = "You are Ada, 52 years old, female. Education: Ph.D."
    round1 = f"{persona} Report your number."
    round2 = f"{persona} Winning numbers of previous rounds: 33. Your previous numbers: 40. Report your number."
    other = "You are Bob, 30 years old, male. Education: high school. Report your number."
    k1, k2, k3 = affinity_keys("rules", [round1, round2, other], [len(persona), len(persona), 48])
    assert k1 == k2 != k3
    assert affinity_keys("other rules", [round1], [len(persona)])[0] != k1  # the system prompt counts
    # without declared prefixes every prompt has the batch's key (the shared system prompt)
    assert affinity_keys("rules", [round1, other], None) == [prefix_key("rules")] * 2
