"""A 3-node NATS cluster on loopback: three nats-server processes configured from the deploy
configs (deploy/nats/cluster/node-<i>.conf, rewritten to 127.0.0.1, free ports and temporary
stores), Populace streams and KV buckets with three replicas, and every service as its own
process connected to a different server of the cluster, playing a game to the end."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
import yaml

from populace.client.run import play
from populace.core import bus, subjects
from populace.core.contracts import HostInfo, RunConfig, ServiceInfo
from populace.core.natsserver import find_binary
from populace.core.processes import stop_all, terminate

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
CONFIGS = DEPLOY / "nats" / "cluster"
NODES = (1, 2, 3)
CORE = {"orchestrator", "environment", "gateway", "recorder"}
STREAMS = [subjects.CTL_STREAM, subjects.RUN_STREAM, subjects.DLQ_STREAM]
BUCKETS = [subjects.RUNS_BUCKET, subjects.HOSTS_BUCKET, subjects.SERVICES_BUCKET, subjects.REPLICAS_BUCKET]


# -- the cluster --------------------------------------------------------------------------------
@dataclass
class Node:
    index: int
    client_port: int
    cluster_port: int
    http_port: int
    conf: Path
    log: Path
    proc: subprocess.Popen | None = None

    @property
    def name(self) -> str:
        return f"nats-{self.index}"

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.client_port}"

    def http(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http_port}{path}", timeout=2) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as err:
            return err.code, {}


def loopback_config(index: int, nodes: dict[int, Node], store: Path) -> str:
    """The deploy config of node `index`, with nats-<j>:6222 routes, the 0.0.0.0 listeners and
    the /data store moved to loopback, free ports and a temporary directory. Every rewrite must
    apply exactly as expected, so a changed deploy config fails here rather than half-working."""
    text = (CONFIGS / f"node-{index}.conf").read_text()
    me = nodes[index]
    rewrites = [
        (r"(?m)^listen:\s*0\.0\.0\.0:4222\s*$", f"listen: 127.0.0.1:{me.client_port}", 1),
        (r"(?m)^http:\s*0\.0\.0\.0:8222\s*$", f"http: 127.0.0.1:{me.http_port}", 1),
        (r"(?m)^(\s+)listen:\s*0\.0\.0\.0:6222\s*$", rf"\g<1>listen: 127.0.0.1:{me.cluster_port}", 1),
        (r"(?m)^(\s+)store_dir:\s*/data\s*$", rf'\g<1>store_dir: "{store}"', 1),
    ]
    for pattern, repl, expected in rewrites:
        text, n = re.subn(pattern, repl, text)
        assert n == expected, f"node-{index}.conf: expected {expected} match(es) of {pattern!r}, got {n}"
    routes = re.findall(r"nats-route://nats-(\d):6222", text)
    assert sorted(int(j) for j in routes) == [j for j in NODES if j != index], routes
    text = re.sub(r"nats-route://nats-(\d):6222",
                  lambda m: f"nats-route://127.0.0.1:{nodes[int(m.group(1))].cluster_port}", text)
    assert not re.search(r"nats-\d", re.sub(r"(?m)#.*$|^server_name:.*$", "", text)), "unrewritten host name"
    return text


def wait_for_cluster(nodes: dict[int, Node], timeout: float = 30.0) -> None:
    """Until every node answers /healthz (JetStream current) and names the same meta leader,
    which sees the two other servers as current peers."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        for n in nodes.values():
            if n.proc and n.proc.poll() is not None:
                raise RuntimeError(f"{n.name} exited ({n.proc.returncode}):\n{n.log.read_text()[-3000:]}")
        try:
            health = [n.http("/healthz")[0] for n in nodes.values()]
            metas = [n.http("/jsz")[1].get("meta_cluster", {}) for n in nodes.values()]
            last = (health, metas)
            leaders = {m.get("leader") for m in metas}
            by_name = {n.name: m for n, m in zip(nodes.values(), metas)}
            if health == [200] * 3 and len(leaders) == 1 and (leader := leaders.pop()) in by_name:
                peers = by_name[leader].get("replicas") or []
                if len(peers) == 2 and all(p.get("current") for p in peers):
                    return
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise TimeoutError(f"cluster not formed in {timeout}s: {last}")


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (all held open while choosing, so none repeats)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in socks]
    finally:
        for sock in socks:
            sock.close()


@contextmanager
def running_cluster(base: Path):
    """Three nats-server processes routed to each other on loopback, until the block ends."""
    ports = iter(free_ports(3 * len(NODES)))
    nodes = {i: Node(i, next(ports), next(ports), next(ports), base / f"node-{i}.conf", base / f"node-{i}.log")
             for i in NODES}
    for i, n in nodes.items():
        store = base / f"store-{i}"
        store.mkdir()
        n.conf.write_text(loopback_config(i, nodes, store))
    logs = []
    try:
        for n in nodes.values():
            logs.append(log := open(n.log, "ab"))
            n.proc = subprocess.Popen([find_binary(), "-c", str(n.conf)], stdout=log, stderr=log,
                                      start_new_session=True)
        wait_for_cluster(nodes)
        yield nodes
    finally:
        for n in nodes.values():
            if n.proc:
                terminate(n.proc)
        for log in logs:
            log.close()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with running_cluster(tmp_path_factory.mktemp("cluster")) as nodes:
        yield nodes


# -- services, each on its own server --------------------------------------------------------------
# orchestrator + recorder → nats-1, environment + gateway → nats-2, both agent-hosts → nats-3
PLACEMENT = {
    "orchestrator": ("orchestrator", 1),
    "recorder": ("recorder", 1),
    "environment": ("environment", 2),
    "gateway": ("gateway", 2),
    "agent-host-0": ("agent-host", 3),
    "agent-host-1": ("agent-host", 3),
}


@pytest.fixture(scope="module")
def services(cluster, tmp_path_factory):
    base = tmp_path_factory.mktemp("services")
    db = base / "populace.duckdb"
    env = {**os.environ, "POPULACE_DB": str(db), "POPULACE_STREAM_REPLICAS": "3", "POPULACE_STORAGE": "file",
           "POPULACE_LOG_FORMAT": "json", "POPULACE_PARENT_PID": str(os.getpid())}
    # No provisioning beforehand: the services create the R3 streams themselves, concurrently,
    # through three different servers, as they do on a fresh deployment.
    procs: dict[str, subprocess.Popen] = {}
    logs = []
    try:
        for key, (service, node) in PLACEMENT.items():
            penv = {**env, "POPULACE_NATS_URL": cluster[node].url}
            if service == "agent-host":
                penv["POPULACE_HOST_ID"] = key.replace("agent-", "")  # host-0, host-1
            logs.append(log := open(base / f"{key}.log", "ab"))
            procs[key] = subprocess.Popen([sys.executable, "-m", "populace.cli", "service", service],
                                          env=penv, stdout=log, stderr=log, start_new_session=True)
        asyncio.run(wait_registered(cluster[1].url, procs, base))
        yield {"db": str(db), "procs": procs, "logs": base}
    finally:
        stop_all(procs)
        for log in logs:
            log.close()


async def assert_r3(js, names: set[str]) -> None:
    """Every Populace stream, KV bucket and object store: three replicas, a leader and two
    peers besides it."""
    for stream in STREAMS + [f"KV_{b}" for b in BUCKETS] + [f"OBJ_{subjects.PERSONAS_BUCKET}"]:
        info = await js.stream_info(stream)
        assert info.config.num_replicas == 3, stream
        assert info.cluster is not None and info.cluster.name == "populace", stream
        peers = {r.name for r in info.cluster.replicas or []}
        assert info.cluster.leader in names and len(peers) == 2, (stream, info.cluster)
        assert peers | {info.cluster.leader} == names, (stream, info.cluster)


async def wait_registered(url: str, procs: dict[str, subprocess.Popen], logs: Path, timeout: float = 60.0) -> None:
    """Until KV `services` lists the four core services and KV `hosts` both agent-hosts."""
    nc = await bus.connect(url, "cluster-test-wait")
    try:
        js = nc.jetstream()
        deadline = time.monotonic() + timeout
        svcs: set[str] = set()
        hosts: list[HostInfo] = []
        while time.monotonic() < deadline:
            for key, p in procs.items():
                if p.poll() is not None:
                    tail = (logs / f"{key}.log").read_text()[-3000:]
                    raise RuntimeError(f"{key} exited with code {p.returncode}:\n{tail}")
            try:
                svcs = {s.service for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)}
                hosts = await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)
            except Exception:
                pass
            if svcs >= CORE and len(hosts) >= 2:
                return
            await asyncio.sleep(0.1)
        raise TimeoutError(f"not registered after {timeout}s: services {sorted(svcs)}, {len(hosts)} hosts; "
                           f"logs in {logs}")
    finally:
        await nc.close()


def compose_default(value: str) -> str:
    """A compose value as `docker compose` interpolates it with no variable set:
    ${VAR:-default} and ${VAR-default} give their default, ${VAR} gives ""."""
    return re.sub(r"\$\{\w+(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


# -- tests ----------------------------------------------------------------------------------------
def test_deploy_configs_are_valid_and_agree_with_the_worker_compose():
    for i in NODES:
        conf = CONFIGS / f"node-{i}.conf"
        r = subprocess.run([find_binary(), "-t", "-c", str(conf)], check=False, capture_output=True, text=True,
                           timeout=10)
        assert r.returncode == 0, r.stdout + r.stderr
        text = conf.read_text()
        assert re.search(rf"(?m)^server_name:\s*nats-{i}\s*$", text)
        assert re.search(r"(?m)^\s+name:\s*populace\s*$", text)
    worker = yaml.safe_load((DEPLOY / "compose.worker.yaml").read_text())
    # what a worker gets when its node sets none of these variables
    env = {name: compose_default(str(value)) for name, value in worker["x-populace"]["environment"].items()}
    assert env["POPULACE_STREAM_REPLICAS"] == "3"
    assert env["POPULACE_NATS_URL"].split(",") == [f"nats://nats-{i}:4222" for i in NODES]
    nodes = yaml.safe_load((DEPLOY / "compose.cluster.yaml").read_text())["services"]
    assert sorted(nodes) == [f"nats-{i}" for i in NODES]
    for i in NODES:
        assert f"./nats/cluster/node-{i}.conf:/etc/nats/nats.conf:ro" in nodes[f"nats-{i}"]["volumes"]


async def test_streams_and_buckets_get_three_replicas(cluster):
    ncs = [await bus.connect(n.url, f"cluster-test-{n.index}") for n in cluster.values()]
    try:
        await bus.provision(ncs[0].jetstream(), storage="file", replicas=3)
        await bus.provision(ncs[1].jetstream(), storage="file", replicas=3)  # found, not re-created
        names = {n.name for n in cluster.values()}
        for nc in ncs:  # the same view through every server
            await assert_r3(nc.jetstream(), names)
        # a write through one server is read back through another
        kv0 = await ncs[0].jetstream().key_value(subjects.RUNS_BUCKET)
        kv2 = await ncs[2].jetstream().key_value(subjects.RUNS_BUCKET)
        await bus.until_ready(lambda: kv0.put("cluster-probe", b"1"), "probe write")
        assert (await bus.until_ready(lambda: kv2.get("cluster-probe"), "probe read")).value == b"1"
        await kv0.delete("cluster-probe")
    finally:
        for nc in ncs:
            await nc.close()


async def test_concurrent_provisioning_from_three_servers(tmp_path):
    """What services starting together on a fresh cluster do, each through its own server:
    provision, then write their first registry heartbeat. Right after one client creates an
    R3 stream its Raft group has no leader for a moment (a stream_info gets no reply, a KV put
    gets 'no response from stream'); bus.provision and Heartbeat.start retry through that."""
    with running_cluster(tmp_path) as nodes:
        ncs = [await bus.connect(n.url, f"cluster-test-{n.index}") for n in nodes.values()]
        try:
            async def start_like_a_service(nc, i: int) -> None:
                js = nc.jetstream()
                await bus.provision(js, storage="file", replicas=3)
                kv = await js.key_value(subjects.SERVICES_BUCKET)
                beat = bus.Heartbeat(kv, f"probe.{i}", lambda: ServiceInfo(
                    service="probe", instance=f"probe.{i}", pid=os.getpid(), heartbeat_at=time.time()), 60.0)
                await beat.start()  # the first heartbeat, as Service._register writes it
                await beat.stop()

            await asyncio.gather(*(start_like_a_service(nc, i) for i, nc in enumerate(ncs)))
            await assert_r3(ncs[2].jetstream(), {n.name for n in nodes.values()})
        finally:
            for nc in ncs:
                await nc.close()


async def play_game(url: str, agents: int = 300, rounds: int = 2, stall_s: float = 30.0, latency: float = 0.0):
    nc = await bus.connect(url, "cluster-test-client")
    try:
        config = RunConfig.model_validate({"agents": agents, "rounds": rounds,
                                           "model": {"latency_s": latency, "seed": 5}})
        return await play(nc, config, stall_s=stall_s)
    finally:
        await nc.close()


def check_recorded(db: str, out, agents: int = 300, rounds: int = 2) -> None:
    """The run as recorded in DuckDB: exactly one guess per agent per round."""
    assert out.status == "completed", out.reason
    assert sorted(out.started.hosts) == ["host-0", "host-1"]
    assert [r.round for r in out.results] == list(range(1, rounds + 1))
    assert out.recorded is not None and out.recorded.outcomes == agents * rounds
    rid = out.run_id
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ? AND finished_at IS NOT NULL",
                           [rid]).fetchall() == [("completed",)]
        assert con.execute("SELECT count(*), count(DISTINCT agent_id), min(agent_id), max(agent_id), "
                           "count(DISTINCT host_id) FROM agents WHERE run_id = ?",
                           [rid]).fetchone() == (agents, agents, 0, agents - 1, 2)
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ?", [rid]).fetchone() == (agents * rounds,)
        assert con.execute("SELECT count(*) FROM (SELECT round, agent_id FROM guesses WHERE run_id = ? "
                           "GROUP BY 1, 2 HAVING count(*) <> 1)", [rid]).fetchone() == (0,)
        assert con.execute("SELECT round, count(DISTINCT agent_id) FROM guesses WHERE run_id = ? "
                           "GROUP BY 1 ORDER BY 1", [rid]).fetchall() == [(r, agents) for r in range(1, rounds + 1)]
        recorded_rounds = con.execute("SELECT round, n, n_valid, mean FROM rounds WHERE run_id = ? ORDER BY round",
                                      [rid]).fetchall()
        assert [r[0] for r in recorded_rounds] == list(range(1, rounds + 1))
        for rnd, n, n_valid, mean in recorded_rounds:
            valid = con.execute("SELECT count(*), avg(value) FROM guesses WHERE run_id = ? AND round = ? AND valid",
                                [rid, rnd]).fetchone()
            assert n == agents and n_valid == valid[0]
            assert mean == pytest.approx(valid[1], rel=1e-12)


async def test_services_on_different_servers_play_a_game(cluster, services):
    # each service really is connected to the server it was given
    for key, (service, node) in PLACEMENT.items():
        _, connz = cluster[node].http("/connz?limit=1024")
        names = [c.get("name") for c in connz.get("connections", [])]
        assert f"populace-{service}" in names, (key, cluster[node].name, names)
    # the streams the services found or created are R3
    nc = await bus.connect(cluster[2].url, "cluster-test-check")
    try:
        await assert_r3(nc.jetstream(), {n.name for n in cluster.values()})
    finally:
        await nc.close()
    # the client goes through nats-2: neither the orchestrator's nor the recorder's server
    out = await play_game(cluster[2].url)
    check_recorded(services["db"], out)
    for key, p in services["procs"].items():
        assert p.poll() is None, f"{key} exited"


async def test_losing_one_nats_node_keeps_the_streams_and_the_next_game_plays(cluster, services):
    """Kill the server leading stream RUN (SIGKILL): the two others keep quorum, every stream
    gets a leader among them, the services connected to the dead one reconnect to the others,
    and the next game plays to the end. (Killed last: the module's other tests need all three.)"""
    probe = await bus.connect(cluster[1].url, "cluster-test-probe")
    try:
        victim_name = (await probe.jetstream().stream_info(subjects.RUN_STREAM)).cluster.leader
        run_msgs = (await probe.jetstream().stream_info(subjects.RUN_STREAM)).state.messages
    finally:
        await probe.close()
    victim = next(n for n in cluster.values() if n.name == victim_name)
    survivors = [n for n in cluster.values() if n is not victim]
    # A run is in flight when the node dies: 4 rounds of 1 s, the kill lands in round 1 or 2.
    # Its publishes are retried (de-duplicated by Nats-Msg-Id) through the leader election.
    in_flight = asyncio.create_task(play_game(survivors[0].url, rounds=4, latency=1.0, stall_s=60))
    await asyncio.sleep(1.5)
    assert not in_flight.done()
    victim.proc.kill()
    victim.proc.wait()
    t_kill = time.monotonic()

    nc = await bus.connect(survivors[0].url, "cluster-test-failover")
    try:
        js = nc.jetstream(timeout=1.0)
        alive = {n.name for n in survivors}
        deadline = time.monotonic() + 30
        leaderless = set(STREAMS + [f"KV_{b}" for b in BUCKETS])
        while leaderless and time.monotonic() < deadline:  # each stream elects a leader among the two
            for stream in sorted(leaderless):
                try:
                    info = await js.stream_info(stream)
                except Exception:
                    continue
                if info.cluster and info.cluster.leader in alive:
                    assert info.config.num_replicas == 3
                    leaderless.discard(stream)
            await asyncio.sleep(0.2)
        assert not leaderless, f"no leader after 30 s: {sorted(leaderless)}"
        failover_s = time.monotonic() - t_kill
        assert (await js.stream_info(subjects.RUN_STREAM)).state.messages >= run_msgs  # nothing lost
        # every service has written a heartbeat since the streams recovered: reconnected and working
        since = time.time()
        while time.monotonic() < deadline:
            svcs = await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)
            hosts = await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)
            if ({s.service for s in svcs if s.heartbeat_at > since} >= CORE
                    and len([h for h in hosts if h.heartbeat_at > since]) >= 2):
                break
            await asyncio.sleep(0.2)
        else:
            raise AssertionError("services did not heartbeat after the failover")
    finally:
        await nc.close()
    print(f"{victim.name} killed; streams led by the others after {failover_s:.1f}s")

    check_recorded(services["db"], await in_flight, rounds=4)  # the run in flight completed

    out = await play_game(survivors[1].url)
    check_recorded(services["db"], out)
    for key, p in services["procs"].items():
        assert p.poll() is None, f"{key} exited"
