"""A real burst through the real gateway process onto two real llama.cpp replicas (SmolLM2):
one replica is SIGKILLed mid-burst and every request still gets a valid answer."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest
from populace_ratio_game.params import GameConfig
from populace_ratio_game.prompts import answer_schema, system_prompt

from populace.core import bus, replies, subjects
from populace.core.contracts import InferBatch, InferReply, LlmCallBatch, ModelConfig, ServiceInfo
from populace.replicas.launch import register_forever, start_local, wait_healthy

pytestmark = pytest.mark.e2e

BATCHES, PER_BATCH = 8, 4


@pytest.fixture
def gateway(nats_server, tmp_path):
    env = {**os.environ, "POPULACE_NATS_URL": nats_server.url, "POPULACE_STORAGE": "memory",
           "POPULACE_GATEWAY_POLL_S": "0.3", "POPULACE_PARENT_PID": str(os.getpid())}
    log = open(tmp_path / "gateway.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "populace.cli", "service", "gateway"], env=env,
                            stdout=log, stderr=log)
    yield proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(15)


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


async def test_killing_one_of_two_replicas_mid_burst_loses_no_request(nats_server, gateway, tmp_path):
    replicas = start_local(2, threads=1, max_concurrency=2, log_dir=str(tmp_path), prefix="failover")
    victim, survivor = replicas.replicas
    nc = await bus.connect(nats_server.url, "failover-test")
    calls: list[LlmCallBatch] = []

    async def on_calls(msg) -> None:
        calls.append(LlmCallBatch.model_validate_json(msg.data))

    try:
        await wait_healthy(replicas, timeout=120)
        await gateway_registered(nc)  # a request before it subscribes would find no responder
        registrar = asyncio.create_task(register_forever(nats_server.url, replicas, every_s=0.5))
        await nc.subscribe("run.failover.calls.>", cb=on_calls)
        game = GameConfig()
        model = ModelConfig(backend="local", max_tokens=24, temperature=0.7)

        async def ask(b: int) -> InferReply:
            keys = list(range(b * PER_BATCH, (b + 1) * PER_BATCH))
            batch = InferBatch(batch_id=f"fo-{b}", run_id="failover", round=1, model=model,
                               system=system_prompt(game),
                               response_schema=answer_schema(game), keys=keys,
                               prompts=[f"You are player {k}. Report your number." for k in keys])
            msg = await replies.request(nc, "gateway", subjects.llm_infer(replies.requester(nc)), bus.encode(batch),
                                        timeout=300)
            return InferReply.model_validate_json(msg.data)

        tasks = [asyncio.create_task(ask(b)) for b in range(BATCHES)]
        # Wait until both replicas are serving, then kill one while the burst is in flight.
        deadline = time.monotonic() + 120
        while not calls and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert calls, "no batch was served before the kill"
        victim.proc.send_signal(signal.SIGKILL)
        outstanding = sum(not t.done() for t in tasks)
        answered = await asyncio.gather(*tasks)
        await asyncio.sleep(0.5)  # the last call records
        registrar.cancel()
    finally:
        await nc.close()
        replicas.stop()

    assert outstanding > 0, "the kill came after the burst"
    for reply in answered:
        assert reply.error is None
        assert len(reply.texts) == PER_BATCH
        assert all(t and not t.startswith("<gateway error") for t in reply.texts), reply.texts
    served_by = {r for c in calls for r in c.replicas}
    assert subjects.replica_key(subjects.REPLICAS_WRITER, survivor.info.replica_id) in served_by  # named by its key
    assert sum(len(c.agent_ids) for c in calls) == BATCHES * PER_BATCH
    valid = sum(v for c in calls for v in c.valid)
    # SmolLM2 at temperature 0.7: a call's seed is fixed, but llama.cpp's batched decoding is not
    # bit-exact across batch compositions, so which answers are valid varies (30-32 of 32 quiet,
    # 28 once at load 15, 2026-12-05). Lost or failed requests are what the asserts above refuse.
    assert valid >= 0.85 * BATCHES * PER_BATCH, f"{valid} of {BATCHES * PER_BATCH} answers valid"
    # the victim had calls in flight: they failed there and were retried on the survivor
    assert sum(a for c in calls for a in c.attempts) > BATCHES * PER_BATCH, calls
