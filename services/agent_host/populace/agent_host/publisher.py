"""Where one round's outcomes leave a host: outcome batches (~1,000 per message) to the
recorder via JetStream async publishes, a progress tick per batch (and, while a gateway works on
the round's prompts, one every few seconds), and — only once JetStream stored every batch — the
host's partial to the environment."""

from __future__ import annotations

import asyncio
import json

from nats.aio.client import Client
from nats.js import JetStreamContext

from populace.agent_host.batch_fit import fit
from populace.core import bus, logs, metrics, subjects, telemetry
from populace.core.checkpoints import put_bytes
from populace.core.contracts import (
    PARTIAL_BYTES_PER_AGENT,
    PARTIAL_INLINE_BYTES,
    PARTIAL_OBJECT_BASE_BYTES,
    OutcomeBatch,
    PartialRef,
    Progress,
    RoundPartial,
    Usage,
    partial_object_limit,
    share_key,
)
from populace.sdk.outcome_wire import outcome_batch
from populace.sdk.play import OutcomeRows, RoundPaused, RoundShare
from populace.sdk.prototypes import KEY as PROTOTYPES
from populace.sdk.statejson import to_wire

log = logs.get("populace.agent_host")

PUBACK_WAIT_S = 10.0
# Of the server's max_payload, what a batch's headers (message id, trace context) may take
HEADERS_ROOM = 4096
# A slow model answers a gateway batch (up to 1,000 prompts) all at once, minutes after it was
# asked; meanwhile a tick this often tells the orchestrator the round is alive, not stalled.
WORKED_ON_TICK_S = 5.0


class PartialTooLarge(RoundPaused):
    """A share's partial larger than the environment takes (partial_object_limit): never stored."""


class OutcomePublisher:
    def __init__(self, nc: Client, js: JetStreamContext, *, run_id: str, round_: int, host_id: str,
                 epoch: int = 0) -> None:
        self._nc, self._js = nc, js
        self.run_id, self.round, self.host_id, self.epoch = run_id, round_, host_id, epoch
        # (subject, data, headers, PubAck future, the connection's reconnects when it was sent) of
        # every batch, until the round closes
        self._sent: list[tuple[str, bytes, dict, asyncio.Future, int]] = []
        self._publishing: list[asyncio.Task] = []
        self._last_worked_on_tick = 0.0
        self._ticks: set[asyncio.Task] = set()  # held until done (the loop keeps only weak references)

    def emit(self, batch: OutcomeRows) -> None:
        """Called by the OutcomeSink for every full batch (synchronously, on the hot path): the
        wire batch is made once, around the sink's own lists (populace.sdk.outcome_wire)."""
        envelope = outcome_batch(batch, run_id=self.run_id, round_=self.round, host_id=self.host_id,
                                 epoch=self.epoch)
        metrics.batch("agent-host", "outcomes", len(batch.agent_ids))
        metrics.INVALID.labels("agent-host").inc(batch.valid.count(False))
        self._publishing.append(asyncio.get_running_loop().create_task(self._publish(envelope)))

    def worked_on(self) -> None:
        """A gateway says it is working on this round's prompts: tick progress (0 answered), at
        most once per WORKED_ON_TICK_S, so a round waiting on a slow model is not taken as stalled."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_worked_on_tick < WORKED_ON_TICK_S:
            return
        self._last_worked_on_tick = loop.time()
        task = loop.create_task(self._tick(0))  # not awaited by close(): advice, never a reason to fail
        self._ticks.add(task)
        task.add_done_callback(self._ticks.discard)

    async def _publish(self, batch: OutcomeBatch) -> None:
        subject = subjects.run_outcomes(self.run_id, self.round, self.host_id)
        # one message, or (past the server's max_payload) its pieces cut between groups; a group
        # that alone does not fit raises BatchTooLarge, which close() raises: the round pauses
        for piece, data in fit(batch, self._nc.max_payload - HEADERS_ROOM):
            shard = f"{self.host_id}-{'audit-' if batch.audit else ''}{batch.seq}{piece}"
            msg_id = subjects.msg_id(self.run_id, self.round, shard, "outcomes", self.epoch)
            headers = telemetry.inject({"Nats-Msg-Id": bus.seal(self._js, msg_id)})
            reconnects = self._reconnects()
            try:
                ack = await self._js.publish_async(subject, data, headers=headers)
            except bus.TRANSIENT as err:  # the connection is away (its buffer full while it reconnects)
                log.warning("outcomes_publish_waiting", run_id=self.run_id, round=self.round, subject=subject,
                            error=type(err).__name__)
                await bus.until_ready(lambda d=data, h=headers: self._js.publish(subject, d, headers=h, timeout=5.0),
                                      f"publish {subject}", attempts=30)
                continue
            self._sent.append((subject, data, headers, ack, reconnects))
        await self._tick(len(batch.agent_ids))

    async def _tick(self, answered: int) -> None:
        """Progress on core NATS, not stored: lost with the connection (a restarting nats-server),
        it must not fail the round whose outcomes JetStream keeps (their PubAcks are checked)."""
        tick = Progress(run_id=self.run_id, round=self.round, host_id=self.host_id, answered=answered)
        try:
            await self._nc.publish(subjects.progress(self.run_id, self.round, self.host_id), bus.encode(tick))
        except Exception as err:  # a closed or reconnecting connection, in any of its forms
            log.debug("progress_tick_lost", error=f"{type(err).__name__}: {err}")

    def _reconnects(self) -> int:
        return self._nc.stats["reconnects"]

    async def _await_ack(self, ack: asyncio.Future, reconnects: int) -> None:
        """The PubAck, within PUBACK_WAIT_S. A PubAck future has no timeout of its own, and one
        lost with the connection (a restarting nats-server) would wait for ever: once the client
        has reconnected since the batch was sent (`reconnects`: its count then), its PubAck cannot
        come any more, and waiting out the bound cost a round 10 s after every nats-server restart."""
        if ack.done():  # the common case, at no cost: no task, no wait
            ack.result()
            return
        await asyncio.wait_for(bus.unless_reconnected(self._nc, asyncio.shield(ack), since=reconnects), PUBACK_WAIT_S)

    async def _confirm(self, subject: str, data: bytes, headers: dict, ack: asyncio.Future, reconnects: int) -> None:
        """Wait for a batch's PubAck; republish it if JetStream did not store it (e.g. during a
        leader election, or a nats-server restart). The same Nats-Msg-Id makes the republish a
        no-op if it was stored."""
        try:
            await self._await_ack(ack, reconnects)
        except bus.TRANSIENT as err:  # Reconnected among them
            log.warning("puback_missing", run_id=self.run_id, round=self.round, subject=subject,
                        error=type(err).__name__)
            await bus.until_ready(lambda: self._js.publish(subject, data, headers=headers, timeout=5.0),
                                  f"republish {subject}")

    async def close(self, share: RoundShare, usage: Usage | None = None,
                    checkpoints: dict[str, str] | None = None, interviews: Usage | None = None) -> None:
        """Wait until JetStream stored every batch, then publish the partial (with the digests
        of the share's `checkpoints` of the round). Ordering matters: the partial (and so the
        round result and the run's end) is stored after every outcome it summarises."""
        await asyncio.gather(*self._publishing)
        await asyncio.gather(*(self._confirm(*sent) for sent in self._sent))
        self._sent.clear()
        payload = to_wire(share.partial, strict=False) if share.partial is not None else {}
        if share.prototypes is not None:  # a prototype run: its representatives' partial, and what its others drew
            payload = {"partial": payload if share.partial is not None else None, PROTOTYPES: share.prototypes}
        data = json.dumps(payload, separators=(",", ":")).encode()
        if len(data) > PARTIAL_INLINE_BYTES:  # e.g. a partial's columns: stored, and the message names it
            limit = partial_object_limit(share.n)
            if len(data) > limit:
                raise PartialTooLarge(
                    f"round {self.round}: the partial of {self.host_id}'s {share.n:,} agents takes {len(data):,} "
                    f"bytes, more than the environment takes ({limit:,}: {PARTIAL_OBJECT_BASE_BYTES:,} and "
                    f"{PARTIAL_BYTES_PER_AGENT} per agent); its Partial must carry less (counts and sums, or fewer "
                    "columns)")
            name = subjects.checkpoint_partial(self.run_id, self.round, share_key(self.host_id, self.epoch))
            digest = await put_bytes(self._js, name, data, writer=self.host_id)
            payload = PartialRef(ref=name, sha256=digest, size=len(data)).model_dump()
        partial = RoundPartial(run_id=self.run_id, round=self.round, host_id=self.host_id, n=share.n,
                               n_valid=share.n_valid, payload=payload, epoch=self.epoch, usage=usage or Usage(),
                               checkpoints=checkpoints or {}, interviews=interviews or Usage(),
                               n_simulation_errors=share.n_simulation_errors,
                               profile=share.cost.wire() if share.cost is not None else None)
        await bus.publish_js(self._js, subjects.run_partial(self.run_id, self.round, self.host_id, self.epoch),
                             partial, msg_id=subjects.msg_id(self.run_id, self.round, self.host_id, "partial",
                                                             self.epoch))
