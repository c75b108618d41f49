"""Start a run over the bus and follow it: `ctl.run.start` out; spawn, round, done and
recorded events in (core subscriptions on just those subjects — never the outcome batches)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client

from populace.core import bus, objects, subjects
from populace.core.contracts import (
    HostSpawned, Progress, RoundOpen, RoundResult, RunConfig, RunDone, RunRecorded, ReplicaInfo, RunStart, RunStarted,
)

EVENT_MODELS = {
    "started": RunStarted, "spawned": HostSpawned, "round.open": RoundOpen,
    "round.result": RoundResult, "done": RunDone, "recorded": RunRecorded,
}


class RunStalled(TimeoutError):
    pass


@dataclass
class RunOutcome:
    run_id: str
    status: str = "unknown"
    reason: str | None = None
    started: RunStarted | None = None
    results: list[RoundResult] = field(default_factory=list)
    recorded: RunRecorded | None = None
    # wall-clock marks (time.monotonic): submitted, spawned, open.<n>, result.<n>, done, recorded
    marks: dict[str, float] = field(default_factory=dict)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


async def replica_identities(js, backend: str) -> list[dict]:
    """Which replicas (and model ids) serve `backend` right now: the manifest's model identity."""
    if backend == "dummy":
        return []
    entries = await bus.registry_entries(js, subjects.REPLICAS_BUCKET, ReplicaInfo)
    return sorted(({"replica_id": r.replica_id, "kind": r.kind, "model": r.model}
                   for r in entries if r.backend == backend), key=lambda r: r["replica_id"])


async def play(nc: Client, config: RunConfig, *, run_id: str | None = None,
               personas: bytes | None = None, manifest: dict | None = None,
               on_event: Callable[[str, object], None] | None = None,
               stall_s: float = 300.0) -> RunOutcome:
    """Submit a run and follow it until it is recorded (or failed). Raises RunStalled when
    no event arrives for `stall_s` seconds. `personas` (the population's JSONL, whose digest
    the config names) is uploaded to the object store first."""
    rid = run_id or new_run_id()
    out = RunOutcome(rid)
    queue: asyncio.Queue = asyncio.Queue()

    async def on_msg(msg) -> None:
        queue.put_nowait(msg)

    subs = [await nc.subscribe(s, cb=on_msg) for s in (
        subjects.run_started(rid), subjects.run_spawned_any(rid), subjects.run_rounds_any(rid),
        subjects.run_done(rid), subjects.run_recorded(rid), subjects.progress_all(rid))]
    await nc.flush()
    spawned: set[str] = set()
    try:
        js = nc.jetstream()
        if personas is not None:
            await objects.put_personas(js, personas)
        if manifest is not None:
            manifest = {**manifest, "run_id": rid}
            manifest["model"] = {**manifest.get("model", {}),
                                 "replicas": await replica_identities(js, config.model.backend)}
        out.marks["submitted"] = time.monotonic()
        await bus.publish_js(js, subjects.RUN_START, RunStart(run_id=rid, config=config, manifest=manifest),
                             msg_id=subjects.msg_id(rid, 0, "cli", "start"))
        while True:
            try:
                msg = await asyncio.wait_for(queue.get(), stall_s)
            except asyncio.TimeoutError:
                raise RunStalled(f"run {rid}: no event for {stall_s:.0f}s") from None
            now = time.monotonic()
            if msg.subject.startswith("progress."):
                if on_event:
                    on_event("progress", Progress.model_validate_json(msg.data))
                continue
            kind = subjects.kind_of(msg.subject)
            model = EVENT_MODELS[kind].model_validate_json(msg.data)
            if isinstance(model, RunStarted):
                out.started = model
            elif isinstance(model, HostSpawned):
                spawned.add(model.host_id)
                if out.started and spawned >= set(out.started.hosts):
                    out.marks["spawned"] = now
            elif isinstance(model, RoundOpen):
                out.marks[f"open.{model.round}"] = now
            elif isinstance(model, RoundResult):
                out.marks[f"result.{model.round}"] = now
                out.results.append(model)
            elif isinstance(model, RunDone):
                out.marks["done"] = now
                out.status, out.reason = model.status, model.reason
            elif isinstance(model, RunRecorded):
                out.marks["recorded"] = now
                out.recorded = model
            if on_event:
                on_event(kind, model)
            if out.recorded is not None:
                return out
    finally:
        for s in subs:
            await s.unsubscribe()
