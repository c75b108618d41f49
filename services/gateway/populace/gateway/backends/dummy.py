"""The paper's dummy benchmark as a backend: every request waits `latency_s`, then answers
with a seeded random integer in [0, max_value] as the structured answer {"guess": n}.

Requests in one batch wait concurrently, as they would on a real server; the answer for an
agent depends only on (seed, round, agent), never on how requests were batched."""

from __future__ import annotations

import asyncio

from populace.core.contracts import InferBatch, InferReply, LlmCallBatch

_MASK = (1 << 64) - 1


def seeded_value(seed: int, round_: int, key: int, max_value: int) -> int:
    """splitmix64 of (seed, round, key) → an integer in [0, max_value]."""
    z = (seed * 0x9E3779B97F4A7C15 + round_ * 0xBF58476D1CE4E5B9 + key * 0x94D049BB133111EB) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    z ^= z >> 31
    return z % (max_value + 1)


class DummyBackend:
    """No LLM call happens, so nothing is recorded in `llm_calls`."""

    async def serve(self, batch: InferBatch) -> tuple[InferReply, LlmCallBatch | None]:
        return InferReply(batch_id=batch.batch_id, texts=await self.complete(batch)), None

    async def complete(self, batch: InferBatch) -> list[str]:
        if batch.model.latency_s > 0:
            await asyncio.sleep(batch.model.latency_s)
        seed, rnd, top = batch.model.seed, batch.round, int(batch.max_value)
        return [f'{{"guess": {seeded_value(seed, rnd, k, top)}}}' for k in batch.keys]
