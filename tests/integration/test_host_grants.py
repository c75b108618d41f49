"""What one agent-host's own NATS user (`populace auth host`) may still do on the JetStream API
and the stores, tried as an attacker holding those credentials (issue 26, items 2 and 9), and
what graph runs need with users on (item 8).

- RUN's consumers: it may read back its own mail, through one consumer named for it and
  filtered to its own mail subjects, and nothing else: it cannot delete, retarget or pull
  from a service's durable, nor read another host's outcomes through a consumer of its own;
- a service's durable that disappears or is changed all the same is re-created by its owner
  from where it had got to, and reported (`durable_recreated`);
- stores: it cannot purge or wipe the checkpoints store (a purge, or a `Nats-Rollup: all`
  header on a message of its own), nor the hosts or services registries.
"""

from __future__ import annotations

import json

import nats.errors
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from test_auth import PASSWORDS, admin_js, connect_as, denied, eventually, server_violations, write_test_conf

from populace.core import subjects
from populace.core.natsserver import EmbeddedNats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

HOSTS = {"host-a": "pw-host-a", "host-b": "pw-host-b"}


@pytest.fixture
def hosts_server(tmp_path):
    conf = write_test_conf(tmp_path, HOSTS)
    with EmbeddedNats(extra_args=["-c", str(conf)], log_file=str(tmp_path / "nats-server.log")) as ns:
        ns.log_path = tmp_path / "nats-server.log"
        yield ns


async def api(nc, subject: str, body: dict | None = None) -> dict | None:
    """One raw JetStream API call; None when no answer comes (the server refused the publish)."""
    try:
        msg = await nc.request(subject, b"" if body is None else json.dumps(body).encode(), timeout=0.5)
    except nats.errors.TimeoutError:
        return None
    return json.loads(msg.data)


async def test_a_host_cannot_touch_service_durables_or_read_other_hosts_through_a_consumer(hosts_server):
    admin, ajs = await admin_js(hosts_server.url)
    # the services' durables as they create them
    await ajs.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
        durable_name="recorder", filter_subject=subjects.ANY_RUN_EVENT, ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.ALL))
    await ajs.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
        durable_name="environment-partial", filter_subject=subjects.ANY_PARTIAL, ack_policy=AckPolicy.EXPLICIT,
        deliver_policy=DeliverPolicy.NEW))
    errors: list[str] = []
    nc = await connect_as(hosts_server.url, "host-a", errors, password=HOSTS["host-a"])
    other = await connect_as(hosts_server.url, "host-b", password=HOSTS["host-b"])
    try:
        await other.jetstream().publish("run.r1.outcomes.1.host-b", b'{"answers": "host-b"}')
        await other.jetstream().publish(subjects.run_mail("r1", 1, "host-a", 0, "host-b"), b'{"mail": 1}')
        js = nc.jetstream(timeout=1.0)
        stream = subjects.RUN_STREAM
        mine = subjects.mail_consumer("host-a")
        own_mail = subjects.run_mail_to("r1", 1, "host-a", 0)
        attacks = {  # what: (API subject, the filter its body asks for)
            "delete the recorder's durable": (f"$JS.API.CONSUMER.DELETE.{stream}.recorder", None),
            "delete environment-partial": (f"$JS.API.CONSUMER.DELETE.{stream}.environment-partial", None),
            "pull from the recorder's durable": (f"$JS.API.CONSUMER.MSG.NEXT.{stream}.recorder", None),
            "look the recorder's durable up": (f"$JS.API.CONSUMER.INFO.{stream}.recorder", None),
            # the named form with a filter of its own mail: an update of the recorder's durable
            "retarget the recorder's durable": (f"$JS.API.CONSUMER.CREATE.{stream}.recorder.{own_mail}", own_mail),
            # the unnamed (legacy) form carries any filter in its body
            "a consumer on every run's events": (f"$JS.API.CONSUMER.CREATE.{stream}", subjects.ANY_RUN_EVENT),
            # its own consumer's name, another host's outcomes or mail
            "another host's answers": (f"$JS.API.CONSUMER.CREATE.{stream}.{mine}.run.*.outcomes.*.host-b",
                                       "run.*.outcomes.*.host-b"),
            "another host's mail": (f"$JS.API.CONSUMER.CREATE.{stream}.{mine}."
                                    + subjects.run_mail_to("r1", 1, "host-b", 0),
                                    subjects.run_mail_to("r1", 1, "host-b", 0)),
        }
        for what, (subject, filt) in attacks.items():
            body = {"stream_name": stream, "config": {"name": mine, "filter_subject": filt, "deliver_policy": "all",
                                                      "ack_policy": "none"}} if filt else (
                {"batch": 1, "no_wait": True} if ".MSG.NEXT." in subject else None)
            assert await api(nc, subject, body) is None, f"a host could {what}"
            await eventually(lambda s=subject: denied(errors, "publish", s), what=f"violation: {what}")
        recorder = await ajs.consumer_info(stream, "recorder")
        assert recorder.config.filter_subject == subjects.ANY_RUN_EVENT and recorder.num_pending == 2
        assert (await ajs.consumer_info(stream, "environment-partial")).config.filter_subject == subjects.ANY_PARTIAL

        # Positive control: its own mail, read back the way MailCarrier.refetch does.
        from populace.agent_host.mail import read_back

        got = await read_back(js, "host-a", subjects.run_mail_to("r1", 1, "host-a", 0))
        assert [m.data for m in got] == [b'{"mail": 1}']
        with pytest.raises(NotFoundError):  # and it is gone once read
            await js.consumer_info(stream, mine)
    finally:
        for c in (nc, other, admin):
            await c.close()


async def test_the_shared_agent_host_user_cannot_touch_service_durables_either(hosts_server):
    """The shared `agent-host` user may name any host's mail consumer (its name token is a
    wildcard), so the services' durables on RUN are denied to it by name."""
    admin, ajs = await admin_js(hosts_server.url)
    await ajs.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
        durable_name="recorder", filter_subject=subjects.ANY_RUN_EVENT, ack_policy=AckPolicy.EXPLICIT))
    errors: list[str] = []
    nc = await connect_as(hosts_server.url, "agent-host", errors)
    try:
        own_mail = subjects.run_mail_to("r1", 1, "host-a", 0)
        for subject, body in (
            (f"$JS.API.CONSUMER.DELETE.{subjects.RUN_STREAM}.recorder", None),
            (f"$JS.API.CONSUMER.MSG.NEXT.{subjects.RUN_STREAM}.recorder", {"batch": 1, "no_wait": True}),
            (f"$JS.API.CONSUMER.CREATE.{subjects.RUN_STREAM}.recorder.{own_mail}",
             {"stream_name": subjects.RUN_STREAM, "config": {"durable_name": "recorder", "filter_subject": own_mail,
                                                             "ack_policy": "explicit"}}),
        ):
            assert await api(nc, subject, body) is None, subject
            await eventually(lambda s=subject: denied(errors, "publish", s), what=f"violation on {subject}")
        assert (await ajs.consumer_info(subjects.RUN_STREAM, "recorder")).config.filter_subject == "run.>"
        # any host's mail read-back still works for it
        from populace.agent_host.mail import read_back

        assert await read_back(nc.jetstream(timeout=2.0), "host-a", own_mail) == []
    finally:
        await nc.close()
        await admin.close()


async def test_a_host_cannot_purge_or_wipe_the_checkpoints_nor_the_registries(hosts_server):
    """A purge of the checkpoints store, and a message of its own with `Nats-Rollup: all` (which
    purges a whole stream that allows rollups: nats-py's object store and KV do) on its
    checkpoint metadata, its chunks, its KV `hosts` entry and its KV `services` entry. Before,
    each emptied the store or the bucket; now the purge is refused by the server's
    permissions, the rollups by the streams, and everything is still there."""
    from populace.core import checkpoints, owned_objects

    admin, ajs = await admin_js(hosts_server.url)
    errors: list[str] = []
    nc = await connect_as(hosts_server.url, "host-a", errors, password=HOSTS["host-a"])
    other = await connect_as(hosts_server.url, "host-b", password=HOSTS["host-b"])
    env = await connect_as(hosts_server.url, "environment")
    try:
        js = nc.jetstream(timeout=1.0)
        # a restore reads checkpoints only against the digests their writers reported
        stored = [await checkpoints.save_agents(other.jetstream(), "r1", 1, 0, 2, {"memory": [[1], [2]]},
                                                writer="host-b"),
                  await checkpoints.save_env(env.jetstream(), "r1", 1, {"n": 1}, {}),
                  await checkpoints.save_agents(js, "r1", 1, 2, 1, {"memory": [[3]]}, writer="host-a")]
        digests = {s.name: s.digest for s in stored}
        await (await ajs.key_value(subjects.HOSTS_BUCKET)).put("host-b", b"{}")
        await (await ajs.key_value(subjects.SERVICES_BUCKET)).put("recorder.1", b"{}")
        await (await js.key_value(subjects.HOSTS_BUCKET)).put("host-a", b"{}")
        stream = f"OBJ_{subjects.CHECKPOINTS_BUCKET}"
        before = {s: (await ajs.stream_info(s)).state.messages for s in (stream, "KV_hosts", "KV_services")}

        with pytest.raises(nats.errors.TimeoutError):
            await js.purge_stream(stream)
        await eventually(lambda: denied(errors, "publish", f"$JS.API.STREAM.PURGE.{stream}"), what="purge violation")
        for subject in (owned_objects.meta_subject("host-a", "r1.1.agents.2"),
                        subjects.checkpoint_chunks("host-a", "r1"), "$KV.hosts.host-a"):
            with pytest.raises(nats.js.errors.APIError, match="rollup not permitted"):
                await js.publish(subject, b"", headers={"Nats-Rollup": "all"})
        # its own user may not write another's chunks or metadata, nor anything in the services
        # registry but an agent-host's entry
        for subject in (subjects.checkpoint_chunks("host-b", "r1"), owned_objects.meta_subject("host-b", "r1.1.agents.0"),
                        "$KV.services.recorder.1"):
            with pytest.raises(nats.errors.TimeoutError):
                await js.publish(subject, b"junk", timeout=0.5)
            await eventually(lambda s=subject: denied(errors, "publish", s), what=f"violation on {subject}")

        after = {s: (await ajs.stream_info(s)).state.messages for s in before}
        assert after == before
        writers = {subjects.checkpoint_agents("r1", 1, 0): "host-b", subjects.checkpoint_agents("r1", 1, 2): "host-a"}
        assert await checkpoints.load_agents(js, "r1", 1, [(0, 2), (2, 1)], [(0, 3)], digests, writers) == {
            0: {"memory": [1]}, 1: {"memory": [2]}, 2: {"memory": [3]}}
        assert await checkpoints.load_env(js, "r1", 1, digests) == ({"n": 1}, {}, None, None, None, None)
    finally:
        for c in (nc, other, env, admin):
            await c.close()


async def test_a_durable_gone_or_changed_is_recreated_by_its_owner_from_its_last_ack(hosts_server):
    """Whoever changed it (an admin's mistake, a user with more rights than a host): the
    recorder's durable retargeted to a filter that matches nothing, which keeps its position
    and skips what arrives meanwhile, and later deleted. Its owner (as the `recorder` user)
    re-creates it each time from its last acknowledged message: nothing is skipped."""
    from populace.core.durables import DurableKeeper

    admin, ajs = await admin_js(hosts_server.url)
    rec = await connect_as(hosts_server.url, "recorder")
    try:
        js = rec.jetstream(timeout=2.0)
        config = ConsumerConfig(durable_name="recorder", filter_subject=subjects.ANY_RUN_EVENT,
                                ack_policy=AckPolicy.EXPLICIT, deliver_policy=DeliverPolicy.ALL, max_deliver=7)
        sub = await js.pull_subscribe(subjects.ANY_RUN_EVENT, durable="recorder", stream=subjects.RUN_STREAM,
                                      config=config)
        keeper = DurableKeeper(js, "recorder")
        keeper.keep(subjects.RUN_STREAM, config.evolve(durable_name="recorder", filter_subject="run.>"))
        for i in range(3):
            await ajs.publish(f"run.r1.outcomes.1.h{i}", b"{}")
        for msg in await sub.fetch(3, timeout=2):
            await msg.ack_sync()
        assert await keeper.check() == []

        # retargeted: it now matches nothing, and two events arrive meanwhile
        await ajs.add_consumer(subjects.RUN_STREAM, ConsumerConfig(
            durable_name="recorder", name="recorder", filter_subject="nothing.>", ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL, max_deliver=7))
        await ajs.publish("run.r1.outcomes.2.h0", b"{}")
        await ajs.publish("run.r1.outcomes.2.h1", b"{}")
        assert (await ajs.consumer_info(subjects.RUN_STREAM, "recorder")).num_pending == 0
        assert await keeper.check() == ["recorder: filter_subject is 'nothing.>', should be 'run.>'"]
        got = await sub.fetch(5, timeout=2)
        assert [m.subject for m in got] == ["run.r1.outcomes.2.h0", "run.r1.outcomes.2.h1"]
        for msg in got:
            await msg.ack_sync()
        assert await keeper.check() == []  # its periodic look: healthy, its floor noted

        # deleted: re-created from there, and the next event still comes through the same pull
        await ajs.delete_consumer(subjects.RUN_STREAM, "recorder")
        await ajs.publish("run.r1.done", b"{}")
        assert await keeper.check() == ["recorder: missing"]
        assert [m.subject for m in await sub.fetch(5, timeout=2)] == ["run.r1.done"]
        assert await keeper.check() == [] and keeper.recreated == 2
        # (a durable re-created between two looks replays what was acknowledged since the
        # first: at least once, as after any restart; every consumer upserts)
    finally:
        await rec.close()
        await admin.close()


async def test_graph_runs_upload_and_read_their_graph_with_users_on_and_a_missing_grant_is_named(hosts_server):
    """Item 8: the client (`cli`, `manager`) writes a graph to object store `graphs`, a host
    reads it back — with no permission violation. A user without the grant is told which
    subject NATS refused, at once (before: "cannot reach NATS … or the run stalled", 80 s on)."""
    from populace.core import bus
    from populace.graph.csr import from_edges
    from populace.graph.serial import dumps
    from populace.graph.store import get_graph, put_graph

    admin, _ = await admin_js(hosts_server.url)
    graph = from_edges(4, [0, 1, 2, 3], [1, 2, 3, 0], directed=False)
    clients = {u: await bus.connect(hosts_server.url, f"test-{u}", user=u, password=PASSWORDS[u])
               for u in ("cli", "manager", "replicas")}
    host = await connect_as(hosts_server.url, "host-a", password=HOSTS["host-a"])
    try:
        key = await put_graph(clients["cli"].jetstream(timeout=2.0), graph)
        assert await put_graph(clients["manager"].jetstream(timeout=2.0), dumps(graph)) == key  # already there
        assert dumps(await get_graph(host.jetstream(timeout=2.0), key)) == dumps(graph)
        assert server_violations(hosts_server) == []

        with pytest.raises(bus.PermissionDenied, match=r"graph.*'replicas'.*permissions violation for publish to "
                                                       r'"\$js\.api\.stream\.msg\.get\.obj_graphs"'):
            await put_graph(clients["replicas"].jetstream(timeout=2.0), from_edges(2, [0], [1], directed=True))
    finally:
        for c in (*clients.values(), host, admin):
            await c.close()
