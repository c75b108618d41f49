"""The recorder answers read requests (`recorder.read.<verb>`): while it writes a run, no other
process can open its DuckDB file, so readers ask it. Reads run on their own cursor in a worker
thread; ingestion goes on meanwhile.

- `snapshot`: a consistent copy of some runs' rows, as a DuckDB file put in the `snapshots`
  object store for the reader to fetch (`populace results`/`report`/`export` on a live run)."""

from __future__ import annotations

import asyncio
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

from faststream.nats import NatsMessage

from populace.core import bus, subjects
from populace.core.contracts import ReadReply, SnapshotReply, SnapshotRequest
from populace.core.service import Service
from populace.recorder.snapshot import write_snapshot
from populace.recorder.store import Store


class Reads:
    def __init__(self, svc: Service, store: Store, when_done: Callable[[], None] = lambda: None) -> None:
        self.svc = svc
        self.store = store
        self.when_done = when_done  # after each read: the recorder may release its file
        self.in_progress = 0  # the recorder keeps its file open while a read uses it
        self.objects = None

    async def start(self) -> None:
        s = self.svc.settings
        self.objects = await bus.provision_snapshots(self.svc.js, s.storage, s.stream_replicas)

    async def snapshot(self, req: SnapshotRequest, msg: NatsMessage) -> bytes:
        """Copy the runs table and the rows of the requested runs into a DuckDB file in the
        `snapshots` object store; the reply names it."""
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


def malformed(reason: str) -> ReadReply:
    return ReadReply(ok=False, error=f"malformed request (dead-lettered): {reason}")


def serve_reads(svc: Service, reads: Reads) -> None:
    """Register the read verbs on `svc`."""
    svc.handle(subjects.recorder_read(SnapshotRequest.VERB), SnapshotRequest, reply_on_error=malformed)(reads.snapshot)
