"""Limits shared by every gateway, on a real nats-server: two pacers leasing from one KV `pacing`
entry never hand out more together than one bucket allows, a 429's pause reaches the other, and
only the gateway's NATS user may touch the bucket (deploy/nats/auth.conf). And how the dispatcher
paces a call against a real simulated provider."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx
import nats
import pytest

from populace.core import bus, subjects
from populace.core.contracts import InferBatch, ModelConfig, ModelEndpoint, ModelLimits
from populace.core.natsserver import EmbeddedNats
from populace.core.settings import Settings
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.keys import KeyRing
from populace.gateway.openai_api import ChatClient
from populace.gateway.pacing import HEADROOM, LocalPacer, limit_key
from populace.gateway.replica_pool import ReplicaPool
from populace.gateway.routing import make_router
from populace.gateway.shared_pacing import LEASE_S, Shared, SharedPacer
from populace.replicas.sim import SimConfig, SimServer

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
N = 600  # requests per minute: 9.5 a second paced, a shared bucket of 19


def most_in_window(times: list[float], window: float) -> int:
    best, left = 0, 0
    for right, t in enumerate(times):
        while times[left] <= t - window:
            left += 1
        best = max(best, right - left + 1)
    return best


async def test_two_pacers_on_one_kv_entry_send_no_more_than_one_limit_together(nc):
    js = nc.jetstream()
    kv = await bus.provision_pacing(js, storage="memory")
    other = await nats.connect(nc.connected_url.geturl())
    try:
        a, b = SharedPacer(kv), SharedPacer(await bus.provision_pacing(other.jetstream(), storage="memory"))
        limits = ModelLimits(requests_per_min=N)
        sent: dict[str, list[float]] = {"a": [], "b": []}
        stop = time.monotonic() + 3.0

        async def caller(pacer: SharedPacer, name: str) -> None:
            while time.monotonic() < stop:
                await pacer.acquire("provider", limits, 1)
                sent[name].append(time.monotonic())

        tasks = [asyncio.create_task(caller(p, n)) for p, n in ((a, "a"), (b, "b")) for _ in range(20)]
        await asyncio.sleep(3.0)
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await other.close()
    times = sorted(sent["a"] + sent["b"])
    rate, capacity = N * HEADROOM / 60, 2.0 * N * HEADROOM / 60
    assert sent["a"] and sent["b"]  # both called
    for window in (0.5, 1.0, 2.0, 3.0):
        # what left the shared bucket in the window and the LEASE_S before it (a lease is spent within it)
        assert most_in_window(times, window) <= capacity + rate * (window + LEASE_S) + 1, window
    assert len(times) > capacity + rate  # not vacuous: 40 callers wanted far more than the limit gave
    assert a.leases + b.leases < len(times)  # leases, not a KV round trip per call


async def test_a_providers_pause_reaches_the_other_gateway(nc):
    kv = await bus.provision_pacing(nc.jetstream(), storage="memory")
    a, b = SharedPacer(kv), SharedPacer(kv)
    limits = ModelLimits(requests_per_min=N)
    await a.acquire("paused-provider", limits, 1)
    a.backoff("paused-provider", 20.0)
    await asyncio.gather(*a._pausing)
    waiting = asyncio.create_task(b.acquire("paused-provider", limits, 1))
    await asyncio.sleep(0.3)
    assert not waiting.done()
    assert b._pools["paused-provider"].paused_until - time.monotonic() > 19.0
    waiting.cancel()
    await asyncio.gather(waiting, return_exceptions=True)
    # a model with no declared limits reads the pause too
    unlimited = asyncio.create_task(SharedPacer(kv).acquire("paused-provider", ModelLimits(), 1))
    await asyncio.sleep(0.3)
    assert not unlimited.done()
    unlimited.cancel()
    await asyncio.gather(unlimited, return_exceptions=True)


async def test_an_entry_deleted_or_dropped_is_made_again(nc):
    kv = await bus.provision_pacing(nc.jetstream(), storage="memory")
    pacer = SharedPacer(kv)
    limits = ModelLimits(requests_per_min=N)
    await pacer.acquire("deleted", limits, 1)
    first = (await kv.get("deleted")).revision
    await kv.delete("deleted")  # by hand (`nats kv del`): a delete marker, not a missing key
    pacer._pools["deleted"].expires = 0.0  # the lease is spent: the next call leases again
    await pacer.acquire("deleted", limits, 1)
    entry = await kv.get("deleted")
    assert entry.revision > first + 1 and Shared.from_bytes(entry.value).requests is not None  # made again
    assert pacer._pools["deleted"].local_until == 0.0  # never paced alone


USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")


async def test_only_the_gateways_user_may_use_the_pacing_bucket(tmp_path):
    text = DEPLOY_CONF.read_text()
    assert set(re.findall(r"\$([A-Z_]+)_PASSWORD\b", text)) == {u.upper().replace("-", "_") for u in USERS}
    conf = tmp_path / "auth.conf"
    conf.write_text("".join(f'{u.upper().replace("-", "_")}_PASSWORD: "pw-{u}"\n' for u in USERS) + text)
    with EmbeddedNats(extra_args=["-c", str(conf)]) as ns:
        admin = await nats.connect(ns.url, user="admin", password="pw-admin")
        await bus.provision(admin.jetstream(), storage="memory")
        gateway = await nats.connect(ns.url, user="gateway", password="pw-gateway",
                                     inbox_prefix=bus.inbox_prefix("gateway"), allow_reconnect=False)
        try:
            js = gateway.jetstream(timeout=5)
            kv = await bus.provision_pacing(js, storage="memory")  # the gateway creates it …
            pacer = SharedPacer(kv)
            limits = ModelLimits(requests_per_min=N)
            await pacer.acquire("provider", limits, 1)  # … reads and writes it
            pacer.backoff("provider", 0.1)
            await asyncio.gather(*pacer._pausing)
            assert (await kv.get("provider")).revision == 2
            errors: dict[str, list[str]] = {}
            others = []
            for user in USERS:
                if user in ("gateway", "admin"):
                    continue
                seen = errors.setdefault(user, [])

                async def on_error(err, seen=seen) -> None:
                    seen.append(str(err).lower())

                nc = await nats.connect(ns.url, user=user, password=f"pw-{user}", error_cb=on_error,
                                        inbox_prefix=bus.inbox_prefix(user), allow_reconnect=False)
                others.append(nc)
                for subject in ("$JS.API.STREAM.INFO.KV_pacing", "$JS.API.STREAM.CREATE.KV_pacing",
                                "$JS.API.STREAM.MSG.GET.KV_pacing", "$JS.API.DIRECT.GET.KV_pacing.provider",
                                "$KV.pacing.provider"):
                    await nc.publish(subject, b"{}")
                await nc.flush()
            deadline = time.monotonic() + 10
            while any(len(e) < 5 for e in errors.values()) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            for user, seen in errors.items():
                for subject in ("$js.api.stream.info.kv_pacing", "$js.api.stream.create.kv_pacing",
                                "$js.api.stream.msg.get.kv_pacing", "$js.api.direct.get.kv_pacing.provider",
                                "$kv.pacing.provider"):
                    assert f'permissions violation for publish to "{subject}"' in " ".join(seen), (user, subject)
            assert (await kv.get("provider")).revision == 2  # nobody else wrote
            for nc in others:
                await nc.close()
        finally:
            await gateway.close()
            await admin.close()
    assert subjects.PACING_BUCKET == "pacing"


class RecordingPacer(LocalPacer):
    """The local pacer, noting what the dispatcher asks of it and how many calls held a replica
    slot at each acquire."""

    def __init__(self) -> None:
        super().__init__()
        self.pool: ReplicaPool | None = None
        self.events: list[tuple] = []

    async def acquire(self, pool, limits, tokens):
        self.events.append(("acquire", pool, sum(r.load.in_flight for r in self.pool.replicas.values())))
        await super().acquire(pool, limits, tokens)

    def settle(self, pool, limits, estimated, used):
        self.events.append(("settle", pool, estimated, used))
        super().settle(pool, limits, estimated, used)


async def test_the_dispatcher_paces_with_its_slot_held_and_settles_as_providers_count():
    async with SimServer(SimConfig(time_scale=0)) as sim, httpx.AsyncClient() as probes:
        endpoint = ModelEndpoint(name="provider", kind="sim", base_url=sim.url, model="sim",
                                 limits=ModelLimits(requests_per_min=6000, tokens_per_min=10**6))
        batch = InferBatch(batch_id="b", run_id="pacing", round=1, model=ModelConfig(backend="sim", max_tokens=16),
                           system="You are a player.", keys=[1, 2, 3], prompts=["guess", "guess again", "and again"],
                           endpoint=endpoint)
        pacer, http = RecordingPacer(), ChatClient(8)
        pacer.pool = ReplicaPool(None, probes)
        dispatcher = Dispatcher(pacer.pool, make_router("round-robin"), http, Settings(gateway_poll_s=3600),
                                keys=KeyRing("", "127.0.0.1"), pacer=pacer)
        try:
            dispatcher.pool_for(batch)
            for replica in pacer.pool.replicas.values():
                replica.load.healthy = True
            reply, _ = await dispatcher.serve(batch)
        finally:
            await http.aclose()
    assert reply.error is None and reply.attempts == [1, 1, 1]
    key = limit_key(endpoint, "")
    acquires = [e for e in pacer.events if e[0] == "acquire"]
    settles = [e for e in pacer.events if e[0] == "settle"]
    assert len(acquires) == len(settles) == 3 and {e[1] for e in pacer.events} == {key}
    assert all(held >= 1 for _, _, held in acquires)  # each call held its replica slot while it was paced
    # as providers count: the prompt tokens the provider reported, plus all of max_tokens
    assert sorted(used for *_, used in settles) == sorted(p + 16 for p in reply.prompt_tokens)
