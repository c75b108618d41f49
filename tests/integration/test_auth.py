"""NATS authentication and per-service permissions (deploy/nats/auth.conf).

The server runs the deploy file itself, preceded by concrete values for its
`$<USER>_PASSWORD` variables. It shows that
- a client without credentials (or with a wrong password) cannot connect at all;
- a connected user may not publish `ctl.run.start` unless it is `cli`, and nothing it
  tried lands in the CTL stream;
- a service (agent-host) cannot publish, subscribe or call the JetStream API outside
  its list — while its own subjects still work;
- the lists are sufficient, not only restrictive: every service runs as its own user,
  a game is played as `cli` to the end; as `cli`, a run is cancelled while a round is in
  play, resumed to its end, and a run is forked after a round (checkpoints written and read
  back by the hosts, the environment and the orchestrator); malformed input is
  dead-lettered by each service, and the server logs no permission violation;
- the checkpoint writers (agent-host, environment) may replace a checkpoint, as a replayed
  round does, and nobody else may write or purge the checkpoints.
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import duckdb
import nats
import nats.errors
import pytest

from populace.client import live as steer
from populace.client.prepare import prepare
from populace.client.run import RunOutcome, new_run_id, play, run_state
from populace.client.stack import Stack
from populace.core import bus, checkpoints, owned_objects, replies, subjects
from populace.core.contracts import RoundOpen, RunConfig, RunStart
from populace.core.hostauth import with_hosts
from populace.core.natsserver import EmbeddedNats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

DEPLOY_CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats" / "auth.conf"
EDUCATION = Path(__file__).resolve().parents[2] / "examples" / "population" / "education.yaml"
SERVICES = ("orchestrator", "environment", "gateway", "recorder", "agent-host")
USERS = (*SERVICES, "replicas", "node", "cli", "manager", "admin")
PASSWORDS = {u: f"test-{u}-pw" for u in USERS}
HOST_ID = "host-0"  # the one agent-host of a Stack (populace.client.stack)


def password_var(user: str) -> str:
    return user.upper().replace("-", "_") + "_PASSWORD"


def write_test_conf(tmp_path: Path, hosts: dict[str, str] | None = None) -> Path:
    """The deploy config unchanged, with its password variables defined up front (and, given
    `hosts`, a user of their own for those agent-hosts: populace.core.hostauth)."""
    text = DEPLOY_CONF.read_text()
    # The deploy file names every password by variable, and exactly these.
    assert set(re.findall(r"\$([A-Z_]+_PASSWORD)\b", text)) == {password_var(u) for u in USERS}
    defs = "".join(f'{password_var(u)}: "{pw}"\n' for u, pw in PASSWORDS.items())
    path = tmp_path / "auth.conf"
    path.write_text(defs + (with_hosts(text, hosts) if hosts else text))
    return path


@pytest.fixture
def server(tmp_path):
    conf = write_test_conf(tmp_path)
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(tmp_path / "nats-server.log")) as ns:
        ns.log_path = tmp_path / "nats-server.log"
        yield ns


async def connect_as(url: str, user: str, errors: list[str] | None = None, password: str | None = None, **kw):
    async def on_error(err: Exception) -> None:
        if errors is not None:
            errors.append(str(err))

    kw.setdefault("inbox_prefix", bus.inbox_prefix(user))  # the only inboxes its user may read
    return await nats.connect(url, user=user, password=password or PASSWORDS[user], name=f"test-{user}",
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
HOST_PASSWORDS = {"host-a": "pw-host-a", "host-b": "pw-host-b"}


async def test_a_hosts_own_user_speaks_only_for_itself_and_reads_only_its_own_inboxes(tmp_path):
    conf = write_test_conf(tmp_path, HOST_PASSWORDS)
    with EmbeddedNats(extra_args=["-c", str(conf)]) as ns:
        admin, ajs = await admin_js(ns.url)
        errors: list[str] = []
        nc = await connect_as(ns.url, "host-a", errors, password=HOST_PASSWORDS["host-a"])
        others: list[str] = []
        replicas = await connect_as(ns.url, "replicas", others)
        try:
            js = nc.jetstream(timeout=1.0)
            # its own partial, outcomes and registry entry are stored (and answered on its inbox)
            assert (await js.publish("run.x.partial.1.host-a.0", b"{}", timeout=2.0)).stream == subjects.RUN_STREAM
            assert (await js.publish("run.x.outcomes.1.host-a", b"{}", timeout=2.0)).stream == subjects.RUN_STREAM
            await (await js.key_value(subjects.HOSTS_BUCKET)).put("host-a", b"{}")
            # another host's are refused by the server, before any service sees them
            for subject in ("run.x.partial.1.host-b.0", "run.x.outcomes.1.host-b", "run.x.spawned.host-b",
                            "$KV.hosts.host-b"):
                with pytest.raises(nats.errors.TimeoutError):
                    await js.publish(subject, b"{}", timeout=0.5)
                await eventually(lambda s=subject: denied(errors, "publish", s), what=f"violation on {subject}")
            # nobody else's inboxes, spawn orders or outcomes can be read
            for subject in ("_INBOX.>", "_INBOX_host-b.>", "_INBOX_recorder.>", "run.*.spawn.host-b",
                            "run.*.outcomes.*.*"):
                await nc.subscribe(subject)
                await nc.flush()
                await eventually(lambda s=subject: denied(errors, "subscription", s), what=f"violation on {subject}")
            for subject in ("_INBOX.>", "_INBOX_recorder.>"):  # the least-privileged user neither
                await replicas.subscribe(subject)
                await replicas.flush()
                await eventually(lambda s=subject: denied(others, "subscription", s), what=f"violation on {subject}")
            assert await messages(ajs, subjects.RUN_STREAM) == 2
        finally:
            await nc.close()
            await replicas.close()
            await admin.close()

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
        # The same connection does its own job: a replica entry in KV `replicas`, under its own name …
        kv = await js.key_value(subjects.REPLICAS_BUCKET)
        await kv.put("replicas.r-1", b"{}")
        assert (await (await ajs.key_value(subjects.REPLICAS_BUCKET)).get("replicas.r-1")).value == b"{}"
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


async def test_checkpoints_are_replaced_by_their_writers_only(server):
    """A round played again (after a resume) writes the same checkpoint names: the newest
    write of a name by its writer is the object (populace.core.owned_objects: no purge; the
    replaced chunks stay until the recorder prunes the run). Readers read; nobody writes under
    another writer's token, and nobody else purges."""
    admin, ajs = await admin_js(server.url)
    errors: list[str] = []
    conns = {u: await connect_as(server.url, u, errors if u in ("orchestrator", "agent-host") else None)
             for u in ("agent-host", "environment", "orchestrator")}
    try:
        host, env, orch = (conns[u].jetstream(timeout=2.0) for u in ("agent-host", "environment", "orchestrator"))
        for round_ in (1, 2):  # the second write replaces the first
            agents = await checkpoints.save_agents(host, "r1", 3, 0, 2, {"memory": [[round_], [round_]]}, writer="h0")
            envs = await checkpoints.save_env(env, "r1", 3, {"history": [round_]}, {"round": round_})
        digests = {agents.name: agents.digest, envs.name: envs.digest}
        # One chunk and one metadata message per write: nothing purged
        assert await messages(ajs, f"OBJ_{subjects.CHECKPOINTS_BUCKET}") == 8
        assert await checkpoints.load_agents(host, "r1", 3, [(0, 2)], [(0, 2)], digests, {agents.name: "h0"}) == {
            0: {"memory": [2]}, 1: {"memory": [2]}}
        assert await checkpoints.load_env(orch, "r1", 3, digests) == ({"history": [2]}, {"round": 2}, None, None, None, None)
        assert server_violations(server) == []

        # The orchestrator reads checkpoints but writes only under its own token (a run's config,
        # populace.core.runconfigs), never as another writer; the shared agent-host user writes
        # as any host, never as the environment or the orchestrator …
        with pytest.raises(nats.errors.TimeoutError):
            await owned_objects.write_object(orch, "r1.3.env", b"{}", "h0")
        with pytest.raises(nats.errors.TimeoutError):
            await owned_objects.write_object(host, "r1.3.env", b"{}", checkpoints.ENV_WRITER)
        with pytest.raises(nats.errors.TimeoutError):
            await host.publish(owned_objects.meta_subject(checkpoints.CONFIG_WRITER, "r1.1.config.x"), b"{}")
        # … nor one more token than its bound covers, nor the layout before it (metadata of any writer)
        with pytest.raises(nats.errors.TimeoutError):
            await host.publish(f"{subjects.checkpoint_chunks('h0', 'r1')}.more", b"x")
        with pytest.raises(nats.errors.TimeoutError):
            await host.publish(f"$O.checkpoints.M.{owned_objects.encode_name('r1.3.env')}", b"{}")
        await eventually(lambda: any('permissions violation for publish to "$o.checkpoints.c.' in e
                                     for e in errors), what="chunk publish violation")
        # … nor purge them; the `cli` may not even look at them.
        with pytest.raises(nats.errors.TimeoutError):
            await orch.purge_stream(f"OBJ_{subjects.CHECKPOINTS_BUCKET}")
        cli = await connect_as(server.url, "cli")
        conns["cli"] = cli
        with pytest.raises(nats.errors.TimeoutError):
            await cli.jetstream(timeout=1.0).object_store(subjects.CHECKPOINTS_BUCKET)
        assert await messages(ajs, f"OBJ_{subjects.CHECKPOINTS_BUCKET}") == 8
        assert await checkpoints.load_env(orch, "r1", 3, digests) == ({"history": [2]}, {"round": 2}, None, None, None, None)
        refused = {re.sub(r'\$O\.checkpoints\.([CM])\.[\w.=-]+', r'$O.checkpoints.\1.<object>', line.split("Subject ")[-1])
                   for line in server_violations(server)}
        assert refused == {'"$O.checkpoints.C.<object>"', '"$O.checkpoints.M.<object>"',
                           '"$JS.API.STREAM.PURGE.OBJ_checkpoints"', '"$JS.API.STREAM.INFO.OBJ_checkpoints"'}, refused
    finally:
        for c in (*conns.values(), admin):
            await c.close()


async def test_recorder_purges_run_events_and_prunes_checkpoints(server):
    """Bounded storage: the recorder may purge a recorded run's events from RUN and delete a
    completed run's checkpoints (list them, purge the chunks none of the kept needs and the
    metadata of the rest); an agent-host may not purge RUN."""
    admin, ajs = await admin_js(server.url)
    errors: list[str] = []
    conns = {u: await connect_as(server.url, u, errors if u == "agent-host" else None)
             for u in ("agent-host", "environment", "recorder")}
    try:
        host, env, rec = (conns[u].jetstream(timeout=2.0) for u in ("agent-host", "environment", "recorder"))
        digests = {}
        for round_ in (1, 2):
            await checkpoints.save_agents(host, "r1", round_, 0, 2, {"memory": [[round_], [round_]]}, writer="h0")
            stored = await checkpoints.save_env(env, "r1", round_, {"history": [round_]}, {"round": round_})
            digests[stored.name] = stored.digest
        again = await checkpoints.save_env(env, "r1", 1, {"history": [1]}, {"round": 1})  # round 1 played again
        digests[again.name] = again.digest
        await checkpoints.save_env(env, "r2", 1, {}, {})
        assert await checkpoints.prune(rec, "r1", "last") == 2
        assert await checkpoints.load_env(host, "r1", 2, digests) == ({"history": [2]}, {"round": 2}, None, None, None, None)
        with pytest.raises(checkpoints.CheckpointError):
            await checkpoints.load_env(host, "r1", 1, digests)
        # What is left: round 2's 2 objects (chunk and metadata each), r2's, and the chunk of round 1's
        # environment written again after round 2's (a writer's chunks go below its oldest kept one's)
        assert await messages(ajs, f"OBJ_{subjects.CHECKPOINTS_BUCKET}") == 7
        assert await checkpoints.prune(rec, "r1", "none") == 2
        assert await messages(ajs, f"OBJ_{subjects.CHECKPOINTS_BUCKET}") == 2  # r2's
        # the recorder sweeps what belongs to no run (KV `runs` knows none of these)
        swept = await checkpoints.sweep(rec)
        assert (swept.subjects, swept.runs) == (2, ["r2"])
        assert await messages(ajs, f"OBJ_{subjects.CHECKPOINTS_BUCKET}") == 0

        await host.publish(subjects.run_outcomes("r1", 1, HOST_ID), b"{}")
        await host.publish(subjects.run_partial("r1", 1, HOST_ID), b"{}")
        with pytest.raises(nats.errors.TimeoutError):
            await host.purge_stream(subjects.RUN_STREAM, subject=subjects.run_outcomes_all("r1"))
        await rec.purge_stream(subjects.RUN_STREAM, subject=subjects.run_outcomes_all("r1"))
        await rec.purge_stream(subjects.RUN_STREAM, subject=subjects.run_calls_all("r1"))
        info = await ajs.stream_info(subjects.RUN_STREAM, subjects_filter=">")
        assert info.state.subjects == {subjects.run_partial("r1", 1, HOST_ID): 1}
        await eventually(lambda: denied(errors, "publish", "$JS.API.STREAM.PURGE.RUN"), what="purge violation")
        refused = {line.split("Subject ")[-1] for line in server_violations(server)}
        assert refused == {'"$JS.API.STREAM.PURGE.RUN"'}, refused
    finally:
        for c in (*conns.values(), admin):
            await c.close()


# --- c. the whole system, one user per service ----------------------------------------
def service_stack(url: str, tmp_path: Path) -> Stack:
    """Every service as its own NATS user (the host as the shared `agent-host`), all in one
    process: each service connects with its own credentials there as in a process of its own, so
    the permissions are what is proved, and the world is imported once, not once per service."""
    return Stack(hosts=1, nats_url=url, db=str(tmp_path / "populace.duckdb"), log_dir=str(tmp_path),
                 users=PASSWORDS, one_process=True,
                 env={"POPULACE_STORAGE": "memory", "OTEL_TRACES_EXPORTER": "none"})


# Steered runs: small, but each round lasts long enough (the dummy model's latency) for a
# cancel to land while it is in play.
STEERED = {"agents": 300, "rounds": 3, "seed": 3, "model": {"latency_s": 0.5, "seed": 21}}


async def cancel_in_round(cli, url: str, round_: int) -> tuple[str, RunOutcome]:
    """As `cli`: start a run and, as soon as `round_` opens, cancel it as `populace cancel`
    does (KV runs read, run.<rid>.done followed, ctl.run.cancel published)."""
    rid = new_run_id()
    pending: list[asyncio.Future] = []

    def on_event(kind: str, model: object) -> None:
        if isinstance(model, RoundOpen) and model.round == round_ and not pending:
            pending.append(asyncio.ensure_future(steer.cancel_run(url, rid, "enough for now")))

    config = prepare(RunConfig.model_validate(STEERED)).config
    out = await asyncio.wait_for(play(cli, config, run_id=rid, on_event=on_event, stall_s=20), timeout=60)
    [(state, stopped)] = await asyncio.gather(*pending)
    assert stopped is not None and stopped.status == "cancelled"  # the orchestrator confirmed
    assert state.status == "cancelled"
    return rid, out


async def test_game_with_one_user_per_service(server, tmp_path, monkeypatch):
    # `populace resume|fork` (populace.client.live) connect with the settings' credentials.
    monkeypatch.setenv("POPULACE_NATS_USER", "cli")
    monkeypatch.setenv("POPULACE_NATS_PASSWORD", PASSWORDS["cli"])
    stack = service_stack(server.url, tmp_path).start()
    try:
        await stack.wait_ready(timeout=40)
        cli_errors: list[str] = []
        cli = await connect_as(server.url, "cli", cli_errors)
        try:
            # With a population: the cli uploads the personas to the object store, the host
            # and the recorder read them back (each step under its own user's permissions).
            prepared = prepare(RunConfig.model_validate({
                "agents": 200, "rounds": 2, "model": {"latency_s": 0.0, "seed": 5},
                "population": {"config": str(EDUCATION)}}))
            out = await asyncio.wait_for(play(cli, prepared.config, personas=prepared.personas,
                                              manifest=prepared.manifest, stall_s=20), timeout=60)
            assert out.status == "completed", out.reason
            assert [r.round for r in out.results] == [1, 2]
            assert out.recorded is not None and out.recorded.outcomes == 400

            # Steering, as `cli`. Cancel while round 2 is in play (ctl.run.cancel → the
            # orchestrator's durable orchestrator-cancel; the hosts drop the round) …
            rid, stopped = await cancel_in_round(cli, server.url, 2)
            assert (stopped.status, stopped.reason) == ("cancelled", "enough for now")
            state = await run_state(cli, rid)  # KV runs, read
            assert (state.status, state.round) == ("cancelled", 1)
            # … resume (`populace resume`: KV runs and hosts read, ctl.run.resume, run.<rid>.resumed
            # followed; the hosts restore their agents from round 1's checkpoints and replay
            # round 2 in a new epoch) …
            _, resumed = await asyncio.wait_for(steer.resume_run(server.url, rid, show_progress=False), timeout=60)
            assert resumed.status == "completed", resumed.reason
            assert "resumed" in resumed.marks
            assert [r.round for r in resumed.results] == [2, 3]
            assert resumed.recorded is not None and resumed.recorded.outcomes == 900
            # … and fork the game after round 1 (`populace fork`: its parent's RunStarted read
            # back from RUN for the manifest; the orchestrator reads the parent's environment
            # checkpoint, the host its agents' checkpoint).
            fork = await asyncio.wait_for(
                steer.fork_run(server.url, out.run_id, 1, {}, show_progress=False, run_id=new_run_id()), timeout=60)
            assert fork.outcome.status == "completed", fork.outcome.reason
            assert [r.round for r in fork.outcome.results] == [2]
            assert fork.outcome.recorded is not None and fork.outcome.recorded.outcomes == 200
            assert fork.prepared.manifest["population"] == prepared.manifest["population"]  # the parent's
        finally:
            await cli.close()
        assert cli_errors == []

        # Each service may dead-letter what it cannot parse: publish dlq.<service> and
        # terminate the JetStream message ($JS.ACK…); the gateway answers the malformed
        # request with an explicit error (on the requester's own reply subject).
        admin, ajs = await admin_js(server.url)
        try:
            garbage = b"\x00{not a message"
            inputs = {
                "orchestrator": subjects.RUN_START,
                "environment": "run.junk.partial.1.h.0",
                "recorder": "run.junk.outcomes.1.h",
                "agent-host": subjects.run_spawn("junk", HOST_ID),  # the stack's one host
            }
            for subject in inputs.values():
                await ajs.publish(subject, garbage, timeout=5.0)
            reply = await replies.request(admin, "gateway", subjects.llm_infer("admin"), garbage,
                                          timeout=10.0)  # answered, with an error, on admin's own reply subject
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
        killed = stack.stop()
    assert killed == [], f"had to kill {killed}"
    with duckdb.connect(str(tmp_path / "populace.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM agent_profiles WHERE run_id = ?", [out.run_id]).fetchone() == (200,)
        assert con.execute("SELECT count(*) FROM runs WHERE manifest_json IS NOT NULL").fetchone() == (2,)
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [rid]).fetchone() == ("completed",)

    # Nothing any service needed was refused, start-up and shutdown included. (The
    # agent-host's core subscribers are no_reply: they used to answer JetStream events on
    # the publisher's PubAck inbox, which this permission set refused.)
    assert server_violations(server) == []


async def test_replicas_user_registers_replicas(server, monkeypatch):
    """`populace replicas …` (register_forever) works as `replicas`: provision, heartbeat
    into KV `replicas`, delete on stop."""
    from populace.core.contracts import ReplicaInfo
    from populace.replicas.launch import register_forever

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
                return (await kv.get("replicas.rep-0")).value is not None  # under its writer's name
            except Exception:
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
