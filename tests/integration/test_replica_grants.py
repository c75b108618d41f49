"""Replicas nobody can hijack (issue 41, item 5), against a real nats-server running deploy/nats/auth.conf
with a replica set's own user (`replicas-main`, populace.core.replicaauth):

- the shared `replicas` user writes keys under its own name only, a set's user under its own: neither
  can overwrite, delete or shadow the other's entries (the server refuses, nothing changes);
- the gateway's replica pool, reading KV `replicas` as `gateway`, takes only an entry whose key names
  its writer and its replica and whose URL its allow-list admits for that writer: a forged entry for
  another server, under the same replica id, is never probed or routed to, and is logged once however
  often the pool polls."""

from __future__ import annotations

import asyncio
import time

import httpx
import nats.errors
import pytest
from test_auth import (
    DEPLOY_CONF,
    PASSWORDS,
    admin_js,
    connect_as,
    denied,
    eventually,
    password_var,
    server_violations,
)

from populace.core import bus, replica_hosts, subjects
from populace.core.contracts import ReplicaInfo
from populace.core.natsserver import EmbeddedNats
from populace.core.replicaauth import with_sets
from populace.gateway.replica_pool import ReplicaPool
from populace.replicas.sim import SimConfig, SimServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SET_PASSWORD = "test-replicas-main-pw"


@pytest.fixture
def server(tmp_path):
    defs = "".join(f'{password_var(u)}: "{pw}"\n' for u, pw in PASSWORDS.items())
    conf = tmp_path / "auth.conf"
    conf.write_text(defs + with_sets(DEPLOY_CONF.read_text(), {"main": SET_PASSWORD}))
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(tmp_path / "nats-server.log")) as ns:
        ns.log_path = tmp_path / "nats-server.log"
        yield ns


def entry(rid: str, url: str) -> bytes:
    return bus.encode(ReplicaInfo(replica_id=rid, url=url, backend="sim", kind="sim", model="sim", max_concurrency=8,
                                  heartbeat_at=time.time()))


async def test_a_replicas_credential_cannot_overwrite_delete_or_shadow_another_sets_keys(server):
    admin, ajs = await admin_js(server.url)
    shared_errors: list[str] = []
    own = await connect_as(server.url, "replicas-main", password=SET_PASSWORD)
    shared = await connect_as(server.url, "replicas", shared_errors)
    try:
        real = await ajs.key_value(subjects.REPLICAS_BUCKET)
        mine = await own.jetstream(timeout=1.0).key_value(subjects.REPLICAS_BUCKET)
        await mine.put("replicas-main.sim-0", entry("sim-0", "http://127.0.0.1:8000"))
        theirs = await shared.jetstream(timeout=1.0).key_value(subjects.REPLICAS_BUCKET)
        attacks = [("overwrite", lambda: theirs.put("replicas-main.sim-0", entry("sim-0", "http://127.0.0.1:9"))),
                   ("delete", lambda: theirs.delete("replicas-main.sim-0")),
                   ("a key under no writer's name", lambda: theirs.put("sim-0", entry("sim-0", "http://127.0.0.1:9")))]
        for what, attack in attacks:
            with pytest.raises(nats.errors.TimeoutError):  # the server stores nothing: no PubAck comes
                await attack()
            subject = "$KV.replicas." + ("sim-0" if what.startswith("a key") else "replicas-main.sim-0")
            await eventually(lambda s=subject: denied(shared_errors, "publish", s), what=f"{what} refused")
        got = ReplicaInfo.model_validate_json((await real.get("replicas-main.sim-0")).value)
        assert got.url == "http://127.0.0.1:8000"
        # each writes its own keys; the set's user cannot write the shared user's either
        await theirs.put("replicas.sim-0", entry("sim-0", "http://127.0.0.1:9"))
        with pytest.raises(nats.errors.TimeoutError):
            await mine.put("replicas.sim-1", entry("sim-1", "http://127.0.0.1:9"))
        keys = sorted(await bus.bucket_keys(ajs, subjects.REPLICAS_BUCKET))
        assert keys == ["replicas-main.sim-0", "replicas.sim-0"]
    finally:
        for nc in (own, shared, admin):
            await nc.close()
    refused = server_violations(server)
    assert len(refused) == 4 and all("Publish Violation" in line for line in refused), refused


async def test_the_gateway_calls_only_bound_allowed_entries_and_says_so_once(server, capsys):
    """The allow-list names the set's writer (`replicas-main@127.0.0.1`): the shared user's entry under
    the same replica id, pointing at its own server on loopback, is refused (logged once over five
    polls) and that server is never asked anything; so are an entry whose body names another replica
    than its key and one for a host outside the list."""
    admin, ajs = await admin_js(server.url)
    real = await SimServer(SimConfig(replica_id="sim-0", time_scale=0)).start()
    connections: list[int] = []  # the attacker's server: counts whoever connects to it

    async def count(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        writer.close()

    evil_server = await asyncio.start_server(count, "127.0.0.1", 0)
    evil_url = f"http://127.0.0.1:{evil_server.sockets[0].getsockname()[1]}"
    gateway = await connect_as(server.url, "gateway")
    try:
        kv = await ajs.key_value(subjects.REPLICAS_BUCKET)  # as admin: any key, to show what the reader does
        await kv.put("replicas-main.sim-0", entry("sim-0", real.url))
        await kv.put("replicas.sim-0", entry("sim-0", evil_url))  # the same id, another writer
        await kv.put("replicas-main.sim-1", entry("sim-9", evil_url))  # the body names another replica
        await kv.put("replicas-main.away", entry("away", "http://203.0.113.7:8000"))  # outside the list
        async with httpx.AsyncClient() as http:
            pool = ReplicaPool(gateway.jetstream(), http, allowed=replica_hosts.parse("replicas-main@127.0.0.1"))
            for _ in range(5):
                await pool.refresh()
        assert list(pool.replicas) == ["replicas-main.sim-0"]
        assert pool.replicas["replicas-main.sim-0"].load.healthy
        assert pool.replicas["replicas-main.sim-0"].info.url == real.url
        assert sorted(pool.refused) == ["replicas-main.away", "replicas-main.sim-1", "replicas.sim-0"]
        assert "registered by replicas is not in POPULACE_REPLICA_HOSTS" in pool.refused["replicas.sim-0"]
        assert "names replica 'sim-1', its entry 'sim-9'" in pool.refused["replicas-main.sim-1"]
        assert "203.0.113.7:8000 registered by replicas-main is not" in pool.refused["replicas-main.away"]
        logged = "".join(capsys.readouterr())  # structlog's stream: stderr once configured, stdout before
        assert logged.count("replica_refused") == 3, logged
        assert connections == []  # never probed, never called
    finally:
        await real.stop()
        evil_server.close()
        await gateway.close()
        await admin.close()
    assert server_violations(server) == []
