"""recorder service: a durable pull consumer on `run.>` → DuckDB, acked only after commit.
Once a run is done *and* every outcome its round results counted is in DuckDB (or known to be
missing: populace.store.shortfall, then the run is `incomplete`), it announces
`run.<rid>.recorded`. It records any simulation: the tables come from the run's declaration.

The fetch loop is our own nats-py pull subscription rather than a FastStream subscriber:
FastStream 0.7.8's batch pull loop catches `nats.errors.TimeoutError`, while nats-py raises
`asyncio.TimeoutError` mid-batch, so the loop restarts and already-fetched messages wait
for redelivery (`ack_wait`). Here both are handled and nothing is dropped.

Run with `populace service recorder` or `faststream run populace.recorder.app:faststream_app --factory`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import time
from collections import OrderedDict

import nats.errors
import pyarrow as pa
from faststream import FastStream
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from pydantic import BaseModel, ValidationError

from populace.core import bus, checkpoints, metrics, objects, subjects, telemetry
from populace.core.contracts import (
    InterviewBatch,
    InterviewOrder,
    InterviewPlaced,
    InterviewsRecorded,
    LlmCallBatch,
    OutcomeBatch,
    RoundOpen,
    RoundPartial,
    RoundResult,
    RunDone,
    RunFault,
    RunRecorded,
    RunResumed,
    RunStarted,
    SimulationTables,
    SpawnBatch,
)
from populace.core.service import MAX_DELIVERIES, Service, keep_in_progress
from populace.core.settings import Settings
from populace.core.telemetry import tracer
from populace.population.by_digest import ByDigest
from populace.recorder.read_server import Reads, serve_reads
from populace.recorder.sweeper import Sweeper
from populace.store.columns import BadColumns, RefusedGroup, check_outcomes
from populace.store.shortfall import Verdict, verdict
from populace.store.store import DiskFull, Event, Store, StoreError, profile_rows

DESCRIPTION = ("Writes every run event to DuckDB exactly once (each simulation's own outcome and "
               "summary tables) and announces a run recorded when every outcome is in, or incomplete "
               "with what is missing.")
# Events the recorder writes; everything else on `run.>` is acknowledged and skipped.
RECORDED: dict[str, type[BaseModel]] = {
    "started": RunStarted, "spawn": SpawnBatch, "outcomes": OutcomeBatch,
    "round.result": RoundResult, "done": RunDone, "calls": LlmCallBatch, "resumed": RunResumed,
    "interviews": InterviewBatch, "ask": InterviewOrder, "asked": InterviewPlaced,
    "partial": RoundPartial,  # its profile only (table round_profile): the environment folds the payload
    "round.open": RoundOpen,  # a population that changed: where its newcomers are placed
}
# Profile rows kept between runs of the same personas (beyond it: parsed again for each run).
PROFILES_KEPT_BYTES = 64 * 2**20
# Runs recorded lately, whose late outcome or call records are purged as they come in.
RECENTLY_RECORDED = 1000
# A full disk: the first retry of the held fetch after this long, then twice as long each time up to the last
ROOM_RETRY_S = (1.0, 10.0)
# How often a recorder that fetched nothing looks again at finished runs still waiting (for their
# interviews' answers): a wait runs out this much late at most; each look opens the file (~40 ms)
IDLE_LOOK_S = 2.0
# A fetch of fewer messages than this waits up to COALESCE_S for more, so that a round's outcomes
# trickling in (one or two batches a fetch) are stored in one transaction rather than one each: a
# transaction's fixed cost (its statements, its commit) is 3-6 ms, as much as a thousand agents'
# rows. Measured: 12 µs per agent of a scene round one batch at a time, 6 µs sixteen at a time.
COALESCE_BELOW = 32
COALESCE_S = 0.05


def misplaced(subject: str, event: BaseModel) -> str | None:
    """Why an event's body does not belong on its subject (None: it does). NATS permissions
    check subjects, so a body must not claim another run or, for outcomes, another sender."""
    if subjects.run_of(subject) != event.run_id:
        return f"an event of run {event.run_id} does not belong on {subject}"
    if isinstance(event, OutcomeBatch) and subject != subjects.run_outcomes(event.run_id, event.round, event.host_id):
        return f"outcomes of {event.host_id}, round {event.round} do not belong on {subject}"
    if isinstance(event, InterviewBatch) and subject != subjects.run_interviews(event.run_id, event.after_round,
                                                                                event.host_id):
        return f"answers of {event.host_id}, after round {event.after_round} do not belong on {subject}"
    if isinstance(event, RoundPartial) and subject != subjects.run_partial(event.run_id, event.round, event.host_id,
                                                                           event.epoch):
        return f"a partial of {event.host_id}@{event.epoch}, round {event.round} does not belong on {subject}"
    return None


class Recorder:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.store = Store(svc.settings.db)
        self.reads = Reads(svc, self.store, when_done=self.release_if_idle)
        self.active: set[str] = set()  # runs started and not yet announced as recorded
        self.finished: dict[str, RunDone] = {}  # done, waiting for every outcome to be committed
        self.done_at: dict[str, float] = {}  # when each finished run's done came (time.monotonic)
        # a finished run short of outcomes: how many it had recorded, and since when (time.monotonic)
        self.progress: dict[str, tuple[int, float]] = {}
        self.batch_refusals: dict[str, str] = {}  # run -> why a whole outcome batch of it was refused (the first)
        self.recorded: OrderedDict[str, None] = OrderedDict()  # announced lately, oldest first
        self.sub = None
        self.task: asyncio.Task | None = None
        self.sweeper = Sweeper(None, svc.settings.checkpoints_sweep_s)  # its stream: once connected (start)
        self.stopping = False
        self.stopped = asyncio.Event()  # wakes a wait for disk space at once on stop
        self.paused_for_room: set[str] = set()  # runs paused because the disk is full (said once per episode)
        self.idle_look_at = 0.0  # when the idle loop may next look at the finished runs (time.monotonic)
        # personas digest -> its agent_profiles rows: a sweep's runs share one population, read once
        self.profiles: ByDigest[pa.Table | None] = ByDigest(
            limit=4, max_bytes=PROFILES_KEPT_BYTES, size=lambda rows: 0 if rows is None else rows.nbytes)

    async def profiles_of(self, digest: str) -> pa.Table | None:
        """A personas file's profile rows, fetched and parsed once per process (kept by digest)."""
        async def parsed() -> pa.Table | None:
            return await asyncio.to_thread(profile_rows, await objects.get_personas(self.svc.js, digest))

        return await self.profiles.get(digest, parsed)

    async def start(self) -> None:
        # A fetch parses a few hundred thousand short-lived objects (a scene's acts carry lists:
        # targets, points); at CPython's default young-generation threshold (700) the collector ran
        # hundreds of times per 64,000 such agents, 0.9 µs per agent of a punishment round's 9 µs
        # (as the agent-hosts, populace.agent_host.app).
        gc.set_threshold(100_000, 50, 100)
        s = self.svc.settings
        self.sweeper.js = self.svc.js
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL,
                                ack_wait=s.recorder_ack_wait_s, max_ack_pending=max(1000, 4 * s.recorder_fetch),
                                max_deliver=MAX_DELIVERIES + 2)  # the server's bound, past ours
        self.sub = await self.svc.js.pull_subscribe(subjects.ANY_RUN_EVENT, durable="recorder",
                                                    stream=subjects.RUN_STREAM, config=config)
        # kept as made (re-created from its last ack when gone or changed: populace.core.durables)
        self.svc.durables.keep(subjects.RUN_STREAM, config.evolve(durable_name="recorder",
                                                                  filter_subject=subjects.ANY_RUN_EVENT))
        self.task = asyncio.create_task(self.consume())
        self.sweeper.start()

    async def stop(self) -> None:
        # A flag, not only cancel(): nats-py's fetch can turn a cancellation into a timeout,
        # which the loop would otherwise treat as "no messages yet" and carry on.
        self.stopping = True
        self.stopped.set()
        await self.sweeper.stop()
        if self.task:
            try:
                await asyncio.wait_for(self.task, timeout=5.0)
            except (TimeoutError, asyncio.CancelledError):
                pass
        if self.sub:
            # Unsubscribe before the broker drains: draining waits for this subscription's
            # pending queue to be marked done, which fetch() never does, so it would hang.
            try:
                await self.sub.unsubscribe()
            except Exception as err:
                self.svc.log.warning("unsubscribe_failed", error=str(err))
        self.store.close()

    async def consume(self) -> None:
        while not self.stopping:
            try:
                msgs = await self.sub.fetch(batch=self.svc.settings.recorder_fetch, timeout=0.5)
            except (TimeoutError, nats.errors.TimeoutError):
                # a run waiting for its interviews' answers may be past its wait (looked at now and
                # then: each look opens the file, which a wait otherwise leaves to readers)
                if self.finished and time.monotonic() >= self.idle_look_at:
                    self.idle_look_at = time.monotonic() + IDLE_LOOK_S
                    await self.announce_complete()
                self.release_if_idle(waiting=True)  # nothing came: no lock is held across a wait
                continue
            except Exception as err:
                self.svc.log.warning("fetch_failed", error=str(err))
                await asyncio.sleep(0.5)
                continue
            if len(msgs) < COALESCE_BELOW:
                msgs += await self.more(self.svc.settings.recorder_fetch - len(msgs))
            beat = asyncio.create_task(keep_in_progress(msgs, self.svc.settings.recorder_ack_wait_s))
            try:
                try:
                    await self.handle(msgs)
                except DiskFull:
                    raise
                except Exception as err:
                    self.svc.log.error("ingest_failed", messages=len(msgs), error=f"{type(err).__name__}: {err}")
                    await self.one_by_one(msgs)
            except DiskFull as err:
                await self.wait_for_room(msgs, err)
            finally:
                beat.cancel()
            # A late message of a run already recorded (a redelivery, a call record) opened the
            # file again: readers of the finished run must not find it locked.
            self.release_if_idle()

    async def more(self, room: int) -> list[Msg]:
        """What else comes within COALESCE_S (at most `room` messages): the rest of a trickle."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COALESCE_S
        got: list[Msg] = []
        while len(got) < room and not self.stopping:
            left = deadline - loop.time()
            if left <= 0:
                break
            try:
                got += await self.sub.fetch(batch=room - len(got), timeout=left)
            except (TimeoutError, nats.errors.TimeoutError):
                break
            except Exception as err:  # what the next fetch will say again; these are stored now
                self.svc.log.warning("fetch_failed", error=str(err))
                break
        return got

    async def wait_for_room(self, msgs: list[Msg], err: DiskFull) -> None:
        """The database's disk is full, so nothing of this fetch was stored. The runs being
        recorded pause, saying why; the fetch is held (in progress, fetching nothing more) and
        ingested again, automatically, until there is room — then recording goes on where it
        stopped, every row once. Held, not nak'd: each nak is a delivery, and after
        `max_deliver` the server would drop the messages for good. On stop they are nak'd, so
        a successor gets them at once."""
        t0 = time.monotonic()
        self.svc.log.error("disk_full", db=err.path, messages=len(msgs), error=str(err))
        await self.pause_for_room(msgs, err)
        delay, longest = ROOM_RETRY_S
        while not self.stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stopped.wait(), delay)
            if self.stopping:
                break
            pending = [m for m in msgs if not m._ackd]
            try:
                await self.handle(pending)
            except DiskFull as again:
                await self.pause_for_room(pending, again)  # runs that joined the fetch's since
                delay = min(delay * 2, longest)
                continue
            except Exception as other:  # room again, and another error: the usual policy
                self.svc.log.error("ingest_failed", messages=len(pending), error=f"{type(other).__name__}: {other}")
                await self.one_by_one(pending)
            self.svc.log.info("disk_room_again", db=err.path, waited_s=round(time.monotonic() - t0, 1),
                              runs_paused=sorted(self.paused_for_room))
            self.paused_for_room.clear()
            return
        for m in msgs:  # stopping while the disk is still full: the successor gets them at once
            if not m._ackd:
                with contextlib.suppress(Exception):
                    await m.nak()

    async def pause_for_room(self, msgs: list[Msg], err: DiskFull) -> None:
        """Pause every run being recorded (and any the held fetch names): none of their events
        can be stored now. Once per run per full-disk episode."""
        runs = {rid for rid in (subjects.run_of(m.subject) for m in msgs) if rid} | self.active
        for rid in sorted(runs - self.paused_for_room):
            reason = (f"disk full at {err.path}: the recorder cannot store the run's events (they wait in "
                      f"NATS and are recorded once there is room); free space, then `populace resume {rid}`")
            try:
                await bus.publish_js(self.svc.js, subjects.run_fault(rid, "recorder"),
                                     RunFault(run_id=rid, source="recorder", reason=reason, pause=True),
                                     msg_id=f"{rid}.recorder.disk-full.{int(time.time())}")
            except Exception as pub_err:
                self.svc.log.error("pause_failed", run_id=rid, error=str(pub_err))
                continue
            self.paused_for_room.add(rid)
            self.svc.log.warning("run_paused_disk_full", run_id=rid, db=err.path)

    async def one_by_one(self, msgs: list[Msg]) -> None:
        """A fetch failed to ingest: each message again on its own, so one poison message cannot
        hold the others back. One that still fails comes again after a growing delay, and after
        MAX_DELIVERIES it is dead-lettered with its error (never a loop without end)."""
        for raw in msgs:
            if raw._ackd:
                continue
            try:
                await self.handle([raw])
            except DiskFull:
                raise  # not this message's fault: the whole fetch waits for room (wait_for_room)
            except Exception as err:
                delay = await self.svc.retry_later(raw, err)  # the services' policy: retry, then dead letter
                if delay is not None:
                    try:
                        await raw.nak(delay=delay)
                    except Exception as nak_err:
                        self.svc.log.warning("nak_failed", error=str(nak_err))

    def checked(self, raws: list[Msg]) -> list[tuple[Msg, Event | OutcomeBatch | None, object]]:
        """Each recorded event validated: (message, its event, None), or (message, None or the
        batch refused whole, why it is refused: dead-letter it), or (message, None, None): skipped
        (a partial the environment refuses, once). Runs in a worker thread: a fetch of 256 outcome
        batches of 1,000 rows is up to a second of CPU, and the service's heartbeat, reads and acks
        go on meanwhile."""
        out: list[tuple[Msg, Event | OutcomeBatch | None, object]] = []
        started: dict[str, SimulationTables] = {}
        for raw in raws:
            model = RECORDED.get(subjects.kind_of(raw.subject))
            if model is None:
                continue  # round opens, our own announcements: acked, not stored
            msg_id = (raw.headers or {}).get("Nats-Msg-Id") or f"seq:{raw.metadata.sequence.stream}"
            try:
                event = model.model_validate_json(raw.data)
            except ValidationError as err:
                out.append((raw, None, None if model is RoundPartial else err))  # a bad partial: the environment's
                continue
            if isinstance(event, RoundOpen) and event.population is None:
                continue  # nothing to record: a run's placement grows only by newcomers
            if why := misplaced(raw.subject, event):
                out.append((raw, None, None if model is RoundPartial else why))
                continue
            if isinstance(event, RunStarted):
                started[event.run_id] = event.tables
            elif isinstance(event, (OutcomeBatch, RoundResult)):
                rid = event.run_id
                tables = started.get(rid) or self.store.known_tables(rid) or self.store.tables_of(rid)
                if tables is None:
                    out.append((raw, None, f"run {rid} was never started here"))
                    continue
                if isinstance(event, OutcomeBatch):
                    try:
                        event, refused = check_outcomes(event, tables)
                    except BadColumns as err:
                        out.append((raw, event, err))  # refused whole: parse() notes why, then dead-letters it
                        continue
                    out.append((raw, Event(msg_id, "outcomes", event, refused_groups=refused), None))
                    continue
            out.append((raw, Event(msg_id, subjects.kind_of(raw.subject), event), None))
        return out

    async def parse(self, raws: list[Msg]) -> list[tuple[Event, Msg]]:
        """Each recorded event validated; malformed ones (and outcome batches whose columns do
        not match their run's declared tables) are dead-lettered, never stored."""
        parsed: list[tuple[Event, Msg]] = []
        started: set[str] = set()  # runs started in this fetch (not yet among the active runs)
        for raw, event, why in await asyncio.to_thread(self.checked, raws):
            if isinstance(event, Event):
                parsed.append((event, raw))
                if event.kind == "started":
                    started.add(event.model.run_id)  # type: ignore[attr-defined]
            elif why is not None:
                if isinstance(event, OutcomeBatch):  # a whole batch refused: kept to say why, should the run be short
                    self.note_refusal(event, str(why), started=event.run_id in started)
                await self.svc.dead_letter(raw, why)  # type: ignore[arg-type]
        return parsed

    async def handle(self, raws: list[Msg]) -> None:
        t0 = time.perf_counter()
        parsed = await self.parse(raws)
        first: dict[str, Msg] = {}  # each run's first message here: its trace context parents our span
        was_active = set(self.active)
        for e, raw in parsed:
            first.setdefault(e.model.run_id, raw)
            if isinstance(e.model, RunResumed):
                self.active.add(e.model.run_id)
                self.finished.pop(e.model.run_id, None)
                self.progress.pop(e.model.run_id, None)
                self.batch_refusals.pop(e.model.run_id, None)
            if isinstance(e.model, RunStarted):
                self.active.add(e.model.run_id)
                pop = e.model.config.population
                if pop is not None and pop.digest is not None:
                    try:  # who the agents are, for per-group analysis (table agent_profiles)
                        e.blob = await self.profiles_of(pop.digest)
                    except objects.BlobError as err:
                        self.svc.log.error("personas_missing", run_id=e.model.run_id, error=str(err))
            living = e.model.population if isinstance(e.model, RoundResult) else None
            if living is not None and living.round == e.model.round:
                try:  # the round's departures and newcomers (table population), checked against its digest
                    e.blob = await checkpoints.load_population(self.svc.js, living)
                except checkpoints.CheckpointError as err:
                    self.svc.log.error("population_missing", run_id=e.model.run_id, round=e.model.round,
                                       error=str(err))
        spans = [tracer.start_span("recorder.ingest", context=telemetry.extract(raw.headers),
                                   attributes={"populace.run_id": rid, "populace.messages": len(raws)})
                 for rid, raw in first.items()]
        try:
            while True:
                try:
                    result = await asyncio.to_thread(self.store.ingest, [e for e, _ in parsed])
                    break
                except StoreError as err:
                    # This run's tables clash with the database (or are unknown): its events are
                    # dead-lettered and the rest of the fetch is stored without them.
                    self.svc.log.error("store_refused", run_id=err.run_id, error=str(err))
                    for e, raw in parsed:
                        if e.model.run_id == err.run_id:
                            await self.svc.dead_letter(raw, err)
                    kept = [(e, raw) for e, raw in parsed if e.model.run_id != err.run_id]
                    if len(kept) == len(parsed):
                        raise
                    parsed = kept
        finally:
            for span in spans:
                span.end()
        # A start or resume seen again (a re-created durable redelivers from its last ack, or
        # from the stream's start) does not make a recorded run active again: it would keep the
        # file open (release_if_idle) for a run that never ends a second time.
        self.active -= {e.model.run_id for e, _ in parsed if isinstance(e.model, (RunStarted, RunResumed))
                        and e.model.run_id not in was_active and e.model.run_id not in result.opened}
        # Bulky events of a run already recorded (a call record published after its run ended):
        # purged as soon as they are acknowledged, like the rest of the run's.
        late = {e.model.run_id for e, _ in parsed if e.kind in ("outcomes", "calls", "interviews")
                and e.model.run_id in self.recorded and e.model.run_id not in self.active}
        if result.refused:  # not what the run expects: stored nowhere, dead letters (once: their ids are in the ledger)
            by_id = {e.msg_id: raw for e, raw in parsed}
            for msg_id, why in result.refused:
                await self.svc.dead_letter(by_id[msg_id], why, terminate=False)
        self.log_refused_groups(result.refused_groups)
        await self.ack(raws, settle=bool(result.finished or self.finished or late))
        for rid in late:
            await self.purge_run_events(rid)
        metrics.batch("recorder", "messages", len(raws), time.perf_counter() - t0)
        if result.outcomes:
            metrics.ITEMS.labels("recorder", "outcomes").inc(result.outcomes)
        if result.outcomes or result.finished:
            self.svc.log.info("recorded", messages=len(raws), outcomes=result.outcomes,
                              seconds=round(time.perf_counter() - t0, 3))
        for done in result.finished:
            self.finished[done.run_id] = done
            self.done_at.setdefault(done.run_id, time.monotonic())
        if result.answers or any(e.kind == "asked" for e, _ in parsed):
            await self.announce_interviews()
        await self.announce_complete()

    def note_refusal(self, batch: OutcomeBatch, why: str, started: bool = False) -> None:
        """A whole outcome batch refused (dead-lettered): kept to say why, should the run be short.
        `started`: its run started in the same fetch (not yet among the active runs)."""
        if (started or batch.run_id in self.active) and batch.run_id not in self.batch_refusals:
            self.batch_refusals[batch.run_id] = (f"a batch of {batch.host_id}, round {batch.round}, was refused: "
                                                 f"{bus.short_error(why)}")

    def log_refused_groups(self, refused: list[tuple[str, int, str, RefusedGroup]]) -> None:
        """Groups taken out of batches that were recorded: one line per batch's share and round
        (its groups and why), and counted. Their rows are missing: the run will be incomplete."""
        if not refused:
            return
        metrics.REFUSED_GROUPS.labels("recorder").inc(len(refused))
        by_batch: dict[tuple[str, int, str], list[RefusedGroup]] = {}
        for rid, round_, share, group in refused:
            by_batch.setdefault((rid, round_, share), []).append(group)
        for (rid, round_, share), groups in by_batch.items():
            self.svc.log.error("groups_refused", run_id=rid, round=round_, share=share, groups=len(groups),
                               outcomes=sum(len(g.agents) for g in groups), acts=sum(g.acts for g in groups),
                               lines=sum(g.lines for g in groups),
                               refused=[{"group": g.group_id, "reason": g.reason} for g in groups[:10]])

    async def ack(self, raws: list[Msg], settle: bool) -> None:
        """Acknowledge a fetch. `settle`: a run may be purged next, below the consumer's ack
        floor, so the last ack waits for the server: it takes acks in order, and the floor then
        covers the whole fetch."""
        unacked = [raw for raw in raws if not raw._ackd]
        last = unacked.pop() if settle and unacked and self.svc.settings.purge_recorded else None
        for raw in unacked:
            await raw.ack()
        if last is not None:
            try:
                await last.ack_sync()
            except Exception as err:
                self.svc.log.warning("ack_sync_failed", error=str(err))
                if not last._ackd:
                    await last.ack()

    async def purge_run_events(self, rid: str) -> None:
        """Remove a recorded run's outcome batches and call records from RUN: DuckDB holds them
        now, and nothing else reads them back (the environment's rebuild, fork and follow read
        the small control events, which stay). Only below the consumer's ack floor, so an event
        not yet stored here (a late call record, a redelivery) stays until it is. A failure is
        logged: the events then stay, and recording goes on."""
        if not self.svc.settings.purge_recorded:
            return
        try:
            info = await self.sub.consumer_info()
            below = info.ack_floor.stream_seq + 1 if info.ack_floor else 1
            for subject in (subjects.run_outcomes_all(rid), subjects.run_calls_all(rid),
                            subjects.run_interviews_all(rid)):
                await self.svc.js.purge_stream(subjects.RUN_STREAM, subject=subject, seq=below)
        except Exception as err:
            self.svc.log.error("purge_failed", run_id=rid, error=str(err))

    async def prune_checkpoints(self, done: RunDone) -> int:
        """A completed run will not be resumed: keep its checkpoints as the setting says (a
        failed, cancelled or paused one keeps them all, its resume starts from the last)."""
        keep = self.svc.settings.checkpoints_keep
        if done.status != "completed" or keep == "all":
            return 0
        try:
            return await checkpoints.prune(self.svc.js, done.run_id, keep)
        except Exception as err:
            self.svc.log.error("checkpoint_prune_failed", run_id=done.run_id, error=str(err))
            return 0

    def release_if_idle(self, waiting: bool = False) -> None:
        """Close the file for readers between runs (no run being recorded, no read going on).
        `waiting` (a fetch found nothing): also while the runs being recorded have all finished
        and only wait (for their interviews' answers, for a redelivery): a wait of minutes must
        not lock readers out. The next message opens it again."""
        recording = self.active - self.finished.keys() if waiting else self.active | self.finished.keys()
        if not recording and not self.reads.in_progress:
            self.store.close()

    async def announce_interviews(self) -> None:
        """Each post-hoc interview whose answers are all in: `run.<rid>.interviewed.<request>`,
        said once the file is released (when no run is being recorded): whoever hears it reads
        the answers from the file at once."""
        complete = await asyncio.to_thread(self.store.interviews.complete_requests)
        self.release_if_idle()
        for rid, request, answers in complete:
            await bus.publish_js(self.svc.js, subjects.run_interviewed(rid, request),
                                 InterviewsRecorded(run_id=rid, request=request, answers=answers,
                                                    db_path=self.store.path),
                                 msg_id=f"{rid}.interviewed.{request}")
            self.svc.log.info("interview_recorded", run_id=rid, request=request, answers=answers)

    async def shortfall(self, rid: str, got: int, expected: int) -> Verdict:
        """Whether the finished run `rid` can be announced now, and what it lacks: outcomes of
        refused groups are known to be missing at once; others are waited for while its outcomes
        keep coming, and missing once none came for recorder_missing_wait_s (populace.store.shortfall)."""
        if got >= expected and not await asyncio.to_thread(self.store.has_refused_groups, rid):
            self.progress.pop(rid, None)
            return Verdict(wait=False)
        now = time.monotonic()
        last, since = self.progress.get(rid, (got, self.done_at.get(rid, now)))
        if got != last:
            since = now  # outcomes still coming in: wait on
        self.progress[rid] = (got, since)
        tallies = await asyncio.to_thread(self.store.tallies, rid, self.finished[rid].rounds)
        v = verdict(tallies, now - since, self.svc.settings.recorder_missing_wait_s)
        if not v.wait:
            self.progress.pop(rid, None)
            if v.unexplained and (why := self.batch_refusals.get(rid)):
                v = dataclasses.replace(v, reason=f"{v.reason}; {why}")
        return v

    async def announce_complete(self) -> None:
        for rid in list(self.finished):
            got, expected = await asyncio.to_thread(self.store.completeness, rid, self.finished[rid].rounds)
            short = await self.shortfall(rid, got, expected)
            if short.wait:
                continue  # some round results or outcome batches are still on their way (redelivery)
            answers, owed = 0, 0
            if self.finished[rid].status == "completed":  # a run stopped short: its interviews stopped too
                # owed after the rounds it played (a fork's after its fork point), awaited only
                # while some may still come (store.interviews_owed)
                due = await asyncio.to_thread(self.store.interviews_owed, rid, self.finished[rid].rounds)
                answers, owed = due.answers, due.owed
                waited = time.monotonic() - self.done_at.get(rid, time.monotonic())
                if due.pending and waited < self.svc.settings.interview_wait_s:
                    continue  # the last rounds' interviews are still being answered
                if due.missing:
                    self.svc.log.error("interviews_missing", run_id=rid, answers=answers, owed=owed,
                                       awaited=due.pending, waited_s=round(waited, 1))
            done = self.finished.pop(rid)
            self.done_at.pop(rid, None)
            self.batch_refusals.pop(rid, None)
            epoch = done.epoch
            status, reason = done.status, done.reason
            if owed > answers and done.status == "completed":  # nor with a promised answer missing
                said = f"{owed - answers:,} of {owed:,} planned interview answers missing"
                short = dataclasses.replace(short, reason=f"{short.reason}; {said}" if short.reason else said)
            if short.reason:  # never `completed` with an outcome, act or line missing
                status = "incomplete" if done.status == "completed" else done.status
                reason = short.reason if done.status == "completed" or not done.reason \
                    else f"{done.reason}; {short.reason}"
                await asyncio.to_thread(self.store.mark_incomplete, rid, status, reason)
                self.svc.log.error("run_incomplete", run_id=rid, status=status, reason=reason,
                                   outcomes_missing=short.outcomes_missing, acts_missing=short.acts_missing,
                                   lines_missing=short.lines_missing, refused_groups=short.refused_groups)
            self.active.discard(rid)
            self.release_if_idle()
            # Before the announcement, so whoever sees `recorded` finds RUN and the checkpoints
            # as they will stay.
            t0 = time.perf_counter()
            await self.purge_run_events(rid)
            pruned = await self.prune_checkpoints(done) if not short.reason else 0  # incomplete: kept, to fork
            settle_s = time.perf_counter() - t0
            self.recorded[rid] = None
            self.recorded.move_to_end(rid)
            while len(self.recorded) > RECENTLY_RECORDED:
                self.recorded.popitem(last=False)
            await bus.publish_js(self.svc.js, subjects.run_recorded(rid),
                                 RunRecorded(run_id=rid, outcomes=got, db_path=self.store.path, answers=answers,
                                             answers_missing=max(0, owed - answers), epoch=epoch, status=status,
                                             reason=reason, outcomes_missing=short.outcomes_missing,
                                             acts_missing=short.acts_missing, lines_missing=short.lines_missing),
                                 msg_id=subjects.msg_id(rid, 0, "recorder", "recorded", epoch))
            self.svc.log.info("run_recorded", run_id=rid, outcomes=got, db=self.store.path,
                              events_purged=self.svc.settings.purge_recorded, checkpoints_pruned=pruned,
                              settle_seconds=round(settle_s, 3))


def create(settings: Settings | None = None) -> Service:
    svc = Service("recorder", settings, DESCRIPTION)
    recorder = Recorder(svc)
    svc.on_ready(recorder.start)
    svc.on_ready(recorder.reads.start)
    svc.on_stop(recorder.stop)
    serve_reads(svc, recorder.reads)
    for subject, model in ((subjects.ANY_STARTED, RunStarted), (subjects.ANY_SPAWN, SpawnBatch),
                           (subjects.ANY_OUTCOMES, OutcomeBatch), (subjects.ANY_ROUND_RESULT, RoundResult),
                           (subjects.ANY_RUN_DONE, RunDone), (subjects.ANY_CALLS, LlmCallBatch),
                           (subjects.ANY_INTERVIEWS, InterviewBatch)):
        svc.consumes(subject, model, "durable pull consumer `recorder` on the RUN stream, acked after commit")
    svc.consumes(subjects.ANY_PARTIAL, RoundPartial, "its profile only (table round_profile), from the same consumer")
    svc.publishes(subjects.ANY_RECORDED, RunRecorded, "every outcome of a finished run is in DuckDB")
    svc.publishes(subjects.ANY_INTERVIEWED, InterviewsRecorded, "every answer of a post-hoc interview is in DuckDB")
    svc.publishes(subjects.ANY_FAULT, RunFault, "the database's disk is full: the runs being recorded pause")
    return svc


def faststream_app() -> FastStream:
    """For FastStream's own CLI: `faststream run|docs gen <this module>:faststream_app --factory`."""
    return create().app
