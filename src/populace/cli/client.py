"""Start a run over the bus and follow it: `ctl.run.start` out; spawn, round, done and
recorded events in (core subscriptions on just those subjects — never the guess batches)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client

from populace.core import bus, subjects
from populace.core.contracts import (
    HostSpawned, Progress, RoundOpen, RoundResult, RunConfig, RunDone, RunRecorded, RunStart, RunStarted,
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


async def play(nc: Client, config: RunConfig, *, run_id: str | None = None,
               on_event: Callable[[str, object], None] | None = None,
               stall_s: float = 300.0) -> RunOutcome:
    """Submit a run and follow it until it is recorded (or failed). Raises RunStalled when
    no event arrives for `stall_s` seconds."""
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
        out.marks["submitted"] = time.monotonic()
        await bus.publish_js(js, subjects.RUN_START, RunStart(run_id=rid, config=config),
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
