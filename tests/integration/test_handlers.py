"""Handler tests with FastStream's TestNatsBroker: the service modules' subscribers, in memory.
(Acks, redelivery, dedup and KV are not emulated there: those are tested on a real server.)"""

from __future__ import annotations

import pytest
from faststream.nats import TestNatsBroker
from faststream.nats.annotations import NatsMessage

from populace.core import bus, subjects
from populace.core.contracts import InferBatch, InferReply, ModelConfig
from populace.games.parsing import parse_guess


def infer_batch(keys, max_value=100.0, seed=7) -> InferBatch:
    return InferBatch(batch_id="b1", run_id="r1", round=2, model=ModelConfig(latency_s=0, seed=seed),
                      max_value=max_value, system="rules", keys=keys, prompts=[f"p{k}" for k in keys])


async def test_gateway_answers_every_prompt_of_a_batch():
    from populace.gateway import app as gw

    async with TestNatsBroker(gw.broker) as br:
        resp = await br.request(bus.encode(infer_batch(list(range(50)))), subjects.LLM_INFER)
        reply = InferReply.model_validate_json(resp.body)
    assert reply.batch_id == "b1" and reply.error is None
    assert len(reply.texts) == 50
    values = [parse_guess(t, 100.0) for t in reply.texts]
    assert all(v is not None and 0 <= v <= 100 for v in values)
    assert len(set(values)) > 10  # seeded per agent, not one constant


async def test_gateway_dead_letters_a_malformed_request_and_still_replies():
    from populace.gateway import app as gw

    dead: list = []

    @gw.broker.subscriber(subjects.dlq("gateway"))
    async def collect(msg: NatsMessage) -> None:
        dead.append((msg.body, msg.headers.get("Populace-Subject")))

    async with TestNatsBroker(gw.broker) as br:
        resp = await br.request(b'{"batch_id": 3, "nonsense": true}', subjects.LLM_INFER)
        reply = InferReply.model_validate_json(resp.body)
        # the service keeps serving after the bad message
        ok = await br.request(bus.encode(infer_batch([1, 2, 3])), subjects.LLM_INFER)
        good = InferReply.model_validate_json(ok.body)
    assert reply.error and "malformed" in reply.error
    assert dead == [(b'{"batch_id": 3, "nonsense": true}', subjects.LLM_INFER)]
    assert len(good.texts) == 3


@pytest.mark.parametrize("subject", ["run.r1.partial.1.h1", "run.r1.round.1.open"])
async def test_environment_dead_letters_malformed_events(subject):
    from populace.environment import app as env

    dead: list = []

    @env.broker.subscriber(subjects.dlq("environment"))
    async def collect(msg: NatsMessage) -> None:
        dead.append((msg.body, msg.headers.get("Populace-Subject")))

    async with TestNatsBroker(env.broker) as br:
        await br.publish(b"not json at all", subject, stream=subjects.RUN_STREAM)
    assert dead == [(b"not json at all", subject)]
