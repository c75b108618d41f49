"""The recorder answers read requests (`recorder.read.<verb>.<requester>`, on the requester's own
reply subject only: populace.core.replies): while it writes a run, no other
process can open its DuckDB file, so readers ask it. Reads run on their own cursor in a worker
thread; ingestion goes on meanwhile.

- `snapshot`: a consistent copy of some runs' rows, as a DuckDB file put in the `snapshots`
  object store for the reader to fetch (`populace results`/`report`/`export` on a live run;
  populace.store.snapshot).
- `agents`: a page of a run's agents, searched and paged, each round's outcome and raw answer
  (`populace.store.live.agents_page`; the manager's agents table).
- `distribution`: one round's histogram or options' shares (`populace.store.live.round_distribution`).
- `profile`: where a run's rounds went (`populace.store.profile`; the manager's run page).
- `groups`: the measure per persona group, with confidence intervals (`populace.analysis.group_table`).
- `interviews`: a run's interviews, per question and group, with confidence intervals
  (`populace.analysis.interviews`).

The first four are the store's plain SQL reads. The last two are statistics: the recorder
depends on the store, not on the analysis library, so it loads them where the library is
installed (the image, or `populace-recorder[reads]`); a recorder without it records every run,
answers the store's reads and refuses these two, naming the extra.

A refusal (an unknown run, a failed query, the analysis not installed) is answered with `ok`
False and its reason; a malformed request is dead-lettered and answered (`malformed`)."""

from __future__ import annotations

import asyncio
import importlib
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from faststream.nats import NatsMessage

from populace.core import bus, subjects
from populace.core.contracts import (
    AgentsReply,
    AgentsRequest,
    DistributionReply,
    DistributionRequest,
    GroupsReply,
    GroupsRequest,
    InterviewsReply,
    InterviewsRequest,
    ProfileReply,
    ProfileRequest,
    ReadReply,
    SnapshotReply,
    SnapshotRequest,
)
from populace.core.service import Service
from populace.store.live import agents_page, round_distribution
from populace.store.profile import last_rounds, profile_totals, round_profile
from populace.store.snapshot import write_snapshot
from populace.store.store import Store
from populace.store.tables import QueryError


class AnalysisMissing(Exception):
    """A read of the analysis library on a recorder installed without it."""


async def analysis(module: str, *names: str) -> tuple:
    """Names of a `populace.analysis` module, imported in a worker thread: the first read's import
    (the analysis library and its dependencies, seconds of CPU) would otherwise stop the event
    loop, so ingestion (and in a one-process stack, every service) with it. AnalysisMissing where
    the library (or one of its dependencies) is not installed."""
    try:
        found = await asyncio.to_thread(importlib.import_module, f"populace.analysis.{module}")
    except ModuleNotFoundError as err:
        raise AnalysisMissing(f"this recorder is installed without the analysis library this read needs "
                              f"({err}); install populace-recorder[reads]") from None
    return tuple(getattr(found, name) for name in names)


class Reads:
    def __init__(self, svc: Service, store: Store, when_done: Callable[[], None] = lambda: None) -> None:
        self.svc = svc
        self.store = store
        self.when_done = when_done  # after each read: the recorder may release its file
        self.in_progress = 0  # the recorder keeps its file open while a read uses it
        self.objects = None
        self.unavailable = "the recorder is still starting"

    async def start(self) -> None:
        """The snapshots store; without it (e.g. a NATS user not allowed to create it) the
        recorder still records, and a snapshot request is answered with the reason."""
        s = self.svc.settings
        try:
            self.objects = await bus.provision_snapshots(self.svc.js, s.storage, s.stream_replicas)
        except Exception as err:
            self.unavailable = f"the recorder has no snapshots store ({type(err).__name__}: {err})"
            self.svc.log.error("snapshots_unavailable", error=self.unavailable)

    async def snapshot(self, req: SnapshotRequest, msg: NatsMessage) -> bytes:
        """Copy the runs table and the rows of the requested runs into a DuckDB file in the
        `snapshots` object store; the reply names it."""
        if self.objects is None:
            return bus.encode(SnapshotReply(ok=False, error=self.unavailable))
        name = f"snapshot-{uuid.uuid4().hex}"
        self.in_progress += 1
        try:
            with tempfile.TemporaryDirectory(prefix="populace-snapshot-") as tmp:
                path = Path(tmp) / "snapshot.duckdb"
                found = await asyncio.to_thread(lambda: write_snapshot(self.store.con, path, list(req.run_ids)))
                size = path.stat().st_size
                with path.open("rb") as f:
                    await self.objects.put(name, f)
        except Exception as err:
            self.svc.log.error("snapshot_failed", runs=len(req.run_ids), error=f"{type(err).__name__}: {err}")
            return bus.encode(SnapshotReply(ok=False, error=f"the recorder could not copy the runs: "
                                                             f"{type(err).__name__}: {err}"))
        finally:
            self.in_progress -= 1
            self.when_done()
        self.svc.log.info("snapshot_written", snapshot=name, runs=len(found), bytes=size)
        return bus.encode(SnapshotReply(ok=True, snapshot=name, size=size, runs=found))

    async def _query(self, name: str, run: Callable, reply_model, fields: dict) -> bytes:
        """Run `run(cursor)` (a read of the store or the analysis) on a cursor of its own in a
        worker thread, ingestion going on meanwhile; its dict is the reply, an error its refusal
        (a QueryError, the analysis' AnalysisError too: a question the data cannot answer)."""

        def work():
            cur = self.store.con.cursor()
            try:
                return run(cur)
            finally:
                cur.close()

        self.in_progress += 1
        t0 = time.perf_counter()
        try:
            found = await asyncio.to_thread(work)
        except QueryError as err:
            return bus.encode(reply_model(ok=False, error=str(err), **fields))
        except Exception as err:
            self.svc.log.error(f"{name}_read_failed", error=f"{type(err).__name__}: {err}", **fields)
            return bus.encode(reply_model(ok=False, error=f"the recorder could not read {name}: "
                                                          f"{type(err).__name__}: {err}", **fields))
        finally:
            self.in_progress -= 1
            self.when_done()
        self.svc.log.debug(f"{name}_read", ms=round((time.perf_counter() - t0) * 1000, 1), **fields)
        return bus.encode(reply_model(ok=True, **found))

    async def agents(self, req: AgentsRequest, msg: NatsMessage) -> bytes:
        return await self._query("agents", lambda cur: agents_page(cur, req.run_id, search=req.search,
                                                                   offset=req.offset, limit=req.limit),
                                 AgentsReply, {"run_id": req.run_id})

    async def distribution(self, req: DistributionRequest, msg: NatsMessage) -> bytes:
        return await self._query("distribution", lambda cur: round_distribution(cur, req.run_id, req.round, req.bins),
                                 DistributionReply, {"run_id": req.run_id})


    async def interviews(self, req: InterviewsRequest, msg: NatsMessage) -> bytes:
        interview_questions, interview_table = await analysis("interviews", "interview_questions", "interview_table")
        (group_attributes,) = await analysis("queries", "group_attributes")

        def run(cur):
            return {"request": req.request, "by": req.by,
                    "questions": interview_questions(cur, [req.run_id], req.request),
                    "rows": interview_table(cur, [req.run_id], by=req.by, request=req.request),
                    "attributes": group_attributes(cur, [req.run_id])}

        return await self._query("interviews", run, InterviewsReply, {"run_id": req.run_id})


    async def groups(self, req: GroupsRequest, msg: NatsMessage) -> bytes:
        group_table, group_attributes = await analysis("queries", "group_table", "group_attributes")

        def run(cur):
            return {"run_id": req.run_id, "by": req.by, "attributes": group_attributes(cur, [req.run_id]),
                    "rows": group_table(cur, [req.run_id], req.by, round=req.round)}

        return await self._query("groups", run, GroupsReply, {"run_id": req.run_id})

    async def profile(self, req: ProfileRequest, msg: NatsMessage) -> bytes:
        def run(cur):
            rows = round_profile(cur, req.run_id)
            return {"run_id": req.run_id, "rows": last_rounds(rows, req.rounds),
                    "rounds_total": len({r["round"] for r in rows}), **profile_totals(rows)}

        return await self._query("profile", run, ProfileReply, {"run_id": req.run_id})


def malformed(reason: str) -> ReadReply:
    return ReadReply(ok=False, error=f"malformed request (dead-lettered): {reason}")


def refused_without_analysis(handler: Callable, reply_model) -> Callable:
    """`handler`, answering a refusal that names the missing library where the analysis is not
    installed (the recorder still records; only this read is unavailable)."""
    async def read(req, msg: NatsMessage) -> bytes:
        try:
            return await handler(req, msg)
        except AnalysisMissing as err:
            return bus.encode(reply_model(ok=False, error=str(err), run_id=req.run_id))

    return read


def serve_reads(svc: Service, reads: Reads) -> None:
    """Register the read verbs on `svc`."""
    for model, handler in ((SnapshotRequest, reads.snapshot), (AgentsRequest, reads.agents),
                           (DistributionRequest, reads.distribution), (ProfileRequest, reads.profile)):
        svc.handle(subjects.recorder_read(model.VERB), model, reply_on_error=malformed, answers=True)(handler)
    for model, handler, reply_model in ((InterviewsRequest, reads.interviews, InterviewsReply),
                                        (GroupsRequest, reads.groups, GroupsReply)):
        svc.handle(subjects.recorder_read(model.VERB), model, reply_on_error=malformed,
                   answers=True)(refused_without_analysis(handler, reply_model))
