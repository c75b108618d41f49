"""agent-host service wiring: spawn and round-open events in, turns played by HostRuntime.

Run with `populace service agent-host` or `faststream run populace.agent_host.app:app`."""

from __future__ import annotations

import asyncio
import os
import time

from faststream.nats.annotations import NatsMessage

from populace.agent_host.runtime import HostRuntime
from populace.core import bus, objects, subjects, telemetry
from populace.core.contracts import HostInfo, HostSpawned, RoundOpen, RunDone, SpawnBatch
from populace.core.service import Service
from populace.games.cast import Cast, cast_from_jsonl
from populace.population.errors import PopulationError

svc = Service("agent-host")
broker, app = svc.broker, svc.app
host_id = svc.settings.host_id
state: dict = {}


@svc.on_ready
async def _start() -> None:
    runtime = HostRuntime(svc.nc, svc.js, svc.settings)
    state["runtime"] = runtime
    started = time.time()
    kv = await svc.js.key_value(subjects.HOSTS_BUCKET)
    hb = bus.Heartbeat(
        kv, host_id,
        lambda: HostInfo(host_id=host_id, capacity=svc.settings.host_capacity,
                         agents=runtime.agent_count, pid=os.getpid(), started_at=started,
                         heartbeat_at=time.time()),
        svc.settings.heartbeat_s,
    )
    state["heartbeat"] = hb
    await hb.start()


@svc.on_stop
async def _stop() -> None:
    if hb := state.get("heartbeat"):
        await hb.stop()
    runtime: HostRuntime | None = state.get("runtime")
    if runtime:
        for rid in list(runtime.runs):
            runtime.forget(rid)


async def load_cast(batch: SpawnBatch) -> Cast | None:
    """The run's personas, read once per file from the object store (cached by digest: a
    sweep reuses one population across many runs)."""
    pop = batch.config.population
    if pop is None or pop.digest is None:
        return None
    casts: dict[str, Cast] = state.setdefault("casts", {})
    if pop.digest not in casts:
        data = await objects.get_personas(svc.js, pop.digest)
        casts.clear()  # keep one population in memory
        casts[pop.digest] = await asyncio.to_thread(cast_from_jsonl, data, f"personas {pop.digest[:12]}")
    return casts[pop.digest]


# no_reply: these are JetStream-published events whose reply subject is the publisher's
# PubAck inbox; an (empty) handler reply there would race the server's real acknowledgement.
@broker.subscriber(subjects.any_spawn_for(host_id), no_reply=True)
async def on_spawn(msg: NatsMessage) -> None:
    batch = await svc.parse(SpawnBatch, msg.raw_message)
    if batch is None:
        return
    t0 = time.perf_counter()
    try:
        cast = await load_cast(batch)
        run = state["runtime"].spawn(batch, cast)
    except (objects.BlobError, PopulationError, ValueError) as err:
        await svc.dead_letter(msg.raw_message, err)
        return
    seconds = time.perf_counter() - t0
    svc.log.info("agents_spawned", run_id=batch.run_id, agents=len(run.agents), seconds=round(seconds, 3),
                 one_per_process=batch.config.placement.agents_per_process == 1)
    await bus.publish_js(
        svc.js, subjects.run_spawned(batch.run_id, host_id),
        HostSpawned(run_id=batch.run_id, host_id=host_id, agents=len(run.agents), seconds=seconds),
        msg_id=subjects.msg_id(batch.run_id, 0, host_id, "spawned"),
    )


@broker.subscriber(subjects.ANY_ROUND_OPEN, no_reply=True)
async def on_round_open(msg: NatsMessage) -> None:
    opened = await svc.parse(RoundOpen, msg.raw_message)
    if opened is not None:
        # plays in its own task; the handler returns at once
        state["runtime"].start_round(opened, telemetry.extract(msg.headers))


@broker.subscriber(subjects.ANY_RUN_DONE, no_reply=True)
async def on_done(msg: NatsMessage) -> None:
    done = await svc.parse(RunDone, msg.raw_message)
    if done is not None:
        state["runtime"].forget(done.run_id)
