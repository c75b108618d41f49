"""`populace node` against a real nats-server: it registers and heartbeats, starts agent-hosts
that register in KV `hosts`, stops one, restarts a killed child by its policy, tails a log,
answers a start re-sent with its request id from memory (starting nothing twice), answers
garbage with an error and lives on, and leaves no process behind — after a clean-up,
a SIGTERM, or its own SIGKILL (checked with psutil). Every process is ended by its PID."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import nats
import psutil
import pytest

from populace.client.nodes import NodeError, NodeUnreachable, list_nodes, node_request
from populace.core import bus, replies, subjects
from populace.core.contracts import (
    AgentHostSpec,
    Cleanup,
    HostInfo,
    ListProcesses,
    NodeInfo,
    NodeReply,
    ReplicasSpec,
    RestartPolicy,
    ServiceSpec,
    StartProcess,
    StopProcess,
    TailLog,
)
from populace.core.natsserver import EmbeddedNats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]


DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"


class Daemon:
    """One `populace node` process and every PID it was seen running, to check and end by PID."""

    def __init__(self, url: str, log_dir, env: dict[str, str] | None = None) -> None:
        self.node_id = f"n-{uuid.uuid4().hex[:8]}"
        env = {**os.environ, "POPULACE_HEARTBEAT_S": "0.5", **(env or {})}
        env.pop("POPULACE_PARENT_PID", None)
        log_dir.mkdir(parents=True, exist_ok=True)
        with open(log_dir / "node.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "populace.cli", "node", "--nats", url, "--node-id", self.node_id,
                 "--log-dir", str(log_dir), "--stop-grace", "5"],
                env=env, stdout=log, stderr=log, start_new_session=True)
        self.log_path = log_dir / "node.log"
        self.seen: set[int] = set()

    def remember(self, reply_or_node) -> None:
        """Note the PIDs of the node's children and of their own children (a replica's servers)."""
        for p in getattr(reply_or_node, "processes", []):
            if p.pid:
                self.seen.add(p.pid)
                with contextlib.suppress(psutil.Error):
                    self.seen.update(c.pid for c in psutil.Process(p.pid).children(recursive=True))

    def alive(self) -> list[int]:
        out = []
        for pid in self.seen:
            with contextlib.suppress(psutil.Error):
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    out.append(pid)
        return out

    def end(self) -> None:
        for pid in [self.proc.pid, *self.alive()]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)


@pytest.fixture
def daemon(nats_server, tmp_path):
    """A node of the test's own: for tests that kill or stop it, or count the processes it numbers."""
    d = Daemon(nats_server.url, tmp_path / "node")
    yield d
    d.end()


@pytest.fixture(scope="module")
def shared_node(nats_server, tmp_path_factory):
    """One node for the tests that leave it as they found it (no process of its own running, none
    numbered by it asserted): a node interpreter started once, not once per test."""
    d = Daemon(nats_server.url, tmp_path_factory.mktemp("node"))
    yield d
    d.end()


@pytest.fixture
async def node(shared_node, nc):
    """The shared node, left with no process at the end of each test (as a test of its own would be)."""
    yield shared_node
    assert shared_node.proc.poll() is None, "the shared node died"
    await ask(nc, shared_node, Cleanup(grace_s=10))
    assert shared_node.alive() == []


async def until(check, timeout: float = 30.0, every: float = 0.2, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(every)


async def registered(js, daemon: Daemon) -> NodeInfo:
    async def found():
        if daemon.proc.poll() is not None:
            raise AssertionError(f"the node exited ({daemon.proc.returncode}):\n{daemon.log_path.read_text()[-3000:]}")
        return next((n for n in await list_nodes(js) if n.node_id == daemon.node_id), None)

    return await until(found, 30, what=f"node {daemon.node_id} in KV nodes")


async def ask(nc, daemon: Daemon, request, check: bool = True) -> NodeReply:
    reply = await node_request(nc, daemon.node_id, request, check=check)
    daemon.remember(reply)
    daemon.remember(reply.node)
    return reply


async def processes(nc, daemon: Daemon):
    return {p.proc_id: p for p in (await ask(nc, daemon, ListProcesses())).node.processes}


async def test_a_node_registers_and_heartbeats(nc, js, node):
    first = await registered(js, node)
    assert first.cpus >= 1 and first.memory_bytes > 0 and first.gpus == [] and first.pid == node.proc.pid
    assert len(first.free_ports) == 5 and first.processes == []

    async def beat_again():
        n = next(n for n in await list_nodes(js) if n.node_id == node.node_id)
        return n.heartbeat_at > first.heartbeat_at

    await until(beat_again, 5, what="a second heartbeat")


async def test_agent_hosts_start_register_stop_tail_and_clean_up(nc, js, daemon):
    await registered(js, daemon)
    reply = await ask(nc, daemon, StartProcess(spec=AgentHostSpec(max_in_flight=100), count=2))
    ids = [p.proc_id for p in reply.processes]
    assert ids == ["agent-host-1", "agent-host-2"] and all(p.state == "running" for p in reply.processes)
    host_ids = {f"{daemon.node_id}-{i}" for i in ids}

    async def hosts_up():
        return host_ids <= {h.host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)}

    await until(hosts_up, 60, what="both agent-hosts in KV hosts")

    async def sampled():  # the node's own entry lists them, with memory and a PID each
        n = next(n for n in await list_nodes(js) if n.node_id == daemon.node_id)
        return len(n.processes) == 2 and all(p.rss_bytes > 0 and p.pid for p in n.processes)

    await until(sampled, 10, what="CPU and memory of both children in KV nodes")

    logs = await ask(nc, daemon, TailLog(proc_id="agent-host-1", lines=5))
    assert "service_ready" in logs.log and len(logs.log.splitlines()) <= 5

    gone_pid = reply.processes[1].pid
    stopped = await ask(nc, daemon, StopProcess(proc_id="agent-host-2", grace_s=10))
    assert stopped.processes[0].state == "stopped" and not psutil.pid_exists(gone_pid)  # stopped and reaped
    assert list(await processes(nc, daemon)) == ["agent-host-1"]
    with pytest.raises(NodeError, match="no process 'agent-host-2'"):
        await ask(nc, daemon, TailLog(proc_id="agent-host-2"))

    # a replica process has children of its own (the simulated servers): cleanup ends them too
    # (one server: a child's child, ended with it, as test_a_killed_node_takes_its_children_with_it's)
    await ask(nc, daemon, StartProcess(spec=ReplicasSpec(backend="sim", servers=1)))
    await until(lambda: _has_servers_1(nc, daemon), 30, what="the replica server")
    assert len(daemon.alive()) >= 3
    cleaned = await ask(nc, daemon, Cleanup(grace_s=10))
    assert sorted(p.proc_id for p in cleaned.processes) == ["agent-host-1", "replicas-3"]
    assert daemon.alive() == []
    assert await processes(nc, daemon) == {}
    assert daemon.proc.poll() is None


async def raw_request(nc, node_id: str, verb: str, body: bytes, timeout: float = 20):
    """Bytes as they are, to a node, answered on this connection's own reply subject."""
    return await replies.request(nc, "node", subjects.node_request(node_id, verb, replies.requester(nc)), body,
                                 timeout=timeout)


async def test_a_start_sent_twice_with_one_request_id_starts_once(nc, js, daemon):
    """A StartProcess re-sent (after a timeout, say) with the same request id gets the first
    reply and starts nothing; a new id starts again; the id on another request is refused."""
    await registered(js, daemon)
    start = StartProcess(spec=AgentHostSpec(), count=2, request_id="retry-1")
    first = await ask(nc, daemon, start)
    # the same bytes again, as a client re-sending after a timeout would
    again = NodeReply.model_validate_json((await raw_request(nc, daemon.node_id, "start", bus.encode(start))).data)
    assert again == first and [p.proc_id for p in first.processes] == ["agent-host-1", "agent-host-2"]
    assert list(await processes(nc, daemon)) == ["agent-host-1", "agent-host-2"]
    assert len(psutil.Process(daemon.proc.pid).children()) == 2
    other = await ask(nc, daemon, StartProcess(spec=AgentHostSpec(), count=1, request_id="retry-1"), check=False)
    assert not other.ok and "'retry-1' was already used for another request" in other.error
    # node_request gives each call its own id: two calls, two starts
    await ask(nc, daemon, StartProcess(spec=AgentHostSpec()))
    assert list(await processes(nc, daemon)) == ["agent-host-1", "agent-host-2", "agent-host-3"]
    await ask(nc, daemon, Cleanup(grace_s=10))
    assert daemon.alive() == []


async def test_node_request_re_sends_a_timed_out_start_with_the_same_id(nc):
    """retries: the first send goes unanswered (a slow node), the re-send carries the same id."""
    seen: list[StartProcess] = []

    async def slow_node(msg):
        seen.append(StartProcess.model_validate_json(msg.data))
        if len(seen) > 1:
            await msg.respond(bus.encode(NodeReply(node_id="slow", ok=True)))

    await nc.subscribe(subjects.node_request("slow", "start"), cb=slow_node)
    # 2 s a try: the re-send's answer must come within it, also when other tests load the machine
    reply = await node_request(nc, "slow", StartProcess(spec=AgentHostSpec()), timeout=2.0, retries=1)
    assert reply.ok and len(seen) == 2 and seen[0].request_id and seen[0] == seen[1]
    mute: list[bytes] = []  # a node that never answers: every try times out

    async def never(msg):
        mute.append(msg.data)

    await nc.subscribe(subjects.node_request("mute", "start"), cb=never)
    with pytest.raises(NodeUnreachable, match=r"did not answer 'start' in time \(3 tries\)"):
        await node_request(nc, "mute", StartProcess(spec=AgentHostSpec()), timeout=0.3, retries=2)
    assert len(mute) == 3 and len(set(mute)) == 1


async def test_a_killed_child_is_restarted_by_its_policy(nc, js, node):
    await registered(js, node)
    policy = RestartPolicy(mode="on-failure", max_restarts=1, backoff_s=0.2)
    started = (await ask(nc, node, StartProcess(spec=ServiceSpec(name="recorder"), restart=policy))).processes[0]
    os.kill(started.pid, signal.SIGKILL)

    async def restarted():
        p = (await processes(nc, node))[started.proc_id]
        return p if p.state == "running" and p.pid != started.pid else None

    again = await until(restarted, 20, what="the recorder restarted")
    assert (again.restarts, again.exit_code) == (1, -signal.SIGKILL)
    os.kill(again.pid, signal.SIGKILL)  # its one restart is used: now it stays down

    async def exited():
        p = (await processes(nc, node))[started.proc_id]
        return p if p.state == "exited" else None

    down = await until(exited, 20, what="the recorder given up")
    assert (down.restarts, down.exit_code, down.pid) == (1, -signal.SIGKILL, None)


async def test_garbage_gets_an_error_reply_and_a_dead_letter_and_the_node_lives_on(nc, js, node):
    await registered(js, node)
    for verb, body, says in [
        ("start", b"not json", "malformed request"),
        ("start", b'{"spec": {"kind": "shell", "cmd": "rm -rf /"}}', "'shell'"),
        ("stop", b'{"proc_id": "a.b"}', "proc_id"),
        ("logs", b'{"proc_id": "agent-host-1", "max_bytes": 1000000000}', "max_bytes"),
    ]:
        msg = await raw_request(nc, node.node_id, verb, body)
        reply = NodeReply.model_validate_json(msg.data)
        assert not reply.ok and says in reply.error, reply.error
    unknown = await ask(nc, node, StartProcess(spec=ServiceSpec(name="nosuch")), check=False)
    assert not unknown.ok and "'nosuch' is not installed" in unknown.error
    # the node dead-letters before it replies, but the stream stores the dead letter on its own
    # path: the reply can come first on a loaded machine (a clean-clone run read the one before)
    deadline = time.monotonic() + 10
    while b"nosuch" not in (last := await js.get_last_msg(subjects.DLQ_STREAM, subjects.dlq("node"))).data:
        assert time.monotonic() < deadline, f"no dead letter of the 'nosuch' start within 10 s; last: {last.data!r}"
        await asyncio.sleep(0.05)
    assert last.headers["Populace-Subject"] == subjects.node_request(node.node_id, "start", replies.ANONYMOUS)
    assert (await ask(nc, node, ListProcesses())).node.processes == []
    with pytest.raises(NodeUnreachable, match="not running"):
        await node_request(nc, "no-such-node", ListProcesses())


async def test_a_node_refuses_replicas_that_could_be_hijacked_before_starting_any(nc, js, node):
    """Issue 41, attack 7: a `model:` that is an option or climbs directories is a malformed request
    (dead-lettered, never passed to vLLM); an `advertise:` name outside the node's
    POPULACE_REPLICA_HOSTS (default loopback) is refused naming the setting; nothing starts."""
    await registered(js, node)
    for model, says in [("--help", "'--help' is an option, not a model"),
                        ("--trust-remote-code", "is an option, not a model"),
                        ("../../../../etc", "climbs directories ('..')")]:
        body = json.dumps({"spec": {"kind": "replicas", "backend": "vllm", "model": model}}).encode()
        reply = NodeReply.model_validate_json((await raw_request(nc, node.node_id, "start", body)).data)
        assert not reply.ok and "malformed request (dead-lettered)" in reply.error and says in reply.error, reply.error
    for spec, says in [
        (ReplicasSpec(backend="sim", bind="0.0.0.0", advertise="evil.example"),
         "advertise: evil.example (on ports picked when they start) registered by replicas is not in "
         "POPULACE_REPLICA_HOSTS (127.0.0.0/8,::1,localhost)"),
        (ReplicasSpec(backend="vllm", model="/etc"), "model: '/etc' is not under this node's model folders "
                                                     "(POPULACE_NODE_MODEL_ROOTS: none)")]:
        refused = await ask(nc, node, StartProcess(spec=spec), check=False)
        assert not refused.ok and says in refused.error, refused.error
    assert (await ask(nc, node, ListProcesses())).node.processes == []


async def test_a_killed_node_takes_its_children_with_it(nc, js, daemon):
    await registered(js, daemon)
    await ask(nc, daemon, StartProcess(spec=AgentHostSpec(), count=2))
    await ask(nc, daemon, StartProcess(spec=ReplicasSpec(backend="sim", servers=1)))
    await until(lambda: _has_servers_1(nc, daemon), 30, what="the replica server")
    assert len(daemon.alive()) >= 4
    daemon.proc.send_signal(signal.SIGKILL)
    daemon.proc.wait(5)

    async def none_left():
        return daemon.alive() == []

    await until(none_left, 15, what=f"the children of a killed node gone (left: {daemon.alive()})")


async def _has_servers_1(nc, daemon: Daemon) -> bool:
    procs = await processes(nc, daemon)
    found = any(p.proc_id.startswith("replicas") and psutil.Process(p.pid).children() for p in procs.values() if p.pid)
    if found:  # `processes` noted the children before they all started: note them as seen now
        daemon.remember(SimpleNamespace(processes=list(procs.values())))
    return found


async def test_a_terminated_node_stops_its_children_and_unregisters(nc, js, daemon):
    await registered(js, daemon)
    await ask(nc, daemon, StartProcess(spec=AgentHostSpec()))
    assert len(daemon.alive()) == 1
    daemon.proc.send_signal(signal.SIGTERM)
    assert daemon.proc.wait(30) == 0
    assert daemon.alive() == []

    async def unregistered():
        return all(n.node_id != daemon.node_id for n in await list_nodes(js, include_gone=True))

    await until(unregistered, 5, what="the node's entry deleted")


async def test_with_nats_users_the_node_and_its_children_need_no_more_than_their_users(tmp_path):
    """deploy/nats/auth.conf: the node runs as `node`, starts an agent-host as `agent-host`, and
    `cli` lists nodes and asks them for things; the server logs no permission violation."""
    text = DEPLOY_CONF.read_text()
    users = {u.lower().replace("_", "-") for u in re.findall(r"\$([A-Z_]+)_PASSWORD\b", text)}
    passwords = {u: f"test-{u}-pw" for u in users}
    conf = tmp_path / "auth.conf"
    conf.write_text("".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{pw}"\n' for u, pw in passwords.items())
                    + text)
    log = tmp_path / "nats-server.log"
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(log)) as server:
        daemon = Daemon(server.url, tmp_path / "node", env={
            "POPULACE_NATS_USER": "node", "POPULACE_NATS_PASSWORD": passwords["node"],
            "POPULACE_PASSWORD_AGENT_HOST": passwords["agent-host"]})
        nc = await nats.connect(server.url, user="cli", password=passwords["cli"],
                                inbox_prefix=bus.inbox_prefix("cli"))
        try:
            js = nc.jetstream()
            await registered(js, daemon)
            started = await ask(nc, daemon, StartProcess(spec=AgentHostSpec()))
            host_id = f"{daemon.node_id}-{started.processes[0].proc_id}"

            async def host_up():
                return any(h.host_id == host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET,
                                                                                      HostInfo))

            await until(host_up, 60, what="the agent-host registered as its own user")
            refused = await ask(nc, daemon, StartProcess(spec=ServiceSpec(name="recorder")), check=False)
            assert not refused.ok and "POPULACE_PASSWORD_RECORDER" in refused.error
            await ask(nc, daemon, Cleanup(grace_s=10))
            assert daemon.alive() == []
        finally:
            await nc.close()
            daemon.end()
        violations = [line for line in log.read_text().splitlines() if "Violation" in line]
        assert violations == []
