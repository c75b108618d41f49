"""What one host's credentials can no longer do to a run through the gateway and the dead-letter
queue (issue 26, items 6 and 7; item 1 is in test_fuzz_e2e and test_reply_subjects).

Users are on exactly as deploy/AUTH.md describes: one NATS user per service, and per agent-host
(`populace auth host`). Two hosts play; the attacker holds the credentials of a third, `host-9`,
a fleet member placed in no run. A simulated replica answers the `sim` runs, so the gateway
records LLM calls. Each test plays an attacked run beside an undisturbed one (the two dummy
attacks share theirs), and asserts that the attack changed no result and stalled nothing:
- a flood of 4,500 inference requests, each within the gateway's caps (a dummy batch of 59 s),
  used to hold every gateway worker and paused the run; now the flooder gets its fair share;
- batches sent first under the ids a host would use (`<host>.<run>.<round>.<k>`) used to make
  the gateway drop that host's real call records as duplicates; now ids are unguessable and
  bound to the requester, and call records from a requester holding none of those agents are
  refused;
- 40 junk messages of 256 KiB used to be copied whole into the DLQ (no byte limit); now a dead
  letter is the message's reference and a 1 KiB excerpt, and RUN and DLQ have byte and age
  limits."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import duckdb
import nats
import pytest
from nats.js.api import DiscardPolicy

from populace.client.prepare import prepare
from populace.client.run import new_run_id, play
from populace.client.stack import Stack
from populace.core import subjects
from populace.core.contracts import RunConfig
from populace.core.hostauth import with_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
AUTH_CONF = ROOT / "deploy" / "nats" / "auth.conf"
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
HOSTS = ("host-0", "host-1", "host-9")  # host-9: placed in no run; the attacker has its credentials
ATTACKER = "host-9"
DUMMY = {"agents": 400, "rounds": 2, "seed": 5, "model": {"latency_s": 0.2, "seed": 17}}
ON_SIM = {"agents": 200, "rounds": 2, "seed": 3, "model": {"backend": "sim", "seed": 21}}
FLOOD = 4500
JUNK, JUNK_BYTES = 40, 256 * 1024


@pytest.fixture(scope="module")
def stack(tmp_path_factory, stacks):
    """Every service and host connects as its own NATS user, with its own permissions, though they
    share one process (the attacks are about what a user may do, which the server enforces per
    connection); the replica registrar has a process of its own."""
    tmp = tmp_path_factory.mktemp("gateway-attacks")
    users = {u: f"attacks-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
    conf = tmp / "auth.conf"
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{users[u]}"\n' for u in USERS)
    conf.write_text(defs + with_hosts(AUTH_CONF.read_text(), {h: users[h] for h in HOSTS}))
    # The replica registrar (an `extra` process) connects as `replicas`: the services and hosts
    # override these with their own users. A model path down for 30 s (not 120) pauses the run,
    # so a stalled run shows as one in this test's time.
    env = {"POPULACE_NATS_USER": "replicas", "POPULACE_NATS_PASSWORD": users["replicas"],
           "POPULACE_INFER_DOWN_S": "30", "POPULACE_STORAGE": "memory"}
    return stacks(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=["-c", str(conf)], env=env,
                  extra={"replicas-sim": ["replicas", "sim", "--count", "1"]}, replicas=1, one_process=True,
                  timeout=120)


def run(stack: Stack, scenario: dict, before=None, at_round_1=None):
    """Play `scenario` as `cli`; as the attacker, `before(nc, rid)` runs before the run is
    submitted and `at_round_1(nc, rid)` once round 1 opens."""
    prepared = prepare(RunConfig.model_validate(scenario))
    rid = new_run_id()

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        attacker = await nats.connect(stack.url, **stack.credentials(ATTACKER))
        fired: list[asyncio.Task] = []

        def on_event(kind, model) -> None:
            if at_round_1 is not None and kind == "round.open" and model.round == 1 and not fired:
                fired.append(asyncio.get_running_loop().create_task(at_round_1(attacker, rid)))

        try:
            if before is not None:
                await before(attacker, rid)
            out = await play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=240,
                             on_event=on_event)
            if fired:
                await fired[0]
            return out
        finally:
            await attacker.close()
            await nc.close()

    out = asyncio.run(go())
    assert out.status == "completed", (out.status, out.reason)
    assert out.recorded is not None and out.recorded.outcomes == scenario["agents"] * scenario["rounds"]
    return rid, out


def rows(db: str, sql: str, rid: str) -> list[tuple]:
    with duckdb.connect(db, read_only=True) as con:
        return con.execute(sql, [rid]).fetchall()


def guesses(db: str, rid: str) -> list[tuple]:
    return rows(db, "SELECT round, agent_id, value, valid, raw FROM guesses WHERE run_id = ? "
                    "ORDER BY round, agent_id", rid)


def calls(db: str, rid: str) -> list[tuple]:
    return rows(db, "SELECT round, agent_id, count(*), bool_and(valid) FROM llm_calls WHERE run_id = ? "
                    "GROUP BY round, agent_id ORDER BY round, agent_id", rid)


def infer_body(rid: str, batch_id: str, keys: list[int], model: dict, round_: int = 1) -> bytes:
    return json.dumps({"batch_id": batch_id, "run_id": rid, "round": round_, "model": model, "system": "s",
                       "keys": keys, "prompts": ["p"] * len(keys)}).encode()


async def ask_everywhere(nc, body: bytes, tag: str) -> None:
    """As the attacker: on every inference subject it might publish, the bare `llm.infer` of
    before and its own `llm.infer.<user>` of now (the server refuses the one it may not)."""
    for subject in ("llm.infer", f"llm.infer.{ATTACKER}"):
        await nc.publish(subject, body, reply=f"reply.gateway.{ATTACKER}.{tag}")


@pytest.fixture(scope="module")
def dummy_reference(stack) -> str:
    """The undisturbed DUMMY run both of its attacked runs are compared with (the same config and
    seeds play the same guesses on the same stack)."""
    reference, _ = run(stack, DUMMY)
    return reference


def test_a_flood_within_the_gateways_caps_stalls_no_other_host(stack, dummy_reference):
    """Item 7: 4,500 requests from one host, each within the caps, held every worker of the
    gateway (4,096) for a minute: the other hosts' batches found none, and the run paused."""
    reference = dummy_reference

    async def flood(nc, rid: str) -> None:
        model = {"backend": "dummy", "latency_s": 59.0}
        for i in range(FLOOD):
            await ask_everywhere(nc, infer_body(rid, f"flood-{i}", [i % 400], model), str(i))
        await nc.flush()

    flooded, out = run(stack, DUMMY, before=flood)
    assert guesses(stack.db, flooded) == guesses(stack.db, reference)
    assert [r.round for r in out.results] == [1, 2]
    stack.check_alive()


def test_an_event_whose_reply_to_header_names_a_run_state_makes_no_service_write_it(stack, dummy_reference):
    """Item 1, beyond the gateway: FastStream answers a JetStream message on its `reply_to`
    header with what the handler returned (None: an empty message), as the consuming service.
    A spawned report from host-9 (placed in no run: ignored) with `reply_to: $KV.runs.<rid>` had
    the orchestrator blank the run's state, and the run stalled for good."""
    reference = dummy_reference

    async def deputy(nc, rid: str) -> None:
        js = nc.jetstream()
        body = json.dumps({"run_id": rid, "host_id": ATTACKER, "agents": 1, "seconds": 0.0}).encode()
        for target in (f"$KV.runs.{rid}", "$KV.hosts.host-0", f"run.{rid}.round.2.result"):
            await js.publish(subjects.run_spawned(rid, ATTACKER), body, headers={"reply_to": target})

    attacked, _ = run(stack, DUMMY, at_round_1=deputy)
    assert guesses(stack.db, attacked) == guesses(stack.db, reference)
    stack.check_alive()


def test_call_records_sent_first_under_a_hosts_batch_ids_replace_none(stack):
    """Item 6: batch ids were `<host>.<run>.<round>.<k>`, k counting from 0 in each host process,
    and the gateway de-duplicated call records by batch id alone: another host that sent those
    ids first had the real records dropped (1,536 rows of 3,000)."""
    reference, _ = run(stack, ON_SIM)
    share = {"host-0": list(range(100)), "host-1": list(range(100, 200))}

    async def pre_empt(nc, rid: str) -> None:
        model = {"backend": "sim", "seed": 21}
        for host, agents in share.items():
            for round_ in (1, 2):
                for k in range(60):
                    batch_id = f"{host}.{rid}.{round_}.{k}"
                    await ask_everywhere(nc, infer_body(rid, batch_id, agents[:1], model, round_), batch_id)
        await nc.flush()

    async def intrude(nc, rid: str) -> None:
        """Calls about host-0's agents under ids of its own, once the run is known: rows added."""
        model = {"backend": "sim", "seed": 21}
        for i in range(20):
            await ask_everywhere(nc, infer_body(rid, f"intruder-{i}", share["host-0"][:10], model, 2), f"i{i}")
        await nc.flush()

    attacked, _ = run(stack, ON_SIM, before=pre_empt, at_round_1=intrude)
    assert calls(stack.db, attacked) == calls(stack.db, reference)
    assert len(calls(stack.db, attacked)) == ON_SIM["agents"] * ON_SIM["rounds"]
    assert guesses(stack.db, attacked) == guesses(stack.db, reference)
    stack.check_alive()


def test_junk_is_dead_lettered_by_reference_and_the_streams_are_bounded(stack):
    """Item 7: 150 MB of junk outcome messages became 314 MB stored: RUN had no byte limit, and
    the recorder copied every bad message whole into a DLQ without one either."""

    async def go():
        admin = await nats.connect(stack.url, **stack.credentials("admin"))
        attacker = await nats.connect(stack.url, **stack.credentials(ATTACKER))
        try:
            js, ajs = admin.jetstream(), attacker.jetstream()
            dlq_before = (await js.stream_info(subjects.DLQ_STREAM)).state
            rid = new_run_id()  # a run that was never started: every message is refused
            sent = []
            for i in range(JUNK):
                ack = await ajs.publish(subjects.run_outcomes(rid, 1, ATTACKER), bytes([i]) * JUNK_BYTES)
                sent.append(ack.seq)
            for _ in range(600):
                letters = [m for m in await recorder_letters(js, dlq_before.last_seq) if
                           str(m.headers.get("Populace-Subject")) == subjects.run_outcomes(rid, 1, ATTACKER)]
                if len(letters) >= JUNK:
                    break
                await asyncio.sleep(0.1)
            dlq_after = (await js.stream_info(subjects.DLQ_STREAM)).state
            run_cfg = (await js.stream_info(subjects.RUN_STREAM)).config
            dlq_cfg = (await js.stream_info(subjects.DLQ_STREAM)).config
            return letters, sent, dlq_after.bytes - dlq_before.bytes, run_cfg, dlq_cfg
        finally:
            await attacker.close()
            await admin.close()

    letters, sent, grown, run_cfg, dlq_cfg = asyncio.run(go())
    assert len(letters) == JUNK  # each dead-lettered once
    assert grown < JUNK * 4096, grown  # references and excerpts: before, 40 × 256 KiB
    assert sorted(int(str(m.headers["Populace-Sequence"])) for m in letters) == sorted(sent)
    for m in letters:
        h = {k: str(v) for k, v in m.headers.items()}
        assert (h["Populace-Size"], h["Populace-Stream"], h["Populace-Sender"]) == (
            str(JUNK_BYTES), subjects.RUN_STREAM, ATTACKER), h
        assert len(m.data) == 1024 and h["Populace-Truncated"] == "1"
    for cfg in (run_cfg, dlq_cfg):
        assert cfg.max_bytes and cfg.max_bytes > 0 and cfg.max_age and cfg.max_age > 0, cfg
    # a full RUN refuses new events, never drops unrecorded ones
    assert DiscardPolicy(run_cfg.discard) == DiscardPolicy.NEW


async def recorder_letters(js, after_seq: int) -> list:
    out = []
    info = await js.stream_info(subjects.DLQ_STREAM)
    for seq in range(max(after_seq + 1, info.state.first_seq), info.state.last_seq + 1):
        try:
            m = await js.get_msg(subjects.DLQ_STREAM, seq)
        except Exception:
            continue
        if m.subject == subjects.dlq("recorder"):
            out.append(m)
    return out
