"""Pacing calls to a model's declared limits (requests and tokens per minute) and to what its
provider says with 429 + Retry-After: a call waits for its turn instead of being refused.

The decision is a pure token bucket (`Bucket.take`): capacity for a short burst, refilled at just
under the declared rate, so a run's throughput sits just under the limit and never over it in any
minute. `LocalPacer` keeps the buckets of one gateway; several gateways calling one provider share
their limit through `populace.gateway.shared_pacing` (a bucket in KV)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from dataclasses import dataclass, field
from typing import Protocol

from populace.core.contracts import ModelEndpoint, ModelLimits

# Refill at this share of the declared rate, and allow a burst of this many seconds of it: in any
# 60 s the bucket hands out at most (BURST_S + 60 * HEADROOM) / 60 = 0.983 of the limit.
HEADROOM = 0.95
BURST_S = 2.0


@dataclass
class Bucket:
    """A token bucket: `rate` per second, at most `capacity` held."""

    rate: float
    capacity: float
    tokens: float = 0.0
    at: float = field(default_factory=time.monotonic)

    @classmethod
    def per_minute(cls, limit: float, now: float) -> Bucket:
        rate = limit * HEADROOM / 60.0
        capacity = max(1.0, rate * BURST_S)
        return cls(rate, capacity, tokens=capacity, at=now)

    def refill(self, now: float) -> None:
        if now > self.at:
            self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
            self.at = now

    def take(self, amount: float, now: float) -> float:
        """Take `amount` (at most the capacity: a larger call takes a full bucket) if the bucket
        holds it; else 0 taken and the seconds until it will (the caller waits, then asks again)."""
        self.refill(now)
        amount = min(amount, self.capacity)
        if self.tokens >= amount:
            self.tokens -= amount
            return 0.0
        return (amount - self.tokens) / self.rate

    def give_back(self, amount: float) -> None:
        """A call used fewer tokens than it took: the rest returns."""
        self.tokens = min(self.capacity, self.tokens + amount)

    def charge(self, amount: float) -> None:
        """A call used more than it took: the bucket goes into debt, which later calls wait out."""
        self.tokens -= amount


def limit_key(endpoint: ModelEndpoint | None, pool: str) -> str:
    """Whose limit a call counts against, as a name fit for a KV key: a model at a URL by what its
    provider limits (its URL, the served model and where the key comes from: providers limit per
    key and model), so two runs that name it differently share one limit; a model whose replicas
    register under its name, by that name; a run without `models:` by its backend's pool."""
    if endpoint is None:
        ident = f"pool\n{pool}"
    elif endpoint.base_url is None:
        ident = f"name\n{endpoint.name}"
    else:
        ident = "\n".join(("url", endpoint.base_url, endpoint.model or "", endpoint.api_key_env or "",
                           endpoint.api_key_file or ""))
    return hashlib.sha256(ident.encode()).hexdigest()[:32]


class Pacer(Protocol):
    async def acquire(self, pool: str, limits: ModelLimits, tokens: int) -> None:
        """Wait until a call of about `tokens` tokens may go to the model of `pool`."""

    def settle(self, pool: str, limits: ModelLimits, estimated: int, used: int) -> None:
        """A call's real token count, once known."""

    def backoff(self, pool: str, seconds: float) -> None:
        """The provider asked for a pause (429 Retry-After): nobody calls it before then."""


class LocalPacer:
    """One gateway's pacing: a requests bucket and a tokens bucket per model."""

    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._requests: dict[str, Bucket] = {}
        self._tokens: dict[str, Bucket] = {}
        self._paused_until: dict[str, float] = {}

    def _buckets(self, pool: str, limits: ModelLimits, now: float) -> tuple[Bucket | None, Bucket | None]:
        req = tok = None
        if limits.requests_per_min:
            req = self._requests.get(pool)
            if req is None or req.rate != limits.requests_per_min * HEADROOM / 60.0:
                req = self._requests[pool] = Bucket.per_minute(limits.requests_per_min, now)
        if limits.tokens_per_min:
            tok = self._tokens.get(pool)
            if tok is None or tok.rate != limits.tokens_per_min * HEADROOM / 60.0:
                tok = self._tokens[pool] = Bucket.per_minute(limits.tokens_per_min, now)
        return req, tok

    async def acquire(self, pool: str, limits: ModelLimits, tokens: int) -> None:
        while True:
            now = self._clock()
            wait = self._paused_until.get(pool, 0.0) - now
            if wait <= 0:
                req, tok = self._buckets(pool, limits, now)
                wait = req.take(1, now) if req is not None else 0.0
                if wait == 0 and tok is not None:
                    wait = tok.take(tokens, now)
                    if wait > 0 and req is not None:
                        req.give_back(1)
                if wait == 0:
                    return
            await asyncio.sleep(wait)

    def settle(self, pool: str, limits: ModelLimits, estimated: int, used: int) -> None:
        tok = self._tokens.get(pool)
        if tok is None:
            return
        if used < estimated:
            tok.give_back(min(estimated, tok.capacity) - min(used, tok.capacity))
        elif used > estimated:
            tok.charge(used - estimated)

    def backoff(self, pool: str, seconds: float) -> None:
        until = self._clock() + seconds
        if until > self._paused_until.get(pool, 0.0):
            self._paused_until[pool] = until
