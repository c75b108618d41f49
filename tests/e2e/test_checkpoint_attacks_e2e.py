"""Issue 41, attacks 1 and 2, on real processes with users on (one NATS user per service and per
host: deploy/nats/auth.conf, populace.core.hostauth), on a world run (Schelling). The attackers
hold the credentials of host-1 (placed in the runs) and host-9 (a fleet member placed in none:
credentials only, no process).

1. Any host could publish the newest metadata of any object of the checkpoints bucket, and readers
   took the newest: a world run failed (blamed on the simulation), a recorded run's post-hoc
   interview failed on both hosts and its fork was refused. Now a reader looks for an object
   under its expected writer only: metadata under the attackers' own tokens (pointing at their
   bytes, or at nothing) changes no result, and publishing under another's token is refused.
2. The checkpoints bucket had no byte limit: host-9 stored 1.5 GB in 12 s, and then `populace
   run` could not publish its start. Now what it stores for one run stops at its bound, the store
   at its limit, a run started meanwhile pauses naming the store (its start goes out), and the
   recorder's sweep gives the room back: the run resumed completes exactly.

Mostly CPU: small rounds played back to back (the last test waits for one sweep, ~1 s)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import duckdb
import nats
import pytest
from pydantic_core import to_json

from populace.client.interviews import as_survey, ask, read_answers
from populace.client.prepare import prepare
from populace.client.run import new_run_id, play, resume, run_state
from populace.client.stack import Stack
from populace.core import bus, owned_objects, subjects
from populace.core.contracts import Question, Restore, RoundOpen, RoundResult, RunConfig
from populace.core.hostauth import with_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
HOSTS = ("host-0", "host-1", "host-9")  # host-9: credentials only, no process: placed in no run
AGENTS, ROUNDS = 200, 3
CONFIG = {"simulation": "schelling", "agents": AGENTS, "rounds": ROUNDS, "seed": 7, "model": {"latency_s": 0.2},
          "grid": {"width": 20, "height": 20}, "rule": {"threshold": 0.5}}
MiB = 2**20
STORE_BYTES, WRITER_RUN_BYTES = 32 * MiB, 16 * MiB  # the checkpoints store's limits on this stack
SURVEY = as_survey([Question(id="home", text="Do you like your street?", options=["yes", "no"])], "street")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stacks):
    """Each service and host connects as its own NATS user though they share one process (the
    server enforces what a user may do per connection); the recorder, which the last test starts
    again with its sweep on, keeps a process of its own."""
    tmp = tmp_path_factory.mktemp("checkpoint-attacks")
    users = {u: f"ckpt-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{users[u]}"\n' for u in USERS)
    conf = tmp / "auth.conf"
    conf.write_text(defs + with_hosts((ROOT / "deploy" / "nats" / "auth.conf").read_text(),
                                      {h: users[h] for h in HOSTS}))
    return stacks(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=["-c", str(conf)],
                  env={"POPULACE_STORAGE": "memory", "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_HOST_LOST_S": "4",
                       "POPULACE_REGISTRY_TTL_S": "4", "POPULACE_CHECKPOINTS_MAX_BYTES": str(STORE_BYTES),
                       "POPULACE_CHECKPOINTS_WRITER_RUN_MAX_BYTES": str(WRITER_RUN_BYTES),
                       "POPULACE_CHECKPOINTS_SWEEP_S": "0"},  # off until the last test turns it on
                  one_process=True, apart=("recorder",), timeout=120)


def outcome_rows(db: str, rid: str, after: int = 0) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, agent_id, cell, kind, \"like\", occupied, move, valid FROM schelling_outcomes "
                           "WHERE run_id = ? AND round > ? ORDER BY round, agent_id", [rid, after]).fetchall()


def round_rows(db: str, rid: str, after: int = 0) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, n, n_valid, like_share, unhappy_share, moved, empty_cells FROM "
                           "schelling_rounds WHERE run_id = ? AND round > ? ORDER BY round", [rid, after]).fetchall()


async def forge(nc, writer: str, names: list[str]) -> None:
    """What `writer`'s credentials may do to each object `names` names: store its own bytes
    under the name (metadata on its own token, the newest of the name) and metadata of its own
    pointing at chunks that hold nothing; its publishes of the layout before (`$O.checkpoints.M.
    <name>`, any writer's) and under the environment's, the orchestrator's and host-0's tokens
    are refused by the server (core publishes: dropped, nothing stored)."""
    js = nc.jetstream()
    for name in names:
        meta = await owned_objects.write_object(js, name, b'{"forged": true}', writer)
        await js.publish(owned_objects.meta_subject(writer, name),
                         to_json(meta.model_copy(update={"first_seq": meta.last_seq + 10**6,
                                                         "last_seq": meta.last_seq + 10**6 + 3, "chunks": 3,
                                                         "size": 300_000})))
        for other in ("environment", "orchestrator", "host-0"):
            await nc.publish(owned_objects.meta_subject(other, name), to_json(meta))
        await nc.publish(f"$O.checkpoints.M.{owned_objects.encode_name(name)}", to_json(meta))
    await nc.flush()


def names_of(rid: str, round_: int, config_digest: str | None) -> list[str]:
    """The objects of run `rid` its readers read after round `round_`: its world, the environment's
    state, each range's agents, its config."""
    names = [subjects.checkpoint_world(rid, round_), subjects.checkpoint_env(rid, round_),
             *(subjects.checkpoint_agents(rid, round_, first) for first in (0, AGENTS // 2))]
    return names + ([subjects.checkpoint_config(rid, 1, config_digest)] if config_digest else [])


async def stored_under(stack: Stack, pattern: str) -> dict[str, int]:
    nc = await nats.connect(stack.url, **stack.credentials("admin"))
    try:
        return await bus.stream_subjects(nc.jetstream(), subjects.CHECKPOINTS_STREAM, pattern)
    finally:
        await nc.close()


def play_run(stack: Stack, on_event=None, fork: Restore | None = None):
    """Play CONFIG as `cli`; `on_event(attackers, kind, model, rid)` runs (awaited, in order) on
    every event, with host-9's and host-1's connections. Returns (outcome, the run's state)."""
    prepared = prepare(RunConfig.model_validate(CONFIG))
    rid = new_run_id()

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        attackers = {h: await nats.connect(stack.url, **stack.credentials(h)) for h in ("host-9", "host-1")}
        queue: asyncio.Queue = asyncio.Queue()

        async def attack() -> None:
            while (item := await queue.get()) is not None:
                await on_event(attackers, *item, rid)

        attacking = asyncio.create_task(attack())
        try:
            out = await asyncio.wait_for(
                play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=120, fork=fork,
                     on_event=(lambda kind, model: queue.put_nowait((kind, model))) if on_event else None), 240)
            queue.put_nowait(None)
            await attacking
            return out, await run_state(nc, rid)
        finally:
            attacking.cancel()
            for c in (nc, *attackers.values()):
                await c.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def reference(stack) -> str:
    out, state = play_run(stack)
    assert out.status == "completed", out.reason
    assert {sh.host_id: sh.count for sh in state.shares} == {"host-0": AGENTS // 2, "host-1": AGENTS // 2}
    assert len(outcome_rows(stack.db, out.run_id)) == AGENTS * ROUNDS
    assert sum(r[5] for r in round_rows(stack.db, out.run_id)) > 0  # the town changed between rounds
    return out.run_id


# --- 1. metadata bound to its writer -------------------------------------------------------------------
def test_a_world_run_completes_exactly_under_forged_metadata(stack, reference):
    """At every round's open and result, host-9 and host-1 store their own objects under the
    names of every object the run's readers read next (the world, the environment's state, each
    range's agents, the config): the hosts read the world at each open, a restarted reader its
    config. The run completed no round past the forged world before; now it is the reference."""
    digest: list[str] = []

    async def on_event(attackers, kind, model, rid) -> None:
        if isinstance(model, RoundOpen):
            digest[:] = [model.config_ref.digest]
            done = model.round - 1
        elif isinstance(model, RoundResult):
            done = model.round
        else:
            return
        for writer, nc in attackers.items():
            await forge(nc, writer, names_of(rid, done, digest[0] if digest else None))

    out, _ = play_run(stack, on_event)
    assert out.status == "completed", (out.status, out.reason)
    assert outcome_rows(stack.db, out.run_id) == outcome_rows(stack.db, reference)
    assert round_rows(stack.db, out.run_id) == round_rows(stack.db, reference)
    # the forged objects are there (the sweep is off); none of the layout before (refused)
    forged = asyncio.run(stored_under(stack, subjects.checkpoint_run_meta(out.run_id, "host-9")))
    assert owned_objects.meta_subject("host-9", subjects.checkpoint_world(out.run_id, 1)) in forged
    assert asyncio.run(stored_under(stack, "$O.checkpoints.M.*")) == {}


def test_an_interview_and_a_fork_of_a_recorded_run_complete_exactly_under_forged_metadata(stack, reference):
    """A post-hoc interview of the recorded reference run after round 2, and a fork from it, once
    host-9 and host-1 stored their own objects under every name of its round 2 (and host-1
    spoiled its own range's newest version): both hosts failed the interview, and the fork was
    refused; now the interview's answers are those asked before the attack, and the fork plays
    round 3 exactly as the reference did."""
    state = asyncio.run(_state(stack, reference))

    async def interview(request: str) -> list[tuple]:
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        try:
            asked = await ask(nc, reference, 2, SURVEY, request=request, timeout_s=120)
        finally:
            await nc.close()
        assert asked.recorded.answers == AGENTS
        with duckdb.connect(stack.db, read_only=True) as con:
            table = read_answers(con, reference, request=request)
        return sorted(zip(*(table.column(c).to_pylist() for c in ("agent_id", "question", "answer", "valid"))))

    before = asyncio.run(interview("before"))

    async def attack() -> None:
        for writer in ("host-9", "host-1"):
            nc = await nats.connect(stack.url, **stack.credentials(writer))
            try:
                await forge(nc, writer, names_of(reference, 2, state.config_ref.digest))
            finally:
                await nc.close()

    asyncio.run(attack())
    assert asyncio.run(interview("after")) == before
    out, _ = play_run(stack, fork=Restore(run_id=reference, round=2))
    assert out.status == "completed", (out.status, out.reason)
    assert outcome_rows(stack.db, out.run_id) == outcome_rows(stack.db, reference, after=2)
    assert round_rows(stack.db, out.run_id) == round_rows(stack.db, reference, after=2)


async def _state(stack: Stack, rid: str):
    nc = await nats.connect(stack.url, **stack.credentials("cli"))
    try:
        return await run_state(nc, rid)
    finally:
        await nc.close()


# --- 2. bounded stores, and a sweep ------------------------------------------------------------------------
async def fill(stack: Stack, reference: str) -> dict:
    """host-9 writes as much as the store takes: under the reference run's id until its bound per
    writer and run refuses it, then under run ids it makes up, each write halving once refused,
    until not one more byte goes in. Returns what each refusal said and what it stored."""
    nc = await nats.connect(stack.url, **stack.credentials("host-9"))
    js = nc.jetstream()
    said: dict[str, str] = {}
    try:
        n = 0
        try:
            while True:
                await owned_objects.write_object(js, f"{reference}.1.agents.{n}", b"z" * owned_objects.CHUNK_BYTES,
                                                 "host-9")
                n += 1
        except owned_objects.StoreFull as err:
            said["run"] = str(err)
        size, made_up = owned_objects.CHUNK_BYTES, 0
        t0 = time.monotonic()
        while size >= 1:
            try:
                await owned_objects.write_object(js, f"made-up-{made_up // 16}.1.env.{made_up}", b"z" * size,
                                                 "host-9")
                made_up += 1
            except owned_objects.StoreFull as err:
                said["store"] = str(err)
                size //= 2
        said["seconds"] = f"{time.monotonic() - t0:.1f}"
        return said
    finally:
        await nc.close()


def test_a_host_in_no_run_cannot_fill_the_store_past_its_limit_and_runs_still_start(stack, reference):
    """host-9 fills the store. What it stores for the reference run stops at its bound, the store
    at its limit. A run started then goes out (its start is on CTL, whose room is its own) and
    pauses naming the store; the recorder's sweep (turned on: its first pass) purges what host-9
    stored, and the run resumed is the reference."""
    said = asyncio.run(fill(stack, reference))
    assert f"host-9 has stored all it may for run {reference} in the object store 'checkpoints'" in said["run"]
    assert "the object store 'checkpoints' is full (POPULACE_CHECKPOINTS_MAX_BYTES)" in said["store"]
    on_run = asyncio.run(stored_under(stack, subjects.checkpoint_chunks("host-9", reference)))
    assert on_run == {subjects.checkpoint_chunks("host-9", reference): WRITER_RUN_BYTES // owned_objects.CHUNK_BYTES}

    async def store_bytes() -> int:
        nc = await nats.connect(stack.url, **stack.credentials("admin"))
        try:
            info = await nc.jetstream().stream_info(subjects.CHECKPOINTS_STREAM)
            assert info.config.max_bytes == STORE_BYTES
            return info.state.bytes
        finally:
            await nc.close()

    assert STORE_BYTES - 2 * owned_objects.CHUNK_BYTES < asyncio.run(store_bytes()) <= STORE_BYTES
    out, state = play_run(stack)
    assert out.status == "paused", (out.status, out.reason)
    assert "the object store 'checkpoints' is full" in out.reason, out.reason
    assert state.round == 0 and outcome_rows(stack.db, out.run_id) == []

    args, env, service = stack.specs["recorder"]  # the sweep, once a second
    stack.specs["recorder"] = (args, {**env, "POPULACE_CHECKPOINTS_SWEEP_S": "1"}, service)
    stack.kill("recorder", signal.SIGTERM)
    stack.restart("recorder")
    asyncio.run(stack.wait_ready(timeout=90))

    async def swept() -> None:
        for _ in range(300):
            if not await stored_under(stack, "$O.checkpoints.*.host-9.>"):
                return
            await asyncio.sleep(0.1)
        raise AssertionError("the recorder's sweep left host-9's objects")

    asyncio.run(swept())
    assert asyncio.run(store_bytes()) < 2 * MiB  # the runs' own objects stay, all of them small

    async def go_on():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        try:
            return await asyncio.wait_for(resume(nc, out.run_id, stall_s=120), 240)
        finally:
            await nc.close()

    resumed = asyncio.run(go_on())
    assert resumed.status == "completed", (resumed.status, resumed.reason)
    assert outcome_rows(stack.db, out.run_id) == outcome_rows(stack.db, reference)
    assert round_rows(stack.db, out.run_id) == round_rows(stack.db, reference)
