"""The manager's NATS user (deploy/nats/auth.conf, `manager`): what its pages do works as
`manager`, and what it has no business doing is refused.

nats-server runs the deploy file, with test passwords defined up front. The manager app itself
(create_app, connected as POPULACE_NATS_USER=manager) serves every page and event stream, submits
a run with a population from the start form (personas uploaded to the object store), cancels
and resumes runs, and asks a node for a log. Its client calls then list runs and nodes, ask a
node, and read a snapshot from the recorder (`recorder.read.*`, answered by the `recorder` user
through allow_responses, and the object store `snapshots`). The server logs no permission
violation. As `manager`, publishing an outcome or a run event, writing KV `runs`, consuming,
subscribing to or purging RUN, answering node or recorder requests, reading another user's
inbox, and touching the checkpoints are refused, and nothing it tried is stored. `cli` reads a
live run from the recorder the same way (`populace results` while the recorder writes)."""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from pathlib import Path

import nats
import nats.errors
import pytest
from nats.js.errors import KeyNotFoundError
from starlette.testclient import TestClient

from populace.client.nodes import list_nodes, node_request
from populace.client.reads import fetch_snapshot
from populace.client.run import cancel, run_state, submit
from populace.core import bus, subjects
from populace.core.contracts import (
    HostInfo,
    ListProcesses,
    NodeInfo,
    NodeReply,
    ReplicaInfo,
    RunConfig,
    RunStart,
    RunState,
    Share,
    SnapshotReply,
)
from populace.core.natsserver import EmbeddedNats
from populace.manager import ManagerSettings, create_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY_CONF = ROOT / "deploy" / "nats" / "auth.conf"
NODE_ID = "auth-node"
HTML = {"accept": "text/html"}


def users_in(text: str) -> list[str]:
    return [u.lower().replace("_", "-") for u in re.findall(r"\$([A-Z_]+)_PASSWORD\b", text)]


PASSWORDS = {u: f"mgr-test-{u}-pw" for u in users_in(DEPLOY_CONF.read_text())}


@pytest.fixture
def server(tmp_path):
    text = DEPLOY_CONF.read_text()
    assert "manager" in PASSWORDS and "recorder" in PASSWORDS
    conf = tmp_path / "auth.conf"
    conf.write_text("".join(f'{u.upper().replace("-", "_")}_PASSWORD: "{pw}"\n' for u, pw in PASSWORDS.items())
                    + text)
    log = tmp_path / "nats-server.log"
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(log)) as ns:
        ns.log_path = log
        yield ns


async def connect_as(url: str, user: str, errors: list[str] | None = None):
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    return await nats.connect(url, user=user, password=PASSWORDS[user], name=f"test-{user}",
                              inbox_prefix=bus.inbox_prefix(user), error_cb=on_error, allow_reconnect=False)


def violations(ns) -> list[str]:
    return [line for line in ns.log_path.read_text().splitlines() if "Violation" in line]


def a_state(rid: str, status: str, rnd: int = 1) -> RunState:
    return RunState(run_id=rid, status=status, round=rnd, config=RunConfig(agents=20, rounds=3),
                    shares=[Share(host_id="h1", ranges=[(0, 20)])])


def a_node() -> NodeInfo:
    now = time.time()
    return NodeInfo(node_id=NODE_ID, hostname="box", pid=1, version="test", cpus=2, memory_bytes=1 << 30,
                    memory_available_bytes=1 << 29, log_dir="/tmp", started_at=now, heartbeat_at=now,
                    heartbeat_s=60.0)


class Fakes:
    """A node (as `node`) and a recorder (as `recorder`) answering requests, and the stack's
    streams and registries provisioned as `admin`."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.snapshot_data = b"a duckdb file, in this test any bytes"

    async def __aenter__(self) -> Fakes:
        self.admin = await connect_as(self.url, "admin")
        self.ajs = self.admin.jetstream()
        await bus.provision(self.ajs, storage="memory")
        await bus.provision_nodes(self.ajs, storage="memory")
        await (await self.ajs.key_value(subjects.NODES_BUCKET)).put(NODE_ID, bus.encode(a_node()))
        self.node = await connect_as(self.url, "node")

        async def answer_node(msg) -> None:
            verb = msg.subject.split(".")[2]  # node.<id>.<verb>.<requester>
            reply = NodeReply(node_id=NODE_ID, ok=True, node=a_node() if verb == "list" else None,
                              log="line 1\nline 2\n" if verb == "logs" else None)
            await msg.respond(bus.encode(reply))

        await self.node.subscribe(subjects.node_request(NODE_ID, "*"), cb=answer_node)
        self.recorder = await connect_as(self.url, "recorder")
        rjs = self.recorder.jetstream()
        self.snapshots = await rjs.create_object_store("snapshots")

        async def answer_read(msg) -> None:
            name = f"snapshot-{uuid.uuid4().hex}"
            await self.snapshots.put(name, self.snapshot_data)
            await msg.respond(bus.encode(SnapshotReply(ok=True, snapshot=name, size=len(self.snapshot_data))))

        await self.recorder.subscribe(subjects.recorder_read("*"), cb=answer_read)
        return self

    async def __aexit__(self, *exc) -> None:
        for nc in (self.recorder, self.node, self.admin):
            await nc.close()

    async def ctl_starts(self) -> list[RunStart]:
        info = await self.ajs.stream_info(subjects.CTL_STREAM, subjects_filter=">")
        starts = []
        if (info.state.subjects or {}).get(subjects.RUN_START):
            msg = await self.ajs.get_last_msg(subjects.CTL_STREAM, subjects.RUN_START)
            starts.append(RunStart.model_validate_json(msg.data))
        return starts

    async def ctl_counts(self) -> dict[str, int]:
        return dict((await self.ajs.stream_info(subjects.CTL_STREAM, subjects_filter=">")).state.subjects or {})


def test_the_manager_app_works_as_its_own_user(server, monkeypatch):
    monkeypatch.chdir(ROOT)  # the start form reads populations under the manager's working directory
    monkeypatch.setenv("POPULACE_NATS_USER", "manager")
    monkeypatch.setenv("POPULACE_NATS_PASSWORD", PASSWORDS["manager"])
    running, failed = f"run-{uuid.uuid4().hex[:6]}", f"run-{uuid.uuid4().hex[:6]}"

    async def setup(fakes: Fakes) -> None:
        kv = await fakes.ajs.key_value(subjects.RUNS_BUCKET)
        await kv.put(running, bus.encode(a_state(running, "running")))
        await kv.put(failed, bus.encode(a_state(failed, "failed")))
        now = time.time()
        await (await fakes.ajs.key_value(subjects.HOSTS_BUCKET)).put(
            "h1", bus.encode(HostInfo(host_id="h1", capacity=100, pid=1, started_at=now, heartbeat_at=now)))
        await (await fakes.ajs.key_value(subjects.REPLICAS_BUCKET)).put(
            "replicas.r1", bus.encode(ReplicaInfo(replica_id="r1", url="http://127.0.0.1:9", backend="sim", kind="sim",
                                         model="m", heartbeat_at=now)))

    async def main() -> None:
        async with Fakes(server.url) as fakes:
            await setup(fakes)
            await asyncio.to_thread(drive_the_pages, server.url, running, failed)
            counts = await fakes.ctl_counts()
            assert counts == {subjects.RUN_START: 1, subjects.RUN_CANCEL: 1, subjects.RUN_RESUME: 1}, counts
            (start,) = await fakes.ctl_starts()
            assert start.config.name == "mgr-auth" and start.config.population.digest  # personas uploaded
            personas = await fakes.ajs.object_store(subjects.PERSONAS_BUCKET)
            assert [i.name for i in await personas.list()] == [start.config.population.digest]

    asyncio.run(main())
    assert violations(server) == []


def drive_the_pages(url: str, running: str, failed: str) -> None:
    app = create_app(ManagerSettings(nats_url=url, sample_s=0.05))
    # without a token the manager answers loopback names only (TestClient's default is 'testserver')
    with TestClient(app, base_url="http://127.0.0.1:8080", follow_redirects=False) as c:
        assert c.get("/healthz").json() == {"nats": True}
        for path in ("/runs", f"/runs/{running}", "/nodes", "/replicas", "/start", "/start?mode=form"):
            res = c.get(path, headers=HTML)
            assert res.status_code == 200, (path, res.text[:500])
        assert running in c.get("/runs").text and NODE_ID in c.get("/nodes").text
        for path in ("/events/runs", f"/events/runs/{running}", "/events/nodes"):
            res = c.get(path + "?once=1")
            assert res.status_code == 200 and "data: " in res.text, path
        res = c.get(f"/nodes/{NODE_ID}/logs/agent-host-1")
        assert res.status_code == 200 and "line 2" in res.text
        scenario = ("simulation: ratio-game\nname: mgr-auth\nagents: 20\nrounds: 2\nmodel:\n  backend: dummy\n"
                    "population:\n  config: examples/population/education.yaml\n")
        res = c.post("/start", data={"scenario": scenario, "simulation": "ratio-game"})
        assert res.status_code == 303 and res.headers["location"].startswith("/runs/"), res.text[:2000]
        res = c.post(f"/runs/{running}/cancel")
        assert res.status_code == 303 and "cancel+sent" in res.headers["location"], res.headers["location"]
        res = c.post(f"/runs/{failed}/resume")
        assert res.status_code == 303 and "resume+sent" in res.headers["location"], res.headers["location"]


def test_the_manager_client_calls_work_and_everything_else_is_refused(server, tmp_path):
    async def main() -> None:
        async with Fakes(server.url) as fakes:
            errors: list[str] = []
            nc = await connect_as(server.url, "manager", errors)
            try:
                await allowed(nc, fakes, tmp_path)
                assert errors == [] and violations(server) == []
                await refused(nc, fakes, errors)
            finally:
                await nc.close()

    asyncio.run(main())


async def snapshot_round_trip(nc, fakes: Fakes, tmp: Path) -> None:
    """populace.client.reads.fetch_snapshot as `nc`'s user: the recorder's copy arrives, and is
    deleted from the object store once read."""
    dest = tmp / f"{uuid.uuid4().hex}.duckdb"
    reply = await fetch_snapshot(nc, nc.jetstream(timeout=2.0), [], dest)
    assert dest.read_bytes() == fakes.snapshot_data
    info = await (await fakes.ajs.object_store("snapshots")).get_info(reply.snapshot, show_deleted=True)
    assert info.deleted


async def allowed(nc, fakes: Fakes, tmp: Path) -> None:
    js = nc.jetstream(timeout=2.0)
    rid = f"run-{uuid.uuid4().hex[:6]}"
    kv = await fakes.ajs.key_value(subjects.RUNS_BUCKET)
    await kv.put(rid, bus.encode(a_state(rid, "running")))
    # list runs and nodes, read one run, ask a node
    assert rid in [s.run_id for s in await bus.registry_entries(js, subjects.RUNS_BUCKET, RunState)]
    assert (await run_state(nc, rid)).status == "running"
    assert [n.node_id for n in await list_nodes(js)] == [NODE_ID]
    assert (await node_request(nc, NODE_ID, ListProcesses())).node.node_id == NODE_ID
    # submit a run and cancel it
    await submit(nc, RunConfig(agents=10, rounds=1, name="by-manager"), run_id=rid + "b")
    await cancel(nc, rid + "b", "from the test")
    assert (await fakes.ctl_counts()) == {subjects.RUN_START: 1, subjects.RUN_CANCEL: 1}
    # a run page's reads of RUN, by subject
    await fakes.ajs.publish(subjects.run_started(rid), b"{}")
    assert (await js.get_last_msg(subjects.RUN_STREAM, subjects.run_started(rid))).data == b"{}"
    # results from the recorder: a read request, then its snapshot fetched and deleted
    await snapshot_round_trip(nc, fakes, tmp)
    # a run page's progress ticks (core)
    got: list[bytes] = []

    async def on_tick(msg) -> None:
        got.append(msg.data)

    sub = await nc.subscribe(subjects.progress_all(rid), cb=on_tick)
    await nc.flush()
    agent_host = await connect_as(fakes.url, "agent-host")
    await agent_host.publish(subjects.progress(rid, 1, "h1"), b"tick")
    await agent_host.flush()
    await agent_host.close()
    for _ in range(100):
        if got:
            break
        await asyncio.sleep(0.02)
    assert got == [b"tick"]
    await sub.unsubscribe()


async def refused(nc, fakes: Fakes, errors: list[str]) -> None:
    js = nc.jetstream(timeout=1.0)
    before = (await fakes.ajs.stream_info(subjects.RUN_STREAM)).state.messages

    def denied(action: str, subject: str) -> bool:
        return f'nats: permissions violation for {action} to "{subject.lower()}"' in errors

    # publishing what a run's services say: an outcome batch, a round's result, a run's end
    for subject in ("run.x.outcomes.1.h1", "run.x.round.1.result", "run.x.done", "dlq.orchestrator"):
        await nc.publish(subject, b"{}")
    # writing the registries
    await nc.publish("$KV.runs.x", b"{}")
    await nc.publish("$KV.nodes.x", b"{}")
    await nc.flush()
    await asyncio.sleep(0.2)
    for subject in ("run.x.outcomes.1.h1", "run.x.round.1.result", "run.x.done", "$KV.runs.x", "$KV.nodes.x"):
        assert denied("publish", subject), (subject, errors)
    # listening on RUN's subjects, answering node or recorder requests, another user's inbox
    for subject in ("run.>", "run.*.outcomes.*.*", "node.*.*", "recorder.read.*", "_INBOX_cli.>", "_INBOX.>"):
        await nc.subscribe(subject)
        await nc.flush()
        await asyncio.sleep(0.05)
        assert denied("subscription", subject), (subject, errors)
    # consuming RUN (a durable, or an ordered consumer), purging it, the checkpoints, making streams
    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
        await js.pull_subscribe("run.>", durable="spy", stream=subjects.RUN_STREAM)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
        await js.subscribe("run.>", ordered_consumer=True, stream=subjects.RUN_STREAM)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
        await js.purge_stream(subjects.RUN_STREAM)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
        await js.object_store(subjects.CHECKPOINTS_BUCKET)
    with pytest.raises((nats.errors.TimeoutError, nats.errors.Error)):
        await js.add_stream(name="EVIL", subjects=["evil.>"])
    await nc.flush()
    assert (await fakes.ajs.stream_info(subjects.RUN_STREAM)).state.messages == before
    with pytest.raises(KeyNotFoundError):
        await (await fakes.ajs.key_value(subjects.RUNS_BUCKET)).get("x")


def test_the_cli_reads_a_live_run_from_the_recorder(server, tmp_path):
    """`populace results|report|export|rerun` on a live run, as `cli`: the same round trip."""
    async def main() -> None:
        async with Fakes(server.url) as fakes:
            nc = await connect_as(server.url, "cli")
            try:
                await snapshot_round_trip(nc, fakes, tmp_path)
            finally:
                await nc.close()

    asyncio.run(main())
    assert violations(server) == []
