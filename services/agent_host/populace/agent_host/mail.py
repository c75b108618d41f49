"""Posts between hosts (a run with a graph): after a round, one message per other share (or
shards of it) over JetStream with de-duplicating ids; before the next round, a wait until every
share's mail of the last round is in — taken from the core subscription as it arrives, and read
back from the stream when a message did not come (lost on the way, sent before this host
subscribed, sent to a share before a re-placement). The mailroom (populace.sdk.mailroom)
decides what goes where and ignores duplicates; this module only moves bytes."""

from __future__ import annotations

import asyncio
import contextlib
import time

from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from pydantic import ValidationError

from populace.core import bus, logs, subjects
from populace.core.contracts import MailBatch, share_key
from populace.core.settings import Settings
from populace.sdk.hosting import HostedRun

log = logs.get("populace.agent_host")

REFETCH_S = 1.0  # mail still missing this long after a round opened is read from the stream


class MailMissing(RuntimeError):
    """Another share's posts of the last round never arrived: the run pauses (resume rebuilds
    every inbox from the round's checkpoints)."""


async def read_back(js: JetStreamContext, host_id: str, subject: str) -> list[Msg]:
    """Every message stored in RUN on `subject` (one share's mail of one round), through the
    one consumer this host's NATS user may create: named for the host, filtered to its own mail
    (deploy/nats/auth.conf). Created afresh for each read (a leftover of a read that died is
    deleted first: an update would keep its old position) and deleted after."""
    name = subjects.mail_consumer(host_id)
    with contextlib.suppress(NotFoundError):
        await js.delete_consumer(subjects.RUN_STREAM, name)
    await js.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
        name=name, filter_subject=subject, ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL,
        inactive_threshold=30.0))  # a read that dies leaves nothing for long
    sub = await js.pull_subscribe_bind(consumer=name, stream=subjects.RUN_STREAM)
    out: list[Msg] = []
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            msgs = await sub.fetch(min(pending, 256), timeout=5.0)
            pending -= len(msgs)
            out.extend(msgs)
    finally:
        await sub.unsubscribe()
        with contextlib.suppress(NotFoundError):
            await js.delete_consumer(subjects.RUN_STREAM, name)
    return out


class MailCarrier:
    def __init__(self, nc: Client, js: JetStreamContext, settings: Settings) -> None:
        self.nc, self.js, self.settings = nc, js, settings
        self.host_id = settings.host_id
        self._arrived: dict[tuple[str, int], asyncio.Event] = {}
        self._drop = settings.fault_drop_mail  # fault tests: mail to ignore, as if lost
        self._reading_back = asyncio.Lock()

    def _event(self, run: HostedRun) -> asyncio.Event:
        return self._arrived.setdefault((run.run_id, run.epoch), asyncio.Event())

    def forget(self, run_id: str, epoch: int) -> None:
        self._arrived.pop((run_id, epoch), None)

    # -- out -----------------------------------------------------------------------------------
    async def send(self, run: HostedRun, round_: int) -> tuple[int, int, int]:
        """Round `round_`'s posts to every share of its newest placement not yet sent to;
        returns (messages, posts, bytes) sent. Awaits every PubAck: the partial goes out after."""
        room = run.mailroom
        placed = run.placements.get(round_)
        if room is None or placed is None:
            return 0, 0, 0
        me = share_key(self.host_id, run.epoch)
        out = room.outgoing(round_, placed[1], me=[me])
        sends = []
        posts = size = 0
        for m in out:
            to_host, _, to_epoch = m.to.rpartition("@")
            batch = MailBatch(run_id=run.run_id, round=round_, host_id=self.host_id, epoch=run.epoch, to=m.to,
                              shard=m.shard, shards=m.shards, authors=m.authors, texts=m.texts, fields=m.fields)
            subject = subjects.run_mail(run.run_id, round_, to_host, int(to_epoch), self.host_id)
            msg_id = subjects.msg_id(run.run_id, round_, f"{me}>{m.to}.{m.shard}", "mail", run.epoch)
            sends.append(bus.publish_js(self.js, subject, batch, msg_id=msg_id))
            posts += len(m.authors)
            size += len(batch.model_dump_json())  # what crosses hosts: measured, for the bench
        await asyncio.gather(*sends)
        return len(sends), posts, size

    # -- in ------------------------------------------------------------------------------------
    def receive(self, runs: dict[str, dict[int, HostedRun]], batch: MailBatch, subject: str) -> str | None:
        """Keep a mail message for the share it is addressed to. Returns why it is refused (a
        forged sender), None when kept or harmlessly ignored (a duplicate, a share gone)."""
        if subject.rsplit(".", 1)[-1] != batch.host_id:
            return f"mail from {batch.host_id} on a subject of another sender ({subject})"
        if self._drop > 0:
            self._drop -= 1
            log.warning("mail_dropped_for_fault_test", run_id=batch.run_id, round=batch.round,
                        source=share_key(batch.host_id, batch.epoch), shard=batch.shard)
            return None
        for run in runs.get(batch.run_id, {}).values():
            if share_key(self.host_id, run.epoch) == batch.to and run.mailroom is not None:
                run.mailroom.receive(batch.round, share_key(batch.host_id, batch.epoch), batch.shard, batch.shards,
                                     (batch.authors, batch.texts, batch.fields))
                self._event(run).set()
        return None

    async def refetch(self, run: HostedRun, round_: int) -> int:
        """Read this share's mail of `round_` back from the stream; returns the new shards."""
        room = run.mailroom
        assert room is not None
        subject = subjects.run_mail_to(run.run_id, round_, self.host_id, run.epoch)
        async with self._reading_back:  # one consumer name per host: one read-back at a time
            msgs = await read_back(self.js, self.host_id, subject)
        new = 0
        me = share_key(self.host_id, run.epoch)
        for msg in msgs:
            try:
                batch = MailBatch.model_validate_json(msg.data)
            except ValidationError:
                continue  # the live subscription dead-letters it; here it is skipped
            if msg.subject.rsplit(".", 1)[-1] != batch.host_id or batch.to != me:
                continue
            new += room.receive(batch.round, share_key(batch.host_id, batch.epoch), batch.shard,
                                batch.shards, (batch.authors, batch.texts, batch.fields))
        return new

    async def ready(self, run: HostedRun, round_: int) -> None:
        """Wait until the posts agents read in `round_` (those of round_-1) are all here."""
        room = run.mailroom
        prev = round_ - 1
        if room is None or prev < 1 or prev in room.restored:
            return
        me = share_key(self.host_id, run.epoch)
        placed = run.placements.get(prev)
        if prev not in room.played or placed is None:
            raise MailMissing(f"share {me} did not play round {prev} and has no checkpoint of its posts")
        sources = {k: r for k, r in placed[1].items() if k != me}
        event = self._event(run)
        started = time.monotonic()
        refetched = 0.0
        while True:
            missing = room.missing(prev, sources)
            if not missing:
                _, refused = room.deliver(prev, sources)
                if refused:
                    log.warning("mail_refused", run_id=run.run_id, round=prev, posts=refused,
                                reason="authors that are not their sender's agents")
                return
            waited = time.monotonic() - started
            if waited > self.settings.mail_wait_s:
                raise MailMissing(f"round {prev}: the posts of shares {', '.join(missing)} did not arrive in "
                                  f"{self.settings.mail_wait_s:g} s")
            if waited >= REFETCH_S and time.monotonic() - refetched >= REFETCH_S:
                refetched = time.monotonic()
                got = await self.refetch(run, prev)
                log.info("mail_refetched", run_id=run.run_id, round=prev, missing=missing, shards=got)
                continue
            event.clear()
            try:
                await asyncio.wait_for(event.wait(), REFETCH_S)
            except TimeoutError:
                pass
