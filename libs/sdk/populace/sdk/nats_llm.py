"""The LLM port on the fleet: `ask()` returns at once with a future; requests are batched
(~1,000 prompts per message, or whatever arrived within a few ms) into one `llm.infer`
request per (system prompt, answer schema), on `llm.infer.<requester>` with the answer on the
requester's own reply subject (populace.core.replies). Batching lives here, in the transport,
never in the agents."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import secrets
import time
from collections import deque
from collections.abc import Callable, Sequence

import numpy as np

from populace.core.extras import fleet_missing

try:  # the fleet's libraries: an author's `populace-sdk` alone has none (populace.core.extras)
    from nats import errors as nats_errors
    from nats.aio.client import Client
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeout

    from populace.core import metrics, replies, telemetry
    from populace.core.telemetry import tracer
except ModuleNotFoundError as missing:
    raise fleet_missing("populace.sdk.nats_llm (the LLM port on the fleet)", missing) from missing

from populace.core import logs, looptime, subjects
from populace.core.contracts import InferBatch, InferReply, ModelConfig, ModelEndpoint, ModelUse, Usage
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
# Answers handed to their turns per turn of the event loop. A gateway's reply wakes up to 1,000
# turns; hundreds of replies read at once woke hundreds of thousands of turns in one loop turn,
# whose prompts and next acts then held the loop for seconds: no socket was read meanwhile, so
# nats-server cut the host off as a slow consumer, and every publish of the reconnecting client
# overflowed its buffer (a 4-member scene at 1M agents, 888 × OutboundBufferLimitError).
ANSWERS_PER_LOOP_TURN = 2000
# What the connection may fail with for a while (a reconnect, a full buffer while reconnecting): the
# batch is sent again once it is back. Anything else nats-py raises is a bug of ours, not a transient.
_NOT_TRANSIENT = (nats_errors.MaxPayloadError, nats_errors.BadSubjectError, nats_errors.BadHeaderError)


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
    """Requests waiting to leave in one batch: they share a system prompt, a schema and a model."""

    __slots__ = ("bytes", "futs", "keys", "model", "prefix", "prompts", "schema", "seqs", "system", "timer")

    def __init__(self, system: str, schema: dict | None, model: int = 0) -> None:
        self.system, self.schema, self.model = system, schema, model
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
                 shared_suffix: bool = False, models: Sequence[ModelEndpoint] = (),
                 model_of: np.ndarray | None = None) -> None:
        """`models`: the run's `models:` (none: `model.backend` answers every call); `model_of`:
        per agent id, the index of its model there (populace.population.model_assignment). A call is
        answered by the model of the agent it is keyed to."""
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
        self._models = tuple(models)
        self._model_of = model_of if self._models and len(self._models) > 1 else None
        # one line of requests per model (its batches name it); calls that bring their own system
        # prompt or schema get lines of their own
        self._defaults = [_Pending(system, response_schema, m) for m in range(max(1, len(self._models)))]
        self._default = self._defaults[0]
        self._other: dict[tuple[str, str, int], _Pending] = {}
        self._by_identity: dict[tuple[int, int, int], tuple[str | None, dict | None, _Pending]] = {}
        self._last: tuple[str | None, dict | None, int, _Pending] | None = None
        # per model index: answered calls, prompt, cached and completion tokens (the usage, in dollars)
        self._use = [[0, 0, 0, 0] for _ in range(max(1, len(self._models)))]
        self._seqs: dict = {}  # key (or caller, key) -> its calls so far this round: each call seeded apart
        self._sending: set[asyncio.Task] = set()
        self.batches_sent = 0
        # answers waiting to be handed to their turns, ANSWERS_PER_LOOP_TURN per loop turn: one
        # entry per reply (its turns' futures, their answers, how many were handed already)
        self._answers: deque[list] = deque()
        self._handing = False
        self._clock = looptime.of(self._loop)
        self._out = Outstanding()  # the seconds a batch of this session was out (table round_profile)

    def _pending_for(self, system: str | None, schema: dict | None, model: int) -> _Pending:
        # a simulation passes the same objects call after call: found by identity first (a
        # json.dumps per call cost more than the rest of the ask), the last one found first of all
        # (a scene's stage asks every member with its schema, one stage after another)
        last = self._last
        if last is not None and last[1] is schema and last[0] is system and last[2] == model:
            return last[3]
        same = self._by_identity.get((id(system), id(schema), model))
        if same is not None and same[0] is system and same[1] is schema:
            pending = same[2]
        else:
            pending = self._pending_by_value(system, schema, model)
            self._by_identity[(id(system), id(schema), model)] = (system, schema, pending)
        self._last = (system, schema, model, pending)
        return pending

    def _pending_by_value(self, system: str | None, schema: dict | None, model: int) -> _Pending:
        system = self._default.system if system is None else system
        schema = self._default.schema if schema is None else schema
        key = (system, json.dumps(schema, sort_keys=True), model)
        pending = self._other.get(key)
        if pending is None:
            pending = self._other[key] = _Pending(system, schema, model)
        return pending

    def _model_for(self, key: int) -> int:
        if self._model_of is None:
            return 0
        if not 0 <= key < len(self._model_of):
            raise ValueError(f"llm.ask: key {key} is not an agent of this run (a call is keyed to the agent it is "
                             "for, and answered by that agent's model)")
        return int(self._model_of[key])

    def ask(self, prompt: str, *, key: int, prefix_chars: int = 0, system: str | None = None,
            schema: dict | None = None) -> asyncio.Future:
        fut = self._loop.create_future()
        model = self._model_for(key)
        p = self._defaults[model] if system is None and schema is None else self._pending_for(system, schema, model)
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
        for p in self._defaults:
            self._flush(p)
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
                           endpoint=self._models[p.model] if self._models else None,
                           suffix=suffix)
        task = self._loop.create_task(self._send(batch, futs, p.model))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, batch: InferBatch, futs: list[asyncio.Future], model: int = 0) -> None:
        n = len(batch.keys)
        self.batches_sent += 1
        in_flight = metrics.LLM_IN_FLIGHT.labels("agent-host")
        in_flight.inc(n)
        t0 = time.perf_counter()
        self._out.begin()
        try:
            with tracer.start_as_current_span("agent-host.infer", attributes={"populace.prompts": n}):
                await self._until_answered(batch, futs, tracing=telemetry.inject(), model=model)
        except Exception as err:
            # Never a task's exception nobody reads, never a turn waiting for ever: the batch's turns
            # fail as "no model answered", naming the cause, and the round pauses on it (play.py).
            log.error("infer_send_failed", batch=batch.batch_id, prompts=n, error=f"{type(err).__name__}: {err}",
                      exc_info=err)
            failure = InferError(f"the request to the gateway failed: {type(err).__name__}: {err}")
            for fut in futs:
                if not fut.done():
                    fut.set_exception(failure)
        finally:
            self._out.end()
            in_flight.dec(n)
            metrics.batch("agent-host", "infer", n, time.perf_counter() - t0)

    def _hand(self, futs: list[asyncio.Future], answers: list[str] | list[BaseException]) -> None:
        """Give turns their answers (or failures), at most ANSWERS_PER_LOOP_TURN per loop turn.
        A reply's answers wait as one entry, not one per turn (a million per round)."""
        if not futs:
            return
        self._answers.append([futs, answers, 0])
        if not self._handing:
            self._handing = True
            self._loop.call_soon(self._hand_some)

    def _hand_some(self) -> None:
        waiting = self._answers
        left = ANSWERS_PER_LOOP_TURN
        while waiting and left > 0:
            entry = waiting[0]
            futs, answers, start = entry
            end = min(len(futs), start + left)
            for fut, answer in zip(futs[start:end], answers[start:end]):
                if fut.done():
                    continue
                if isinstance(answer, BaseException):
                    fut.set_exception(answer)
                else:
                    fut.set_result(answer)
            left -= end - start
            if end == len(futs):
                waiting.popleft()
            else:
                entry[2] = end
        if waiting:  # the rest after the turns woken now ran and the sockets were read
            self._loop.call_soon(self._hand_some)
        else:
            self._handing = False

    async def _until_answered(self, batch: InferBatch, futs: list[asyncio.Future], tracing: dict,
                              model: int = 0) -> None:
        """Send the batch, then again what no model answered (the whole batch when its gateway
        went silent or none took it), with backoff, until every prompt has its answer — or no
        model answered anything for `down_s`: then ModelUnavailable, never a made-up answer."""
        pending = list(range(len(futs)))
        failing_since: float | None = None
        attempt, error, refused = 0, "", None
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
                if reply.refused:  # the model will not answer this run (its key refused): no retry helps
                    refused = reply.refused
                    break
                if reply.error:
                    raise InferError(reply.error)
                if len(reply.texts) != len(pending):
                    raise InferError(f"gateway answered {len(reply.texts)} of {len(pending)} prompts")
                failed = reply.failed or [None] * len(pending)
                counted = len(reply.prompt_tokens) == len(pending) == len(reply.completion_tokens)
                cached = reply.cached_tokens if len(reply.cached_tokens) == len(pending) else None
                use = self._use[model]
                still = []
                given: list[asyncio.Future] = []
                texts: list[str] = []
                prompt_t = completion_t = cached_t = squares = 0
                for j, (i, text, why) in enumerate(zip(pending, reply.texts, failed)):
                    if why:
                        still.append(i)
                        error = why
                    elif not futs[i].done():
                        given.append(futs[i])
                        texts.append(text)
                        if counted:
                            p, c = reply.prompt_tokens[j], reply.completion_tokens[j]
                            prompt_t += p
                            completion_t += c
                            squares += (p + c) ** 2
                            if cached is not None:
                                cached_t += cached[j]
                self._hand(given, texts)
                self.llm_calls += len(given)
                self.prompt_tokens += prompt_t
                self.completion_tokens += completion_t
                self.tokens_sq += squares
                use[0] += len(given)
                use[1] += prompt_t
                use[2] += cached_t
                use[3] += completion_t
                if len(still) < len(pending):
                    failing_since = None  # a model answered: the path is up
                pending = still
                if not pending:
                    return
            except (TimeoutError, NatsTimeout, NoRespondersError, InferError) as err:
                error = f"{type(err).__name__}: {err}"
            except nats_errors.Error as err:  # the connection is away: sent again once it is back
                if isinstance(err, _NOT_TRANSIENT):
                    raise
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
        exc = ModelUnavailable(refused or f"no model answered for {self._down_s:g}s: {error or 'gateway unavailable'}")
        failing = [futs[i] for i in pending if not futs[i].done()]
        self._hand(failing, [exc] * len(failing))

    async def _ask(self, batch: InferBatch, tracing: dict) -> InferReply:
        """One request to the gateways' queue group. The gateway that takes it says so at once
        and every few seconds while it works: silence for `silence_s` means it is gone (or no
        gateway took it), and the batch is sent again without waiting for its timeout. Silence is
        counted on the loop's responsive clock (populace.core.looptime): seconds this process
        spent unable to read its socket are not the gateway's silence."""
        nc, loop, clock = self._nc, self._loop, self._clock
        inbox = replies.new_reply("gateway", self._requester)
        sub = await nc.subscribe(inbox)
        try:
            await nc.publish(self._subject, batch.model_dump_json().encode(), reply=inbox,
                             headers={**(tracing or {}), subjects.INFER_KEEPALIVE_HEADER: "1"})
            start = loop.time()
            deadline = start + self._timeout + len(batch.keys) * self._per_prompt_s
            heard = clock.now()
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise TimeoutError(f"no answer within {self._timeout:g}s")
                quiet = clock.now() - heard
                try:
                    msg = await sub.next_msg(timeout=max(0.05, min(self._silence_s - quiet, left)))
                except NatsTimeout:
                    if deadline - loop.time() <= 0:
                        raise TimeoutError(f"no answer within {self._timeout:g}s") from None
                    if clock.now() - heard < self._silence_s:
                        continue  # this process was held part of that wait: not the gateway's silence
                    raise InferError(f"no gateway has the batch (silent for {self._silence_s:g}s)") from None
                heard = clock.now()
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
            with contextlib.suppress(nats_errors.Error):  # a connection going away has dropped it anyway
                await sub.unsubscribe()

    @property
    def model_wait_s(self) -> float:
        """Seconds so far during which at least one of this session's batches was out."""
        return self._out.now()

    def usage(self) -> Usage:
        """The LLM work of this round so far (what the budget and the estimate count), in
        dollars at the models' prices, and per model when the run has several."""
        by_model = {}
        for m, (calls, prompt, cached, completion) in zip(self._models, self._use, strict=False):
            by_model[m.name] = ModelUse(llm_calls=calls, prompt_tokens=prompt, cached_tokens=cached,
                                        completion_tokens=completion,
                                        dollars=m.prices.dollars(prompt, cached, completion))
        return Usage(llm_calls=self.llm_calls, prompt_tokens=self.prompt_tokens,
                     completion_tokens=self.completion_tokens, tokens_sq=self.tokens_sq,
                     infra_retries=self.infra_retries, cached_tokens=sum(u[2] for u in self._use),
                     dollars=sum(u.dollars for u in by_model.values()), by_model=by_model)

    async def drain(self) -> None:
        self.flush()
        while self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
