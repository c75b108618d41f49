"""The pages' live updates: server-sent event streams, each sampled at most once per
`sample_s` per open page (one NATS watch or subscription per open page, none when no page is open).

    GET  /events/runs            the runs list (KV `runs` watched)
    GET  /events/runs/{run}      one run: its state, the round in play's answers, the rounds closed since
    GET  /events/nodes           the nodes (KV `nodes` watched)
    GET  /events/replicas        the replicas, probed again every REPLICAS_SAMPLE_S
`?once=1` ends a stream after its first event.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

from nats.js.errors import BucketNotFoundError, KeyNotFoundError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from populace.client.run import recorded_event
from populace.core import bus, subjects
from populace.core.contracts import NodeInfo, RoundOpen, RoundResult, RunState
from populace.manager import views
from populace.manager.replicas import replica_rows
from populace.manager.runs import run_state
from populace.manager.web import nc_of, settings_of, sse

RESULTS_PER_UPDATE = 200  # round results fetched per live update (a long run's page catches up over a few)

# Replicas are probed over HTTP (health, /metrics) while a page that shows them is open: not
# more often than this, whatever the manager's sample_s (the gateways poll them to route).
REPLICAS_SAMPLE_S = 2.0


def _once(request: Request) -> bool:
    return request.query_params.get("once") == "1"


async def runs_events(request: Request) -> Response:
    return sse(_runs_stream(nc_of(request), settings_of(request).sample_s, _once(request)))


async def run_events(request: Request) -> Response:
    rid = request.path_params["run"]
    if not subjects.valid_token(rid):
        return PlainTextResponse("not a run id", status_code=404)
    return sse(_run_stream(nc_of(request), rid, settings_of(request).sample_s, _once(request)))


async def nodes_events(request: Request) -> Response:
    return sse(_nodes_stream(nc_of(request), settings_of(request).sample_s, _once(request)))


async def replicas_events(request: Request) -> Response:
    every_s = max(settings_of(request).sample_s, REPLICAS_SAMPLE_S)
    return sse(_replicas_stream(nc_of(request), every_s, _once(request)))


async def _replicas_stream(nc, every_s: float, once: bool) -> AsyncIterator[bytes]:
    """The replicas page's live update: every replica probed every `every_s` seconds."""
    while True:
        yield views.sse({"replicas": await replica_rows(nc)})
        if once:
            return
        await asyncio.sleep(every_s)


KEEPALIVE_S = 15.0  # an event stream with nothing new sends a comment this often (proxies close idle ones)


async def _runs_stream(nc, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The runs list's live updates: KV `runs` watched (see _kv_stream)."""
    async for chunk in _kv_stream(nc, subjects.RUNS_BUCKET, RunState,
                                  lambda states: views.runs_payload(list(states.values())), sample_s, once):
        yield chunk


async def _nodes_stream(nc, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The nodes page's live updates: KV `nodes` watched (each heartbeat is a change)."""
    async for chunk in _kv_stream(nc, subjects.NODES_BUCKET, NodeInfo,
                                  lambda nodes: views.nodes_payload(list(nodes.values())), sample_s, once):
        yield chunk


async def _kv_stream(nc, bucket: str, model, payload, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """A KV bucket watched (one ordered consumer per open page: each key's latest value, then
    its changes), its entries as `payload(entries by key)` sent at most once per `sample_s`
    and only when something changed. A bucket that does not exist yet is asked for again
    until it does."""
    entries: dict[str, object] = {}
    ready = asyncio.Event()
    changed = asyncio.Event()

    async def drain(watcher) -> None:
        async for entry in watcher:
            if entry is None:  # the initial values are in
                ready.set()
                continue
            if entry.operation in ("DEL", "PURGE"):
                entries.pop(entry.key, None)
            else:
                try:
                    entries[entry.key] = model.model_validate_json(entry.value)
                except ValidationError:
                    continue  # malformed: skipped, as registry readers skip it
            if ready.is_set():
                changed.set()

    watcher = task = kv = None
    js = nc.jetstream()
    try:
        while watcher is None:
            try:
                kv = await js.key_value(bucket)
                watcher = await kv.watchall()
            except BucketNotFoundError:
                yield views.sse(payload({}))
                if once:
                    return
                await asyncio.sleep(max(sample_s, 1.0))
        task = asyncio.get_running_loop().create_task(drain(watcher))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.wait(), 10.0)
        # The watcher says its initial values are in at the first entry with nothing pending,
        # which under concurrent writes comes before every key was delivered (nats-io/nats.py#995,
        # as for registry reads): the keys it has not delivered yet are read, so the first payload
        # is whole (the watcher's later deliveries are newer, and win).
        await _read_missing(js, kv, bucket, model, entries)
        quiet_since = time.monotonic()
        yield views.sse(payload(entries))
        while not once:
            await asyncio.sleep(sample_s)
            if changed.is_set():
                changed.clear()
                quiet_since = time.monotonic()
                yield views.sse(payload(entries))
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield b": keepalive\n\n"
    finally:
        if task is not None:
            task.cancel()
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()


async def _read_missing(js, kv, bucket: str, model, entries: dict[str, object]) -> None:
    """The bucket's entries the watcher has not delivered yet, read into `entries` (a key gone
    meanwhile, or malformed, is skipped, as the watcher skips it)."""
    try:
        keys = await bus.bucket_keys(js, bucket)
    except Exception:
        return  # the watcher's view stands; its next deliveries complete it
    for key in keys:
        if key in entries:
            continue
        try:
            entry = await kv.get(key)
            entries.setdefault(key, model.model_validate_json(entry.value))
        except (KeyNotFoundError, ValidationError):
            continue


async def _run_stream(nc, rid: str, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The run page's live updates: every `sample_s`, the run's state from KV, the round in
    play's answers (summed from progress ticks this stream subscribed to) out of its
    RoundOpen's `expected`, and the round results closed since the last update (read from the
    RUN stream by subject, newest version of each)."""
    ticks = views.RoundTicks(rid)
    js = nc.jetstream()

    async def on_tick(msg) -> None:
        ticks.add(msg.data)

    sub = await nc.subscribe(subjects.progress_all(rid), cb=on_tick)
    sent = 0  # rounds whose results this stream has sent: 1..sent
    recorded = None  # the run's RunRecorded, once it is done and recorded
    expected: dict[int, int] = {}
    try:
        while True:
            state = await run_state(nc, rid)
            if ticks.first_round is None:
                # the first round counted from its opening: the next one (a round in play when
                # the page opened had ticks before it listened); all of them for a run not yet known
                ticks.opened(1 if state is None else state.round + 1)
            new: list[RoundResult] = []
            if state is not None:
                done = views.last_completed(state)
                for n in range(sent + 1, min(done, sent + RESULTS_PER_UPDATE) + 1):
                    result = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_round_result(rid, n), RoundResult)
                    if result is not None and result.run_id == rid:
                        new.append(result)
                    sent = n
            current = state.round if state is not None and state.status == "running" else None
            if current and current not in expected:
                opened = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_round_open(rid, current), RoundOpen)
                if opened is not None:
                    expected[current] = opened.expected
            exp = expected.get(current) if current else None
            if state is not None and state.status == "done" and (recorded is None or recorded.epoch < state.epoch):
                recorded = await recorded_event(nc, rid)  # its status as recorded (incomplete: rows missing)
            yield views.sse(views.run_payload(rid, state, ticks, exp or (state.config.agents if current else None),
                                              new, recorded))
            if once:
                return
            await asyncio.sleep(sample_s)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


routes = [
    Route("/events/runs", runs_events),
    Route("/events/runs/{run}", run_events),
    Route("/events/nodes", nodes_events),
    Route("/events/replicas", replicas_events),
]
