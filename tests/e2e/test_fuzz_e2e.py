"""Fuzzing the bus against a live run (real nats-server, real services, DuckDB).

While a run of 2,000 agents × 4 rounds is in its second round, an attacker publishes on every
subject family: random bytes, empty payloads, wrong schemas, absurd values (NaN, negative and
huge ids, a guess of 1e308, rounds that do not exist), replays of recorded outcomes under fresh message ids and
without any, forgeries from a host, range, round or epoch the run never placed, a forged round
open for a later round, inference requests that ask the gateway for an hour, inference requests
whose reply subject is a JetStream API call, the run's KV state or another user's inbox (the
gateway must not publish there for them), and a flood. Then:
- every service is still up, and the run completed;
- its recorded results equal an undisturbed run's (dummy model, same seed): every agent's
  answer in every round, every round's summary;
- each bad message the attacker could publish is in the DLQ, and no service dead-lettered
  the same message twice;
- the services' logs stayed small (one line per bad message, not a loop).

It runs twice: on an open bus, and with one NATS user per service and per host
(deploy/nats/auth.conf, populace.core.hostauth), where the attacker holds host-1's credentials
(a compromised host): what its user may not publish, the server refuses before any service
sees it, and the message ids it could predict are sealed with each publisher's password."""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
from pathlib import Path

import nats
import pytest
from locked_reads import read_recorded

from populace.client.prepare import prepare
from populace.client.run import new_run_id, play
from populace.client.stack import ONE_PROCESS, Stack
from populace.core import bus, replies, subjects
from populace.core.contracts import RunConfig
from populace.core.hostauth import with_hosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
AUTH_CONF = ROOT / "deploy" / "nats" / "auth.conf"
USERS = ("orchestrator", "environment", "gateway", "recorder", "agent-host", "replicas", "node", "cli", "manager",
         "admin")
AGENTS, ROUNDS = 2000, 4
CONFIG = {"agents": AGENTS, "rounds": ROUNDS, "seed": 5, "model": {"latency_s": 0.5, "seed": 17}}
FLOOD = 2000
ATTACKER = "host-1"  # with users: the compromised host whose credentials the attacker holds
LOG_BUDGET_BYTES = 4 * 1024 * 1024  # every service's log over the whole module


HOSTS = ("host-0", "host-1")


def auth_conf(tmp: Path, passwords: dict[str, str]) -> Path:
    """The deploy file with a user per host added, its password variables defined up front."""
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{passwords[u]}"\n' for u in USERS)
    path = tmp / "auth.conf"
    path.write_text(defs + with_hosts(AUTH_CONF.read_text(), {h: passwords[h] for h in HOSTS}))
    return path


@pytest.fixture(scope="module", params=["open-bus", "one-user-per-service"])
def stack(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    users = None
    args: list[str] = []
    if request.param == "one-user-per-service":
        users = {u: f"fuzz-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
        args = ["-c", str(auth_conf(tmp, users))]
    # one process for every service (each built with its own NATS user, host id and identity):
    # nothing here kills, restarts or measures one, and each log line names its service
    s = Stack(hosts=2, db=str(tmp / "populace.duckdb"), users=users, nats_args=args,
              env={"POPULACE_LOG_LEVEL": "info"}, one_process=True)
    with s.up(timeout=90):
        yield s


def run_with(stack: Stack, attack=None) -> str:
    """Play CONFIG as `cli`; `attack(nc_attacker, run_id)` runs once round 2 opens."""
    prepared = prepare(RunConfig.model_validate(CONFIG))
    rid = new_run_id()

    async def go():
        nc = await nats.connect(stack.url, **stack.credentials("cli"))
        attacker = await nats.connect(stack.url, **stack.credentials(ATTACKER if stack.users else "agent-host"))
        fired: list[asyncio.Task] = []

        def on_event(kind, model) -> None:
            if attack is not None and kind == "round.open" and model.round == 2 and not fired:
                fired.append(asyncio.get_running_loop().create_task(attack(attacker, rid)))

        try:
            out = await play(nc, prepared.config, run_id=rid, manifest=prepared.manifest, stall_s=180,
                             on_event=on_event)
            if fired:
                await fired[0]
            return out
        finally:
            await attacker.close()
            await nc.close()

    out = asyncio.run(go())
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == AGENTS * ROUNDS
    return rid


def read_db(db: str, sql: str, params: list) -> list[tuple]:
    """Rows of a recorded run. A re-created durable redelivers what the recorder had not
    acknowledged, after the run is recorded: a reader meeting the recorder's lock on the file
    tries again (locked_reads)."""
    return read_recorded(db, lambda con: con.execute(sql, params).fetchall())


def answers(db: str, rid: str) -> list[tuple]:
    return read_db(db, "SELECT round, agent_id, value, valid, raw FROM guesses WHERE run_id = ? "
                       "ORDER BY round, agent_id", [rid])


def summaries(db: str, rid: str) -> list[tuple]:
    return read_db(db, "SELECT round, n, n_valid, mean, target, winner_agent_id, winner_value, n_winners, "
                       "llm_calls FROM rounds WHERE run_id = ? ORDER BY round", [rid])


def forgeries(rid: str, requester: str) -> list[tuple[str, bytes, dict | None]]:
    """(subject, payload, headers): every payload distinct, so its DLQ copies can be counted.
    Host subjects are the attacker's own (`me`), which its user may publish on, but for a few
    that claim the other host's."""
    rng = random.Random(7)
    me, other = ATTACKER, "host-0"
    out: list[tuple[str, bytes, dict | None]] = []
    families = [subjects.run_partial(rid, 2, me, 0), subjects.run_outcomes(rid, 2, me),
                subjects.run_spawned(rid, me), subjects.run_round_open(rid, 3),
                subjects.run_round_result(rid, 2), subjects.run_done(rid), subjects.run_fault(rid, me),
                subjects.llm_infer(requester), subjects.RUN_START, subjects.RUN_CANCEL]
    for subject in families:
        out.append((subject, rng.randbytes(64), None))  # random bytes
        out.append((subject, b"", {"Nats-Msg-Id": f"empty-{subject}"}))  # empty payload
        out.append((subject, json.dumps({"hello": subject}).encode(), None))  # wrong schema

    def outcomes(seq: int, host: str, round_: int, ids: list, value=50.0, epoch: int = 0, run: str = rid) -> bytes:
        n = len(ids)
        return json.dumps({"run_id": run, "round": round_, "host_id": host, "seq": seq, "agent_ids": ids,
                           "columns": {"value": [value] * n}, "valid": [True] * n, "raws": ["x"] * n,
                           "latency_ms": [1.0] * n, "errors": [None] * n, "epoch": epoch}).encode()

    def partial(host: str, round_: int, n: int, payload: dict, epoch: int = 0, run: str = rid) -> bytes:
        return json.dumps({"run_id": run, "round": round_, "host_id": host, "n": n, "n_valid": n,
                           "payload": payload, "epoch": epoch}).encode()

    good_partial = {"n_valid": 10, "total": 0.0, "by_value": [[0.0, 10, 0]]}  # the ratio game's: ten 0s
    mine = list(range(1000, 1010))  # agents of the attacker's share (host-1 plays 1000-1999)
    out += [
        # absurd values
        (subjects.run_outcomes(rid, 2, me), outcomes(901, me, 2, [-5, 10**15]), None),
        (subjects.run_outcomes(rid, 2, me), outcomes(902, me, 2, mine[:2]).replace(b"50.0", b"NaN"), None),
        (subjects.run_outcomes(rid, 2, me), outcomes(903, me, 2, mine[2:3], value=1e308), None),  # out of range
        (subjects.run_partial(rid, 2, me, 0), partial(me, 2, 1000, {"by_value": [[float("nan"), 1, 0]]}), None),
        (subjects.run_partial(rid, 99, me, 0), partial(me, 99, 1000, good_partial), None),
        # a run that does not exist
        (subjects.run_outcomes("no-such-run", 1, me), outcomes(904, me, 1, [0], run="no-such-run"), None),
        (subjects.run_partial("no-such-run", 1, me, 0), partial(me, 1, 1, good_partial, run="no-such-run"), None),
        # replays of round 1 (recorded) under a fresh id and without one
        (subjects.run_outcomes(rid, 1, me), outcomes(905, me, 1, list(range(1000, 1100)), value=99.0),
         {"Nats-Msg-Id": f"{rid}.replay-1"}),
        (subjects.run_outcomes(rid, 1, me), outcomes(906, me, 1, list(range(1100, 1200)), value=98.0), None),
        (subjects.run_outcomes(rid, 1, other), outcomes(911, other, 1, list(range(100)), value=97.0), None),
        # forgeries: a host the run never placed, another host's agents, an epoch never placed,
        # a body claiming another host than its subject, a round the run does not have
        (subjects.run_outcomes(rid, 2, "host-9"), outcomes(907, "host-9", 2, list(range(10)), value=0.0), None),
        (subjects.run_partial(rid, 2, "host-9", 0), partial("host-9", 2, AGENTS, good_partial), None),
        (subjects.run_outcomes(rid, 3, me), outcomes(908, me, 3, list(range(10)), value=1.0), None),
        (subjects.run_outcomes(rid, 2, me), outcomes(909, me, 2, mine, epoch=7), None),
        (subjects.run_partial(rid, 2, me, 7), partial(me, 2, 1000, good_partial, epoch=7), None),
        (subjects.run_outcomes(rid, 2, me), outcomes(912, other, 2, list(range(10)), value=2.0), None),
        (subjects.run_partial(rid, 2, me, 0), partial(other, 2, 1000, good_partial), None),
        (subjects.run_partial(rid, 2, other, 0), partial(me, 2, 1000, good_partial), None),
        (subjects.run_outcomes(rid, 5, me), outcomes(910, me, 5, [1500]), None),
    ]
    # valid events of a run that does not exist (a redelivery loop and 318 MB of log, before)
    out.append((subjects.RUN_CANCEL, json.dumps({"run_id": "no-such-run", "reason": "fuzz"}).encode(), None))
    out.append((subjects.run_round_result("no-such-run", 1), json.dumps({
        "run_id": "no-such-run", "round": 1, "n": 1, "n_valid": 1, "summary": {}, "observation": {}, "state": {},
        "closed_at": 0.0}).encode(), None))
    # a round open for a later round (a stalled run, before), naming a config nobody stored
    out.append((subjects.run_round_open(rid, 4), json.dumps({
        "run_id": rid, "round": 4, "expected": AGENTS, "config_ref": {"digest": "f" * 64, "from_round": 1},
        "opened_at": 0.0, "epoch": 0, "shares": {"host-0@0": 1000, "host-1@0": 1000}}).encode(), None))
    # the same in the shape round opens had before they named the config by digest: refused as malformed
    out.append((subjects.run_round_open(rid, 4), json.dumps({
        "run_id": rid, "round": 4, "expected": AGENTS, "config": CONFIG, "opened_at": 0.0, "epoch": 0,
        "shares": {"host-0@0": 1000, "host-1@0": 1000}}).encode(), None))
    # the flood: junk partials, each distinct
    out += [(subjects.run_partial(rid, 2, me, 0), b"flood-%d" % i, None) for i in range(FLOOD)]
    return out


def deputy_requests(rid: str, requester: str) -> list[tuple[str, bytes, str]]:
    """Valid inference requests whose reply subject is not the requester's: a JetStream API
    call (the gateway's first keepalive is an empty body, a valid API request), the run's state
    in KV, another user's inbox or replies. Before, the gateway published there: one deleted RUN."""
    base = {"run_id": rid, "round": 2, "system": "s", "keys": [1], "prompts": ["p"], "model": {"backend": "dummy"}}
    targets = ["$JS.API.STREAM.DELETE.RUN", "$JS.API.STREAM.PURGE.RUN", f"$KV.runs.{rid}",
               "$JS.API.CONSUMER.DELETE.RUN.recorder", "_INBOX_recorder.x", "reply.gateway.host-0.x"]
    return [(subjects.llm_infer(requester), json.dumps({**base, "batch_id": f"deputy-{i}"}).encode(), target)
            for i, target in enumerate(targets)]


def greedy_requests(rid: str) -> list[bytes]:
    """Inference requests that would hold a gateway worker for an hour, or ask a huge answer."""
    base = {"run_id": rid, "round": 2, "system": "s", "keys": [1], "prompts": ["p"]}
    return [json.dumps({**base, "batch_id": f"greedy-{i}", "model": {"backend": "dummy", "latency_s": 3600}}).encode()
            for i in range(50)] + [
        json.dumps({**base, "batch_id": "huge", "model": {"backend": "dummy", "max_tokens": 8192}}).encode()]


def predicted_ids(rid: str) -> list[tuple[str, bytes, dict | None]]:
    """Junk on the attacker's own subject under the message ids host-0's next outcome batches
    and partial would have on an open bus: JetStream de-duplicates across subjects, so a
    guessed id published first would make it drop host-0's real batch."""
    out = []
    for n in (3, 4):
        for seq in range(2):
            guess = subjects.msg_id(rid, n, f"host-0-{seq}", "outcomes")
            out.append((subjects.run_outcomes(rid, n, ATTACKER), b"predicted " + guess.encode(),
                        {"Nats-Msg-Id": guess}))
        guess = subjects.msg_id(rid, n, "host-0", "partial")
        out.append((subjects.run_partial(rid, n, ATTACKER, 0), b"predicted " + guess.encode(), {"Nats-Msg-Id": guess}))
    return out


async def attack(nc, rid: str, sent: list[tuple[str, bytes]], answers: list[bytes], sealed: bool) -> None:
    requester = replies.requester(nc)
    for subject, payload, headers in forgeries(rid, requester) + (predicted_ids(rid) if sealed else []):
        await nc.publish(subject, payload, headers=headers)
        sent.append((subject, payload))
    for subject, payload, reply_to in deputy_requests(rid, requester):
        await nc.publish(subject, payload, reply=reply_to, headers={subjects.INFER_KEEPALIVE_HEADER: "1"})
        sent.append((subject, payload))
    for req in greedy_requests(rid):
        try:
            answers.append((await replies.request(nc, "gateway", subjects.llm_infer(requester), req, timeout=10)).data)
        except Exception as err:
            answers.append(repr(err).encode())
    await nc.flush()


async def dead_letters(stack: Stack) -> list[tuple[str, str, bytes, str]]:
    """(refusing process, original subject, payload, reason) of every message in DLQ."""
    nc = await nats.connect(stack.url, **stack.credentials("admin"))
    try:
        js = nc.jetstream()
        info = await js.stream_info(subjects.DLQ_STREAM)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                m = await js.get_msg(subjects.DLQ_STREAM, seq)
            except Exception:
                continue
            h = m.headers or {}
            out.append((h.get("Populace-Instance", m.subject), h.get("Populace-Subject", ""), m.data or b"",
                        h.get("Populace-Error", "")))
        return out
    finally:
        await nc.close()


def log_bytes(stack: Stack) -> int:
    return sum(p.stat().st_size for p in Path(stack.log_dir).glob("*.log") if p.name != "nats-server.log")


@pytest.fixture(scope="module")
def reference(stack) -> str:
    """The undisturbed run both tests compare with: played once per stack (the dummy model's
    answers depend on the seed alone, so a second copy would record the same rows)."""
    return run_with(stack)


def test_a_fuzzed_bus_leaves_the_run_exact_the_services_up_and_each_bad_message_dead_lettered_once(stack, reference):
    before = asyncio.run(dead_letters(stack))
    logs_before = log_bytes(stack)
    sent: list[tuple[str, bytes]] = []
    answers_: list[bytes] = []
    fuzzed = run_with(stack, lambda nc, rid: attack(nc, rid, sent, answers_, sealed=stack.users is not None))
    assert len(sent) >= FLOOD + 40

    # the run is exact
    assert answers(stack.db, fuzzed) == answers(stack.db, reference)
    assert summaries(stack.db, fuzzed) == summaries(stack.db, reference)
    assert read_db(stack.db, "SELECT count(*) FROM guesses WHERE run_id = ?", ["no-such-run"]) == [(0,)]
    stack.check_alive()

    # each bad message: in the DLQ (unless the server refused it), never twice in one service's
    dlq = asyncio.run(dead_letters(stack))[len(before):]
    copies: dict[tuple[str, str, bytes], int] = {}
    for process, subject, payload, _ in dlq:
        copies[(process, subject, payload)] = copies.get((process, subject, payload), 0) + 1
    twice = {k: n for k, n in copies.items() if n > 1}
    assert not twice, list(twice)[:5]
    # a dead letter keeps an excerpt of its message (and its reference), not an unbounded copy
    lettered = {(subject, payload) for _, subject, payload, _ in dlq}
    assert all(len(payload) <= bus.DLQ_EXCERPT_BYTES for _, _, payload, _ in dlq)
    allowed = allowed_subjects(stack)
    missing = [(s, p[:80]) for s, p in sent if allowed(s) and (s, p[:bus.DLQ_EXCERPT_BYTES]) not in lettered]
    assert not missing, missing[:10]

    # the greedy requests got an explicit refusal, at once
    assert all(b"above this gateway's limit" in r or b"Permissions Violation" in r or b"permissions" in r.lower()
               for r in answers_), answers_[:3]

    # one log line per bad message at most, no loop
    grown = log_bytes(stack) - logs_before
    assert grown < LOG_BUDGET_BYTES, grown


def allowed_subjects(stack: Stack):
    """Whether the attacker's user may publish on a subject (its host user: its own subjects)."""
    if stack.users is None:
        return lambda subject: True
    h = re.escape(ATTACKER)
    patterns = [rf"run\.[^.]+\.spawned\.{h}", rf"run\.[^.]+\.outcomes\.[^.]+\.{h}",
                rf"run\.[^.]+\.partial\.[^.]+\.{h}\.[^.]+", rf"run\.[^.]+\.fault\.{h}", rf"llm\.infer\.{h}"]
    return lambda subject: any(re.fullmatch(p, subject) for p in patterns)


def test_service_durables_changed_or_deleted_mid_run_are_recreated_and_the_run_stays_exact(stack, reference):
    """Round 2 in play, the recorder's durable is retargeted to a filter that matches nothing
    (an update: it keeps its position and skips what arrives) and the environment's partials
    durable is deleted — what a host's credentials could do before (issue 26, item 2), done here
    as `admin`. Their owners notice (populace.core.durables), re-create them from their last
    acknowledged message and say so; the run completes, recorded in full and exact."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    async def tamper(_attacker, rid: str) -> None:
        nc = await nats.connect(stack.url, **stack.credentials("admin"))
        try:
            js = nc.jetstream()
            await js.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
                durable_name="recorder", name="recorder", filter_subject="nothing.>",
                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL))
            await js.delete_consumer(subjects.RUN_STREAM, "environment-partial")
        finally:
            await nc.close()

    def recreated() -> dict[str, int]:  # per service, from the log the services share
        events = [json.loads(line) for line in Path(stack.log_dir, f"{ONE_PROCESS}.log").read_text().splitlines()
                  if line.startswith("{")]
        return {k: sum(e.get("event") == "durable_recreated" and e.get("service") == k for e in events)
                for k in ("recorder", "environment", "orchestrator")}

    assert recreated() == {"recorder": 0, "environment": 0, "orchestrator": 0}, "a durable as its owner made it was re-created"
    tampered = run_with(stack, tamper)
    assert answers(stack.db, tampered) == answers(stack.db, reference)
    assert summaries(stack.db, tampered) == summaries(stack.db, reference)
    assert recreated() == {"recorder": 1, "environment": 1, "orchestrator": 0}
    stack.check_alive()
