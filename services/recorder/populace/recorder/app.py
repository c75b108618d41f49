"""recorder service wiring: a durable pull consumer on `run.>` → DuckDB, acked only after
commit. After a run's `done` is committed it announces `run.<rid>.recorded`.

Run with `populace service recorder` or `faststream run populace.recorder.app:app`."""

from __future__ import annotations

import asyncio
import time

from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from pydantic import BaseModel, ValidationError

from populace.core import bus, subjects
from populace.core.contracts import GuessBatch, RoundResult, RunDone, RunRecorded, RunStarted, SpawnBatch
from populace.core.service import Service
from populace.recorder.store import Event, Store

svc = Service("recorder")
broker, app = svc.broker, svc.app
store = Store(svc.settings.db, stream=subjects.RUN_STREAM)
active: set[str] = set()

# Events the recorder writes; everything else on `run.>` is acknowledged and skipped.
RECORDED: dict[str, type[BaseModel]] = {
    "started": RunStarted, "spawn": SpawnBatch, "guesses": GuessBatch,
    "round.result": RoundResult, "done": RunDone,
}


@svc.on_stop
async def _close() -> None:
    store.close()


@broker.subscriber(subjects.ANY_RUN_EVENT, stream=JStream(subjects.RUN_STREAM, declare=False),
                   durable="recorder", deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.MANUAL,
                   pull_sub=PullSub(batch_size=svc.settings.recorder_fetch, batch=True, timeout=1.0))
async def on_events(msg: NatsMessage) -> None:
    raws = msg.raw_message
    t0 = time.perf_counter()
    events: list[Event] = []
    for raw in raws:
        kind = subjects.kind_of(raw.subject)
        model = RECORDED.get(kind)
        seq = raw.metadata.sequence.stream
        if model is None:
            events.append(Event(seq, kind, None))
            continue
        try:
            events.append(Event(seq, kind, model.model_validate_json(raw.data)))
        except ValidationError as err:
            await bus.dead_letter(svc.nc, svc.name, raw.subject, raw.data, err, raw_msg=raw)
    for e in events:
        if isinstance(e.model, RunStarted):
            active.add(e.model.run_id)
    result = await asyncio.to_thread(store.ingest, events)
    for raw in raws:
        if not raw._ackd:
            await raw.ack()
    if result.guesses or result.finished:
        svc.log.info("recorded", messages=len(raws), guesses=result.guesses,
                     seconds=round(time.perf_counter() - t0, 3))
    for done in result.finished:
        active.discard(done.run_id)
        count = await asyncio.to_thread(store.count_guesses, done.run_id)
        if not active:
            store.close()
        await bus.publish_js(svc.js, subjects.run_recorded(done.run_id),
                             RunRecorded(run_id=done.run_id, guesses=count, db_path=store.path),
                             msg_id=subjects.msg_id(done.run_id, 0, "recorder", "recorded"))
        svc.log.info("run_recorded", run_id=done.run_id, guesses=count, db=store.path)
