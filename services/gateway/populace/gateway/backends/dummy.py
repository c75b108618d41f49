"""The paper's dummy benchmark as a backend: every request waits `latency_s`, then answers
with a seeded answer that satisfies the request's JSON schema (`populace.core.synth`): for
the ratio game's `{"guess": number in [0, 100]}`, a seeded integer in [0, 100].

Requests in one batch wait concurrently, as they would on a real server; the answer for an
agent depends only on (seed, round, agent) and the schema, never on how requests were batched."""

from __future__ import annotations

import asyncio

from populace.core import synth
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch


class DummyBackend:
    """No LLM call happens, so nothing is recorded in `llm_calls`."""

    async def serve(self, batch: InferBatch) -> tuple[InferReply, LlmCallBatch | None]:
        return InferReply(batch_id=batch.batch_id, texts=await self.complete(batch)), None

    async def complete(self, batch: InferBatch) -> list[str]:
        latency = batch.endpoint.latency_s if batch.endpoint is not None else batch.model.latency_s
        if latency > 0:
            await asyncio.sleep(latency)
        seed, rnd, render = batch.model.seed, batch.round, synth.renderer(batch.response_schema)
        if batch.seqs is None:
            return [render(seed, rnd, k) for k in batch.keys]
        return [render(synth.call_seed(seed, s), rnd, k) for k, s in zip(batch.keys, batch.seqs)]
