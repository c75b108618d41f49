"""The health file a container's healthcheck reads (POPULACE_HEALTH_FILE, set by
deploy/Dockerfile): touched after every heartbeat NATS took, and only then; gone once the
heartbeat stops, and removed by a service that starts (a restarted container keeps its /tmp)."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
from pydantic import ValidationError

from populace.core import bus, subjects
from populace.core.contracts import HostInfo
from populace.core.service import Service
from populace.core.settings import Settings

pytestmark = pytest.mark.integration


def payload() -> HostInfo:
    return HostInfo(host_id="alive", capacity=1, pid=os.getpid(), started_at=0, heartbeat_at=time.time())


async def beating(js, alive, every_s: float = 60) -> bus.Heartbeat:
    """A started heartbeat of KV `hosts` that touches the health file `alive`."""
    hb = bus.Heartbeat(await js.key_value(subjects.HOSTS_BUCKET), "alive", payload, every_s=every_s,
                       alive_file=str(alive))
    await hb.start()
    return hb


async def test_every_heartbeat_nats_took_touches_the_health_file(js, tmp_path):
    alive = tmp_path / "alive"
    hb = await beating(js, alive, every_s=0.05)
    try:
        assert alive.exists()  # the first heartbeat, before start() returns
        first = alive.stat().st_mtime_ns
        for _ in range(200):  # the loop's next beats move its time on
            if alive.stat().st_mtime_ns > first:
                break
            await asyncio.sleep(0.05)
        assert alive.stat().st_mtime_ns > first
    finally:
        await hb.stop()


async def test_a_heartbeat_nats_refused_leaves_the_health_file_alone(js, tmp_path):
    alive = tmp_path / "alive"
    hb = await beating(js, alive)
    await hb.stop()
    assert not alive.exists()  # a stopped heartbeat takes its file with it
    await js.delete_key_value(subjects.HOSTS_BUCKET)  # the put of the next beat fails
    try:
        with pytest.raises(Exception):  # noqa: B017 — whatever nats-py raises for a missing bucket
            await hb._beat()
        assert not alive.exists()
    finally:
        await bus.provision(js, storage="memory")


def test_a_health_file_in_a_missing_directory_is_refused_naming_the_setting(tmp_path):
    with pytest.raises(ValidationError, match="health_file"):
        Settings(health_file=str(tmp_path / "missing" / "alive"))
    assert Settings(health_file=str(tmp_path / "alive")).health_file == str(tmp_path / "alive")


async def test_the_health_file_goes_when_the_heartbeat_stops(js, tmp_path):
    alive = tmp_path / "alive"
    hb = await beating(js, alive)
    assert alive.exists()
    await hb.stop()
    assert not alive.exists()


async def test_a_starting_service_removes_the_health_file_its_predecessor_left(nats_server, tmp_path):
    alive = tmp_path / "alive"
    alive.touch()  # what the container's previous process wrote, seconds ago: `healthy`
    svc = Service("health-probe", Settings(nats_url=nats_server.url, storage="memory", health_file=str(alive)))
    await svc._connect_and_provision()
    try:
        assert not alive.exists()  # connected, provisioned, no heartbeat yet: not healthy
    finally:
        await svc.broker.stop()
