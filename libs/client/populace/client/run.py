"""Start, steer and follow runs over the bus: `ctl.run.start`, `ctl.run.cancel` and
`ctl.run.resume` out; spawn, round, resume, done and recorded events, and the recorder's
faults, in (core subscriptions on just those subjects — never the outcome batches)."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from nats.aio.client import Client
from nats.js.errors import KeyNotFoundError
from pydantic import ValidationError

from populace.core import bus, objects, replica_hosts, subjects
from populace.core.contracts import (
    Budget,
    HostSpawned,
    Progress,
    ReplicaInfo,
    Restore,
    RoundOpen,
    RoundResult,
    RunCancel,
    RunConfig,
    RunDone,
    RunFault,
    RunRecorded,
    RunResume,
    RunResumed,
    RunStart,
    RunStarted,
    RunState,
)
from populace.core.settings import Settings

EVENT_MODELS = {
    "started": RunStarted, "spawned": HostSpawned, "round.open": RoundOpen, "resumed": RunResumed,
    "round.result": RoundResult, "done": RunDone, "recorded": RunRecorded, "fault": RunFault,
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
    # why the recorder cannot store the run's events now (its disk is full): then nobody waits
    # for `recorded`, which comes only once there is room again
    unrecorded: str | None = None
    # wall-clock marks (time.monotonic): submitted, spawned, open.<n>, result.<n>, done, recorded
    marks: dict[str, float] = field(default_factory=dict)
    malformed: int = 0  # messages on the run's subjects that were not its events (skipped)


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


async def replica_identities(js, backend: str) -> list[dict]:
    """Which replicas (and model ids) serve `backend` right now: the manifest's model identity."""
    if backend == "dummy":
        return []
    entries = replica_hosts.bound(await bus.registry_items(js, subjects.REPLICAS_BUCKET, ReplicaInfo),
                                  replica_hosts.parse(Settings().replica_hosts))  # those a gateway like it calls
    return sorted(({"replica_id": r.replica_id, "kind": r.kind, "model": r.model}
                   for r in entries if r.backend == backend), key=lambda r: r["replica_id"])


class _Following:
    """A run's events on the core bus (never its outcome batches): subscribed before anything
    is asked of the run, read until it is recorded."""

    def __init__(self, nc: Client, rid: str, on_event: Callable[[str, object], None] | None, stall_s: float,
                 resuming: bool = False) -> None:
        self.nc, self.rid, self.on_event, self.stall_s = nc, rid, on_event, stall_s
        self.resuming = resuming  # a stop before the resume is announced is its refusal
        self.out = RunOutcome(rid)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.subs: list = []
        self.spawned: set[str] = set()
        self.hosts: set[str] = set()
        self.epoch = 0  # the run's newest epoch seen (resumed, done): a record of an older stop is not its end

    async def __aenter__(self) -> _Following:
        async def on_msg(msg) -> None:
            self.queue.put_nowait(msg)

        rid = self.rid
        self.subs = [await self.nc.subscribe(s, cb=on_msg) for s in (
            subjects.run_started(rid), subjects.run_spawned_any(rid), subjects.run_rounds_any(rid),
            subjects.run_resumed(rid), subjects.run_done(rid), subjects.run_recorded(rid),
            subjects.run_fault(rid, "recorder"), subjects.progress_all(rid))]
        await self.nc.flush()
        return self

    async def __aexit__(self, *exc) -> None:
        for s in self.subs:
            await s.unsubscribe()

    def newer_epoch(self, epoch: int) -> None:
        """The run is at `epoch` or later: a record of an earlier stop, whichever subscription
        delivered it first, is not its end."""
        self.epoch = max(self.epoch, epoch)
        if self.out.recorded is not None and self.out.recorded.epoch < self.epoch:
            self.out.recorded = None
            self.out.marks.pop("recorded", None)

    def as_recorded(self) -> None:
        """The recorder's word on the run's status is the last: a run that completed with rows
        missing is `incomplete` (whichever of done and recorded came first)."""
        rec = self.out.recorded
        if rec is not None and rec.status is not None and rec.epoch >= self.epoch:
            self.out.status, self.out.reason = rec.status, rec.reason

    async def until_recorded(self) -> RunOutcome:
        out = self.out
        while True:
            try:
                msg = await asyncio.wait_for(self.queue.get(), self.stall_s)
            except TimeoutError:
                raise RunStalled(f"run {self.rid}: no event for {self.stall_s:.0f}s") from None
            now = time.monotonic()
            kind = "progress" if msg.subject.startswith("progress.") else subjects.kind_of(msg.subject)
            try:
                model = (Progress if kind == "progress" else EVENT_MODELS[kind]).model_validate_json(msg.data)
            except (KeyError, ValidationError):
                model = None
            if model is None or model.run_id != self.rid:
                out.malformed += 1  # not an event of this run: the services dead-letter it, we skip it
                continue
            if kind == "progress":
                if self.on_event:
                    self.on_event("progress", model)
                continue
            if isinstance(model, RunStarted):
                out.started = model
                self.hosts = set(model.hosts)
            elif isinstance(model, RunResumed):
                out.marks["resumed"] = now
                self.newer_epoch(model.epoch)
                self.hosts, self.spawned = set(model.hosts), set()
            elif isinstance(model, HostSpawned):
                self.spawned.add(model.host_id)
                if self.hosts and self.spawned >= self.hosts:
                    out.marks["spawned"] = now
            elif isinstance(model, RoundOpen):
                out.marks[f"open.{model.round}"] = now
            elif isinstance(model, RoundResult):
                out.marks[f"result.{model.round}"] = now
                out.results = [r for r in out.results if r.round != model.round] + [model]
            elif isinstance(model, RunDone):
                out.marks["done"] = now
                self.newer_epoch(model.epoch)
                out.status, out.reason = model.status, model.reason
                self.as_recorded()
                if self.resuming and "resumed" not in out.marks:
                    if self.on_event:
                        self.on_event(kind, model)
                    return out  # refused: nothing was played, nothing more will be recorded
            elif isinstance(model, RunRecorded):
                if model.epoch < self.epoch:
                    # the stop before a resume, recorded only now (the recorder waited for room):
                    # not what this run's end recorded
                    continue
                out.marks["recorded"] = now
                out.recorded = model
                self.as_recorded()
            elif isinstance(model, RunFault):
                out.unrecorded = model.reason
            if self.on_event:
                self.on_event(kind, model)
            if (out.recorded is not None or out.unrecorded is not None) and "done" in out.marks:
                return out


async def play(nc: Client, config: RunConfig, *, run_id: str | None = None,
               personas: bytes | None = None, graph: tuple[bytes | None, bytes | None] | None = None,
               manifest: dict | None = None,
               on_event: Callable[[str, object], None] | None = None,
               stall_s: float = 300.0, fork: Restore | None = None) -> RunOutcome:
    """Submit a run and follow it until it is recorded (or failed). Raises RunStalled when
    no event arrives for `stall_s` seconds. `personas` (the population's JSONL, whose digest
    the config names) is uploaded to the object store first. `fork`: start from another
    run's state after one of its rounds."""
    rid = run_id or new_run_id()
    async with _Following(nc, rid, on_event, stall_s) as following:
        await submit(nc, config, run_id=rid, personas=personas, graph=graph, manifest=manifest, fork=fork,
                     marks=following.out.marks)
        return await following.until_recorded()


async def submit(nc: Client, config: RunConfig, *, run_id: str, personas: bytes | None = None,
                 graph: tuple[bytes | None, bytes | None] | None = None,
                 manifest: dict | None = None, fork: Restore | None = None,
                 marks: dict[str, float] | None = None) -> str:
    """Publish a run's start (personas and graph uploaded first, the manifest given its run id
    and the replicas serving its model) without following it: `play` follows, the manager does
    not. `graph`: (the graph's bytes, its agent order's bytes or None), as prepared."""
    js = nc.jetstream()
    if personas is not None:
        await objects.put_personas(js, personas)
    if graph is not None and graph[0] is not None:
        from populace.graph.store import put_blob, put_graph

        await put_graph(js, graph[0])
        if graph[1] is not None:
            await put_blob(js, graph[1], "graph order")
    if manifest is not None:
        manifest = {**manifest, "run_id": run_id}
        manifest["model"] = {**manifest.get("model", {}),
                             "replicas": await replica_identities(js, config.model.backend)}
    if marks is not None:
        marks["submitted"] = time.monotonic()
    await bus.publish_js(js, subjects.RUN_START, RunStart(run_id=run_id, config=config, manifest=manifest,
                                                          fork=fork),
                         msg_id=subjects.msg_id(run_id, 0, "cli", "start"))
    return run_id


def status_as_recorded(state: RunState, recorded: RunRecorded | None) -> tuple[str, str | None]:
    """A run's status and reason to show from its state (KV `runs`) and its RunRecorded (None: not
    read, or not recorded yet): a run done but recorded with rows missing is `incomplete`, with
    the recorder's reason; otherwise the state's own."""
    if (state.status == "done" and recorded is not None and recorded.run_id == state.run_id
            and recorded.status == "incomplete" and recorded.epoch >= state.epoch):
        return recorded.status, recorded.reason
    return state.status, state.reason


async def recorded_event(nc: Client, rid: str) -> RunRecorded | None:
    """The run's RunRecorded in stream RUN (None: not recorded yet, aged out, or no stream)."""
    try:
        return await bus.last_on(nc.jetstream(), subjects.RUN_STREAM, subjects.run_recorded(rid), RunRecorded)
    except Exception:  # the stream not there, the bus gone: nothing to add to the state
        return None


async def run_state(nc: Client, rid: str) -> RunState | None:
    """The run's state in KV `runs` (None: no such run on this stack)."""
    kv = await nc.jetstream().key_value(subjects.RUNS_BUCKET)
    try:
        entry = await kv.get(rid)
    except KeyNotFoundError:
        return None
    return RunState.model_validate_json(entry.value)


async def cancel(nc: Client, rid: str, reason: str = "cancelled by the user") -> None:
    await bus.publish_js(nc.jetstream(), subjects.RUN_CANCEL, RunCancel(run_id=rid, reason=reason),
                         msg_id=f"cancel.{rid}.{uuid.uuid4().hex[:8]}")


async def resume(nc: Client, rid: str, *, on_event: Callable[[str, object], None] | None = None,
                 stall_s: float = 300.0, budget: Budget | None = None) -> RunOutcome:
    """Ask for a failed, cancelled or paused run to continue after its last completed round
    (with `budget` replacing its own, when given), and follow it until it is recorded."""
    async with _Following(nc, rid, on_event, stall_s, resuming=True) as following:
        following.out.marks["submitted"] = time.monotonic()
        await request_resume(nc, rid, budget)
        return await following.until_recorded()


async def request_resume(nc: Client, rid: str, budget: Budget | None = None) -> None:
    """Ask for a run to continue (`ctl.run.resume`) without following it."""
    await bus.publish_js(nc.jetstream(), subjects.RUN_RESUME, RunResume(run_id=rid, budget=budget),
                         msg_id=f"resume.{rid}.{uuid.uuid4().hex[:8]}")


async def follow(nc: Client, rid: str, *, on_event: Callable[[str, object], None] | None = None,
                 stall_s: float = 300.0) -> RunOutcome:
    """Follow a run that is already under way, from its next event until it is recorded."""
    async with _Following(nc, rid, on_event, stall_s) as following:
        return await following.until_recorded()
