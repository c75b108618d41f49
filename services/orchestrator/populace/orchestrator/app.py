"""orchestrator service wiring: `ctl.run.start` in; placement, round pacing and run state
(KV `runs`, compare-and-swap) out. Rounds are the backpressure gate: round n+1 opens only
after round n's result.

Run with `populace service orchestrator` or `faststream run populace.orchestrator.app:app`."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from faststream.middlewares import AckPolicy
from faststream.nats import JStream, PullSub
from faststream.nats.annotations import NatsMessage
from nats.js.api import DeliverPolicy
from nats.js.errors import KeyWrongLastSequenceError

from opentelemetry import trace
from opentelemetry.trace import Span

from populace.core import bus, metrics, subjects, telemetry
from populace.core.telemetry import tracer
from populace.core.contracts import (
    HostInfo, HostSpawned, RoundOpen, RoundResult, RunDone, RunStart, RunStarted, RunState, SpawnBatch,
)
from populace.core.service import Service
from populace.orchestrator import workflow
from populace.orchestrator.placement import PlacementError, place

svc = Service("orchestrator")
broker, app = svc.broker, svc.app
# Subscribers NACK on error: a handler that failed on a transient JetStream error (e.g. during
# a leader election) gets the message again instead of losing it (which stalled the run).
ctl_stream = JStream(subjects.CTL_STREAM, declare=False)
run_stream = JStream(subjects.RUN_STREAM, declare=False)
HOST_WAIT_S = 10.0  # how long a run start waits for a first agent-host to register
# Open spans: "<rid>" is the run (the trace's root), "<rid>.<n>" its rounds.
spans: dict[str, Span] = {}
# Runs this orchestrator placed (or adopted after a restart) and has not finished, with
# their hosts: those hosts are watched.
watched: dict[str, set[str]] = {}
watch_state: dict = {}


@svc.on_ready
async def _start_watch() -> None:
    watch_state["task"] = asyncio.create_task(watch_hosts())


@svc.on_stop
async def _stop_watch() -> None:
    if task := watch_state.get("task"):
        task.cancel()


async def adopt_unfinished_runs() -> None:
    """After a restart: watch the runs KV says are still spawning or running."""
    for state in await bus.registry_entries(svc.js, subjects.RUNS_BUCKET, RunState):
        if state.status in ("spawning", "running"):
            watched[state.run_id] = set(state.placement)
    if watched:
        svc.log.info("runs_adopted", runs=sorted(watched))


async def watch_hosts() -> None:
    """Every heartbeat, fail the watched runs whose hosts stopped heartbeating. A host counts
    as lost only when a complete registry read says so on two beats in a row: a failed read
    (a NATS leader election) proves nothing and is skipped."""
    silent_s = svc.settings.host_lost_s
    try:
        await adopt_unfinished_runs()
    except Exception as err:  # noqa: BLE001
        svc.log.warning("runs_adopt_failed", error=str(err))
    missing: dict[str, int] = {}  # host id -> consecutive beats it was seen stale or absent
    while True:
        await asyncio.sleep(svc.settings.heartbeat_s)
        if not watched:
            missing.clear()
            continue
        try:
            fresh = {h.host_id for h in await bus.registry_entries(
                svc.js, subjects.HOSTS_BUCKET, HostInfo, fresh_within_s=silent_s, strict=True)}
        except Exception as err:  # noqa: BLE001 - no verdict from a failed read
            svc.log.warning("host_watch_read_failed", error=str(err))
            continue
        placed = set().union(*watched.values())
        missing = {h: missing.get(h, 0) + 1 for h in placed if h not in fresh}
        live = fresh | {h for h, beats in missing.items() if beats < 2}
        try:
            for rid in list(watched):
                await advance(rid, lambda s: workflow.on_hosts_lost(s, live, silent_s))
        except Exception as err:  # noqa: BLE001 - a KV hiccup: look again next beat
            svc.log.warning("host_watch_failed", error=str(err))


async def runs_kv():
    return await svc.js.key_value(subjects.RUNS_BUCKET)


async def fresh_hosts() -> list[HostInfo]:
    return await bus.registry_entries(svc.js, subjects.HOSTS_BUCKET, HostInfo,
                                      fresh_within_s=svc.settings.registry_ttl_s)


@broker.subscriber(subjects.RUN_START, stream=ctl_stream, durable="orchestrator-ctl",
                   pull_sub=PullSub(batch_size=8), deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
async def on_run_start(msg: NatsMessage) -> None:
    start = await svc.parse(RunStart, msg.raw_message)
    if start is None:
        return
    rid, cfg = start.run_id, start.config
    kv = await runs_kv()
    hosts = await fresh_hosts()
    deadline = time.monotonic() + HOST_WAIT_S
    while not hosts and time.monotonic() < deadline:
        await asyncio.sleep(0.25)
        hosts = await fresh_hosts()
    try:
        placement = place(cfg.agents, hosts)
    except PlacementError as err:
        svc.log.warning("run_rejected", run_id=rid, reason=str(err))
        await finish(rid, workflow.FinishRun("failed", 0, str(err)))
        return
    state = workflow.new_run(rid, cfg, placement)
    try:
        await kv.create(rid, bus.encode(state))
    except Exception:  # noqa: BLE001 - key exists: a replayed start of a known run
        svc.log.info("run_start_replayed", run_id=rid)
        return
    run_span = spans[rid] = tracer.start_span(
        "orchestrator.run", context=telemetry.extract(msg.headers),
        attributes={"populace.run_id": rid, "populace.agents": cfg.agents, "populace.rounds": cfg.rounds})
    watched[rid] = set(placement)
    with trace.use_span(run_span, end_on_exit=False):
        await announce(rid, cfg, placement, start.manifest)


async def announce(rid: str, cfg, placement: dict, manifest: dict | None = None) -> None:
    await bus.publish_js(svc.js, subjects.run_started(rid),
                         RunStarted(run_id=rid, config=cfg, started_at=time.time(), hosts=sorted(placement),
                                    manifest=manifest),
                         msg_id=subjects.msg_id(rid, 0, "orch", "started"))
    for host_id, ranges in placement.items():
        await bus.publish_js(svc.js, subjects.run_spawn(rid, host_id),
                             SpawnBatch(run_id=rid, host_id=host_id, ranges=ranges, config=cfg),
                             msg_id=subjects.msg_id(rid, 0, host_id, "spawn"))
    svc.log.info("run_placed", run_id=rid, agents=cfg.agents, rounds=cfg.rounds,
                 hosts={h: sum(c for _, c in r) for h, r in placement.items()})


async def advance(rid: str, decide: Callable[[RunState], tuple[RunState, list[workflow.Action]]]) -> None:
    """Compare-and-swap the run state, then perform the actions the decision asked for."""
    kv = await bus.until_ready(runs_kv, "KV runs")
    for _ in range(50):
        entry = await bus.until_ready(lambda: kv.get(rid), f"run state {rid}")
        state = RunState.model_validate_json(entry.value)
        new, actions = decide(state)
        if new is state:
            return
        try:
            await kv.update(rid, bus.encode(new), last=entry.revision)
        except KeyWrongLastSequenceError:
            continue  # someone advanced it first: decide again on the fresh state
        except bus.TRANSIENT:
            # No answer (e.g. a leader election): the write may have landed. If it did, the
            # actions are still ours to do (they are idempotent publishes); if not, decide again.
            now = RunState.model_validate_json(
                (await bus.until_ready(lambda: kv.get(rid), f"run state {rid}")).value)
            if not same_state(now, new):
                continue
        for action in actions:
            if isinstance(action, workflow.OpenRound):
                await open_round(new, action)
            else:
                await finish(rid, action)
        return
    raise RuntimeError(f"run {rid}: could not update state (contention)")


def same_state(a: RunState, b: RunState) -> bool:
    return a.model_dump(exclude={"updated_at"}) == b.model_dump(exclude={"updated_at"})


async def open_round(state: RunState, action: workflow.OpenRound) -> None:
    rid = state.run_id
    run_span = spans.get(rid)
    round_span = spans[f"{rid}.{action.round}"] = tracer.start_span(
        "orchestrator.round", context=telemetry.context_of(run_span) if run_span else None,
        attributes={"populace.run_id": rid, "populace.round": action.round})
    with trace.use_span(round_span, end_on_exit=False):
        await publish_open(state, action)


async def publish_open(state: RunState, action: workflow.OpenRound) -> None:
    rid = state.run_id
    await bus.publish_js(
        svc.js, subjects.run_round_open(rid, action.round),
        RoundOpen(run_id=rid, round=action.round, expected=action.expected, history=action.history,
                  game=state.config.game, opened_at=time.time()),
        msg_id=subjects.msg_id(rid, action.round, "orch", "open"),
    )
    metrics.ROUNDS.labels("orchestrator").inc()
    svc.log.info("round_opened", run_id=rid, round=action.round, expected=action.expected)


async def finish(rid: str, action: workflow.FinishRun) -> None:
    watched.pop(rid, None)
    run_span = spans.pop(rid, None)
    if run_span is None:  # a run rejected before it started: no trace to continue
        await publish_done(rid, action)
        return
    if action.status != "completed":
        run_span.set_status(trace.StatusCode.ERROR, action.reason or action.status)
    with trace.use_span(run_span, end_on_exit=True):
        await publish_done(rid, action)


async def publish_done(rid: str, action: workflow.FinishRun) -> None:
    await bus.publish_js(svc.js, subjects.run_done(rid),
                         RunDone(run_id=rid, status=action.status, rounds=action.rounds,
                                 finished_at=time.time(), reason=action.reason),
                         msg_id=subjects.msg_id(rid, 0, "orch", "done"))
    svc.log.info("run_finished", run_id=rid, status=action.status, rounds=action.rounds, reason=action.reason)


@broker.subscriber(subjects.ANY_SPAWNED, stream=run_stream, durable="orchestrator-spawned",
                   pull_sub=PullSub(batch_size=64), deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
async def on_spawned(msg: NatsMessage) -> None:
    spawned = await svc.parse(HostSpawned, msg.raw_message)
    if spawned is not None:
        await advance(spawned.run_id, lambda s: workflow.on_spawned(s, spawned.host_id))


@broker.subscriber(subjects.ANY_ROUND_RESULT, stream=run_stream, durable="orchestrator-result",
                   pull_sub=PullSub(batch_size=16), deliver_policy=DeliverPolicy.NEW, ack_policy=AckPolicy.NACK_ON_ERROR)
async def on_result(msg: NatsMessage) -> None:
    result = await svc.parse(RoundResult, msg.raw_message)
    if result is not None:
        if round_span := spans.pop(f"{result.run_id}.{result.round}", None):
            round_span.set_attributes({"populace.n_valid": result.n_valid, "populace.mean": result.mean or 0.0})
            round_span.end()
        await advance(result.run_id, lambda s: workflow.on_result(s, result))
