"""A model's limits shared by every gateway that calls it: its token buckets live in KV `pacing`
(one entry per provider limit, populace.gateway.pacing.limit_key), so two gateways never send
more than one limit allows together, and a provider's 429 Retry-After pauses them all.

No KV round trip per call: a gateway takes a *lease*, a small share of the buckets (as many
calls as it has waiting or spent in its last lease, at most a quarter of a bucket) by
compare-and-swap, and spends it locally. A lease not spent within LEASE_S is dropped, never
returned: so every call goes out within LEASE_S of the moment its share left the shared bucket,
and a gateway that dies holding a lease starves nobody (its share was at most a quarter of a
bucket, and the bucket refills). In any window of W seconds the gateways together send at most
capacity + rate * (W + LEASE_S) = rate * (62.5 s) for W = 60: 0.99 of the declared limit.

One clock: the buckets' times are the wall clock of the gateway that wrote them last. A gateway
whose clock runs ahead of the others' by e seconds adds at most e seconds of refill once (a bucket
only moves its time forward, so the error does not accumulate); one behind only refills late. With
NTP (milliseconds) that is nothing; a skew above CLOCK_SKEW_WARN_S is logged.

The decision is pure (`lease`, `pause`: state in, state and grant out, tested without a broker);
`SharedPacer` does the KV reads and writes. When KV cannot be reached the gateway paces alone
(`LocalPacer`) and says so: a run goes on at the risk of a 429, which is waited out."""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field

from nats.js.errors import KeyDeletedError, KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from populace.core import logs
from populace.core.contracts import ModelLimits
from populace.gateway.pacing import HEADROOM, Bucket, LocalPacer

log = logs.get("populace.gateway.pacing")

LEASE_S = 0.5  # a lease is spent within this long or dropped; a pool without limits reads the shared pause as often
LEASE_SHARE = 0.25  # at most this share of a bucket's capacity in one lease
CAS_ATTEMPTS = 16  # compare-and-swap rounds before a lease is given up for now (asked again at once)
KV_RETRY_S = 1.0  # after KV failed, pace alone this long before asking it again
CLOCK_SKEW_WARN_S = 2.0
MAX_PAUSE_S = 3600.0  # the longest Retry-After read (populace.gateway.openai_api.retry_after)
LOG_EVERY_S = 30.0  # one line per pool and kind of trouble this often, not one per call


# ---------------------------------------------------------------------------------- pure


@dataclass
class Shared:
    """One provider's limits as KV holds them: its buckets (None: no such limit declared) and until
    when (wall clock) its provider asked everyone to wait."""

    requests: Bucket | None = None
    tokens: Bucket | None = None
    paused_until: float = 0.0

    def to_bytes(self) -> bytes:
        def bucket(b: Bucket | None) -> list[float] | None:
            return None if b is None else [b.rate, b.capacity, b.tokens, b.at]

        return json.dumps({"requests": bucket(self.requests), "tokens": bucket(self.tokens),
                           "paused_until": self.paused_until}, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Shared:
        """Raises ValueError on anything but what to_bytes writes (the entry is then rewritten)."""
        try:
            obj = json.loads(data)
            paused = float(obj["paused_until"])
            buckets = [obj["requests"], obj["tokens"]]
        except (ValueError, TypeError, KeyError) as err:
            raise ValueError(f"not a pacing entry: {err}") from None

        def bucket(v) -> Bucket | None:
            if v is None:
                return None
            if not isinstance(v, list) or len(v) != 4 or not all(isinstance(x, int | float) for x in v):
                raise ValueError("not a pacing entry: a bucket is [rate, capacity, tokens, at]")
            rate, capacity, tokens, at = (float(x) for x in v)
            if not all(math.isfinite(x) for x in (rate, capacity, tokens, at)) or rate <= 0 or capacity <= 0:
                raise ValueError("not a pacing entry: a bucket's numbers are out of range")
            return Bucket(rate, capacity, min(tokens, capacity), at)

        if not math.isfinite(paused):
            raise ValueError("not a pacing entry: paused_until is not finite")
        return cls(bucket(buckets[0]), bucket(buckets[1]), paused)


@dataclass(frozen=True)
class Grant:
    """What a lease got: calls and tokens to spend within LEASE_S (inf: no such limit), or none
    and how long until asking again may get some."""

    requests: float = 0.0
    tokens: float = 0.0
    wait_s: float = 0.0
    token_capacity: float = math.inf  # the tokens bucket's capacity: a larger call takes all of it

    @property
    def granted(self) -> bool:
        return self.wait_s <= 0


def _declared(old: Bucket | None, limit: int, now: float) -> tuple[Bucket, bool]:
    """The bucket of a declared per-minute limit, the stored one when it is that limit's; (bucket,
    whether it changed). Another limit declared for the same provider (another run's config) takes
    over from now, keeping no more tokens than it allows."""
    rate = limit * HEADROOM / 60.0
    if old is not None and old.rate == rate:
        return old, False
    fresh = Bucket.per_minute(limit, now)
    if old is not None:
        fresh.tokens, fresh.at = min(old.tokens, fresh.capacity), min(old.at, now)
    return fresh, True


def lease(state: Shared | None, limits: ModelLimits, now: float, want_requests: int, want_tokens: float,
          need_tokens: float, debt: float = 0.0) -> tuple[Shared | None, Grant]:
    """A lease of at least one call of `need_tokens` tokens and at most `want_requests` calls and
    `want_tokens` tokens (each at most LEASE_SHARE of its bucket), at wall time `now`; `debt`:
    tokens this gateway's calls used beyond what they took, charged now. Returns the state to
    write (None: nothing changed) and the grant. Pure."""
    if state is None:
        if not limits.requests_per_min and not limits.tokens_per_min:
            return None, Grant(math.inf, math.inf)
        state = Shared()
        changed = True
    else:
        state = Shared(*(None if b is None else Bucket(b.rate, b.capacity, b.tokens, b.at)
                         for b in (state.requests, state.tokens)), state.paused_until)
        changed = False
    # A limit this call does not declare is not its to pace by, nor to erase (another run's may be there).
    req = tok = None
    if limits.requests_per_min:
        req, moved = _declared(state.requests, limits.requests_per_min, now)
        state.requests, changed = req, changed or moved
    if limits.tokens_per_min:
        tok, moved = _declared(state.tokens, limits.tokens_per_min, now)
        state.tokens, changed = tok, changed or moved
    if tok is not None and debt > 0:
        tok.charge(debt)
        changed = True
    capacity = tok.capacity if tok is not None else math.inf
    if state.paused_until > now:  # never longer than a provider may ask (Retry-After is read up to an hour)
        wait = min(state.paused_until - now, MAX_PAUSE_S)
        return (state if changed else None), Grant(wait_s=wait, token_capacity=capacity)
    need = min(need_tokens, capacity)
    wait = 0.0
    for bucket, amount in ((req, 1.0), (tok, need)):
        if bucket is not None:
            bucket.refill(now)
            if bucket.tokens < amount:
                wait = max(wait, (amount - bucket.tokens) / bucket.rate)
    if wait > 0:
        return (state if changed else None), Grant(wait_s=wait, token_capacity=capacity)
    calls = math.inf
    if req is not None:
        calls = float(max(1, min(want_requests, math.floor(req.tokens), math.floor(req.capacity * LEASE_SHARE))))
        req.tokens -= calls
    tokens = math.inf
    if tok is not None:
        tokens = max(need, min(want_tokens, tok.tokens, tok.capacity * LEASE_SHARE))
        tok.tokens -= tokens
    return state, Grant(calls, tokens, token_capacity=capacity)


def pause(state: Shared | None, until: float) -> Shared:
    """The provider asked for a pause (429 Retry-After) until wall time `until`: everyone waits
    that long (the later of two pauses wins). Pure."""
    state = Shared() if state is None else Shared(state.requests, state.tokens, state.paused_until)
    state.paused_until = max(state.paused_until, until)
    return state


# ---------------------------------------------------------------------------------- KV


@dataclass
class _Pool:
    """One limit's state in this gateway: its lease, what it knows of the shared pause."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one lease asked at a time
    requests: float = 0.0  # leased and not spent yet
    tokens: float = 0.0
    token_capacity: float = math.inf
    expires: float = 0.0  # monotonic: the lease is dropped then
    paused_until: float = 0.0  # monotonic
    waiting: int = 0  # calls in acquire now
    spent: int = 0  # calls spent from the current lease
    spent_last: int = 0  # calls spent from the one before
    debt: float = 0.0  # tokens used beyond what was leased, charged at the next lease
    local_until: float = 0.0  # monotonic: KV failed, paced alone until then
    logged: dict[str, float] = field(default_factory=dict)


class SharedPacer:
    """The Pacer (populace.gateway.pacing) of a gateway with KV `pacing`: shared buckets, leased."""

    def __init__(self, kv: KeyValue, wall=time.time, clock=time.monotonic) -> None:
        self.kv, self._wall, self._clock = kv, wall, clock
        self._pools: dict[str, _Pool] = {}
        self._alone = LocalPacer(clock)  # while KV cannot be reached
        self._pausing: set[asyncio.Task] = set()
        self.leases = 0  # KV leases taken (a lease serves many calls)

    def _pool(self, key: str) -> _Pool:
        pool = self._pools.get(key)
        if pool is None:
            pool = self._pools[key] = _Pool()
        return pool

    def _spend(self, pool: _Pool, tokens: int, now: float) -> bool:
        if now >= pool.expires:
            pool.requests = pool.tokens = 0.0
            return False
        need = min(tokens, pool.token_capacity)
        if pool.requests >= 1 and pool.tokens >= need:
            pool.requests -= 1
            pool.tokens -= need
            pool.spent += 1
            return True
        return False

    async def acquire(self, key: str, limits: ModelLimits, tokens: int) -> None:
        pool = self._pool(key)
        pool.waiting += 1
        try:
            while True:
                now = self._clock()
                if pool.paused_until > now:
                    await asyncio.sleep(pool.paused_until - now)
                    continue
                if self._spend(pool, tokens, now):
                    return
                if now < pool.local_until:
                    await self._alone.acquire(key, limits, tokens)
                    return
                async with pool.lock:
                    now = self._clock()
                    if pool.paused_until > now or now < pool.local_until:
                        continue
                    if self._spend(pool, tokens, now):
                        return
                    try:
                        grant = await self._lease(key, pool, limits, tokens)
                    except Exception as err:  # KV down or refused: pace alone a moment, and say so
                        pool.local_until = self._clock() + KV_RETRY_S
                        self._log(pool, "pacing_not_shared", key=key, error=f"{type(err).__name__}: {err}",
                                  effect="this gateway paces the model alone until KV `pacing` answers again")
                        continue
                    if grant is None:  # others kept moving the entry: ask again
                        continue
                    if not grant.granted:
                        pool.paused_until = max(pool.paused_until, self._clock() + grant.wait_s)
                        continue
                    pool.requests, pool.tokens = grant.requests, grant.tokens
                    pool.token_capacity = grant.token_capacity
                    pool.expires = self._clock() + LEASE_S
                    pool.spent_last, pool.spent = pool.spent, 0
                    # the lease always holds this call's share: spend it now
                    if self._spend(pool, tokens, self._clock()):
                        return
        finally:
            pool.waiting -= 1

    async def _lease(self, key: str, pool: _Pool, limits: ModelLimits, tokens: int) -> Grant | None:
        for _ in range(CAS_ATTEMPTS):
            entry, state = await self._read(key, pool)
            # as many calls as wait now (counted after the read: more came meanwhile), or as the last lease served
            want = max(1, pool.waiting, pool.spent, pool.spent_last)
            wall, debt = self._wall(), pool.debt  # calls may settle more debt while the write is out
            new, grant = lease(state, limits, wall, want, want * tokens, tokens, debt)
            if new is not None:
                try:
                    if entry is None:
                        await self.kv.create(key, new.to_bytes())
                    else:
                        await self.kv.update(key, new.to_bytes(), last=entry.revision)
                except KeyWrongLastSequenceError:
                    continue  # another gateway moved it first
                pool.debt -= debt
            self.leases += grant.granted
            return grant
        return None

    async def _read(self, key: str, pool: _Pool):
        try:
            entry = await self.kv.get(key)
        except (KeyNotFoundError, KeyDeletedError):  # never written, dropped by its TTL, or deleted by hand
            return None, None
        try:
            state = Shared.from_bytes(entry.value or b"")
        except ValueError as err:
            self._log(pool, "pacing_entry_rewritten", key=key, error=str(err))
            return entry, None
        latest = max((b.at for b in (state.requests, state.tokens) if b is not None), default=0.0)
        if latest - self._wall() > CLOCK_SKEW_WARN_S:
            self._log(pool, "pacing_clock_skew", key=key, ahead_s=round(latest - self._wall(), 3),
                      effect="another gateway's clock runs ahead of this one's: this one refills late")
        return entry, state

    def settle(self, key: str, limits: ModelLimits, estimated: int, used: int) -> None:
        self._alone.settle(key, limits, estimated, used)
        pool = self._pool(key)
        if used > estimated:
            pool.debt += used - estimated
        elif used < estimated and self._clock() < pool.expires:
            pool.tokens += estimated - used  # back into the lease it came from, spent within it or dropped

    def backoff(self, key: str, seconds: float) -> None:
        self._alone.backoff(key, seconds)
        pool = self._pool(key)
        pool.paused_until = max(pool.paused_until, self._clock() + seconds)
        pool.requests = pool.tokens = 0.0  # what was leased waits with everyone else
        until = self._wall() + seconds
        task = asyncio.get_running_loop().create_task(self._share_pause(key, pool, until))
        self._pausing.add(task)
        task.add_done_callback(self._pausing.discard)

    async def _share_pause(self, key: str, pool: _Pool, until: float) -> None:
        """The pause into KV, so the other gateways wait too (they read it at their next lease)."""
        try:
            for _ in range(CAS_ATTEMPTS):
                entry, state = await self._read(key, pool)
                if state is not None and state.paused_until >= until:
                    return
                data = pause(state, until).to_bytes()
                try:
                    if entry is None:
                        await self.kv.create(key, data)
                    else:
                        await self.kv.update(key, data, last=entry.revision)
                    return
                except KeyWrongLastSequenceError:
                    continue
        except Exception as err:  # the others will get their own 429s: said, not fatal
            self._log(pool, "pacing_pause_not_shared", key=key, error=f"{type(err).__name__}: {err}")

    async def close(self) -> None:
        for task in list(self._pausing):
            task.cancel()
        await asyncio.gather(*self._pausing, return_exceptions=True)

    def _log(self, pool: _Pool, event: str, **fields) -> None:
        now = self._clock()
        if now - pool.logged.get(event, -math.inf) >= LOG_EVERY_S:
            pool.logged[event] = now
            log.warning(event, **fields)
