"""inference-gateway service wiring: `llm.infer` (core request/reply, queue group) in,
InferReply out. Every request gets a reply — an explicit error rather than a timeout.

Run with `populace service gateway` or `faststream run populace.gateway.app:app`."""

from __future__ import annotations

from faststream.nats.annotations import NatsMessage

from populace.core import bus, subjects
from populace.core.contracts import InferBatch, InferReply
from populace.core.service import Service
from populace.gateway.backends import Backend, make_backend

svc = Service("gateway")
broker, app = svc.broker, svc.app
backends: dict[str, Backend] = {}
stats = {"batches": 0, "prompts": 0, "errors": 0}


def backend_for(name: str) -> Backend:
    if name not in backends:
        backends[name] = make_backend(name)
    return backends[name]


@broker.subscriber(subjects.LLM_INFER, queue=subjects.GATEWAY_QUEUE,
                   max_workers=svc.settings.gateway_max_workers)
async def on_infer(msg: NatsMessage) -> bytes:
    """Returns the reply (FastStream sends it to the request's reply subject)."""
    batch = await svc.parse(InferBatch, msg.raw_message)
    if batch is None:
        return bus.encode(InferReply(batch_id="?", error="malformed request (dead-lettered)"))
    try:
        texts = await backend_for(batch.model.backend).complete(batch)
        reply = InferReply(batch_id=batch.batch_id, texts=texts)
    except Exception as err:  # noqa: BLE001 - the caller gets an explicit error, not a timeout
        stats["errors"] += 1
        svc.log.warning("infer_failed", batch=batch.batch_id, error=str(err))
        reply = InferReply(batch_id=batch.batch_id, error=f"{type(err).__name__}: {err}")
    stats["batches"] += 1
    stats["prompts"] += len(batch.keys)
    if stats["batches"] % 200 == 0:
        svc.log.info("gateway_progress", batches=stats["batches"], prompts=stats["prompts"],
                     errors=stats["errors"])
    return reply.model_dump_json().encode()
