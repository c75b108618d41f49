"""Serving one inference batch on real replicas: every prompt is one structured call,
routed by the policy, bounded by per-replica caps and a gateway-wide admission limit,
retried on another replica (jittered backoff, retry budget) when a replica fails, and
re-asked once when the answer does not satisfy the schema. Nothing is invented: an answer
that stays invalid is returned as the model wrote it, marked invalid."""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from dataclasses import dataclass

from populace.core import logs, metrics
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch
from populace.core.settings import Settings
from populace.gateway import schema_check
from populace.gateway.keys import KeyRing, KeyUnavailable
from populace.gateway.openai_api import (
    ChatResult,
    KeyRefused,
    Poster,
    RateLimited,
    ReplicaError,
    RequestRejected,
    chat,
)
from populace.gateway.pacing import LocalPacer, Pacer, limit_key
from populace.gateway.replica_pool import ReplicaPool, pool_of
from populace.gateway.routing import ReplicaLoad, Router, affinity_keys

log = logs.get("populace.gateway.dispatch")
REGISTRATION_WAIT_S = 60.0  # replicas may still be loading their model when a run starts


class CallFailed(RuntimeError):
    """No answer from any replica. `infrastructure`: the model path failed (no replica, every
    attempt failed), as opposed to the request itself being refused (e.g. too long)."""

    def __init__(self, message: str, attempts: int = 0, infrastructure: bool = True) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.infrastructure = infrastructure


class ModelRefused(RuntimeError):
    """The model will not answer this run, whatever is retried: its key was refused (401/403), or
    cannot be read or sent where its URL points. The batch's reply says so (`refused`) and the run
    pauses naming the model."""


# A refused key is remembered this long: batches for the model are refused at once meanwhile
# (no storm of calls the provider refuses), then it is tried again (a key file may be fixed).
REFUSED_MEMORY_S = 30.0
# How long one call may wait on a provider's 429s (Retry-After) in all before it is an
# infrastructure failure like any other (the host asks again later).
RATE_LIMITED_WAIT_S = 600.0


def call_seed(model_seed: int, key: int, seq: int = 0) -> int | None:
    """The sampling seed sent with a call: the run's model seed spread by the agent (`key`), and by
    its call tag in the round (`seq`, populace.sdk.llm.call_tag) so that an agent's second call (or
    one on another's behalf) samples apart; None for an unseeded model (seed 0)."""
    if not model_seed:
        return None
    seed = model_seed * 1_000_003 + key
    return (seed + seq * 1_000_000_007) % 2**31 if seq else seed


@dataclass(slots=True)
class Decision:
    text: str
    valid: bool
    attempts: int  # HTTP calls made: retries on other replicas and re-asks included
    replica: str
    prompt_tokens: int
    completion_tokens: int
    latency_ms: float
    failed: str | None = None  # no model answered (infrastructure): the agent-host asks again
    reasks: int = 0  # corrective re-asks after an invalid answer (their calls are in `attempts`)
    cached_tokens: int = 0


class Dispatcher:
    def __init__(self, pool: ReplicaPool, router: Router, http: Poster, settings: Settings,
                 keys: KeyRing | None = None, pacer: Pacer | None = None) -> None:
        self.pool, self.router, self.http, self.s = pool, router, http, settings
        self.keys = keys or KeyRing(settings.gateway_keys, settings.gateway_model_hosts)
        self.pacer = pacer or LocalPacer()
        self.refused: dict[str, tuple[float, str]] = {}  # pool -> (when, why) of a model that refused its key
        pool.auth = lambda r: self.keys.headers(r.endpoint) if r.endpoint is not None else {}
        self.admitted = 0  # prompts being served now
        self.calls = 0
        self.retries = 0  # retries the budget counts
        self.failovers = 0  # calls moved off a replica that was gone (refused or dropped them): not counted
        self._rng = random.Random()
        # Calls waiting for a replica slot, first come first served: a released slot wakes
        # one waiter (not all of them, which made a burst quadratic); a pool refresh, which
        # may bring new capacity, wakes everyone.
        self._waiters: deque[asyncio.Future] = deque()
        pool.on_refresh = lambda: self._wake(everyone=True)

    # -- one batch --------------------------------------------------------------------
    def pool_for(self, batch: InferBatch) -> str:
        """The pool of the batch's model; raises ModelRefused when this gateway will not call it."""
        endpoint = batch.endpoint
        if endpoint is None:
            return batch.model.backend
        why = self.keys.refusal(endpoint)
        if why is None:
            try:
                self.keys.key(endpoint)  # readable now, or said so now (not once per call)
            except KeyUnavailable as err:
                why = str(err)
        if why is not None:
            raise ModelRefused(why)
        pool = self.pool.add_endpoint(endpoint) if endpoint.base_url is not None else pool_of(endpoint, "")
        refused = self.refused.get(pool)
        if refused is not None:
            if time.monotonic() - refused[0] < REFUSED_MEMORY_S:
                raise ModelRefused(refused[1])
            del self.refused[pool]
        return pool

    async def serve(self, batch: InferBatch) -> tuple[InferReply, LlmCallBatch | None]:
        n = len(batch.prompts)
        try:
            pool = self.pool_for(batch)
        except ModelRefused as err:
            return InferReply(batch_id=batch.batch_id, refused=str(err)), None
        if self.admitted + n > self.s.gateway_max_queue:
            return InferReply(batch_id=batch.batch_id,
                              error=f"gateway overloaded: {self.admitted} prompts in service, limit "
                                    f"{self.s.gateway_max_queue}; retry later"), None
        self.admitted += n
        metrics.LLM_IN_FLIGHT.labels("gateway").set(self.admitted)
        keys = affinity_keys(batch.system, batch.prompts, batch.prefix_chars)
        why = None
        try:
            async with asyncio.TaskGroup() as group:  # a refused key stops the batch's other calls
                tasks = [group.create_task(self.decide(batch, i, keys[i], pool)) for i in range(n)]
            decisions = [task.result() for task in tasks]
        except* ModelRefused as refusal:
            why = str(refusal.exceptions[0])
        finally:
            self.admitted -= n
            metrics.LLM_IN_FLIGHT.labels("gateway").set(self.admitted)
        if why is not None:
            self.refused[pool] = (time.monotonic(), why)
            log.error("model_refused", pool=pool, batch=batch.batch_id, error=why)
            return InferReply(batch_id=batch.batch_id, refused=why), None
        export_metrics(decisions)
        failed = [d.failed for d in decisions]
        endpoint = batch.endpoint
        cached = [d.cached_tokens for d in decisions]
        dollars = ([endpoint.prices.dollars(d.prompt_tokens, d.cached_tokens, d.completion_tokens) for d in decisions]
                   if endpoint is not None and not endpoint.prices.free else [])
        reply = InferReply(batch_id=batch.batch_id, texts=[d.text for d in decisions],
                           valid=[d.valid for d in decisions], attempts=[d.attempts for d in decisions],
                           failed=failed if any(failed) else [],
                           prompt_tokens=[d.prompt_tokens for d in decisions],
                           completion_tokens=[d.completion_tokens for d in decisions],
                           cached_tokens=cached if any(cached) else [])
        calls = LlmCallBatch(
            run_id=batch.run_id, round=batch.round, batch_id=batch.batch_id, agent_ids=batch.keys,
            replicas=[d.replica for d in decisions], prompt_tokens=[d.prompt_tokens for d in decisions],
            completion_tokens=[d.completion_tokens for d in decisions],
            latency_ms=[d.latency_ms for d in decisions], attempts=[d.attempts for d in decisions],
            valid=[d.valid for d in decisions], reasks=[d.reasks for d in decisions],
            model=endpoint.name if endpoint is not None else "", cached_tokens=cached if any(cached) else [],
            dollars=dollars,
        )
        return reply, calls

    async def decide(self, batch: InferBatch, i: int, key: str, pool: str | None = None) -> Decision:
        """One decision: one call, plus at most `gateway_reasks` corrective re-asks."""
        pool = pool or batch.model.backend
        t0 = time.perf_counter()
        messages = [{"role": "system", "content": batch.system}, {"role": "user", "content": batch.prompt(i)}]
        seed = call_seed(batch.model.seed, batch.keys[i], batch.seqs[i] if batch.seqs is not None else 0)
        attempts = ptok = ctok = cached = reasks = 0
        text, replica, valid, failed = "", "", False, None
        for asked in range(1 + self.s.gateway_reasks):
            reasks = asked
            try:
                replica, res, tries = await self.call(batch, messages, key, seed, pool)
            except CallFailed as err:
                attempts += err.attempts
                if not text and err.infrastructure:
                    failed = str(err)  # no model answered at all: not an answer, asked again
                text = text or f"<gateway error: {err}>"
                break
            attempts += tries
            ptok += res.prompt_tokens
            ctok += res.completion_tokens
            cached += res.cached_tokens
            text = res.text
            valid = schema_check.check(text, batch.response_schema)
            if valid:
                break
            messages = [*messages, {"role": "assistant", "content": text},
                        {"role": "user", "content": schema_check.reask_message(batch.response_schema)}]
        return Decision(text, valid, attempts, replica, ptok, ctok, (time.perf_counter() - t0) * 1000, failed, reasks,
                        cached)

    # -- one call, with retries on other replicas -----------------------------------
    async def call(self, batch: InferBatch, messages: list[dict], key: str,
                   seed: int | None, pool: str | None = None) -> tuple[str, ChatResult, int]:
        """(replica id, result, HTTP attempts) — retried on other replicas when one fails; paced
        to the model's limits, and waiting out its 429s (Retry-After) without counting them as
        failures."""
        pool = pool or batch.model.backend
        self.calls += 1
        tried: set[str] = set()
        error = "no attempt made"
        endpoint = batch.endpoint
        max_tokens = batch.model.max_tokens
        estimate = sum(len(m["content"]) for m in messages) // 4 + max_tokens  # tokens, before the provider counts
        paced = limit_key(endpoint, pool)  # whose limit: shared by every gateway that calls this provider
        limited_until = asyncio.get_running_loop().time() + RATE_LIMITED_WAIT_S
        # Hand-written, not tenacity: the retry budget is shared by every call and each retry avoids the replicas
        # already tried; with tenacity that state would move into custom stop/wait/hook callables.
        attempt, gone = 0, False
        while attempt < self.s.gateway_attempts:
            if attempt:
                # The budget keeps retries from piling onto replicas that answer badly or slowly. A call
                # whose replica was gone (refused or dropped it: the server died, maybe with a burst in
                # flight) moves to another without spending it (still within its attempts): those calls
                # are at most what dead replicas held, and on a young gateway (a small run's first round) the budget
                # (a share of the calls so far) was smaller than that, so a lost replica failed calls
                # a live one could have answered.
                if gone:
                    self.failovers += 1
                elif self.retries >= self.s.gateway_retry_budget * self.calls + 10:
                    raise CallFailed(f"retry budget exhausted; last error: {error}", attempt)
                else:
                    self.retries += 1
                metrics.RETRIES.labels("gateway").inc()
                await asyncio.sleep(min(2.0, 0.05 * 2**attempt) * (0.5 + self._rng.random()))
            load = await self.acquire(pool, key, tried)
            replica = self.pool.replica(load.replica_id)
            info = replica.info
            try:
                # a model at its URL, or a replica registered for a keyed model: its key, if it may go there
                auth = self.keys.headers(replica.endpoint or endpoint, None if replica.endpoint else info.url)
                served = (endpoint.model if endpoint is not None else None) or batch.model.name
                if endpoint is not None:  # paced last: a call leaves as soon as its pacing share is taken
                    await self.pacer.acquire(paced, endpoint.limits, estimate)
                res = await chat(self.http, info, messages, schema=batch.response_schema,
                                 max_tokens=max_tokens, temperature=batch.model.temperature, seed=seed, model=served,
                                 timeout=self.s.gateway_request_timeout_s, auth=auth,
                                 url=f"{replica.endpoint.api_base}/chat/completions" if replica.endpoint else None,
                                 redact=self.keys.redact)
                if endpoint is not None and res.prompt_tokens:  # as providers count a call: its prompt and
                    # all the output it may have (OpenAI counts max_tokens); no usage reported: the estimate stands
                    self.pacer.settle(paced, endpoint.limits, estimate, res.prompt_tokens + max_tokens)
                return info.replica_id, res, attempt + 1
            except KeyUnavailable as err:
                raise ModelRefused(str(err)) from None
            except KeyRefused as err:
                raise ModelRefused(f"model {endpoint.name if endpoint else pool!r}: {err}") from None
            except RateLimited as err:
                # the provider's limit, not a failure: wait as it asks, then the same call again
                wait = err.retry_after if err.retry_after is not None else 1.0
                self.pacer.backoff(paced, wait)
                metrics.RATE_LIMITED.labels(pool if endpoint is None else endpoint.name).inc()
                if asyncio.get_running_loop().time() + wait > limited_until:
                    raise CallFailed(f"{err} (rate limited for {RATE_LIMITED_WAIT_S:.0f}s)", attempt + 1) from None
                await asyncio.sleep(wait)
                continue
            except ReplicaError as err:
                error, gone = str(err), err.gone
                tried.add(info.replica_id)
                self.pool.mark_failed(info.replica_id, error)
            except RequestRejected as err:
                raise CallFailed(str(err), attempt + 1, infrastructure=False) from None
            finally:
                load.in_flight -= 1
                self._wake()
            attempt += 1
        raise CallFailed(f"failed on {len(tried)} replica(s): {error}", self.s.gateway_attempts)

    async def acquire(self, pool: str, key: str, tried: set[str]) -> ReplicaLoad:
        """A replica slot for this call: routed by policy, preferring replicas not tried yet.
        Waits (bounded, in FIFO order) while every replica is at its cap or still loading."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(REGISTRATION_WAIT_S, self.s.gateway_request_timeout_s)
        while True:
            loads = self.pool.loads(pool)
            choice = self.router.choose(key, loads, tried) or self.router.choose(key, loads)
            if choice is not None:
                choice.in_flight += 1
                return choice
            if (refused := self.pool.key_refused(pool)) is not None:
                raise ModelRefused(f"model {pool.removeprefix('model:').split('@')[0]!r}: {refused}")
            remaining = deadline - loop.time()
            if remaining <= 0:
                what = "registered" if not loads else "healthy with a free slot"
                raise CallFailed(f"no {pool!r} replica {what} (waited {REGISTRATION_WAIT_S:.0f}s)")
            fut = loop.create_future()
            self._waiters.append(fut)
            try:
                await asyncio.wait_for(fut, remaining)
            except TimeoutError:
                pass

    def _wake(self, everyone: bool = False) -> None:
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if not everyone:
                    return


def export_metrics(decisions: list[Decision]) -> None:
    """One batch's decisions in the metrics: counters summed per replica first (one increment
    per replica and kind, not per decision); latencies one by one (a histogram has no bulk
    observe), which costs far less than the HTTP call each of them stands for."""
    by_replica: dict[str, list[Decision]] = {}
    invalid = 0
    for d in decisions:
        if d.replica:  # a replica answered (an infrastructure failure has none)
            by_replica.setdefault(d.replica, []).append(d)
        if not d.valid and not d.failed:
            invalid += 1
    for replica, answered in by_replica.items():
        metrics.LLM_CALLS.labels(replica).inc(len(answered))
        metrics.LLM_TOKENS.labels("prompt", replica).inc(sum(d.prompt_tokens for d in answered))
        metrics.LLM_TOKENS.labels("completion", replica).inc(sum(d.completion_tokens for d in answered))
        metrics.REASKS.labels(replica).inc(sum(d.reasks for d in answered))
        latency = metrics.LLM_SECONDS.labels(replica)
        for d in answered:
            latency.observe(d.latency_ms / 1000)
    metrics.INVALID.labels("gateway").inc(invalid)
