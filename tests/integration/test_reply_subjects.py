"""A service answers a request only on the requester's own reply subject (issue 26, item 1).

With users on exactly as deploy/AUTH.md describes (deploy/nats/auth.conf, a user of its own
per agent-host), the gateway, the recorder and a node run as their own users. An attacker holds
ONE user's credentials (a host's, the manager's, the cli's) and sends each responder a valid
request on every request subject that user may publish, whose reply subject is somewhere the
responder may not be made to write: a JetStream API call (`$JS.API.STREAM.DELETE.RUN`, a
purge), a KV key (`$KV.runs.<rid>`), another user's inbox or reply subject. Before, the
responders' `allow_responses` let the reply go there: one `llm.infer` deleted stream RUN.

Now nothing is deleted, purged or overwritten, nobody else hears anything, each such request
is dead-lettered once naming its sender, and the responder still answers the same user on its
own reply subject."""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nats
import nats.errors
import pytest

from populace.core import bus, subjects
from populace.core.contracts import AgentsRequest, InferBatch, ListProcesses, ModelConfig, ServiceInfo
from populace.core.hostauth import with_hosts
from populace.core.natsserver import EmbeddedNats
from populace.core.processes import stop_all

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
USERS = [u.lower().replace("_", "-") for u in re.findall(r"\$([A-Z_]+)_PASSWORD\b", DEPLOY_CONF.read_text())]
HOSTS = ("host-a", "host-b")
PASSWORDS = {u: f"replies-{u}-pw" for u in (*USERS, *HOSTS)}
NODE_ID = "node-r"
VICTIM = "r-victim"  # a run whose state the attacker would overwrite


def deputy_replies(other: str) -> list[str]:
    """Reply subjects no requester owns: stream and KV writes, another user's inbox and replies."""
    return ["$JS.API.STREAM.DELETE.RUN", "$JS.API.STREAM.PURGE.RUN", f"$KV.runs.{VICTIM}",
            "_INBOX_recorder.stolen", other]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("replies")
    conf = tmp / "auth.conf"
    defs = "".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{PASSWORDS[u]}"\n' for u in USERS)
    conf.write_text(defs + with_hosts(DEPLOY_CONF.read_text(), {h: PASSWORDS[h] for h in HOSTS}))
    log = tmp / "nats-server.log"
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(log)) as ns:
        ns.log_path = log
        procs = {}
        try:
            for name, args in (("gateway", ["service", "gateway"]), ("recorder", ["service", "recorder"]),
                               ("node", ["node", "--nats", ns.url, "--node-id", NODE_ID, "--log-dir",
                                         str(tmp / "node")])):
                env = {**os.environ, "POPULACE_NATS_URL": ns.url, "POPULACE_NATS_USER": name,
                       "POPULACE_NATS_PASSWORD": PASSWORDS[name], "POPULACE_DB": str(tmp / "populace.duckdb"),
                       "POPULACE_STORAGE": "memory", "POPULACE_PARENT_PID": str(os.getpid()),
                       "POPULACE_LOG_FORMAT": "json", "POPULACE_METRICS_PORT": "0", "OTEL_TRACES_EXPORTER": "none"}
                with open(tmp / f"{name}.log", "ab") as out:
                    procs[name] = subprocess.Popen([sys.executable, "-m", "populace.cli", *args], env=env,
                                                   stdout=out, stderr=out, start_new_session=True)
            asyncio.run(wait_registered(ns.url, procs, tmp))
            yield ns
        finally:
            assert stop_all(procs) == []


async def connect_as(url: str, user: str, errors: list[str] | None = None):
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    return await nats.connect(url, user=user, password=PASSWORDS[user], name=f"test-{user}",
                              inbox_prefix=bus.inbox_prefix(user), error_cb=on_error, allow_reconnect=False)


async def wait_registered(url: str, procs: dict, tmp: Path, timeout: float = 90.0) -> None:
    admin = await connect_as(url, "admin")
    try:
        js = admin.jetstream(timeout=2.0)
        await bus.provision(js, storage="memory")
        deadline = time.monotonic() + timeout
        while True:
            for name, p in procs.items():
                if p.poll() is not None:
                    raise AssertionError(f"{name} exited: {(tmp / f'{name}.log').read_text()[-2000:]}")
            try:
                up = {s.service for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)}
            except Exception:
                up = set()
            if {"gateway", "recorder", "node"} <= up:
                return
            assert time.monotonic() < deadline, f"not registered: {up}"
            await asyncio.sleep(0.2)
    finally:
        await admin.close()


async def seeded(url: str) -> tuple:
    """An admin connection, with RUN holding one event and KV runs one state to be kept."""
    admin = await connect_as(url, "admin")
    js = admin.jetstream(timeout=5.0)
    await bus.provision(js, storage="memory")
    await js.publish(f"run.{VICTIM}.started", b"{}")
    await (await js.key_value(subjects.RUNS_BUCKET)).put(VICTIM, b'{"the": "state"}')
    return admin, js


REQUESTS = {"gateway": "llm.infer", "recorder": "recorder.read.", "node": "node."}


async def dead_letters(js, service: str) -> list:
    """`service`'s dead letters of requests (not, say, the recorder's of the junk event seeded on RUN)."""
    out = []
    info = await js.stream_info(subjects.DLQ_STREAM)
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            m = await js.get_msg(subjects.DLQ_STREAM, seq)
        except Exception:
            continue
        if m.subject == subjects.dlq(service) and str((m.headers or {}).get("Populace-Subject", "")).startswith(
                REQUESTS[service]):
            out.append(m)
    return out


async def eventually_letters(js, service: str, n: int, heard: list) -> list:
    """Until `service` has dead-lettered `n` messages, checking all along that nothing was harmed."""
    deadline = time.monotonic() + 60  # a recorder's first read imports the analysis: slow on a busy machine
    while True:
        await nothing_harmed(js, heard)
        if len(letters := await dead_letters(js, service)) >= n:
            return letters
        assert time.monotonic() < deadline, f"{len(letters)} dead letters from {service}, expected {n}"
        await asyncio.sleep(0.1)


async def nothing_harmed(js, heard: list) -> None:
    """RUN still holds its event, KV runs its state, and nobody else heard a thing."""
    info = await js.stream_info(subjects.RUN_STREAM)  # NotFoundError: the stream was deleted
    assert info.state.messages >= 1, "stream RUN was purged"
    entry = await (await js.key_value(subjects.RUNS_BUCKET)).get(VICTIM)
    assert entry.value == b'{"the": "state"}', entry.value
    assert heard == []


async def listeners(url: str, other: str) -> tuple[list, list]:
    """Subscribers on the recorder's inbox and `other`'s reply subject the attack names: what reached them."""
    heard: list = []
    conns = []
    for user, subject in (("recorder", "_INBOX_recorder.stolen"), (other.split(".")[2], other)):
        nc = await connect_as(url, user)

        async def got(msg) -> None:
            heard.append(msg.subject)

        await nc.subscribe(subject, cb=got)
        await nc.flush()
        conns.append(nc)
    return heard, conns


async def attack(nc, subject_family: list[str], body: bytes, replies_to: list[str], headers=None) -> None:
    for subject in subject_family:
        for reply in replies_to:
            await nc.publish(subject, body, reply=reply, headers=headers)
    await nc.flush()


def check_letters(letters: list, sender: str, replies_to: list[str]) -> None:
    """One dead letter per refused request, naming its sender and the reply subject it wanted."""
    errors = [str(m.headers["Populace-Error"]) for m in letters]
    assert sorted(e.split("'")[1] for e in errors) == sorted(replies_to), errors
    for m, error in zip(letters, errors, strict=True):
        assert str(m.headers["Populace-Sender"]) == sender, m.headers
        assert f"is not one of requester {sender}'s" in error, error


async def test_the_gateway_answers_a_host_only_on_its_own_reply_subjects(stack):
    admin, js = await seeded(stack.url)
    errors: list[str] = []
    host = await connect_as(stack.url, "host-a", errors)
    other = "reply.gateway.host-b.stolen"
    heard, conns = await listeners(stack.url, other)
    try:
        batch = InferBatch(batch_id="b1", run_id=VICTIM, round=1, model=ModelConfig(latency_s=0.0), system="s",
                           keys=[0], prompts=["p"])
        # every inference subject host-a may publish (before: llm.infer, now: llm.infer.host-a),
        # asking for keepalives too: the gateway's first one is an empty body, a valid API request
        to = deputy_replies(other)
        await attack(host, ["llm.infer", "llm.infer.host-a"], bus.encode(batch), to,
                     headers={subjects.INFER_KEEPALIVE_HEADER: "1"})
        letters = await eventually_letters(js, "gateway", len(to), heard)
        await nothing_harmed(js, heard)
        check_letters(letters, "host-a", to)
        # host-a may not ask as another host
        await host.publish("llm.infer.host-b", bus.encode(batch), reply=other)
        await host.flush()
        # its own request is answered, on its own reply subject
        from populace.core import replies

        msg = await replies.request(host, "gateway", subjects.llm_infer("host-a"), bus.encode(batch), timeout=20)
        assert b'"texts"' in msg.data and msg.subject.startswith(subjects.reply_prefix("gateway", "host-a"))
        assert len(await dead_letters(js, "gateway")) == len(to)  # once each
        await nothing_harmed(js, heard)
    finally:
        for nc in (host, admin, *conns):
            await nc.close()
    gateway_violations = [line for line in stack.log_path.read_text().splitlines()
                          if "Violation" in line and "user:gateway" in line]
    assert gateway_violations == []


async def test_the_recorder_answers_a_reader_only_on_its_own_reply_subjects(stack):
    from populace.client.reads import ReadError, request_agents

    admin, js = await seeded(stack.url)
    manager = await connect_as(stack.url, "manager")
    other = "reply.recorder.cli.stolen"
    heard, conns = await listeners(stack.url, other)
    before = len(await dead_letters(js, "recorder"))
    try:
        to = deputy_replies(other)
        body = bus.encode(AgentsRequest(run_id=VICTIM))
        await attack(manager, ["recorder.read.agents", "recorder.read.agents.manager"], body, to)
        letters = (await eventually_letters(js, "recorder", before + len(to), heard))[before:]
        await nothing_harmed(js, heard)
        check_letters(letters, "manager", to)
        # its own read is answered (a refusal: the run was never recorded)
        with pytest.raises(ReadError, match=VICTIM):
            await request_agents(manager, VICTIM, timeout=90)  # its first read imports the analysis
        await nothing_harmed(js, heard)
    finally:
        for nc in (manager, admin, *conns):
            await nc.close()


async def test_a_node_answers_the_cli_only_on_its_own_reply_subjects(stack):
    from populace.client.nodes import node_request

    admin, js = await seeded(stack.url)
    cli = await connect_as(stack.url, "cli")
    other = "reply.node.manager.stolen"
    heard, conns = await listeners(stack.url, other)
    try:
        to = deputy_replies(other)
        body = bus.encode(ListProcesses())
        await attack(cli, [f"node.{NODE_ID}.list", f"node.{NODE_ID}.list.cli"], body, to)
        letters = await eventually_letters(js, "node", len(to), heard)
        await nothing_harmed(js, heard)
        check_letters(letters, "cli", to)
        assert (await node_request(cli, NODE_ID, ListProcesses())).node.node_id == NODE_ID
        await nothing_harmed(js, heard)
    finally:
        for nc in (cli, admin, *conns):
            await nc.close()
