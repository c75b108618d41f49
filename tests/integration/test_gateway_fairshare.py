"""The gateway on a real nats-server (in this process): it answers a batch on its requester's own
reply subject, and its requesters share it fairly (issue 26, item 7): a requester that floods it
with slow batches, each within its caps, holds at most its share of the gateway's workers, and
another requester's batch is served at once, before any of the flood's."""

from __future__ import annotations

import asyncio
import json

import pytest

from populace.core import bus, serve, subjects
from populace.core.contracts import InferBatch, InferReply, ModelConfig
from populace.core.settings import Settings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SCHEMA = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
          "required": ["guess"]}
FLOOD = 12  # batches, each holding a worker for FLOOD_LATENCY_S
FLOOD_LATENCY_S = 50.0  # within the gateway's cap (60 s)


def infer_batch(keys, batch_id="b1", latency_s=0.0, seed=7) -> InferBatch:
    return InferBatch(batch_id=batch_id, run_id="r1", round=2, model=ModelConfig(latency_s=latency_s, seed=seed),
                      system="rules", keys=keys, prompts=[f"p{k}" for k in keys], response_schema=SCHEMA)


@pytest.fixture
async def gateway(nats_server, js):
    svc = serve.build("gateway", Settings(nats_url=nats_server.url, storage="memory", gateway_max_workers=4))
    await svc.app.start()
    try:
        yield svc
    finally:
        await svc.app.stop()


async def test_gateway_answers_every_prompt_of_a_batch(nc, gateway):
    from populace.core import replies

    requester = replies.requester(nc)
    msg = await replies.request(nc, "gateway", subjects.llm_infer(requester), bus.encode(infer_batch(list(range(50)))),
                                timeout=30)
    reply = InferReply.model_validate_json(msg.data)
    assert reply.batch_id == "b1" and reply.error is None
    values = [json.loads(t)["guess"] for t in reply.texts]
    assert len(values) == 50 and all(0 <= v <= 100 for v in values)
    assert len(set(values)) > 10  # seeded per agent, not one constant


async def test_a_flooding_requester_gets_its_share_and_another_is_served_at_once(nc, gateway):
    answers: list[str] = []
    got_one = asyncio.Event()

    async def answered(msg) -> None:
        if msg.data:  # not a keepalive
            answers.append(msg.subject.split(".")[2])  # reply.gateway.<requester>.<n>
            got_one.set()

    await nc.subscribe("reply.gateway.*.*", cb=answered)
    # Both ways a requester could have asked, before and after requesters were named: the
    # bare llm.infer (nobody listens there now) and llm.infer.<requester>.
    for i in range(FLOOD):
        body = bus.encode(infer_batch([i], batch_id=f"flood-{i}", latency_s=FLOOD_LATENCY_S))
        for subject in ("llm.infer", "llm.infer.flooder"):
            await nc.publish(subject, body, reply=f"reply.gateway.flooder.{i}")
    await nc.flush()
    body = bus.encode(infer_batch([99], batch_id="host"))
    for subject in ("llm.infer", "llm.infer.host-x"):
        await nc.publish(subject, body, reply="reply.gateway.host-x.1")
    await nc.flush()
    await asyncio.wait_for(got_one.wait(), 30)
    # the other requester's batch came first, while the flood still holds its share
    assert answers == ["host-x"], answers
