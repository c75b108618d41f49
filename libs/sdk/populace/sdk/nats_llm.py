"""The LLM port on the fleet: `ask()` returns at once with a future; requests are batched
(~1,000 prompts per message, or whatever arrived within a few ms) into one `llm.infer`
request per (system prompt, answer schema), on `llm.infer.<requester>` with the answer on the
requester's own reply subject (populace.core.replies). Batching lives here, in the transport,
never in the agents."""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import secrets
import time
from collections.abc import Callable

from nats.aio.client import Client
from nats.errors import NoRespondersError
from nats.errors import TimeoutError as NatsTimeout

from populace.core import logs, metrics, replies, subjects, telemetry
from populace.core.contracts import InferBatch, InferReply, ModelConfig, Usage
from populace.core.telemetry import tracer
from populace.sdk.llm import InferError, ModelUnavailable, call_tag
from populace.sdk.profile import Outstanding

log = logs.get("populace.llm")
_batch_ids = itertools.count()

# A batch's encoded prompts are kept well under NATS' default 1 MB max_payload.
MAX_BATCH_BYTES = 512 * 1024
# A real model's batch may take as long as its tokens at the slowest decode we plan for
# (20 tokens/s for the whole batch: SmolLM2 with chain of thought on a busy 2-core CPU).
# Waiting less makes the agent re-send work the gateway is still doing, which only adds load.
SECONDS_PER_TOKEN = 0.05
# While a gateway says it is working on a batch (a keepalive every second), the batch is not
# timed out by that estimate: the gateway bounds each model call itself (its request timeout,
# re-asks, retries), and a slow replica shared by many batches (SmolLM2 with chain of thought on
# a busy CPU) may take longer than one batch's share; re-sending would only queue the same work
# again and turn a slow round into a pause. This cap guards against a gateway that never ends.
MAX_WAIT_WHILE_WORKED_ON_S = 1800.0


# A shared suffix shorter than this stays in the prompts (not worth a field).
MIN_SUFFIX = 16


def common_suffix(prompts: list[str], keep: list[int]) -> int:
    """How many trailing characters all `prompts` share, never reaching into the first
    `keep[i]` characters of prompt i (its prefix, which routes it)."""
    first = prompts[0]
    most = min(len(text) - k for text, k in zip(prompts, keep, strict=True))
    if most <= 0:
        return 0
    tail = first[len(first) - most:]
    for text in prompts[1:]:
        if text.endswith(tail):
            continue
        lo, hi = 0, len(tail) - 1  # the longest end of `tail` that `text` ends with (monotone in length)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text.endswith(tail[len(tail) - mid:]):
                lo = mid
            else:
                hi = mid - 1
        if lo < MIN_SUFFIX:
            return 0
        tail = tail[len(tail) - lo:]
    return len(tail)


class _Pending:
    """Requests waiting to leave in one batch: they share a system prompt and a schema."""

    __slots__ = ("bytes", "futs", "keys", "prefix", "prompts", "schema", "seqs", "system", "timer")

    def __init__(self, system: str, schema: dict | None) -> None:
        self.system, self.schema = system, schema
        self.keys: list[int] = []
        self.seqs: list[int] = []
        self.prompts: list[str] = []
        self.prefix: list[int] = []
        self.futs: list[asyncio.Future] = []
        self.bytes = 0
        self.timer: asyncio.TimerHandle | None = None


class InferSession:
    """One round's requests from one host."""

    def __init__(self, nc: Client, *, run_id: str, round_: int, model: ModelConfig, system: str,
                 response_schema: dict | None = None, batch_size: int = 1000, flush_s: float = 0.005,
                 timeout_s: float = 60.0, attempts: int = 3, host_id: str = "", silence_s: float = 5.0,
                 down_s: float = 120.0, on_worked_on: Callable[[], None] | None = None,
                 shared_suffix: bool = False) -> None:
        self._nc = nc
        self._loop = asyncio.get_running_loop()
        self._run_id, self._round, self._model = run_id, round_, model
        # Who asks (its NATS user: the gateway answers only on that user's reply subjects), and
        # batch ids nobody else can predict: the gateway records each batch's calls under the
        # requester and this id, so another host sending them first would drop the real records.
        self._requester = replies.requester(nc, fallback=host_id or replies.ANONYMOUS)
        self._subject = subjects.llm_infer(self._requester)
        self._id_prefix = f"{host_id}.{run_id}.{round_}.{secrets.token_hex(8)}."
        self._batch_size = batch_size
        self._flush_s = flush_s
        self._timeout = timeout_s
        self._per_prompt_s = 0.0 if model.backend == "dummy" else model.max_tokens * SECONDS_PER_TOKEN
        self._attempts = attempts  # tries before a failure is logged as a warning
        self._silence_s, self._down_s = silence_s, down_s
        # called on every keepalive of a gateway working on one of this session's batches: the
        # round is making progress even while no answer has come back yet
        self._on_worked_on = on_worked_on
        # Whether the text every prompt of a batch ends with is sent once (InferBatch.suffix): an
        # interview's prompts end with its question, the same for everyone asked it.
        self._shared_suffix = shared_suffix
        self.infra_retries = 0  # prompts sent again because no model answered them
        self.llm_calls = self.prompt_tokens = self.completion_tokens = 0  # answered prompts, their tokens
        self.tokens_sq = 0.0
        self._default = _Pending(system, response_schema)
        self._other: dict[tuple[str, str], _Pending] = {}  # calls that brought their own system/schema
        self._by_identity: dict[tuple[int, int], tuple[str | None, dict | None, _Pending]] = {}
        self._seqs: dict = {}  # key (or caller, key) -> its calls so far this round: each call seeded apart
        self._sending: set[asyncio.Task] = set()
        self.batches_sent = 0
        self._out = Outstanding()  # the seconds a batch of this session was out (table round_profile)

    def _pending_for(self, system: str | None, schema: dict | None) -> _Pending:
        # a simulation passes the same objects call after call: found by identity first (a
        # json.dumps per call cost more than the rest of the ask)
        same = self._by_identity.get((id(system), id(schema)))
        if same is not None and same[0] is system and same[1] is schema:
            return same[2]
        pending = self._pending_by_value(system, schema)
        self._by_identity[(id(system), id(schema))] = (system, schema, pending)
        return pending

    def _pending_by_value(self, system: str | None, schema: dict | None) -> _Pending:
        system = self._default.system if system is None else system
        schema = self._default.schema if schema is None else schema
        key = (system, json.dumps(schema, sort_keys=True))
        pending = self._other.get(key)
        if pending is None:
            pending = self._other[key] = _Pending(system, schema)
        return pending

    def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
            schema: dict | None = None) -> asyncio.Future:
        fut = self._loop.create_future()
        p = self._default if system is None and schema is None else self._pending_for(system, schema)
        p.keys.append(key)
        p.seqs.append(call_tag(self._seqs, key))
        p.prompts.append(prompt)
        p.prefix.append(prefix_chars)
        p.futs.append(fut)
        p.bytes += len(prompt) + 16
        if len(p.keys) >= self._batch_size or p.bytes >= MAX_BATCH_BYTES:
            self._flush(p)
        elif p.timer is None:
            p.timer = self._loop.call_later(self._flush_s, self._flush, p)
        return fut

    def flush(self) -> None:
        """Send everything queued now rather than after the flush timer."""
        self._flush(self._default)
        for p in self._other.values():
            self._flush(p)

    def _flush(self, p: _Pending) -> None:
        if p.timer is not None:
            p.timer.cancel()
            p.timer = None
        if not p.keys:
            return
        keys, prompts, futs, prefix, seqs = p.keys, p.prompts, p.futs, p.prefix, p.seqs
        p.keys, p.prompts, p.futs, p.prefix, p.seqs, p.bytes = [], [], [], [], [], 0
        suffix = None
        if self._shared_suffix and len(prompts) > 1:
            n = common_suffix(prompts, prefix)
            if n >= MIN_SUFFIX:
                suffix = prompts[0][len(prompts[0]) - n:]
                prompts = [text[:len(text) - n] for text in prompts]
        batch = InferBatch(batch_id=f"{self._id_prefix}{next(_batch_ids)}", run_id=self._run_id,
                           round=self._round, model=self._model, system=p.system,
                           response_schema=p.schema, keys=keys, prompts=prompts,
                           prefix_chars=prefix if any(prefix) else None, seqs=seqs if any(seqs) else None,
                           suffix=suffix)
        task = self._loop.create_task(self._send(batch, futs))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: InferBatch, futs: list[asyncio.Future]) -> None:
        n = len(batch.keys)
        self.batches_sent += 1
        in_flight = metrics.LLM_IN_FLIGHT.labels("agent-host")
        in_flight.inc(n)
        t0 = time.perf_counter()
        self._out.begin()
        try:
            with tracer.start_as_current_span("agent-host.infer", attributes={"populace.prompts": n}):
                await self._until_answered(batch, futs, tracing=telemetry.inject())
        finally:
            self._out.end()
            in_flight.dec(n)
            metrics.batch("agent-host", "infer", n, time.perf_counter() - t0)

    async def _until_answered(self, batch: InferBatch, futs: list[asyncio.Future], tracing: dict) -> None:
        """Send the batch, then again what no model answered (the whole batch when its gateway
        went silent or none took it), with backoff, until every prompt has its answer — or no
        model answered anything for `down_s`: then ModelUnavailable, never a made-up answer."""
        pending = list(range(len(futs)))
        failing_since: float | None = None
        attempt, error = 0, ""
        loop = self._loop
        # Hand-written, not tenacity: each pass re-sends only the prompts still unanswered, and the deadline
        # restarts whenever a model answers some; tenacity retries one call until it succeeds.
        while True:
            part = batch if len(pending) == len(futs) else batch.model_copy(update={
                "keys": [batch.keys[i] for i in pending], "prompts": [batch.prompts[i] for i in pending],
                "prefix_chars": [batch.prefix_chars[i] for i in pending] if batch.prefix_chars else None,
                "seqs": [batch.seqs[i] for i in pending] if batch.seqs else None,
                "batch_id": f"{batch.batch_id}.r{attempt}"})
            try:
                reply = await self._ask(part, tracing)
                if reply.error:
                    raise InferError(reply.error)
                if len(reply.texts) != len(pending):
                    raise InferError(f"gateway answered {len(reply.texts)} of {len(pending)} prompts")
                failed = reply.failed or [None] * len(pending)
                counted = len(reply.prompt_tokens) == len(pending) == len(reply.completion_tokens)
                still = []
                for j, (i, text, why) in enumerate(zip(pending, reply.texts, failed)):
                    if why:
                        still.append(i)
                        error = why
                    elif not futs[i].done():
                        futs[i].set_result(text)
                        self.llm_calls += 1
                        if counted:
                            p, c = reply.prompt_tokens[j], reply.completion_tokens[j]
                            self.prompt_tokens += p
                            self.completion_tokens += c
                            self.tokens_sq += (p + c) ** 2
                if len(still) < len(pending):
                    failing_since = None  # a model answered: the path is up
                pending = still
                if not pending:
                    return
            except (TimeoutError, NatsTimeout, NoRespondersError, InferError) as err:
                error = f"{type(err).__name__}: {err}"
            now = loop.time()
            failing_since = now if failing_since is None else failing_since
            if now - failing_since >= self._down_s:
                break
            self.infra_retries += len(pending)
            if attempt + 1 >= self._attempts:
                log.warning("infer_retry", batch=batch.batch_id, attempt=attempt + 1, prompts=len(pending), error=error)
            # Jittered backoff: the gateway may be momentarily full, or restarting.
            await asyncio.sleep(min(5.0, 0.1 * 2**attempt) * (0.5 + random.random()))
            attempt += 1
        exc = ModelUnavailable(f"no model answered for {self._down_s:g}s: {error or 'gateway unavailable'}")
        for i in pending:
            if not futs[i].done():
                futs[i].set_exception(exc)

    async def _ask(self, batch: InferBatch, tracing: dict) -> InferReply:
        """One request to the gateways' queue group. The gateway that takes it says so at once
        and every few seconds while it works: silence for `silence_s` means it is gone (or no
        gateway took it), and the batch is sent again without waiting for its timeout."""
        nc, loop = self._nc, self._loop
        inbox = replies.new_reply("gateway", self._requester)
        sub = await nc.subscribe(inbox)
        try:
            await nc.publish(self._subject, batch.model_dump_json().encode(), reply=inbox,
                             headers={**(tracing or {}), subjects.INFER_KEEPALIVE_HEADER: "1"})
            start = loop.time()
            deadline = start + self._timeout + len(batch.keys) * self._per_prompt_s
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"no answer within {self._timeout:g}s")
                try:
                    msg = await sub.next_msg(timeout=min(self._silence_s, left))
                except NatsTimeout:
                    if deadline - loop.time() <= 0:
                        raise TimeoutError(f"no answer within {self._timeout:g}s") from None
                    raise InferError(f"no gateway has the batch (silent for {self._silence_s:g}s)") from None
                headers = msg.headers or {}
                if headers.get("Status") == "503":
                    raise NoRespondersError
                if subjects.INFER_ACCEPTED_HEADER in headers:  # a gateway has it and is working on it
                    deadline = max(deadline, start + MAX_WAIT_WHILE_WORKED_ON_S)
                    if self._on_worked_on is not None:
                        self._on_worked_on()
                    continue
                try:
                    return InferReply.model_validate_json(msg.data)
                except ValueError as err:
                    raise InferError(f"malformed reply from the gateway: {err}") from None
        finally:
            await sub.unsubscribe()

    @property
    def model_wait_s(self) -> float:
        """Seconds so far during which at least one of this session's batches was out."""
        return self._out.now()

    def usage(self) -> Usage:
        """The LLM work of this round so far (what the budget and the estimate count)."""
        return Usage(llm_calls=self.llm_calls, prompt_tokens=self.prompt_tokens,
                     completion_tokens=self.completion_tokens, tokens_sq=self.tokens_sq,
                     infra_retries=self.infra_retries)

    async def drain(self) -> None:
        self.flush()
        while self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
