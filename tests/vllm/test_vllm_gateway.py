"""The gateway's `openai` backend against real vLLM, through the gateway process:
- a replica answering 429 or 503 (a proxy in front of the real vLLM replica) has its calls
  retried on the other replica, and every answer is valid;
- a vLLM replica started by `populace replicas vllm`, whose parent is SIGKILLed mid-burst,
  loses no request (its calls are retried on the tier's replica) and leaves no process
  behind (no `VLLM::` engine core)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time

import httpx
import pytest
import uvicorn
from populace_ratio_game.params import GameConfig
from populace_ratio_game.prompts import answer_schema, system_prompt
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from populace.core import bus, replies, subjects
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch, ModelConfig, ReplicaInfo, ServiceInfo
from populace.core.natsserver import free_port
from populace.replicas.launch import ReplicaSet, register_forever

pytestmark = pytest.mark.vllm

START_TIMEOUT_S = 600.0
GAME = GameConfig()
MODEL = ModelConfig(backend="openai", max_tokens=24, temperature=0.7)


def batch(b: int, per: int, run: str) -> InferBatch:
    keys = list(range(b * per, (b + 1) * per))
    return InferBatch(batch_id=f"{run}-{b}", run_id=run, round=1, model=MODEL, system=system_prompt(GAME),
                      response_schema=answer_schema(GAME), keys=keys,
                      prompts=[f"You are player {k}. Report your number." for k in keys])


async def ask(nc, b: int, per: int, run: str) -> InferReply:
    msg = await replies.request(nc, "gateway", subjects.llm_infer(replies.requester(nc)), bus.encode(batch(b, per, run)),
                                timeout=600)
    return InferReply.model_validate_json(msg.data)


class Flaky:
    """A replica in front of the real vLLM one that answers its first `fail` chat calls with
    429 and 503 in turn, and forwards everything else (/health, /metrics, later calls)."""

    def __init__(self, upstream: str, fail: int) -> None:
        self.upstream, self.fail, self.calls, self.failed = upstream, fail, 0, 0
        self.port = free_port()
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.http = httpx.AsyncClient(timeout=300)

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        if path == "/v1/chat/completions":
            self.calls += 1
            if self.failed < self.fail:
                self.failed += 1
                return Response(json.dumps({"error": "busy"}), status_code=429 if self.failed % 2 else 503,
                                media_type="application/json")
        r = await self.http.request(request.method, self.upstream + path, content=await request.body(),
                                    headers={"content-type": request.headers.get("content-type", "application/json")})
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


async def test_429_and_5xx_from_a_replica_are_retried_on_real_vllm(nats_server, gateway, vllm_replica):
    real = vllm_replica.replicas[0]
    flaky = Flaky(real.info.url, fail=6)
    serving = asyncio.create_task(flaky.server.serve())
    proxy = ReplicaSet([_Registered(ReplicaInfo(replica_id="vllm-flaky", url=f"http://127.0.0.1:{flaky.port}",
                                                backend="openai", kind="vllm", model=real.info.model,
                                                max_concurrency=8, heartbeat_at=time.time()))])
    nc = await bus.connect(nats_server.url, "vllm-flaky-test")
    calls: list[LlmCallBatch] = []

    async def on_calls(msg) -> None:
        calls.append(LlmCallBatch.model_validate_json(msg.data))

    registrars = []
    try:
        await gateway_registered(nc)
        registrars = [asyncio.create_task(register_forever(nats_server.url, rs, every_s=0.5))
                      for rs in (vllm_replica, proxy)]
        await nc.subscribe("run.flaky.calls.>", cb=on_calls)
        await asyncio.sleep(1.5)  # the gateway polls both replicas (0.3 s) and finds them healthy
        replies = await asyncio.gather(*(ask(nc, b, 4, "flaky") for b in range(6)))
        await asyncio.sleep(0.5)
    finally:
        for t in registrars:
            t.cancel()
        await asyncio.gather(*registrars, return_exceptions=True)
        await nc.close()
        flaky.server.should_exit = True
        await serving
        await flaky.http.aclose()
    assert flaky.failed == 6, "the flaky replica was not asked often enough to fail"
    for reply in replies:
        assert reply.error is None and reply.failed == []
        assert all(reply.valid), reply.texts
    assert sum(len(c.agent_ids) for c in calls) == 24
    assert sum(a for c in calls for a in c.attempts) >= 24 + 6  # each 429/503 cost one more attempt


async def gateway_registered(nc, timeout: float = 120.0) -> None:
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(s.service == "gateway" for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET,
                                                                               ServiceInfo)):
                return
        except Exception:
            pass
        await asyncio.sleep(0.2)
    raise AssertionError("the gateway did not register")


class _Registered:
    """A replica that is registered but not a process of ours (the flaky proxy)."""

    def __init__(self, info: ReplicaInfo) -> None:
        self.info = info

    def alive(self) -> bool:
        return True

    def stop(self) -> None:
        pass


async def wait_registered(nc, replica_prefix: str, timeout: float) -> ReplicaInfo:
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            for r in await bus.registry_entries(js, subjects.REPLICAS_BUCKET, ReplicaInfo):
                if r.replica_id.startswith(replica_prefix):
                    return r
        await asyncio.sleep(0.5)
    raise AssertionError(f"no replica {replica_prefix}* registered after {timeout}s")


async def test_a_vllm_replica_whose_parent_is_killed_mid_burst_loses_no_request(victim_nats, victim_gateway,
                                                                                vllm_replica, victim_cli, group_gone):
    """The victim was started with the tier's replica (conftest: victim_cli), on a nats-server of
    its own; it has served part of the burst when its parent is SIGKILLed. What it had in flight
    is retried on the tier's replica, and its process group (vLLM's server, engine core, worker)
    is gone within 60 s."""
    cli = victim_cli
    nc = await bus.connect(victim_nats.url, "vllm-failover-test")
    calls: list[LlmCallBatch] = []

    async def on_calls(msg) -> None:
        calls.append(LlmCallBatch.model_validate_json(msg.data))

    registrar = None
    try:
        victim = await wait_registered(nc, "vllm-cpu-", START_TIMEOUT_S)
        await gateway_registered(nc)
        registrar = asyncio.create_task(register_forever(victim_nats.url, vllm_replica, every_s=0.5))
        await nc.subscribe("run.failover.calls.>", cb=on_calls)
        await asyncio.sleep(1.5)  # the gateway finds both healthy
        tasks = [asyncio.create_task(ask(nc, b, 4, "failover")) for b in range(10)]
        deadline = time.monotonic() + 300
        while not any(victim.replica_id in c.replicas for c in calls) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert any(victim.replica_id in c.replicas for c in calls), "the victim served nothing before the kill"
        os.kill(cli.pid, signal.SIGKILL)  # the parent, as a crash would: vLLM must go with it
        outstanding = sum(not t.done() for t in tasks)
        replies = await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)
    finally:
        if registrar:
            registrar.cancel()
            await asyncio.gather(registrar, return_exceptions=True)
        await nc.close()
    gone = group_gone(victim.pid, 60)
    if not gone:  # clean up before failing
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)
    assert gone, "vLLM (or its engine core) outlived the SIGKILLed `populace replicas vllm`"
    assert outstanding > 0, "the kill came after the burst"
    for reply in replies:
        assert reply.error is None and reply.failed == []
        assert len(reply.texts) == 4 and all(t and not t.startswith("<gateway error") for t in reply.texts)
    assert sum(len(c.agent_ids) for c in calls) == 40
    assert vllm_replica.replicas[0].info.replica_id in {r for c in calls for r in c.replicas}
    assert sum(v for c in calls for v in c.valid) >= 0.95 * 40
