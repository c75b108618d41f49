"""Handler tests with FastStream's TestNatsBroker: services built by their factories, their
typed subscribers exercised in memory (acks, redelivery, dedup and KV are not emulated there:
those are tested on a real server), and the AsyncAPI document they produce."""

from __future__ import annotations

from importlib import metadata

import pytest
from faststream.nats import TestNatsBroker
from faststream.nats.annotations import NatsMessage

from populace.core import serve, subjects
from populace.core.contracts import InferBatch, ModelConfig
from populace.core.settings import Settings

SCHEMA = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
          "required": ["guess"]}


def infer_batch(keys, seed=7) -> InferBatch:
    return InferBatch(batch_id="b1", run_id="r1", round=2, model=ModelConfig(latency_s=0, seed=seed),
                      system="rules", keys=keys, prompts=[f"p{k}" for k in keys], response_schema=SCHEMA)


@pytest.mark.parametrize("subject", ["run.r1.partial.1.h1.0", "run.r1.round.1.open"])
async def test_environment_dead_letters_malformed_events_and_goes_on(subject):
    env = serve.build("environment", Settings())
    dead: list = []

    @env.broker.subscriber(subjects.dlq("environment"))
    async def collect(msg: NatsMessage) -> None:
        dead.append((msg.body, msg.headers.get("Populace-Subject")))

    async with TestNatsBroker(env.broker) as br:
        await br.publish(b"not json at all", subject, stream=subjects.RUN_STREAM)
        await br.publish(b'{"run_id": "r1", "nonsense": true}', subject, stream=subjects.RUN_STREAM)
    assert dead == [(b"not json at all", subject), (b'{"run_id": "r1", "nonsense": true}', subject)]


def test_two_services_of_one_kind_share_no_state():
    a, b = serve.build("environment", Settings()), serve.build("environment", Settings())
    assert a.broker is not b.broker and a.app is not b.app


@pytest.mark.parametrize("name", ["orchestrator", "agent-host", "environment", "gateway", "recorder"])
def test_every_service_documents_its_subjects_with_their_payload_schemas(name):
    svc = serve.build(name, Settings(host_id="myhost-1234"))
    doc = svc.app.schema.to_specification().to_jsonable()
    assert doc["info"]["title"] == f"populace {name}"  # not "FastStream"
    assert doc["info"]["version"] == metadata.version("populace-core") and doc["info"]["description"]
    channels = set(doc["channels"])
    assert channels, f"{name} documents no subject"
    assert not any("myhost" in c for c in channels)  # a host's own subject is documented for every host
    schemas = doc["components"]["schemas"]
    assert "EmptyPayload" not in schemas and schemas  # real wire models, not placeholders
    expected = {"orchestrator": "RunStart", "agent-host": "SpawnBatch", "environment": "RoundPartial",
                "gateway": "InferBatch", "recorder": "OutcomeBatch"}[name]
    assert expected in schemas, sorted(schemas)
