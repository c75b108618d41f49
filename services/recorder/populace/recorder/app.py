"""recorder service wiring: a durable pull consumer on `run.>` → DuckDB, acked only after
commit. Once a run is done *and* every guess its round results counted is in DuckDB, it
announces `run.<rid>.recorded`.

The fetch loop is our own nats-py pull subscription rather than a FastStream subscriber:
FastStream 0.7.8's batch pull loop catches `nats.errors.TimeoutError`, while nats-py raises
`asyncio.TimeoutError` mid-batch, so the loop restarts and already-fetched messages wait
for redelivery (`ack_wait`). Here both are handled and nothing is dropped.

Run with `populace service recorder` or `faststream run populace.recorder.app:app`."""

from __future__ import annotations

import asyncio
import time

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import BaseModel, ValidationError

from populace.core import bus, metrics, objects, subjects, telemetry
from populace.core.telemetry import tracer
from populace.core.contracts import (
    GuessBatch, LlmCallBatch, RoundResult, RunDone, RunRecorded, RunStarted, SpawnBatch,
)
from populace.core.service import Service
from populace.recorder.store import Event, Store

svc = Service("recorder")
broker, app = svc.broker, svc.app
store = Store(svc.settings.db)
active: set[str] = set()  # runs started and not yet announced as recorded
finished: dict[str, RunDone] = {}  # done, waiting for every guess to be committed
loop_state: dict = {}

# Events the recorder writes; everything else on `run.>` is acknowledged and skipped.
RECORDED: dict[str, type[BaseModel]] = {
    "started": RunStarted, "spawn": SpawnBatch, "guesses": GuessBatch,
    "round.result": RoundResult, "done": RunDone, "calls": LlmCallBatch,
}
ACK_WAIT_S = 120.0


@svc.on_ready
async def _start() -> None:
    sub = await svc.js.pull_subscribe(
        subjects.ANY_RUN_EVENT, durable="recorder", stream=subjects.RUN_STREAM,
        config=ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                              ack_wait=ACK_WAIT_S, max_ack_pending=max(1000, 4 * svc.settings.recorder_fetch)),
    )
    loop_state["sub"] = sub
    loop_state["task"] = asyncio.create_task(consume(sub))


@svc.on_stop
async def _stop() -> None:
    # A flag, not only cancel(): nats-py's fetch can turn a cancellation into a timeout,
    # which the loop would otherwise treat as "no messages yet" and carry on.
    loop_state["stopping"] = True
    if task := loop_state.get("task"):
        try:
            await asyncio.wait_for(task, timeout=5.0)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
    if sub := loop_state.get("sub"):
        # Unsubscribe before the broker drains: draining waits for this subscription's
        # pending queue to be marked done, which fetch() never does, so it would hang.
        try:
            await sub.unsubscribe()
        except Exception as err:  # noqa: BLE001
            svc.log.warning("unsubscribe_failed", error=str(err))
    store.close()


async def consume(sub) -> None:
    while not loop_state.get("stopping"):
        try:
            msgs = await sub.fetch(batch=svc.settings.recorder_fetch, timeout=0.5)
        except (asyncio.TimeoutError, nats.errors.TimeoutError):
            continue
        except Exception as err:  # noqa: BLE001 - reconnects etc.: keep consuming
            svc.log.warning("fetch_failed", error=str(err))
            await asyncio.sleep(0.5)
            continue
        try:
            await handle(msgs)
        except Exception as err:  # noqa: BLE001 - unacked messages are redelivered
            svc.log.error("ingest_failed", messages=len(msgs), error=str(err))
            await asyncio.sleep(1.0)


async def handle(raws: list[Msg]) -> None:
    t0 = time.perf_counter()
    events: list[Event] = []
    first: dict[str, Msg] = {}  # each run's first message here: its trace context parents our span
    for raw in raws:
        kind = subjects.kind_of(raw.subject)
        msg_id = (raw.headers or {}).get("Nats-Msg-Id") or f"seq:{raw.metadata.sequence.stream}"
        model = RECORDED.get(kind)
        if model is None:
            continue  # partials, round opens, our own announcements: acked, not stored
        try:
            event = Event(msg_id, kind, model.model_validate_json(raw.data))
            events.append(event)
            first.setdefault(event.model.run_id, raw)
        except ValidationError as err:
            await svc.dead_letter(raw, err)
    for e in events:
        if isinstance(e.model, RunStarted):
            active.add(e.model.run_id)
            pop = e.model.config.population
            if pop is not None and pop.digest is not None:
                try:  # who the agents are, for per-group analysis (table agent_profiles)
                    e.blob = await objects.get_personas(svc.js, pop.digest)
                except objects.BlobError as err:
                    svc.log.error("personas_missing", run_id=e.model.run_id, error=str(err))
    spans = [tracer.start_span("recorder.ingest", context=telemetry.extract(raw.headers),
                               attributes={"populace.run_id": rid, "populace.messages": len(raws)})
             for rid, raw in first.items()]
    try:
        result = await asyncio.to_thread(store.ingest, events)
    finally:
        for span in spans:
            span.end()
    for raw in raws:
        if not raw._ackd:
            await raw.ack()
    metrics.batch("recorder", "messages", len(raws))
    if result.guesses:
        metrics.ITEMS.labels("recorder", "guesses").inc(result.guesses)
    if result.guesses or result.finished:
        svc.log.info("recorded", messages=len(raws), guesses=result.guesses,
                     seconds=round(time.perf_counter() - t0, 3))
    for done in result.finished:
        finished[done.run_id] = done
    await announce_complete()


async def announce_complete() -> None:
    for rid in list(finished):
        got, expected = await asyncio.to_thread(store.completeness, rid)
        if got < expected:
            continue  # some guess batches are still on their way (redelivery): wait for them
        finished.pop(rid)
        active.discard(rid)
        if not active and not finished:
            store.close()  # release the file for readers between runs
        await bus.publish_js(svc.js, subjects.run_recorded(rid),
                             RunRecorded(run_id=rid, guesses=got, db_path=store.path),
                             msg_id=subjects.msg_id(rid, 0, "recorder", "recorded"))
        svc.log.info("run_recorded", run_id=rid, guesses=got, db=store.path)
