"""The agents' side of the inference gateway: `ask()` returns at once with a future; requests
are batched (~1,000 prompts per message, or whatever arrived within a few ms) into one
`llm.infer` request. Batching lives here, in the transport, never in the agents."""

from __future__ import annotations

import asyncio
import itertools
import random

from nats.aio.client import Client
from nats.errors import NoRespondersError, TimeoutError as NatsTimeout

from populace.core import logs, metrics, subjects, telemetry
from populace.core.telemetry import tracer
from populace.core.contracts import InferBatch, InferReply, ModelConfig

log = logs.get("populace.llm")
_batch_ids = itertools.count()

# A batch's encoded prompts are kept well under NATS' default 1 MB max_payload.
MAX_BATCH_BYTES = 512 * 1024
# A real model's batch may take as long as its tokens at the slowest decode we plan for
# (20 tokens/s for the whole batch: SmolLM2 with chain of thought on a busy 2-core CPU).
# Waiting less makes the agent re-send work the gateway is still doing, which only adds load.
SECONDS_PER_TOKEN = 0.05


class InferError(RuntimeError):
    """The gateway could not answer (after retries). The agent records an invalid answer."""


class InferSession:
    """Batches one round's requests from one host. All requests share a system prompt."""

    def __init__(self, nc: Client, *, run_id: str, round_: int, model: ModelConfig,
                 max_value: float, system: str, response_schema: dict | None = None,
                 batch_size: int = 1000, flush_s: float = 0.005,
                 timeout_s: float = 60.0, attempts: int = 3, host_id: str = "") -> None:
        self._nc = nc
        self._loop = asyncio.get_running_loop()
        self._header = dict(run_id=run_id, round=round_, model=model, max_value=max_value,
                            system=system, response_schema=response_schema)
        self._id_prefix = f"{host_id}.{run_id}.{round_}."
        self._batch_size = batch_size
        self._flush_s = flush_s
        self._timeout = timeout_s
        self._per_prompt_s = 0.0 if model.backend == "dummy" else model.max_tokens * SECONDS_PER_TOKEN
        self._attempts = attempts
        self._keys: list[int] = []
        self._prompts: list[str] = []
        self._prefix: list[int] = []
        self._futs: list[asyncio.Future] = []
        self._bytes = 0
        self._timer: asyncio.TimerHandle | None = None
        self._sending: set[asyncio.Task] = set()
        self.batches_sent = 0

    def ask(self, key: int, prompt: str, prefix_chars: int = 0) -> asyncio.Future:
        """`prefix_chars`: how much of the prompt's start is the same every round (a persona)."""
        fut = self._loop.create_future()
        self._keys.append(key)
        self._prompts.append(prompt)
        self._prefix.append(prefix_chars)
        self._futs.append(fut)
        self._bytes += len(prompt) + 16
        if len(self._keys) >= self._batch_size or self._bytes >= MAX_BATCH_BYTES:
            self.flush()
        elif self._timer is None:
            self._timer = self._loop.call_later(self._flush_s, self.flush)
        return fut

    def flush(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._keys:
            return
        keys, prompts, futs, prefix = self._keys, self._prompts, self._futs, self._prefix
        self._keys, self._prompts, self._futs, self._prefix, self._bytes = [], [], [], [], 0
        task = self._loop.create_task(self._send(keys, prompts, futs, prefix if any(prefix) else None))
        self._sending.add(task)
        task.add_done_callback(self._sending.discard)

    async def _send(self, keys: list[int], prompts: list[str], futs: list[asyncio.Future],
                    prefix: list[int] | None) -> None:
        batch = InferBatch(batch_id=f"{self._id_prefix}{next(_batch_ids)}", keys=keys,
                           prompts=prompts, prefix_chars=prefix, **self._header)
        data = batch.model_dump_json().encode()
        self.batches_sent += 1
        metrics.batch("agent-host", "infer", len(keys))
        in_flight = metrics.LLM_IN_FLIGHT.labels("agent-host")
        in_flight.inc(len(keys))
        try:
            with tracer.start_as_current_span("agent-host.infer", attributes={"populace.prompts": len(keys)}):
                await self._request(batch.batch_id, data, futs, tracing=telemetry.inject())
        finally:
            in_flight.dec(len(keys))

    async def _request(self, batch_id: str, data: bytes, futs: list[asyncio.Future], tracing: dict) -> None:
        error: str = ""
        for attempt in range(self._attempts):
            try:
                msg = await self._nc.request(subjects.LLM_INFER, data,
                                             timeout=self._timeout + len(futs) * self._per_prompt_s,
                                             headers=tracing or None)
                reply = InferReply.model_validate_json(msg.data)
                if reply.error:
                    raise InferError(reply.error)
                if len(reply.texts) != len(futs):
                    raise InferError(f"gateway answered {len(reply.texts)} of {len(futs)} prompts")
                for fut, text in zip(futs, reply.texts):
                    if not fut.done():
                        fut.set_result(text)
                return
            except (NatsTimeout, NoRespondersError, InferError, asyncio.TimeoutError) as err:
                error = f"{type(err).__name__}: {err}"
                log.warning("infer_retry", batch=batch_id, attempt=attempt + 1, error=error)
                # Idempotent retry with jittered backoff: the gateway may be momentarily full.
                await asyncio.sleep(min(2.0, 0.1 * 2**attempt) * (0.5 + random.random()))
        exc = InferError(error or "gateway unavailable")
        for fut in futs:
            if not fut.done():
                fut.set_exception(exc)

    async def drain(self) -> None:
        self.flush()
        while self._sending:
            await asyncio.gather(*list(self._sending), return_exceptions=True)
