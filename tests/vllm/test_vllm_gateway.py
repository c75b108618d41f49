"""The gateway's `openai` backend against real vLLM, through the gateway process:
- a replica answering 429 or 503 (a proxy in front of the real vLLM replica) has its calls
  retried on the other replica, and every answer is valid;
- the tier's vLLM replica, started by `populace replicas vllm`, whose parent is SIGKILLed
  mid-burst, loses no request (its calls are retried on a simulated replica that took the
  burst beside it) and leaves no process behind (no `VLLM::` engine core). It runs last in the
  tier (conftest: replica_to_kill)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import time

import httpx
import nats.errors
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
from populace.replicas.launch import VLLM_CPU_CONCURRENCY, ReplicaSet, register_forever
from populace.replicas.sim import SimConfig, SimServer

pytestmark = pytest.mark.vllm

GAME = GameConfig()
MODEL = ModelConfig(backend="openai", max_tokens=24, temperature=0.7)
# A batch's reply: the gateway answers every batch, an error included, once each of its calls is
# answered or has failed (its own limits: 120 s a try, 3 tries, its retry budget).
ASK_TIMEOUT_S = 600.0
# The flaky proxy's calls to the real replica: the gateway gives up on a call after 120 s
# (gateway_request_timeout_s), so the proxy does too (it waited 300 s, so that after asks that
# timed out at 600 s its shutdown still waited for them: 900 s, the tier's test timeout).
UPSTREAM_TIMEOUT_S = 120.0
PROXY_SHUTDOWN_S = 10.0  # how long a stopping proxy lets what it forwards finish


def batch(b: int, per: int, run: str) -> InferBatch:
    keys = list(range(b * per, (b + 1) * per))
    return InferBatch(batch_id=f"{run}-{b}", run_id=run, round=1, model=MODEL, system=system_prompt(GAME),
                      response_schema=answer_schema(GAME), keys=keys,
                      prompts=[f"You are player {k}. Report your number." for k in keys])


async def ask(nc, b: int, per: int, run: str) -> InferReply:
    try:
        msg = await replies.request(nc, "gateway", subjects.llm_infer(replies.requester(nc)),
                                    bus.encode(batch(b, per, run)), timeout=ASK_TIMEOUT_S)
    except nats.errors.TimeoutError:
        raise AssertionError(f"no reply from the gateway to batch {run}-{b} after {ASK_TIMEOUT_S:g}s") from None
    return InferReply.model_validate_json(msg.data)


async def within(aw, seconds: float, what: str):
    """`aw`, bounded: an AssertionError naming `what` if it takes longer than `seconds`."""
    try:
        return await asyncio.wait_for(aw, seconds)
    except TimeoutError:
        raise AssertionError(f"{what}: not done after {seconds:g}s") from None


class Flaky:
    """A replica in front of the real vLLM one that answers its first `fail` chat calls with
    429 and 503 in turn, and forwards everything else (/health, /metrics, later calls).

    It serves on a socket bound here (no port picked now and bound later, which another
    process may take meanwhile); `start()` and `stop()` bound its life, and `stop()` says what
    was still in flight if the server did not finish in time."""

    def __init__(self, upstream: str, fail: int) -> None:
        self.upstream, self.fail, self.calls, self.failed = upstream, fail, 0, 0
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        app = Starlette(routes=[Route("/{path:path}", self.handle, methods=["GET", "POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
        self.http = httpx.AsyncClient(timeout=UPSTREAM_TIMEOUT_S)
        self.in_flight: dict[int, tuple[str, float]] = {}  # what it is serving: path, since when
        self.serving: asyncio.Task | None = None

    def start(self) -> None:
        self.serving = asyncio.create_task(self.server.serve(sockets=[self.sock]))

    async def stop(self) -> None:
        """Stops serving: what is in flight (calls forwarded to the real replica) may finish for
        PROXY_SHUTDOWN_S; anything still waiting for the real replica then fails the test, named."""
        self.server.should_exit = True
        try:
            if self.serving is not None:
                await asyncio.wait_for(asyncio.shield(self.serving), PROXY_SHUTDOWN_S)
        except TimeoutError:
            now = time.monotonic()
            waiting = [(path, round(now - t0, 1)) for path, t0 in self.in_flight.values()]
            self.server.force_exit = True  # stop waiting for them
            await asyncio.wait_for(self.serving, 5)
            raise AssertionError(f"the flaky proxy's calls to the real replica were still unanswered "
                                 f"{PROXY_SHUTDOWN_S:g}s after the test (path, seconds waited): {waiting}") from None
        finally:
            self.sock.close()
            await self.http.aclose()

    async def handle(self, request: Request) -> Response:
        path = request.url.path
        if path == "/v1/chat/completions":
            self.calls += 1
            if self.failed < self.fail:
                self.failed += 1
                return Response(json.dumps({"error": "busy"}), status_code=429 if self.failed % 2 else 503,
                                media_type="application/json")
        self.in_flight[id(request)] = (path, time.monotonic())
        upstream = asyncio.ensure_future(self.http.request(
            request.method, self.upstream + path, content=await request.body(),
            headers={"content-type": request.headers.get("content-type", "application/json")}))
        try:
            # A caller that gives up (the gateway after its request timeout) closes its connection: the
            # proxy then drops its own call, so that vLLM aborts the request as it does when its
            # client goes (it went on generating for nobody, beside the gateway's retry).
            while not (await asyncio.wait({upstream}, timeout=0.5))[0]:
                if await request.is_disconnected():
                    upstream.cancel()
                    await asyncio.gather(upstream, return_exceptions=True)
                    return Response(status_code=499)
            r = upstream.result()
        finally:
            upstream.cancel()
            del self.in_flight[id(request)]
        return Response(r.content, status_code=r.status_code, media_type=r.headers.get("content-type"))


async def test_429_and_5xx_from_a_replica_are_retried_on_real_vllm(nats_server, gateway, vllm_replica):
    real = vllm_replica.replicas[0]
    flaky = Flaky(real.info.url, fail=6)
    flaky.start()
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
        await within(asyncio.gather(*registrars, return_exceptions=True), 15, "stopping the registrations")
        await within(nc.close(), 15, "closing the test's NATS connection")
        await flaky.stop()
    assert flaky.failed == 6, "the flaky replica was not asked often enough to fail"
    for reply in replies:
        assert reply.error is None and reply.failed == []
        assert all(reply.valid), reply.texts
    assert sum(len(c.agent_ids) for c in calls) == 24
    # each 503 costs one more attempt; a 429 is waited out (Retry-After) and is not an attempt
    assert sum(a for c in calls for a in c.attempts) >= 24 + 3


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


# The survivor: a simulated replica in this process (no model to load: only where the victim's
# calls go matters, and that real vLLM answers within the schema the tests above show). Capped and
# queueing as the tier's replica (32 in flight, 8 sequences at once), so that the two take about
# half the burst each (capped at 4, it left the victim 36 of the 40 calls to hold at the kill).
SURVIVOR = SimConfig(replica_id="sim-survivor", decode_tokens_per_s=24.0, max_num_seqs=8, seed=1)


async def test_a_vllm_replica_whose_parent_is_killed_mid_burst_loses_no_request(replica_to_kill, tier_nats,
                                                                                tier_gateway, group_gone):
    """The tier's replica (`populace replicas vllm`, conftest: vllm_tier, registered on tier_nats)
    has served part of the burst, beside a simulated replica, when its parent is SIGKILLed. What
    it had in flight is retried on the simulated one, and its process group (vLLM's server, engine
    core, worker) is gone within 60 s."""
    victim = replica_to_kill.replicas[0]
    victim_key = subjects.replica_key(subjects.REPLICAS_WRITER, victim.info.replica_id)
    nc = await bus.connect(tier_nats.url, "vllm-failover-test")
    calls: list[LlmCallBatch] = []

    async def on_calls(msg) -> None:
        calls.append(LlmCallBatch.model_validate_json(msg.data))

    registrar = None
    async with SimServer(SURVIVOR.model_copy(update={"model_name": victim.info.model})) as sim:
        survivor = ReplicaSet([_Registered(ReplicaInfo(
            replica_id=SURVIVOR.replica_id, url=sim.url, backend="openai", kind="sim", model=victim.info.model,
            max_concurrency=VLLM_CPU_CONCURRENCY, heartbeat_at=time.time()))])
        try:
            await gateway_registered(nc)
            registrar = asyncio.create_task(register_forever(tier_nats.url, survivor, every_s=0.5))
            await nc.subscribe("run.failover.calls.>", cb=on_calls)
            await asyncio.sleep(1.5)  # the gateway finds both healthy
            tasks = [asyncio.create_task(ask(nc, b, 4, "failover")) for b in range(10)]
            deadline = time.monotonic() + 300
            while not any(victim_key in c.replicas for c in calls) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert any(victim_key in c.replicas for c in calls), "the victim served nothing before the kill"
            os.kill(victim.proc.pid, signal.SIGKILL)  # the parent, as a crash would: vLLM must go with it
            outstanding = sum(not t.done() for t in tasks)
            replies = await asyncio.gather(*tasks)
            await asyncio.sleep(0.5)
        finally:
            if registrar:
                registrar.cancel()
                await within(asyncio.gather(registrar, return_exceptions=True), 15, "stopping the registration")
            await within(nc.close(), 15, "closing the test's NATS connection")
    gone = group_gone(victim.info.pid, 60)
    if not gone:  # clean up before failing
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.info.pid, signal.SIGKILL)
    assert gone, "vLLM (or its engine core) outlived the SIGKILLed `populace replicas vllm`"
    assert outstanding > 0, "the kill came after the burst"
    for reply in replies:
        assert reply.error is None and reply.failed == []
        assert len(reply.texts) == 4 and all(t and not t.startswith("<gateway error") for t in reply.texts)
    assert sum(len(c.agent_ids) for c in calls) == 40
    assert sum(a for c in calls for a in c.attempts) > 40, "nothing was retried"
    served = {r for c in calls for r in c.replicas}
    assert subjects.replica_key(subjects.REPLICAS_WRITER, SURVIVOR.replica_id) in served, served
    assert sum(v for c in calls for v in c.valid) >= 0.95 * 40
