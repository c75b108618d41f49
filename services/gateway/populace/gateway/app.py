"""inference-gateway service wiring: `llm.infer` (core request/reply, queue group) in,
InferReply out; per-call records (`run.<rid>.calls.<n>.<gateway>`) to the recorder.
Every request gets a reply — an explicit error rather than a timeout.

Run with `populace service gateway` or `faststream run populace.gateway.app:app`."""

from __future__ import annotations

import asyncio

import httpx
from faststream.nats.annotations import NatsMessage

from populace.core import bus, metrics, subjects, telemetry
from populace.core.telemetry import tracer
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch
from populace.core.service import Service
from populace.gateway.backends import Backend
from populace.gateway.backends.dummy import DummyBackend
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.replicas import ReplicaPool
from populace.gateway.routing import make_router

svc = Service("gateway")
broker, app = svc.broker, svc.app
state: dict = {"dummy": DummyBackend()}
stats = {"batches": 0, "prompts": 0, "errors": 0}
recording: set[asyncio.Task] = set()


@svc.on_ready
async def _start() -> None:
    s = svc.settings
    http = httpx.AsyncClient(limits=httpx.Limits(max_connections=s.gateway_http_connections,
                                                   max_keepalive_connections=s.gateway_http_connections))
    pool = ReplicaPool(svc.js, http, static=s.replicas, ttl_s=s.registry_ttl_s, poll_s=s.gateway_poll_s)
    await pool.start()
    dispatcher = Dispatcher(pool, make_router(s.gateway_router), http, s)
    state.update(http=http, pool=pool, replicas=dispatcher)


@svc.on_stop
async def _stop() -> None:
    if pool := state.get("pool"):
        await pool.stop()
    if http := state.get("http"):
        await http.aclose()


async def record_calls(batch: InferBatch, calls: LlmCallBatch) -> None:
    try:
        await bus.publish_js(svc.js, subjects.run_calls(batch.run_id, batch.round, svc.settings.gateway_id),
                             calls, msg_id=f"{batch.batch_id}.calls")
    except Exception as err:  # noqa: BLE001 - the answers went out; losing a record is logged
        svc.log.error("calls_record_failed", batch=batch.batch_id, error=str(err))


def backend_for(name: str) -> Backend:
    return state["dummy"] if name == "dummy" else state["replicas"]


@broker.subscriber(subjects.LLM_INFER, queue=subjects.GATEWAY_QUEUE,
                   max_workers=svc.settings.gateway_max_workers)
async def on_infer(msg: NatsMessage) -> bytes:
    """Returns the reply (FastStream sends it to the request's reply subject)."""
    batch = await svc.parse(InferBatch, msg.raw_message)
    if batch is None:
        return bus.encode(InferReply(batch_id="?", error="malformed request (dead-lettered)"))
    try:
        with tracer.start_as_current_span(
                "gateway.batch", context=telemetry.extract(msg.headers),
                attributes={"populace.run_id": batch.run_id, "populace.round": batch.round,
                            "populace.backend": batch.model.backend, "populace.prompts": len(batch.keys)}):
            reply, calls = await backend_for(batch.model.backend).serve(batch)
    except Exception as err:  # noqa: BLE001 - the caller gets an explicit error, not a timeout
        stats["errors"] += 1
        svc.log.warning("infer_failed", batch=batch.batch_id, error=str(err))
        reply, calls = InferReply(batch_id=batch.batch_id, error=f"{type(err).__name__}: {err}"), None
    if calls is not None:
        # Recorded after the reply is on its way: the agents do not wait for the record.
        task = asyncio.create_task(record_calls(batch, calls))
        recording.add(task)
        task.add_done_callback(recording.discard)
        svc.log.info("batch_served", run_id=batch.run_id, round=batch.round, prompts=len(batch.keys),
                     valid=sum(calls.valid), attempts=sum(calls.attempts),
                     replicas=sorted(set(calls.replicas)))
    stats["batches"] += 1
    stats["prompts"] += len(batch.keys)
    metrics.batch("gateway", "infer", len(batch.keys))
    if stats["batches"] % 200 == 0:
        svc.log.info("gateway_progress", batches=stats["batches"], prompts=stats["prompts"],
                     errors=stats["errors"])
    return reply.model_dump_json().encode()
