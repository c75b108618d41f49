"""Issue 26, items 3–5, and issue 41, attack 1, attacked on real processes with users on: one NATS
user per service and per host (deploy/nats/auth.conf, populace.core.hostauth). The attacker holds
the credentials of host-1 (placed in the runs) or of host-9 (a fleet member placed in none:
credentials only, no process). Each test fails without the fix it covers; with it, the attack
changes no result:
- checkpoint objects another host stores under the names of a run's objects (its own metadata
  pointing at its own bytes, or at nothing) are never looked at: a lost host's replacement
  restores the genuine state and the run completes exactly, and so does a fork from them (both
  paused or failed before, and every resume paused again);
- faults and pauses from a host placed in no run, or claiming another sender, are dead-lettered
  once naming the sender, and the run is exact; spoofed progress ticks do not keep a stalled
  run running;
- a host claiming a capacity of 10^8 gets an even share of a run."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
from pathlib import Path

import duckdb
import nats
import pytest
from pydantic_core import to_json

from populace.client.prepare import prepare
from populace.client.run import new_run_id, play, run_state
from populace.client.stack import Stack
from populace.core import bus, checkpoints, owned_objects, runconfigs, subjects
from populace.core.contracts import Progress, Restore, RoundOpen, RunConfig
from populace.core.hostauth import with_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SIMS = Path(__file__).with_name("sims")
sys.path.insert(0, str(SIMS))  # memory_sim, for prepare() here; the services get it through PYTHONPATH

USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
HOSTS = ("host-0", "host-1", "host-9")  # host-9: credentials only, no process: placed in no run
AGENTS, ROUNDS = 200, 4
CONFIG = {"simulation": "memory_sim:Memory", "agents": AGENTS, "rounds": ROUNDS, "seed": 4,
          "model": {"latency_s": 2.0, "seed": 9}}
STALL_S = 20  # the orchestrator's round deadline here (POPULACE_ROUND_STALL_S)
SPOOF_STALL_S = 8  # its deadline for the last test, which waits out two of them


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stacks):
    """Each service and host connects as its own NATS user (the server enforces what a user may do
    per connection); the services the tests kill or start again (both hosts, the environment, the
    orchestrator) keep a process each, the gateway and the recorder share one."""
    tmp = tmp_path_factory.mktemp("state-integrity")
    users = {u: f"integrity-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{users[u]}"\n' for u in USERS)
    conf = tmp / "auth.conf"
    conf.write_text(defs + with_hosts((ROOT / "deploy" / "nats" / "auth.conf").read_text(),
                                      {h: users[h] for h in HOSTS}))
    return stacks(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=["-c", str(conf)],
                  env={"PYTHONPATH": str(SIMS), "POPULACE_STORAGE": "memory", "POPULACE_HEARTBEAT_S": "0.5",
                       "POPULACE_HOST_LOST_S": "4", "POPULACE_REGISTRY_TTL_S": "4",
                       "POPULACE_ROUND_STALL_S": str(STALL_S)},
                  one_process=True, apart=("orchestrator", "environment", "agent-host-0", "agent-host-1"),
                  timeout=120)


def play_run(stack: Stack, config: dict = CONFIG, on_open=None, attacker: str = "host-1",
             fork: Restore | None = None, timeout: float = 300):
    """Play `config` as `cli`; `on_open(nc_attacker, run_id, round)` runs (awaited, in order)
    on every round open. Returns (outcome, the run's state)."""
    prepared = prepare(RunConfig.model_validate(config))
    rid = new_run_id()

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        evil = await nats.connect(stack.url, **stack.credentials(attacker))
        queue: asyncio.Queue = asyncio.Queue()

        async def attack() -> None:
            while (n := await queue.get()) is not None:
                await on_open(evil, rid, n)

        def on_event(kind, model) -> None:
            if on_open is not None and isinstance(model, RoundOpen) and model.nudge == 0:
                queue.put_nowait(model.round)

        attacking = asyncio.create_task(attack())
        try:
            out = await asyncio.wait_for(play(nc, prepared.config, run_id=rid, manifest=prepared.manifest,
                                              on_event=on_event, stall_s=timeout, fork=fork), timeout)
            queue.put_nowait(None)
            await attacking
            return out, await run_state(nc, rid)
        finally:
            attacking.cancel()
            await evil.close()
            await nc.close()

    return asyncio.run(go())


def rows(db: str, rid: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, agent_id, remembered, total, valid FROM memory_outcomes WHERE run_id = ? "
                           "ORDER BY round, agent_id", [rid]).fetchall()


def summaries(db: str, rid: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute("SELECT round, n, n_valid, total FROM memory_rounds WHERE run_id = ? ORDER BY round",
                           [rid]).fetchall()


async def dead_letters(stack: Stack) -> list[tuple[str, str, str]]:
    """(refusing process, original subject, reason) of every message in DLQ."""
    nc = await nats.connect(stack.url, **stack.credentials("admin"))
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.DLQ_STREAM)
        out = []
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):  # an empty stream: none
            m = await js.get_msg(subjects.DLQ_STREAM, seq)
            h = m.headers or {}
            out.append((h.get("Populace-Instance", ""), h.get("Populace-Subject", ""), h.get("Populace-Error", "")))
        return out
    finally:
        await nc.close()


def refused_on(stack: Stack, before: int, subject: str, at_least: int) -> list[tuple[str, str, str]]:
    """The dead letters of messages sent on `subject` since the DLQ held `before`, once there
    are `at_least` (the services refuse them asynchronously); bounded by a minute."""
    async def poll():
        for _ in range(600):
            got = [d for d in (await dead_letters(stack))[before:] if d[1] == subject]
            if len(got) >= at_least:
                return got
            await asyncio.sleep(0.1)
        return got

    return asyncio.run(poll())


async def forge(nc, name: str, value: object, writer: str = "host-1") -> None:
    """What a host's credentials may do to an object of the checkpoints bucket: store its own
    bytes under the object's name (its metadata on its own token, the newest of the name), and
    metadata of its own pointing at chunks that hold nothing. Its user may not publish the
    metadata of the layout before (any writer's, on `$O.checkpoints.M.<name>`) nor under another
    writer's token: those publishes are refused by the server, and nothing is stored."""
    js = nc.jetstream()
    meta = await owned_objects.write_object(js, name, to_json(value), writer)
    await js.publish(owned_objects.meta_subject(writer, name),
                     to_json(meta.model_copy(update={"first_seq": meta.last_seq + 10**6,
                                                     "last_seq": meta.last_seq + 10**6 + 5})))
    rid = subjects.checkpoint_run_of(name)
    for subject in (f"$O.checkpoints.M.{owned_objects.encode_name(name)}",
                    owned_objects.meta_subject(checkpoints.ENV_WRITER, name),
                    owned_objects.meta_subject("host-0", name), subjects.checkpoint_chunks("host-0", rid)):
        await nc.publish(subject, to_json(meta))  # core publishes: the server drops them (a violation)
    await nc.flush()


def forged_agents(first: int, count: int) -> dict:
    return {"first": first, "count": count, "fields": {"memory": [[7777] for _ in range(count)]}}


@pytest.fixture(scope="module")
def reference(stack) -> str:
    out, state = play_run(stack)
    assert out.status == "completed", out.reason
    assert {sh.host_id: sh.count for sh in state.shares} == {"host-0": AGENTS // 2, "host-1": AGENTS // 2}
    assert len(rows(stack.db, out.run_id)) == AGENTS * ROUNDS
    return out.run_id


def check_exact(stack: Stack, out, reference: str) -> None:
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == AGENTS * ROUNDS
    assert rows(stack.db, out.run_id) == rows(stack.db, reference)
    assert summaries(stack.db, out.run_id) == summaries(stack.db, reference)


# --- 3. (issue 41) recovery reads each object as its own writer stored it ---------------------------
async def stored_under(stack: Stack, pattern: str) -> dict[str, int]:
    nc = await nats.connect(stack.url, **stack.credentials("admin"))
    try:
        return await bus.stream_subjects(nc.jetstream(), subjects.CHECKPOINTS_STREAM, pattern)
    finally:
        await nc.close()


def test_a_lost_hosts_replacement_restores_its_genuine_checkpoint_under_forged_metadata(stack, reference):
    """host-1 stores its own bytes under host-0's round-1 checkpoint name and the run's config's
    (and metadata pointing at nothing); host-0 then dies as round 2 opens. Its agents'
    replacement restored the forged object (an issue 26 run "completed" with other numbers), then
    refused it and paused, and every resume paused again; a restarted host read a forged config
    and paused (issue 41). Now it restores host-0's own, and the run completes exactly."""
    victim = None

    async def on_open(evil, rid, n) -> None:
        nonlocal victim
        if n == 2 and victim is None:
            victim = subjects.checkpoint_agents(rid, 1, 0)
            stack.kill("agent-host-0")  # before it could send its share of round 2
            await forge(evil, victim, forged_agents(0, AGENTS // 2))
            head = await bus.run_head(evil.jetstream(), rid)  # a host may read any run's state
            await forge(evil, runconfigs.object_name(rid, head.config_ref), {"agents": 1})
            threading.Thread(target=stack.restart, args=("agent-host-0",), daemon=True).start()

    try:
        out, state = play_run(stack, on_open=on_open)
    finally:
        asyncio.run(stack.wait_ready(timeout=90))
    assert victim is not None
    check_exact(stack, out, reference)
    assert len(state.layouts) == 2, "host-0's agents should have been placed again, restored from round 1"
    # the forgery was there all along (host-1 is one of the run's writers: no sweep takes it)
    forged = asyncio.run(stored_under(stack, owned_objects.meta_subject("host-1", victim)))
    assert forged == {owned_objects.meta_subject("host-1", victim): 2}
    assert asyncio.run(stored_under(stack, f"$O.checkpoints.M.{owned_objects.encode_name(victim)}")) == {}


def test_a_fork_starts_from_the_genuine_checkpoint_under_forged_metadata(stack, reference):
    """A fork from round 1 of the reference run, after host-1 stored its own bytes under the
    names of host-0's agents' object, of the environment's and of its own agents' object (its
    newest version of it spoiled: a fork paused on the first and failed on the second): the
    fork plays rounds 2-4 exactly as the reference did."""
    async def attack() -> None:
        nc = await nats.connect(stack.url, **stack.credentials("host-1"))
        try:
            await forge(nc, subjects.checkpoint_agents(reference, 1, 0), forged_agents(0, AGENTS // 2))
            await forge(nc, subjects.checkpoint_agents(reference, 1, AGENTS // 2),
                        forged_agents(AGENTS // 2, AGENTS // 2))
            await forge(nc, subjects.checkpoint_env(reference, 1), {"state": {}, "observation": {"round": 3}})
        finally:
            await nc.close()

    asyncio.run(attack())
    out, _ = play_run(stack, fork=Restore(run_id=reference, round=1))
    assert out.status == "completed", (out.status, out.reason)
    assert rows(stack.db, out.run_id) == [r for r in rows(stack.db, reference) if r[0] > 1]
    assert summaries(stack.db, out.run_id) == [r for r in summaries(stack.db, reference) if r[0] > 1]


# --- 4. only a run's placed shares (and its services) may fail, pause or pace it -------------------
def test_faults_and_pauses_from_a_host_placed_in_no_run_change_nothing_and_are_dead_lettered(stack, reference):
    """host-9, placed in no run, fails the run once and pauses it at every round open (one such
    fault failed a run; the pauses made three resumes achieve nothing), and sends faults on its
    own subject claiming host-0 and the environment as their source."""
    before = len(asyncio.run(dead_letters(stack)))
    sent: list[str] = []

    async def on_open(evil, rid, n) -> None:
        js = evil.jetstream()
        faults = [{"source": "host-9", "reason": f"forged pause {n}", "pause": True}]
        if n == 2:
            faults += [{"source": "host-9", "reason": "forged failure"},
                       {"source": "host-9", "reason": "forged epoch", "epoch": 0},
                       {"source": "host-0", "reason": "claims host-0", "epoch": 0},
                       {"source": "environment", "reason": "claims the environment"}]
        for f in faults:  # well-formed RunFault bodies (raw: what any client can send)
            await js.publish(subjects.run_fault(rid, "host-9"), to_json({"v": 1, "run_id": rid, "round": n, **f}))
            sent.append(f["reason"])

    out, state = play_run(stack, on_open=on_open, attacker="host-9")
    check_exact(stack, out, reference)
    assert state.reason is None
    assert len(sent) == ROUNDS + 4
    refused = refused_on(stack, before, subjects.run_fault(out.run_id, "host-9"), len(sent))
    assert len(refused) == len(sent), refused
    assert all(d[0].startswith("orchestrator.") and d[2].startswith("fault refused from host-9: ") for d in refused)
    reasons = "\n".join(d[2] for d in refused)
    assert "agent-host host-9 plays no share of run" in reasons and "share host-9@0 is not in run" in reasons
    assert "claims to come from 'host-0'" in reasons and "claims to come from 'environment'" in reasons


# --- 5. a host's own capacity claim does not decide placement ---------------------------------------
def test_a_host_claiming_a_huge_capacity_gets_an_even_share(stack, reference):
    """host-1 restarts claiming a capacity of 10^8 (host-0 offers the default, from its memory): it got
    1,961 of 2,000 agents; now the run is spread evenly, and its results are the reference's."""
    args, env, service = stack.specs["agent-host-1"]
    stack.specs["agent-host-1"] = (args, {**env, "POPULACE_HOST_CAPACITY": "100000000"}, service)
    stack.kill("agent-host-1", signal.SIGTERM)
    stack.restart("agent-host-1")
    asyncio.run(stack.wait_ready(timeout=90))

    async def claims() -> dict[str, int]:
        from populace.core.contracts import HostInfo

        nc = await nats.connect(stack.url, **stack.credentials("admin"))
        try:
            hosts = await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo)
            return {h.host_id: h.capacity for h in hosts}
        finally:
            await nc.close()

    from populace.core.settings import Settings

    assert asyncio.run(claims()) == {"host-0": Settings().host_capacity, "host-1": 100_000_000}
    out, state = play_run(stack)
    assert {sh.host_id: sh.count for sh in state.shares} == {"host-0": AGENTS // 2, "host-1": AGENTS // 2}
    check_exact(stack, out, reference)


# --- 4. (continued, last: it shortens the orchestrator's round deadline) ------------------------------
def test_spoofed_progress_does_not_keep_a_stalled_run_running(stack):
    """The environment dies as round 2 opens: the round can never close. host-9 ticks progress
    for it every half second (it kept such a run "running" with no reason for 230 s); the round
    is announced again once past its deadline, then the run pauses with the reason.

    Last in the module: its orchestrator is started again with a deadline of SPOOF_STALL_S
    instead of STALL_S (the run waits out two deadlines: 16 s instead of 40); the ticks come 16
    times a deadline still, and the module's other runs keep the margin of the longer one."""
    args, env, service = stack.specs["orchestrator"]
    stack.specs["orchestrator"] = (args, {**env, "POPULACE_ROUND_STALL_S": str(SPOOF_STALL_S)}, service)
    stack.kill("orchestrator", signal.SIGTERM)
    stack.restart("orchestrator")
    asyncio.run(stack.wait_ready(timeout=90))
    ticking: list[asyncio.Task] = []

    async def spoof(evil, rid) -> None:
        subject = subjects.progress(rid, 2, "host-9")
        while True:
            await evil.publish(subject, bus.encode(Progress(run_id=rid, round=2, host_id="host-9", answered=1)))
            await evil.publish(subject, bus.encode(Progress(run_id=rid, round=2, host_id="host-9", answered=0)))
            await asyncio.sleep(0.5)

    async def on_open(evil, rid, n) -> None:
        if n == 2 and not ticking:
            stack.kill("environment")
            ticking.append(asyncio.get_running_loop().create_task(spoof(evil, rid)))

    before = len(asyncio.run(dead_letters(stack)))
    try:
        out, state = play_run(stack, on_open=on_open, attacker="host-9", timeout=8 * STALL_S)
    finally:
        for t in ticking:
            t.cancel()
    # the environment stays down: no test comes after this one (an interpreter not started)
    assert out.status == "paused", (out.status, out.reason)
    assert f"round 2 made no progress for {SPOOF_STALL_S}s (announced again once)" in out.reason, out.reason
    assert state.round == 1
    refused = refused_on(stack, before, subjects.progress(out.run_id, 2, "host-9"), 1)
    assert refused and all(d[2] == f"progress refused from host-9: agent-host host-9 plays no share of run "
                                   f"{out.run_id} (epoch 0)" for d in refused), refused[:3]
