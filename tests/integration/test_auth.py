"""NATS authentication and per-service permissions (deploy/nats/auth.conf).

The server runs the deploy file itself, preceded by concrete values for its
`$<USER>_PASSWORD` variables. It shows that
- a client without credentials (or with a wrong password) cannot connect at all;
- a connected user may not publish `ctl.run.start` unless it is `cli`, and nothing it
  tried lands in the CTL stream;
- a service (agent-host) cannot publish, subscribe or call the JetStream API outside
  its list — while its own subjects still work;
- the lists are sufficient, not only restrictive: every service runs as its own user,
  a game is played as `cli` to the end, malformed input is dead-lettered by each
  service, and the server logs no permission violation beyond the one documented below.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import nats
import nats.errors
import pytest
from populace.core.processes import stop_all
from populace.core import bus, subjects
from populace.client.prepare import prepare
from populace.core.contracts import HostInfo, RunConfig, RunStart, ServiceInfo
from populace.core.natsserver import EmbeddedNats

from populace.client.run import play

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
EDUCATION = Path(__file__).resolve().parents[2] / "examples" / "population" / "education.yaml"
SERVICES = ("orchestrator", "environment", "gateway", "recorder", "agent-host")
USERS = (*SERVICES, "replicas", "cli", "admin")
PASSWORDS = {u: f"test-{u}-pw" for u in USERS}
HOST_ID = "auth-host-0"


def password_var(user: str) -> str:
    return user.upper().replace("-", "_") + "_PASSWORD"


def write_test_conf(tmp_path: Path) -> Path:
    """The deploy config unchanged, with its password variables defined up front."""
    text = DEPLOY_CONF.read_text()
    # The deploy file names every password by variable, and exactly these.
    assert set(re.findall(r"\$([A-Z_]+_PASSWORD)\b", text)) == {password_var(u) for u in USERS}
    defs = "".join(f'{password_var(u)}: "{pw}"\n' for u, pw in PASSWORDS.items())
    path = tmp_path / "auth.conf"
    path.write_text(defs + text)
    return path


@pytest.fixture
def server(tmp_path):
    conf = write_test_conf(tmp_path)
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(tmp_path / "nats-server.log")) as ns:
        ns.log_path = tmp_path / "nats-server.log"
        yield ns


async def connect_as(url: str, user: str, errors: list[str] | None = None, **kw):
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    return await nats.connect(url, user=user, password=PASSWORDS[user], name=f"test-{user}",
                              error_cb=on_error, allow_reconnect=False, **kw)


async def eventually(predicate, timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def denied(errors: list[str], action: str, subject: str) -> bool:
    """nats-py reports `-ERR 'Permissions Violation for Publish to "x"'` to error_cb, lower-cased."""
    return f'nats: permissions violation for {action} to "{subject.lower()}"' in errors


def server_violations(ns) -> list[str]:
    return [line for line in ns.log_path.read_text().splitlines() if "Violation" in line]


async def admin_js(url: str):
    nc = await connect_as(url, "admin")
    js = nc.jetstream()
    await bus.provision(js, storage="memory")
    return nc, js


async def dlq_counts(js) -> dict[str, int]:
    info = await js.stream_info(subjects.DLQ_STREAM, subjects_filter=">")
    return dict(info.state.subjects or {})


async def messages(js, stream: str) -> int:
    return (await js.stream_info(stream)).state.messages


# --- a. no credentials, or credentials without the permission -------------------------
async def test_unauthenticated_client_cannot_connect(server):
    errors: list[str] = []

    async def on_error(err: Exception) -> None:
        errors.append(str(err))

    # With authorization on, the server answers CONNECT with -ERR 'Authorization Violation'
    # and closes; nats-py raises it as nats.errors.Error from connect().
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, name="anonymous", error_cb=on_error, allow_reconnect=False)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(server.url, user="cli", password="not-the-password", name="wrong",
                           error_cb=on_error, allow_reconnect=False)
    assert errors == ["nats: 'Authorization Violation'"] * 2
    assert sum("authentication error" in line for line in server.log_path.read_text().splitlines()) == 2


async def test_user_without_permission_cannot_start_a_run(server):
    admin, ajs = await admin_js(server.url)
    errors: list[str] = []
    nc = await connect_as(server.url, "replicas", errors)
    cli = await connect_as(server.url, "cli")
    try:
        js = nc.jetstream(timeout=1.0)
        forged = bus.encode(RunStart(run_id="forged", config=RunConfig(agents=1, rounds=1)))
        # JetStream publish: the server drops the message before any stream sees it, so no
        # PubAck ever comes back — the publish times out, the error goes to error_cb.
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(subjects.RUN_START, forged, timeout=1.0)
        await eventually(lambda: denied(errors, "publish", subjects.RUN_START), what="publish violation")
        # Core publish: silently dropped by the server, reported the same way.
        errors.clear()
        await nc.publish(subjects.RUN_START, forged)
        await nc.flush()
        await eventually(lambda: denied(errors, "publish", subjects.RUN_START), what="publish violation")
        assert await messages(ajs, subjects.CTL_STREAM) == 0
        # The same connection does its own job: a replica entry in KV `replicas` …
        kv = await js.key_value(subjects.REPLICAS_BUCKET)
        await kv.put("r-1", b"{}")
        assert (await (await ajs.key_value(subjects.REPLICAS_BUCKET)).get("r-1")).value == b"{}"
        # … and nothing else: not the hosts registry.
        hosts = await js.key_value(subjects.HOSTS_BUCKET)  # binding (STREAM.INFO) is allowed
        with pytest.raises(nats.errors.TimeoutError):
            await hosts.put("fake-host", b"{}")
        await eventually(lambda: denied(errors, "publish", "$KV.hosts.fake-host"), what="KV violation")
        # Positive control: `cli` may start a run, and that one is stored.
        ack = await cli.jetstream().publish(subjects.RUN_START, forged, timeout=2.0)
        assert ack.stream == subjects.CTL_STREAM
        assert await messages(ajs, subjects.CTL_STREAM) == 1
    finally:
        for c in (nc, cli, admin):
            await c.close()


# --- b. a service outside its permissions ----------------------------------------------
async def test_service_cannot_act_outside_its_permissions(server):
    admin, ajs = await admin_js(server.url)
    errors: list[str] = []
    nc = await connect_as(server.url, "agent-host", errors)
    try:
        js = nc.jetstream(timeout=1.0)
        # Events owned by other services, and the control plane.
        for subject in ("run.x.round.1.result", "run.x.round.1.open", "run.x.done", subjects.RUN_START):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(subject, b"{}", timeout=0.5)
            await eventually(lambda s=subject: denied(errors, "publish", s), what=f"violation on {subject}")
        await nc.publish("run.x.round.1.result", b"{}")  # core publish: same refusal
        # Nor read what is not meant for it (other hosts' outcomes, the control plane) …
        await nc.subscribe("run.*.outcomes.*.*")
        await nc.subscribe("ctl.>")
        await nc.flush()
        await eventually(lambda: denied(errors, "subscription", "run.*.outcomes.*.*")
                         and denied(errors, "subscription", "ctl.>"), what="subscription violations")
        # … nor manage streams or other consumers.
        with pytest.raises(nats.errors.TimeoutError):
            await js.delete_stream(subjects.RUN_STREAM)
        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(subjects.CTL_STREAM)
        assert denied(errors, "publish", "$JS.API.STREAM.DELETE.RUN")
        assert await messages(ajs, subjects.RUN_STREAM) == 0
        assert await messages(ajs, subjects.CTL_STREAM) == 0
        # Positive control: its own subjects are stored.
        ack = await js.publish("run.x.spawned.h0", b"{}", timeout=2.0)
        assert ack.stream == subjects.RUN_STREAM
        assert await messages(ajs, subjects.RUN_STREAM) == 1
    finally:
        await nc.close()
        await admin.close()


# --- c. the whole system, one user per service ----------------------------------------
def start_service(name: str, url: str, tmp_path: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "POPULACE_NATS_URL": url,
        "POPULACE_NATS_USER": name,
        "POPULACE_NATS_PASSWORD": PASSWORDS[name],
        "POPULACE_DB": str(tmp_path / "populace.duckdb"),
        "POPULACE_HOST_ID": HOST_ID,
        "POPULACE_STORAGE": "memory",
        "POPULACE_PARENT_PID": str(os.getpid()),
        "POPULACE_LOG_FORMAT": "json",
        "POPULACE_METRICS_PORT": "0",
        "OTEL_TRACES_EXPORTER": "none",
    }
    with open(tmp_path / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-m", "populace.cli", "service", name],
                                env=env, stdout=log, stderr=log, start_new_session=True)


def log_tail(tmp_path: Path, name: str, lines: int = 20) -> str:
    return "\n".join((tmp_path / f"{name}.log").read_text(errors="replace").splitlines()[-lines:])


async def wait_registered(nc, procs, tmp_path: Path, timeout: float = 40.0) -> None:
    """As the `cli` user (KV read): every service in `services`, the host in `hosts`."""
    js = nc.jetstream(timeout=2.0)
    deadline = time.monotonic() + timeout
    while True:
        for name, p in procs.items():
            if p.poll() is not None:
                raise AssertionError(f"{name} exited with {p.returncode}:\n{log_tail(tmp_path, name)}")
        try:
            svcs = {s.service for s in await bus.registry_entries(js, subjects.SERVICES_BUCKET, ServiceInfo)}
            hosts = {h.host_id for h in await bus.registry_entries(js, subjects.HOSTS_BUCKET, HostInfo)}
        except Exception:  # noqa: BLE001 - buckets not created yet
            svcs, hosts = set(), set()
        if set(SERVICES) <= svcs and HOST_ID in hosts:
            return
        if time.monotonic() > deadline:
            tails = "\n".join(f"--- {n}\n{log_tail(tmp_path, n, 5)}" for n in procs)
            raise AssertionError(f"not registered after {timeout}s: services {sorted(svcs)}, hosts {hosts}\n{tails}")
        await asyncio.sleep(0.1)


async def test_game_with_one_user_per_service(server, tmp_path):
    procs: dict[str, subprocess.Popen] = {}
    try:
        for name in SERVICES:
            procs[name] = start_service(name, server.url, tmp_path)
        cli_errors: list[str] = []
        cli = await connect_as(server.url, "cli", cli_errors)
        try:
            await wait_registered(cli, procs, tmp_path)
            # With a population: the cli uploads the personas to the object store, the host
            # and the recorder read them back (each step under its own user's permissions).
            prepared = prepare(RunConfig.model_validate({
                "agents": 200, "rounds": 2, "model": {"latency_s": 0.0, "seed": 5},
                "population": {"config": str(EDUCATION)}}))
            out = await asyncio.wait_for(play(cli, prepared.config, personas=prepared.personas,
                                              manifest=prepared.manifest, stall_s=20), timeout=60)
        finally:
            await cli.close()
        assert out.status == "completed", out.reason
        assert [r.round for r in out.results] == [1, 2]
        assert out.recorded is not None and out.recorded.outcomes == 400
        assert cli_errors == []

        # Each service may dead-letter what it cannot parse: publish dlq.<service> and
        # terminate the JetStream message ($JS.ACK…); the gateway answers the malformed
        # request with an explicit error (allow_responses).
        admin, ajs = await admin_js(server.url)
        try:
            garbage = b"\x00{not a message"
            inputs = {
                "orchestrator": subjects.RUN_START,
                "environment": "run.junk.partial.1.h",
                "recorder": "run.junk.outcomes.1.h",
                "agent-host": subjects.run_spawn("junk", HOST_ID),
            }
            for subject in inputs.values():
                await ajs.publish(subject, garbage, timeout=5.0)
            reply = await admin.request(subjects.LLM_INFER, garbage, timeout=10.0)  # answered, with an error
            assert b"malformed" in reply.data
            # The recorder also records spawn orders, so it dead-letters the junk spawn too.
            expected = {subjects.dlq(s): 1 for s in (*inputs, "gateway")}
            expected[subjects.dlq("recorder")] = 2
            deadline = time.monotonic() + 10
            while (got := await dlq_counts(ajs)) != expected:
                assert time.monotonic() < deadline, f"dead letters {got}, expected {expected}"
                await asyncio.sleep(0.05)
        finally:
            await admin.close()
    finally:
        killed = stop_all(procs)
    assert killed == [], f"had to kill {killed}"
    with duckdb.connect(str(tmp_path / "populace.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM agent_profiles").fetchone() == (200,)
        assert con.execute("SELECT count(*) FROM runs WHERE manifest_json IS NOT NULL").fetchone() == (1,)

    # Nothing any service needed was refused, start-up and shutdown included. (The
    # agent-host's core subscribers are no_reply: they used to answer JetStream events on
    # the publisher's PubAck inbox, which this permission set refused.)
    assert server_violations(server) == []


async def test_replicas_user_registers_replicas(server, monkeypatch):
    """`populace replicas …` (register_forever) works as `replicas`: provision, heartbeat
    into KV `replicas`, delete on stop."""
    from populace.core.contracts import ReplicaInfo
    from populace.gateway.launch import register_forever

    monkeypatch.setenv("POPULACE_NATS_USER", "replicas")
    monkeypatch.setenv("POPULACE_NATS_PASSWORD", PASSWORDS["replicas"])
    monkeypatch.setenv("POPULACE_STORAGE", "memory")
    admin, ajs = await admin_js(server.url)

    class FakeReplica:
        info = ReplicaInfo(replica_id="rep-0", url="http://127.0.0.1:9", backend="sim", kind="sim",
                           model="m", max_concurrency=4, heartbeat_at=time.time())

        def alive(self) -> bool:
            return True

    class FakeSet:
        replicas = (FakeReplica(),)

    task = asyncio.create_task(register_forever(server.url, FakeSet(), every_s=0.2))
    try:
        kv = await ajs.key_value(subjects.REPLICAS_BUCKET)

        async def registered() -> bool:
            try:
                return (await kv.get("rep-0")).value is not None
            except Exception:  # noqa: BLE001
                return False

        deadline = time.monotonic() + 10
        while not await registered():
            assert not task.done(), task.exception()
            assert time.monotonic() < deadline, "replica not registered"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert not await registered()  # deleted on stop
    await admin.close()
    assert server_violations(server) == []
