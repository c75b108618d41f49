"""Limits shared by every gateway (populace.gateway.shared_pacing): the pure lease decision over the
shared buckets, and the pacer's use of KV, against an in-memory stand-in for the bucket (the real
one is in tests/integration/test_shared_pacing.py)."""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque

import pytest
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError

from populace.core.contracts import ModelEndpoint, ModelLimits
from populace.gateway import shared_pacing
from populace.gateway.pacing import BURST_S, HEADROOM, Bucket, limit_key
from populace.gateway.shared_pacing import LEASE_SHARE, Grant, Shared, SharedPacer, lease, pause

RPM = ModelLimits(requests_per_min=600)  # 9.5 a second, a bucket of 19


def test_a_first_lease_creates_a_full_bucket_and_takes_what_is_wanted_up_to_a_quarter():
    state, grant = lease(None, RPM, now=100.0, want_requests=3, want_tokens=0, need_tokens=50)
    assert state.requests.rate == pytest.approx(9.5) and state.requests.capacity == pytest.approx(19.0)
    assert state.tokens is None and state.paused_until == 0
    assert (grant.requests, grant.tokens, grant.wait_s) == (3, math.inf, 0)
    assert state.requests.tokens == pytest.approx(16.0)
    state, grant = lease(state, RPM, now=100.0, want_requests=100, want_tokens=0, need_tokens=50)
    assert grant.requests == math.floor(19.0 * LEASE_SHARE) == 4  # a quarter of the bucket at most
    state.requests.tokens = 0.5
    state, grant = lease(state, RPM, now=100.0, want_requests=1, want_tokens=0, need_tokens=50)
    assert not grant.granted and grant.wait_s == pytest.approx(0.5 / 9.5)
    assert state is None  # nothing changed: nothing to write


def test_tokens_per_minute_lease_at_least_the_call_and_at_most_a_quarter():
    limits = ModelLimits(tokens_per_min=60_000)  # 950 a second, a bucket of 1,900
    state, grant = lease(None, limits, 0.0, want_requests=8, want_tokens=8 * 100, need_tokens=100)
    assert grant.requests == math.inf and grant.tokens == pytest.approx(475)  # a quarter of 1,900
    assert grant.token_capacity == pytest.approx(1900)
    new, grant = lease(state, limits, 0.0, 1, 100, need_tokens=5_000)  # larger than the bucket: takes it all
    assert new is None and not grant.granted  # 1,425 left, 1,900 needed
    assert grant.wait_s == pytest.approx((1900 - 1425) / 950)
    state, grant = lease(state, limits, 0.5, 1, 100, need_tokens=5_000)
    assert grant.granted and grant.tokens == pytest.approx(1900) and state.tokens.tokens == pytest.approx(0)


def test_debt_is_charged_to_the_shared_bucket():
    limits = ModelLimits(tokens_per_min=60_000)
    state, _ = lease(None, limits, 0.0, 1, 100, 100)
    state, grant = lease(state, limits, 0.0, 1, 100, 100, debt=1_750)
    assert not grant.granted and state.tokens.tokens == pytest.approx(1800 - 1750)  # written: the debt is paid


def simulate(gateways: int, seconds: float, skew: list[float], limits=RPM, seed=3) -> deque[float]:
    """Gateways leasing from one shared entry at random moments, each with its own clock (true time
    + its skew), asking for random amounts; the true time of every call granted."""
    rng = random.Random(seed)
    state: Shared | None = None
    grants: deque[float] = deque()
    t = 0.0
    while t < seconds:
        t += rng.expovariate(40.0)
        g = rng.randrange(gateways)
        new, grant = lease(state, limits, t + skew[g], rng.randint(1, 12), 0, 1)
        if new is not None:
            state = new
        if grant.granted:
            grants.extend([t] * int(grant.requests))
    return grants


def most_in_any_window(times: deque[float], window: float) -> int:
    best, left = 0, 0
    ts = list(times)
    for right, t in enumerate(ts):
        while ts[left] <= t - window:
            left += 1
        best = max(best, right - left + 1)
    return best


def test_gateways_together_never_exceed_the_limit_in_any_minute():
    grants = simulate(gateways=3, seconds=300, skew=[0.0, 0.0, 0.0])
    most = most_in_any_window(grants, 60.0)
    # a full bucket, then the refill: (BURST_S + 60 * HEADROOM) / 60 of the limit
    assert most <= 600 * (BURST_S + 60 * HEADROOM) / 60 + 1 < 600
    assert most >= 0.97 * 600 * HEADROOM  # demand is above the limit: it sits just under it


def test_a_clock_ahead_adds_its_skew_of_refill_once_never_more():
    skew = 1.5
    grants = simulate(gateways=2, seconds=300, skew=[0.0, skew])
    bound = 600 * HEADROOM / 60 * (BURST_S + 60 + skew) + 1
    assert most_in_any_window(grants, 60.0) <= bound
    grants = simulate(gateways=2, seconds=300, skew=[0.0, -skew])  # one behind: it only refills late
    assert most_in_any_window(grants, 60.0) <= 600 * (BURST_S + 60 * HEADROOM) / 60 + 1


def test_a_pause_stops_every_lease_until_it_ends():
    state, _ = lease(None, RPM, 0.0, 1, 0, 1)
    paused = pause(state, until=30.0)
    assert pause(paused, until=10.0).paused_until == 30.0  # the later pause wins
    new, grant = lease(paused, RPM, 12.0, 1, 0, 1)
    assert new is None and not grant.granted and grant.wait_s == pytest.approx(18.0)
    _, grant = lease(paused, RPM, 30.0, 1, 0, 1)
    assert grant.granted
    assert lease(pause(state, 1e12), RPM, 0.0, 1, 0, 1)[1].wait_s == 3600.0  # never longer than a provider may ask
    # a model without declared limits reads the pause too, and writes nothing
    assert lease(pause(None, 5.0), ModelLimits(), 1.0, 1, 0, 1)[1].wait_s == pytest.approx(4.0)
    assert lease(None, ModelLimits(), 1.0, 1, 0, 1) == (None, Grant(math.inf, math.inf))


def test_another_runs_limit_takes_over_and_an_undeclared_one_is_left_alone():
    state, _ = lease(None, ModelLimits(requests_per_min=600, tokens_per_min=60_000), 0.0, 1, 10, 10)
    state, grant = lease(state, ModelLimits(requests_per_min=60), 1.0, 1, 0, 1)
    assert state.requests.rate == pytest.approx(0.95) and state.requests.tokens == pytest.approx(1.9 - 1)
    assert state.tokens is not None and state.tokens.rate == pytest.approx(950)  # not this run's to erase
    assert grant.tokens == math.inf


def test_an_entry_round_trips_and_junk_is_refused():
    state = Shared(Bucket(9.5, 19.0, 3.25, 12.5), None, 40.0)
    assert Shared.from_bytes(state.to_bytes()) == state
    for junk in (b"", b"[]", b'{"requests": null}', b'{"requests": [1, 2], "tokens": null, "paused_until": 0}',
                 b'{"requests": [0, 1, 1, 1], "tokens": null, "paused_until": 0}',
                 b'{"requests": null, "tokens": null, "paused_until": NaN}'):
        with pytest.raises(ValueError, match="not a pacing entry"):
            Shared.from_bytes(junk)


def test_one_provider_limit_is_one_key_whatever_the_runs_call_it():
    a = ModelEndpoint(name="gpt", kind="openai", base_url="https://api.example.com/v1", model="m-1",
                      api_key_env="EXAMPLE_KEY")
    b = a.model_copy(update={"name": "the-same"})
    c = a.model_copy(update={"model": "m-2"})
    d = a.model_copy(update={"api_key_env": "OTHER_KEY"})
    assert limit_key(a, "x") == limit_key(b, "y") != limit_key(c, "x") != limit_key(d, "x")
    local = ModelEndpoint(name="mine", kind="sim")
    assert limit_key(local, "model:mine") != limit_key(local.model_copy(update={"name": "other"}), "model:other")
    assert limit_key(None, "sim") != limit_key(None, "local")
    assert all(len(k) == 32 and k.isalnum() for k in (limit_key(a, ""), limit_key(local, ""), limit_key(None, "")))


# ------------------------------------------------------------------- the pacer, on a KV stand-in


class Entry:
    def __init__(self, value: bytes, revision: int) -> None:
        self.value, self.revision = value, revision


class MemoryKV:
    """get/create/update with KV's revision rules (a unit-test stand-in for nats-py's KeyValue)."""

    def __init__(self) -> None:
        self.data: dict[str, Entry] = {}
        self.revision = 0
        self.calls = 0
        self.fail: Exception | None = None

    async def get(self, key):
        self.calls += 1
        await asyncio.sleep(0)
        if self.fail is not None:
            raise self.fail
        if key not in self.data:
            raise KeyNotFoundError
        return self.data[key]

    async def create(self, key, value):
        return await self.update(key, value, last=0)

    async def update(self, key, value, last=None):
        self.calls += 1
        await asyncio.sleep(0)
        have = self.data[key].revision if key in self.data else 0
        if last != have:
            raise KeyWrongLastSequenceError
        self.revision += 1
        self.data[key] = Entry(value, self.revision)
        return self.revision


async def test_a_lease_serves_many_calls_with_one_kv_round_trip():
    kv = MemoryKV()
    pacer = SharedPacer(kv)
    limits = ModelLimits(requests_per_min=60_000)  # a bucket of 1,900: leases of up to 475
    await asyncio.gather(*(pacer.acquire("k", limits, 10) for _ in range(200)))
    assert pacer.leases <= 3 and kv.calls <= 8
    state = Shared.from_bytes(kv.data["k"].value)
    assert state.requests.tokens == pytest.approx(1900 - 200, abs=475)  # what was leased left the shared bucket


async def test_two_pacers_on_one_entry_share_one_bucket():
    kv = MemoryKV()
    frozen = lambda: 1000.0  # noqa: E731 — no refill while the test looks
    a, b = SharedPacer(kv, wall=frozen, clock=frozen), SharedPacer(kv, wall=frozen, clock=frozen)
    limits = ModelLimits(requests_per_min=120)  # a bucket of 3.8: 3 calls at once, then 1.9 a second
    done: list[str] = []

    async def call(pacer, name):
        await pacer.acquire("k", limits, 1)
        done.append(name)

    tasks = [asyncio.create_task(call(p, n)) for p, n in ((a, "a"), (b, "b")) for _ in range(4)]
    await asyncio.sleep(0.3)
    assert len(done) == 3 and set(done) == {"a", "b"}  # the shared burst, not 3 each
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_429_pauses_the_other_pacer_through_kv():
    kv = MemoryKV()
    a, b = SharedPacer(kv), SharedPacer(kv)
    await a.acquire("k", RPM, 1)
    a.backoff("k", 30.0)
    await asyncio.gather(*a._pausing)
    assert Shared.from_bytes(kv.data["k"].value).paused_until > a._wall() + 29
    waiting = asyncio.create_task(b.acquire("k", RPM, 1))
    await asyncio.sleep(0.05)
    assert not waiting.done() and b._pools["k"].paused_until > b._clock() + 29
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)


async def test_kv_trouble_paces_alone_and_says_so(monkeypatch):
    kv = MemoryKV()
    kv.fail = ConnectionError("nats: connection closed")
    lines: list[tuple[str, dict]] = []
    monkeypatch.setattr(shared_pacing.log, "warning", lambda event, **kw: lines.append((event, kw)))
    pacer = SharedPacer(kv)
    await asyncio.gather(*(pacer.acquire("k", RPM, 1) for _ in range(5)))  # the local bucket's burst
    assert [e for e, _ in lines] == ["pacing_not_shared"]  # said once, not per call
    assert "connection closed" in lines[0][1]["error"]
    kv.fail = None
    pacer._pools["k"].local_until = 0.0
    await pacer.acquire("k", RPM, 1)
    assert "k" in kv.data  # back on the shared bucket
