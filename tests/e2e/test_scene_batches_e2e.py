"""Bargaining (scenes with text) on 2 agent-hosts, recorded whole: every outcome, act and
transcript line, equal to the local runner's, and the run announced recorded — undisturbed at 400
agents and at 2,000, and with a host SIGKILLed inside a round at 2,000 (where batches leave on the
scenes' text: a batch once left with a pair's acts and one member's outcome, the recorder refused
it whole, and 484 of 4,000 outcomes were recorded of a run that said `completed`).

And a batch carrying a bad group: on an open bus a forger that beats host-0 to its batch's
message id replaces the batch (with users, ids are sealed: populace.core.bus.seal). The forged
batch is the genuine one with one act moved to another group: that group alone is refused, the
rest recorded, and the run ends `incomplete`, saying which group of which host, why, and how many
outcomes, acts and lines it lacks — in the follower (`populace run`), `runs`, `populace results` and
what the manager's run page reads. A batch refused whole (a column the run lacks) is waited for,
then the run ends `incomplete` too: the recorder never waits for ever.

One stack, hosts of the default capacity (a lost host's agents fit on the survivor), its services
in one process but agent-host-1 (the one the kill test SIGKILLs and restarts). The module
mostly waits: on the paced dummy model and, in the kill rows, on the 4 s host-loss window."""

from __future__ import annotations

import asyncio
import json

import duckdb
import pytest
from in_round import kill_in_round
from test_shapes_e2e import assert_as_in_one_process, table

from populace.client.prepare import prepare
from populace.client.run import new_run_id, play, recorded_event, run_state, status_as_recorded
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import ActColumns, LineColumns, OutcomeBatch, RunConfig, SpawnBatch
from populace.sdk.local import LocalResult, run_local

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    db = tmp_path_factory.mktemp("scene-batches") / "populace.duckdb"
    s = Stack(hosts=2, db=str(db), env={"POPULACE_STORAGE": "memory", "POPULACE_HOST_LOST_S": "4",
                                         "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_REGISTRY_TTL_S": "4",
                                         # a batch refused whole is waited for this long (180 s by default)
                                         "POPULACE_RECORDER_MISSING_WAIT_S": "5"},
              one_process=True, apart=("agent-host-1",))  # a process of its own: the one the kill test SIGKILLs
    with s.up(timeout=120):
        yield s


def bargaining(agents: int, latency_s: float, rounds: int = 2) -> dict:
    return {"simulation": "bargaining", "agents": agents, "rounds": rounds, "seed": 3,
            "model": {"latency_s": latency_s, "seed": 6}, "game": {"block": 100 if agents >= 200 else 10}}


def fleet(stack: Stack, data: dict, during=None, run_id: str | None = None):
    prepared = prepare(RunConfig.model_validate(data))

    async def go():
        nc = await bus.connect(stack.url, "e2e-scene-batches")
        try:
            task = asyncio.create_task(play(nc, prepared.config, run_id=run_id, manifest=prepared.manifest,
                                            stall_s=120))
            if during is not None:
                await during(nc)
            return await asyncio.wait_for(task, 240)
        finally:
            await nc.close()

    return prepared, asyncio.run(go())


def assert_whole(stack: Stack, out, local: LocalResult, agents: int, rounds: int) -> None:
    assert out.status == "completed", out.reason
    rec = out.recorded
    assert rec is not None and (rec.status, rec.outcomes, rec.outcomes_missing, rec.acts_missing,
                                rec.lines_missing) == ("completed", agents * rounds, 0, 0, 0)
    pairs = agents // 2 * rounds
    messages = sum(t for t, role in zip(local.outcomes["turns"], local.outcomes["role"]) if role == "first")
    assert len(local.acts["seq"]) == messages and len(local.transcripts["seq"]) == messages + pairs
    with duckdb.connect(stack.db, read_only=True) as con:
        counts = con.execute(
            "SELECT (SELECT count(*) FROM bargaining_outcomes WHERE run_id = $1), "
            "(SELECT count(*) FROM bargaining_acts WHERE run_id = $1), "
            "(SELECT count(*) FROM transcripts WHERE run_id = $1), "
            "(SELECT status FROM runs WHERE run_id = $1)", [out.run_id]).fetchone()
    assert counts == (agents * rounds, messages, messages + pairs, "completed")
    assert_as_in_one_process(stack.db, out.run_id, local)  # every row, by value


@pytest.mark.parametrize("agents", [400, 2000])
def test_bargaining_undisturbed_records_every_outcome_act_and_line(stack, agents):
    prepared, out = fleet(stack, bargaining(agents, latency_s=0.02))
    assert_whole(stack, out, asyncio.run(run_local(prepared.resolved)), agents, 2)


def test_bargaining_with_a_host_killed_in_a_round_records_every_outcome_act_and_line(stack):
    """Host 1 dies while round 2's conversations wait on the model: its pairs are placed on host 0
    and replay their whole scenes; nothing is missing, nothing counted twice. At 2,000 agents
    only: the replay is the same code at 400, where no batch leaves on the scenes' text (a row of
    its own before, 12 s); scenes replayed after a kill at that size are also
    test_shapes_e2e.py's kill test."""
    agents = 2000

    async def kill_in_round_2(nc):
        await kill_in_round(nc, stack, 2, "agent-host-1", settle_s=0.5)

    try:
        prepared, out = fleet(stack, bargaining(agents, latency_s=0.4), during=kill_in_round_2)
        with duckdb.connect(stack.db, read_only=True) as con:
            shares = con.execute("SELECT count(*) FROM _shares WHERE run_id = ?", [out.run_id]).fetchone()[0]
        assert shares == 3, "host 1's agents should have been placed again, in a new share"
        assert_whole(stack, out, asyncio.run(run_local(prepared.resolved)), agents, 2)
    finally:
        stack.restart("agent-host-1")
        asyncio.run(stack.wait_ready(timeout=90))


def forged(rid: str, spawn: SpawnBatch, local: LocalResult) -> tuple[OutcomeBatch, dict]:
    """Host 0's round-1 batch as it sends it (the local runner's rows of its agents), with the
    first act of its first pair moved to its second pair; and what that refusal leaves out."""
    first, count = spawn.ranges[0]
    mine = lambda cols, key: [i for i, a in enumerate(cols[key]) if first <= a < first + count]  # noqa: E731
    o, a, t = local.outcomes, local.acts, local.transcripts
    rows, acts = mine(o, "agent_id"), mine(a, "agent_id")
    groups = sorted({o["group_id"][i] for i in rows})
    bad, other = groups[0], groups[1]
    intruder = next(o["agent_id"][i] for i in rows if o["group_id"][i] == other)
    lines = [i for i, g in enumerate(t["group_id"]) if g in set(groups)]
    act_agents = [a["agent_id"][i] for i in acts]
    moved = next(k for k, i in enumerate(acts) if a["group_id"][i] == bad)
    act_agents[moved] = intruder
    pick = lambda cols, idx, keys: {k: [cols[k][i] for i in idx] for k in keys}  # noqa: E731
    batch = OutcomeBatch(
        run_id=rid, round=1, host_id=spawn.host_id, seq=0, epoch=spawn.epoch, agent_ids=pick(o, rows, ["agent_id"])[
            "agent_id"], columns=pick(o, rows, ["role", "partner", "deal", "share", "turns"]),
        valid=pick(o, rows, ["valid"])["valid"], raws=pick(o, rows, ["raw"])["raw"],
        latency_ms=pick(o, rows, ["latency_ms"])["latency_ms"], errors=pick(o, rows, ["error"])["error"],
        group_ids=pick(o, rows, ["group_id"])["group_id"],
        acts=ActColumns(**{**pick(a, acts, ["group_id", "seq", "phase", "valid", "raw", "latency_ms", "error"]),
                           "agent_id": act_agents}, columns=pick(a, acts, ["say", "propose", "accept"])),
        lines=LineColumns(**pick(t, lines, ["group_id", "seq", "speaker", "text", "fields"])))
    lost = {"group": bad, "intruder": intruder, "other": other,
            "outcomes": sum(o["group_id"][i] == bad for i in rows),
            "acts": sum(a["group_id"][i] == bad for i in acts), "lines": sum(t["group_id"][i] == bad for i in lines)}
    return batch, lost


def forge_first(rid: str, local: LocalResult, spoil, lost: dict):
    """What to do during the run: once host 0 is placed, publish its round-1 batch (spoiled by
    `spoil(batch, spawn, lost)`) first, under the message id host 0 will use."""
    async def forge_host_0(nc):
        seen: asyncio.Future = asyncio.get_running_loop().create_future()

        async def on_spawn(msg):
            spawn = SpawnBatch.model_validate_json(msg.data)
            if spawn.host_id == "host-0" and not seen.done():
                seen.set_result(spawn)

        sub = await nc.subscribe(subjects.run_spawn(rid, "host-0"), cb=on_spawn)
        try:
            spawn = await asyncio.wait_for(seen, 60)
        finally:
            await sub.unsubscribe()
        batch, gone = forged(rid, spawn, local)
        lost.update(gone)
        msg_id = subjects.msg_id(rid, 1, f"{spawn.host_id}-0", "outcomes", spawn.epoch)
        await bus.publish_js(nc.jetstream(), subjects.run_outcomes(rid, 1, spawn.host_id), spoil(batch, spawn, lost),
                             msg_id=msg_id)

    return forge_host_0


def test_a_bad_group_is_refused_alone_and_the_run_ends_incomplete_saying_why(stack, cli):
    data = bargaining(20, latency_s=0.5, rounds=1)
    prepared = prepare(RunConfig.model_validate(data))
    local = asyncio.run(run_local(prepared.resolved))
    rid = new_run_id()
    lost: dict = {}
    forge_host_0 = forge_first(rid, local, lambda batch, spawn, lost: batch, lost)  # its act moved: one bad group
    _, out = fleet(stack, data, during=forge_host_0, run_id=rid)
    why = (f"round 1: {lost['outcomes']} of 20 outcomes, {lost['acts']} acts and {lost['lines']} lines missing "
           f"(group {lost['group']} of host-0@0 refused: acts.agent_id: agent {lost['intruder']} is in group "
           f"{lost['other']}, not group {lost['group']})")
    assert (out.status, out.reason) == ("incomplete", why)
    assert (out.recorded.outcomes, out.recorded.outcomes_missing, out.recorded.acts_missing,
            out.recorded.lines_missing) == (20 - lost["outcomes"], lost["outcomes"], lost["acts"], lost["lines"])
    # the rest is recorded as played: every row but the refused group's
    drop = lambda cols: {k: [v for v, g in zip(vals, cols["group_id"]) if g != lost["group"]]  # noqa: E731
                         for k, vals in cols.items()}
    assert_as_in_one_process(stack.db, rid, LocalResult(rid, local.config, local.tables, outcomes=drop(
        local.outcomes), rounds=local.rounds, acts=drop(local.acts), transcripts=drop(local.transcripts)))
    assert table(stack.db, "runs", rid, "run_id")[0]["status"] == "incomplete"

    async def as_the_manager_reads_it():  # its run page: the state (KV runs) and the run's RunRecorded
        nc = await bus.connect(stack.url, "e2e-scene-batches")
        try:
            return status_as_recorded(await run_state(nc, rid), await recorded_event(nc, rid))
        finally:
            await nc.close()

    assert asyncio.run(as_the_manager_reads_it()) == ("incomplete", why)
    res = cli("results", rid, "--json", "--db", stack.db, "--nats", stack.url)
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    assert (run["status"], run["reason"]) == ("incomplete", why)


def test_a_batch_refused_whole_is_waited_for_then_the_run_ends_incomplete_saying_so(stack):
    """Host 0's batch forged with a column the run does not have: refused whole (dead-lettered),
    and the host's own is dropped as its duplicate. Its outcomes never come: the recorder stops
    waiting once none came for POPULACE_RECORDER_MISSING_WAIT_S (5 s here) and says so."""
    data = bargaining(20, latency_s=0.5, rounds=1)
    local = asyncio.run(run_local(prepare(RunConfig.model_validate(data)).resolved))
    rid = new_run_id()
    lost: dict = {}

    def extra_column(batch, spawn, lost):
        lost["agents"] = spawn.ranges[0][1]
        return batch.model_copy(update={"columns": {**batch.columns, "bonus": [1] * len(batch.agent_ids)}})

    _, out = fleet(stack, data, during=forge_first(rid, local, extra_column, lost), run_id=rid)
    n = lost["agents"]
    assert (out.status, out.reason) == ("incomplete", (
        f"round 1: {n} of 20 outcomes missing ({n} never arrived: none came in 5s); a batch of host-0, round 1, was "
        "refused: columns ['bonus', 'deal', 'partner', 'role', 'share', 'turns'] are not the run's outcome columns "
        "['deal', 'partner', 'role', 'share', 'turns']"))
    assert (out.recorded.outcomes, out.recorded.outcomes_missing) == (20 - n, n)
