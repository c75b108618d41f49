"""End to end, bounded storage on real processes: once a run is recorded, its outcome batches
and LLM call records are gone from stream RUN (its small control events stay), every outcome
is in DuckDB, and the stream's size stays flat from run to run instead of growing with
agents × rounds. With POPULACE_CHECKPOINTS_KEEP=last a completed run keeps only its last
round's checkpoints: a fork from that round still plays, one from an earlier round is refused
with the reason."""

from __future__ import annotations

import asyncio
from itertools import pairwise

import duckdb
import pytest
from nats.js.api import DiscardPolicy

from populace.client.prepare import prepare, prepare_fork
from populace.client.run import play, run_state
from populace.client.stack import Stack
from populace.core import bus, checkpoints, subjects
from populace.core.contracts import Restore, RunConfig

pytestmark = pytest.mark.e2e

RUNS, AGENTS, ROUNDS = 5, 2000, 2
BASE = {"agents": AGENTS, "rounds": ROUNDS, "seed": 3, "model": {"latency_s": 0.0, "seed": 21}}
ON_SIM = {"agents": 50, "rounds": ROUNDS, "seed": 3, "model": {"backend": "sim", "seed": 21}}
BULKY = ("outcomes", "calls")
MAX_AGE_S = 3600.0
DLQ_MAX_AGE_S = 7200.0  # its own limit, not RUN's (a dead letter is kept for inspection, not replayed)


@pytest.fixture(scope="module")
def stack(stacks):
    # A simulated model replica: the gateway's call records go through RUN (the dummy model
    # makes none). The services share one process: what is checked is in the streams and DuckDB.
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory", "POPULACE_CHECKPOINTS_KEEP": "last",
                                "POPULACE_RUN_MAX_AGE_S": str(MAX_AGE_S), "POPULACE_DLQ_MAX_AGE_S": str(DLQ_MAX_AGE_S)},
                  extra={"replicas-sim": ["replicas", "sim", "--count", "1"]}, replicas=1, one_process=True)


def outcomes_recorded(db: str, run_id: str) -> list[tuple[int, int]]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, count(DISTINCT agent_id) FROM guesses WHERE run_id = ? "
                           "GROUP BY round ORDER BY round", [run_id]).fetchall()


async def checkpoint_rounds(js, rid: str) -> tuple[set[int], int]:
    """The rounds of the run's checkpoints left, and how many of its configs are left."""
    listed = sorted({name for _, name in await checkpoints.run_objects(js, rid)
                     if subjects.checkpoint_round(rid, name) is not None})
    return ({subjects.checkpoint_round(rid, name) for name in listed if not subjects.is_checkpoint_config(name)},
            sum(subjects.is_checkpoint_config(name) for name in listed))


async def play_runs(stack: Stack) -> dict:
    nc = await bus.connect(stack.url, "e2e-retention")
    js = nc.jetstream()
    bulky_bytes: dict[str, int] = {}

    async def count(msg) -> None:  # what the runs put on RUN that the recorder purges
        rid = msg.subject.split(".")[1]
        bulky_bytes[rid] = bulky_bytes.get(rid, 0) + len(msg.data)

    for kind in BULKY:
        await nc.subscribe(f"run.*.{kind}.>", cb=count)
    report: dict = {"runs": [], "bytes": [], "left": [], "checkpoints": [], "configs": []}
    try:
        for _ in range(RUNS):
            out = await play(nc, prepare(RunConfig.model_validate(BASE)).config, stall_s=120)
            assert out.status == "completed", out.reason
            assert out.recorded is not None and out.recorded.outcomes == AGENTS * ROUNDS
            info = await js.stream_info(subjects.RUN_STREAM, subjects_filter=subjects.run_all(out.run_id))
            report["runs"].append(out.run_id)
            report["left"].append(info.state.subjects or {})
            report["bytes"].append((await js.stream_info(subjects.RUN_STREAM)).state.bytes)
            rounds, configs = await checkpoint_rounds(js, out.run_id)
            report["checkpoints"].append(rounds)
            report["configs"].append(configs)
        report["bulky_bytes"] = bulky_bytes
        return report
    finally:
        await nc.close()


@pytest.fixture(scope="module")
def played(stack) -> dict:
    return asyncio.run(play_runs(stack))


def test_recorded_runs_leave_only_their_control_events_on_run(stack, played):
    for rid, left in zip(played["runs"], played["left"]):
        kinds = {subjects.kind_of(s) for s in left}
        assert not kinds & set(BULKY), (rid, sorted(left))
        # (not `recorded`: the client hears it over core NATS, maybe before the stream stores it)
        assert {"started", "spawn", "round.open", "partial", "round.result", "done"} <= kinds
        # every outcome is in DuckDB, exactly one per agent and round
        assert outcomes_recorded(stack.db, rid) == [(n, AGENTS) for n in range(1, ROUNDS + 1)]


def test_a_run_on_a_model_leaves_no_call_records_on_run(stack):
    async def go():
        nc = await bus.connect(stack.url, "e2e-retention-sim")
        try:
            out = await play(nc, prepare(RunConfig.model_validate(ON_SIM)).config, stall_s=120)
            info = await nc.jetstream().stream_info(subjects.RUN_STREAM, subjects_filter=subjects.run_all(out.run_id))
            return out, info.state.subjects or {}
        finally:
            await nc.close()

    out, left = asyncio.run(go())
    assert out.status == "completed", out.reason
    assert not {subjects.kind_of(s) for s in left} & set(BULKY), sorted(left)
    with duckdb.connect(stack.db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM llm_calls WHERE run_id = ?", [out.run_id]).fetchone() == (
            ON_SIM["agents"] * ROUNDS,)


def test_run_stream_stays_flat_across_runs(played):
    sizes, bulky = played["bytes"], played["bulky_bytes"]
    assert set(played["runs"]) <= set(bulky), "the runs published no outcome batches?"
    growth = [b - a for a, b in pairwise(sizes)]
    per_run_bulky = min(bulky[rid] for rid in played["runs"])
    # What a run leaves behind is its control events: a small share of what it published.
    assert max(growth) < 0.25 * per_run_bulky, (sizes, growth, per_run_bulky)
    assert sizes[-1] < sizes[0] + (RUNS - 1) * 0.25 * per_run_bulky


def test_run_stream_gets_the_age_limit_and_the_dlq_keeps_its_own(stack):
    async def go():
        nc = await bus.connect(stack.url, "e2e-retention-config")
        try:
            js = nc.jetstream()
            return ((await js.stream_info(subjects.RUN_STREAM)).config,
                    (await js.stream_info(subjects.DLQ_STREAM)).config)
        finally:
            await nc.close()

    run, dlq = asyncio.run(go())
    assert run.max_age == MAX_AGE_S
    # the DLQ is bounded too (README "Streams"), by its own settings: oldest dead letters go first
    assert (dlq.max_msgs, dlq.max_age, dlq.discard) == (100_000, DLQ_MAX_AGE_S, DiscardPolicy.OLD)
    assert 0 < dlq.max_bytes <= bus.DLQ_MAX_BYTES


def test_completed_runs_keep_only_their_last_rounds_checkpoint(played):
    assert played["checkpoints"] == [{ROUNDS}] * RUNS


def test_completed_runs_keep_their_config_which_an_interview_order_names(played):
    assert played["configs"] == [1] * RUNS


def test_a_fork_from_the_kept_round_plays_and_one_from_a_pruned_round_is_refused(stack, played):
    parent = played["runs"][-1]

    async def go():
        nc = await bus.connect(stack.url, "e2e-retention-fork")
        try:
            config = (await run_state(nc, parent)).config
            prepared = prepare_fork(config, ROUNDS, {"rounds": ROUNDS + 1}, None, parent)
            kept = await play(nc, prepared.config, manifest=prepared.manifest, stall_s=120,
                              fork=Restore(run_id=parent, round=ROUNDS))
            pruned = await play(nc, config, stall_s=60, fork=Restore(run_id=parent, round=1))
            return kept, pruned
        finally:
            await nc.close()

    kept, pruned = asyncio.run(go())
    assert kept.status == "completed", kept.reason
    assert [r.round for r in kept.results] == [ROUNDS + 1]
    assert outcomes_recorded(stack.db, kept.run_id) == [(ROUNDS + 1, AGENTS)]
    assert pruned.status == "failed"
    assert pruned.reason == (f"cannot fork: checkpoint {subjects.checkpoint_env(parent, 1)} by environment is not "
                             f"in the object store '{subjects.CHECKPOINTS_BUCKET}'")
