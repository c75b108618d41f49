"""Read what the recorder holds while it writes: DuckDB lets one process open a database file,
so a reader of a live run (`populace results`, `report`, `export`, the manager) asks the
recorder over the bus instead of opening the file.

    await fetch_snapshot(nc, js, ["run-1"], Path("/tmp/x/live.duckdb"))
    duckdb.connect("/tmp/x/live.duckdb", read_only=True)    # runs table + run-1's rows, consistent

    await request_agents(nc, "run-1", search="teacher", offset=50, limit=50)  # AgentsReply
    await request_distribution(nc, "run-1")               # the last closed round's histogram or shares

A request is core NATS request/reply on `recorder.read.<verb>.<requester>`, answered on the
requester's own reply subject (populace.core.replies); no recorder answering is
RecorderUnreachable, a refusal is ReadError with the recorder's reason."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from pathlib import Path

import nats.errors
from nats.aio.client import Client
from nats.js import JetStreamContext
from pydantic import ValidationError

from populace.core import bus, replies, subjects
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
    ReadRequest,
    SnapshotReply,
    SnapshotRequest,
)

# Copying a run of a million agents takes the recorder about a second; a busy recorder longer.
SNAPSHOT_TIMEOUT_S = 120.0
# A page of agents or a distribution: milliseconds, a search of a million personas under a second.
QUERY_TIMEOUT_S = 15.0


class ReadError(RuntimeError):
    """The recorder could not answer the read; the message is its reason."""


class RecorderUnreachable(ReadError):
    """No recorder answered on the bus."""


async def _request(nc: Client, req: ReadRequest, reply_model: type[ReadReply], timeout: float) -> ReadReply:
    subject = subjects.recorder_read(req.VERB, replies.requester(nc))
    try:
        msg = await replies.request(nc, "recorder", subject, bus.encode(req), timeout=timeout)
    except nats.errors.NoRespondersError:
        raise RecorderUnreachable(f"no recorder is running (nobody listens on {subject})") from None
    except nats.errors.TimeoutError:
        raise RecorderUnreachable(f"the recorder did not answer within {timeout:.0f} s") from None
    try:
        reply = reply_model.model_validate_json(msg.data)
    except ValidationError as err:
        raise ReadError(f"the recorder sent a reply this client cannot read: {bus.short_error(err)}") from None
    if not reply.ok:
        raise ReadError(reply.error or "refused")
    return reply


async def request_snapshot(nc: Client, run_ids: Sequence[str], timeout: float = SNAPSHOT_TIMEOUT_S) -> SnapshotReply:
    try:
        req = SnapshotRequest(run_ids=list(run_ids))
    except ValidationError as err:  # e.g. a sweep of more runs than one copy takes
        raise ReadError(f"cannot ask for these runs: {bus.short_error(err)}") from None
    return await _request(nc, req, SnapshotReply, timeout)


async def request_agents(nc: Client, run_id: str, *, search: str | None = None, offset: int = 0, limit: int = 50,
                         timeout: float = QUERY_TIMEOUT_S) -> AgentsReply:
    """A page of the run's agents (ValidationError: a request the recorder would refuse)."""
    req = AgentsRequest(run_id=run_id, search=search or None, offset=offset, limit=limit)
    return await _request(nc, req, AgentsReply, timeout)


async def request_distribution(nc: Client, run_id: str, round_: int | None = None, bins: int = 30,
                               timeout: float = QUERY_TIMEOUT_S) -> DistributionReply:
    """The run's measure in `round_` (None: the last closed round)."""
    return await _request(nc, DistributionRequest(run_id=run_id, round=round_, bins=bins), DistributionReply, timeout)


async def request_profile(nc: Client, run_id: str, rounds: int = 50,
                          timeout: float = QUERY_TIMEOUT_S) -> ProfileReply:
    """Where the run's last `rounds` rounds went (table round_profile), and its totals."""
    return await _request(nc, ProfileRequest(run_id=run_id, rounds=rounds), ProfileReply, timeout)


async def request_groups(nc: Client, run_id: str, by: str, round_: int | None = None,
                         timeout: float = QUERY_TIMEOUT_S) -> GroupsReply:
    """The run's measure per group of `by` (an attribute, or `model`), with CIs."""
    return await _request(nc, GroupsRequest(run_id=run_id, by=by, round=round_), GroupsReply, timeout)


async def request_interviews(nc: Client, run_id: str, *, request: str | None = None, by: str | None = None,
                             timeout: float = QUERY_TIMEOUT_S) -> InterviewsReply:
    """A run's interviews (one request's, or all), per question and group of `by`."""
    return await _request(nc, InterviewsRequest(run_id=run_id, request=request, by=by), InterviewsReply,
                          timeout)  # type: ignore[return-value]


async def fetch_snapshot(nc: Client, js: JetStreamContext, run_ids: Sequence[str], dest: Path) -> SnapshotReply:
    """Have the recorder copy the runs table and `run_ids`' rows, and write the copy to `dest`."""
    reply = await request_snapshot(nc, run_ids)
    store = await js.object_store(subjects.SNAPSHOTS_BUCKET)
    with dest.open("wb") as f:
        await store.get(reply.snapshot, writeinto=f)
    with contextlib.suppress(Exception):  # read once; the bucket's TTL clears it otherwise
        await store.delete(reply.snapshot)
    return reply


def live_copy(url: str, directory: Path, resolve: Callable[[Path], Sequence[str]]) -> Path:
    """A DuckDB file (in `directory`) with what the recorder at `url` holds of the runs that
    `resolve` names. `resolve(path)` gets a copy of the runs table alone (to turn 'last', a
    sweep's id or a fork into run ids) and returns the runs whose rows are needed.
    ConnectionError: no NATS at `url`."""

    async def copy() -> Path:
        nc = await bus.connect_or_fail(url, "populace-reader")
        try:
            js = nc.jetstream()
            index = directory / "runs.duckdb"
            await fetch_snapshot(nc, js, [], index)
            wanted = await asyncio.to_thread(resolve, index)
            path = directory / "live.duckdb"
            await fetch_snapshot(nc, js, wanted, path)
            return path
        finally:
            await nc.close()

    return asyncio.run(copy())
