"""Collects one round's answers on a host: guess batches (~1,000 per message) go to the
recorder via JetStream async publishes; the host's partial aggregate goes to the environment."""

from __future__ import annotations

import asyncio

from nats.aio.client import Client
from nats.js import JetStreamContext

from populace.core import bus, metrics, subjects, telemetry
from populace.core.contracts import GuessBatch, Progress
from populace.games.rules import PartialBuilder


class GuessCollector:
    def __init__(self, nc: Client, js: JetStreamContext, *, run_id: str, round_: int,
                 host_id: str, batch_size: int) -> None:
        self._nc, self._js = nc, js
        self.run_id, self.round, self.host_id = run_id, round_, host_id
        self._batch_size = batch_size
        self.partial = PartialBuilder()
        self._seq = 0
        # (subject, data, headers, PubAck future) of every batch, until the round closes
        self._sent: list[tuple[str, bytes, dict, asyncio.Future]] = []
        self._publishing: list[asyncio.Task] = []
        self._new()

    def _new(self) -> None:
        self._ids: list[int] = []
        self._values: list[float | None] = []
        self._raws: list[str] = []
        self._lat: list[float] = []

    def add(self, agent_id: int, value: float | None, raw: str, latency_ms: float) -> None:
        self._ids.append(agent_id)
        self._values.append(value)
        self._raws.append(raw)
        self._lat.append(latency_ms)
        self.partial.add(agent_id, value)
        if len(self._ids) >= self._batch_size:
            self.flush()

    def flush(self) -> None:
        if not self._ids:
            return
        batch = GuessBatch.model_construct(
            v=1, run_id=self.run_id, round=self.round, host_id=self.host_id, seq=self._seq,
            agent_ids=self._ids, values=self._values, raws=self._raws, latency_ms=self._lat,
        )
        self._seq += 1
        metrics.batch("agent-host", "guesses", len(self._ids))
        self._new()
        self._publishing.append(asyncio.get_running_loop().create_task(self._publish(batch)))

    async def _publish(self, batch: GuessBatch) -> None:
        shard = f"{self.host_id}-{batch.seq}"
        data = batch.model_dump_json().encode()
        subject = subjects.run_guesses(self.run_id, self.round, self.host_id)
        headers = telemetry.inject({"Nats-Msg-Id": subjects.msg_id(self.run_id, self.round, shard, "guesses")})
        ack = await self._js.publish_async(subject, data, headers=headers)
        self._sent.append((subject, data, headers, ack))
        tick = Progress(run_id=self.run_id, round=self.round, host_id=self.host_id,
                        answered=len(batch.agent_ids))
        await self._nc.publish(subjects.progress(self.run_id, self.round, self.host_id), bus.encode(tick))

    async def _confirm(self, subject: str, data: bytes, headers: dict, ack: asyncio.Future) -> None:
        """Wait for a batch's PubAck; republish it if JetStream did not store it (e.g. during a
        leader election). The same Nats-Msg-Id makes the republish a no-op if it was stored."""
        try:
            await ack
        except bus.TRANSIENT:
            await bus.until_ready(lambda: self._js.publish(subject, data, headers=headers, timeout=5.0),
                                  f"republish {subject}")

    async def close(self) -> int:
        """Flush, wait until JetStream stored every batch, then publish the partial.
        Returns the number of batches. Ordering matters: the partial (and so the round
        result and the run's end) is stored after every guess it summarises."""
        self.flush()
        await asyncio.gather(*self._publishing)
        await asyncio.gather(*(self._confirm(*sent) for sent in self._sent))
        self._sent.clear()
        partial = self.partial.build(self.run_id, self.round, self.host_id)
        await bus.publish_js(self._js, subjects.run_partial(self.run_id, self.round, self.host_id),
                             partial, msg_id=subjects.msg_id(self.run_id, self.round, self.host_id, "partial"))
        return self._seq
