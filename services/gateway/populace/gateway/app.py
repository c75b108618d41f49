"""inference-gateway service: `llm.infer.<requester>` (core request/reply, queue group) in,
InferReply out on the requester's own reply subject (populace.core.replies: any other reply
subject is refused and dead-lettered); per-call records (`run.<rid>.calls.<n>.<gateway>`) to the
recorder. Every request with a reply subject of its requester's gets a reply — an explicit error
rather than a timeout, a malformed request included. Requesters share the gateway fairly
(fairshare.py).

Run with `populace service gateway` or `faststream run populace.gateway.app:faststream_app --factory`."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx
from faststream import FastStream
from faststream.nats.annotations import NatsMessage

from populace.core import bus, metrics, replica_hosts, subjects
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch
from populace.core.service import Service
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.gateway.backends import Backend
from populace.gateway.backends.dummy import DummyBackend
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.fairshare import FairShare
from populace.gateway.keys import KeyRing
from populace.gateway.openai_api import ChatClient, HttpxPoster
from populace.gateway.pacing import LocalPacer, Pacer
from populace.gateway.replica_pool import ReplicaPool
from populace.gateway.routing import make_router
from populace.gateway.shared_pacing import SharedPacer

DESCRIPTION = ("One structured call per decision: batches of prompts in, answers out, routed to "
               "LLM replicas (llama.cpp, vLLM, simulated) or answered by the dummy model.")


STARTING_WAIT_S = 60.0


def dummy(batch: InferBatch) -> bool:
    """The batch is the dummy model's: answered here, no replica (a run model of kind dummy too)."""
    return batch.endpoint.kind == "dummy" if batch.endpoint is not None else batch.model.backend == "dummy"


class Gateway:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.dummy = DummyBackend()
        self.replicas: Dispatcher | None = None
        self.pacer: Pacer | None = None
        self.pool: ReplicaPool | None = None
        self.http: httpx.AsyncClient | None = None  # health and load probes
        self.chat: ChatClient | HttpxPoster | None = None  # the calls themselves (ChatClient says why two)
        self.stats = {"batches": 0, "prompts": 0, "errors": 0}
        self.recording: set[asyncio.Task] = set()
        self.ready = asyncio.Event()  # set once the replica pool is up
        s = svc.settings
        self.fair = FairShare(s.gateway_max_workers, s.gateway_max_queue, s.gateway_requester_share,
                              s.gateway_requester_waiting_bytes)
        self.over_share: Counter[str] = Counter()  # requests refused, by requester (for the log)
        self.beating: Counter[str] = Counter()  # reply subjects of the batches taken and not answered yet
        self.beat: asyncio.Task | None = None

    async def start(self) -> None:
        s = self.svc.settings
        self.beat = asyncio.create_task(self.keep_alive())
        self.http = httpx.AsyncClient()
        self.chat = (ChatClient if s.gateway_http_client == "aiohttp" else HttpxPoster)(s.gateway_http_connections)
        self.pool = ReplicaPool(self.svc.js, self.http, static=s.replicas, ttl_s=s.registry_ttl_s,
                                poll_s=s.gateway_poll_s, allowed=replica_hosts.parse(s.replica_hosts))
        await self.pool.start()
        self.pacer = await self.shared_pacer()
        self.replicas = Dispatcher(self.pool, make_router(s.gateway_router), self.chat, s,
                                   keys=KeyRing(s.gateway_keys, s.gateway_model_hosts), pacer=self.pacer)
        self.ready.set()

    async def shared_pacer(self) -> Pacer:
        """Limits shared with every other gateway through KV `pacing`; alone (LocalPacer) when the
        bucket cannot be had, said once: two gateways may then exceed a provider's limit together
        (its 429s are waited out, never failures)."""
        s = self.svc.settings
        try:
            return SharedPacer(await bus.provision_pacing(self.svc.js, storage=s.storage, replicas=s.stream_replicas))
        except Exception as err:
            self.svc.log.error("pacing_not_shared", error=f"{type(err).__name__}: {err}",
                               effect="this gateway paces each model's declared limits alone",
                               fix=f"let the gateway's NATS user use KV `{subjects.PACING_BUCKET}` "
                                   "(deploy/nats/auth.conf)")
            return LocalPacer()

    async def stop(self) -> None:
        self.fair.cancel()
        if self.beat:
            self.beat.cancel()
        if self.pool:
            await self.pool.stop()
        if isinstance(self.pacer, SharedPacer):
            await self.pacer.close()
        if self.http:
            await self.http.aclose()
        if self.chat:
            await self.chat.aclose()

    async def backend_for(self, batch: InferBatch) -> Backend:
        if dummy(batch):
            return self.dummy
        # The subscription may deliver a batch while the pool is still starting (a loaded
        # machine): wait for it rather than answer with an error.
        try:
            await asyncio.wait_for(self.ready.wait(), STARTING_WAIT_S)
        except TimeoutError:
            raise RuntimeError(f"the gateway is still starting after {STARTING_WAIT_S:g}s") from None
        return self.replicas

    async def record_calls(self, batch: InferBatch, calls: LlmCallBatch, requester: str) -> None:
        # The id is the requester's: another requester sending batches under the same batch ids
        # first makes records of its own, never a duplicate that drops the real ones.
        try:
            await bus.publish_js(self.svc.js, subjects.run_calls(batch.run_id, batch.round,
                                                                 self.svc.settings.gateway_id),
                                 calls, msg_id=f"{requester}.{batch.batch_id}.calls")
        except Exception as err:
            self.svc.log.error("calls_record_failed", batch=batch.batch_id, requester=requester, error=str(err))

    async def keep_alive(self) -> None:
        """Tell every asking agent-host whose batch this gateway has (waiting its turn or in
        service) so, every few seconds until its answers go out: if the gateway dies, the host
        stops hearing it and re-sends. One loop for every batch, not a task each."""
        headers = {subjects.INFER_ACCEPTED_HEADER: self.svc.settings.gateway_id}
        while True:
            await asyncio.sleep(self.svc.settings.gateway_keepalive_s)
            for reply_to in list(self.beating):
                try:
                    await self.svc.nc.publish(reply_to, b"", headers=headers)
                except Exception as err:
                    self.svc.log.warning("keepalive_failed", error=str(err))
                    break

    async def on_infer(self, batch: InferBatch, msg: NatsMessage) -> bytes | None:
        """Prompts that share a system prompt and an answer schema; the reply has the answers
        in order (or an explicit error). The service frame has checked that the reply subject
        is the requester's own (populace.core.replies); the batch waits for its requester's
        fair share (fairshare.py) and is answered when served."""
        raw = msg.raw_message
        requester, reply_to = subjects.requester_of(raw.subject), raw.reply
        if why := self.refusal(batch):
            self.stats["errors"] += 1
            self.svc.log.warning("infer_refused", batch=batch.batch_id, run_id=batch.run_id, requester=requester,
                                 error=why)
            return InferReply(batch_id=batch.batch_id, error=why).model_dump_json().encode()
        prompts = 0 if dummy(batch) else len(batch.keys)
        wants_beat = subjects.INFER_KEEPALIVE_HEADER in (raw.headers or {})
        taken = self.fair.submit(requester, prompts, len(raw.data),
                                 lambda: self.serve(batch, requester, reply_to, wants_beat))
        if not taken:
            self.stats["errors"] += 1
            self.over_share[requester] += 1
            if self.over_share[requester] % 100 == 1:  # a flood is one line per hundred, not one each
                self.svc.log.warning("fair_share_exceeded", requester=requester, refused=self.over_share[requester],
                                     waiting=self.fair.waiting(requester))
            return InferReply(batch_id=batch.batch_id, error=(
                f"requester {requester} has {self.fair.waiting(requester)} batches waiting, its fair share of this "
                f"gateway (POPULACE_GATEWAY_REQUESTER_WAITING_BYTES); retry later")).model_dump_json().encode()
        if wants_beat:
            self.beating[reply_to] += 1
            try:  # taken: said at once, then by keep_alive until answered
                await self.svc.nc.publish(reply_to, b"", headers={
                    subjects.INFER_ACCEPTED_HEADER: self.svc.settings.gateway_id})
            except Exception as err:
                self.svc.log.warning("keepalive_failed", error=str(err))
        return None

    async def serve(self, batch: InferBatch, requester: str, reply_to: str, beat: bool) -> None:
        try:
            reply = await self.answer(batch, requester)
        finally:
            if beat:
                self.beating[reply_to] -= 1
                if self.beating[reply_to] <= 0:
                    del self.beating[reply_to]
        try:
            await self.svc.nc.publish(reply_to, reply)
        except Exception as err:
            self.svc.log.warning("reply_failed", batch=batch.batch_id, requester=requester, error=str(err))

    def refusal(self, batch: InferBatch) -> str | None:
        """Why this gateway will not take a batch: it asks more than the gateway's caps (a
        forged request must not hold its workers for an hour)."""
        s, model = self.svc.settings, batch.model
        latency = batch.endpoint.latency_s if batch.endpoint is not None else model.latency_s
        if dummy(batch) and latency > s.gateway_max_latency_s:
            return (f"model.latency_s: {latency:g}s is above this gateway's limit of "
                    f"{s.gateway_max_latency_s:g}s (POPULACE_GATEWAY_MAX_LATENCY_S)")
        if model.max_tokens > s.gateway_max_tokens:
            return (f"model.max_tokens: {model.max_tokens} is above this gateway's limit of "
                    f"{s.gateway_max_tokens} (POPULACE_GATEWAY_MAX_TOKENS)")
        return None

    async def answer(self, batch: InferBatch, requester: str) -> bytes:
        stats = self.stats
        t0 = time.perf_counter()
        try:
            with tracer.start_as_current_span(
                    "gateway.batch",
                    attributes={"populace.run_id": batch.run_id, "populace.round": batch.round,
                                "populace.backend": batch.endpoint.name if batch.endpoint else batch.model.backend,
                                "populace.prompts": len(batch.keys)}):
                reply, calls = await (await self.backend_for(batch)).serve(batch)
        except Exception as err:
            stats["errors"] += 1
            self.svc.log.warning("infer_failed", batch=batch.batch_id, error=str(err))
            reply, calls = InferReply(batch_id=batch.batch_id, error=f"{type(err).__name__}: {err}"), None
        if calls is not None:
            # Recorded after the reply is on its way: the agents do not wait for the record.
            calls = calls.model_copy(update={"requester": requester})
            task = asyncio.create_task(self.record_calls(batch, calls, requester))
            self.recording.add(task)
            task.add_done_callback(self.recording.discard)
            self.svc.log.info("batch_served", run_id=batch.run_id, round=batch.round, prompts=len(batch.keys),
                              valid=sum(calls.valid), attempts=sum(calls.attempts),
                              replicas=sorted(set(calls.replicas)))
        stats["batches"] += 1
        stats["prompts"] += len(batch.keys)
        metrics.batch("gateway", "infer", len(batch.keys), time.perf_counter() - t0)
        if stats["batches"] % 200 == 0:
            self.svc.log.info("gateway_progress", batches=stats["batches"], prompts=stats["prompts"],
                              errors=stats["errors"])
        return reply.model_dump_json().encode()


def create(settings: Settings | None = None) -> Service:
    svc = Service("gateway", settings, DESCRIPTION)
    gw = Gateway(svc)
    svc.on_ready(gw.start)
    svc.on_stop(gw.stop)
    # The handler only parses, checks and queues (fairshare.py bounds the batches in service), so
    # few workers keep up with any request rate.
    svc.handle(subjects.ANY_LLM_INFER, InferBatch, queue=subjects.GATEWAY_QUEUE, answers=True,
               max_workers=min(64, svc.settings.gateway_max_workers),
               reply_on_error=lambda reason: InferReply(batch_id="?", error=f"malformed request "
                                                                            f"(dead-lettered): {reason}"))(gw.on_infer)
    svc.publishes(subjects.ANY_CALLS, LlmCallBatch, "what the gateway did for each decision (table llm_calls)")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
