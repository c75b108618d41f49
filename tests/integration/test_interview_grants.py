"""Who may publish interviews' subjects (deploy/nats/auth.conf), by attempted publishes on a
server running the deploy file, every other role refused:
- answers (`run.<rid>.interviews.<n>.<host>`): an agent-host (a host's own user under its id only);
- a post-hoc request (`ctl.run.interview`): cli and manager;
- its orders to hosts (`run.<rid>.ask.<host>`) and its placement (`run.<rid>.asked.<request>`):
  the orchestrator;
- its answers all recorded (`run.<rid>.interviewed.<request>`): the recorder.
And who may hear them: orders only agent-hosts (a host's own user its own), the placement
and the recording cli (the manager reads them from RUN)."""

from __future__ import annotations

import nats.errors
import pytest
from test_auth import (
    HOST_PASSWORDS,
    USERS,
    admin_js,
    connect_as,
    denied,
    eventually,
    messages,
    write_test_conf,
)

from populace.core import subjects
from populace.core.natsserver import EmbeddedNats

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

ANSWERS = subjects.run_interviews("x", 1, "host-a")
# subject -> the roles that may publish it
PUBLISHERS = {
    ANSWERS: {"agent-host"},
    subjects.RUN_INTERVIEW: {"cli", "manager"},
    subjects.run_ask("x", "host-a"): {"orchestrator"},
    subjects.run_asked("x", "iv-1"): {"orchestrator"},
    subjects.run_interviewed("x", "iv-1"): {"recorder"},
}
# subject -> the roles that may subscribe to it
HEARERS = {subjects.run_ask("x", "host-a"): {"agent-host"}, subjects.run_asked("x", "iv-1"): {"cli"},
           subjects.run_interviewed("x", "iv-1"): {"cli"}}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("interview-grants")
    conf = write_test_conf(tmp, HOST_PASSWORDS)
    with EmbeddedNats(extra_args=["-c", str(conf)]) as ns:
        yield ns


async def refused(url: str, user: str, subject: str, password: str | None = None) -> None:
    errors: list[str] = []
    nc = await connect_as(url, user, errors, password=password)
    try:
        js = nc.jetstream(timeout=1.0)
        with pytest.raises(nats.errors.TimeoutError):
            await js.publish(subject, b"{}", timeout=0.5)
        await eventually(lambda: denied(errors, "publish", subject), what=f"{user}'s violation on {subject}")
    finally:
        await nc.close()


async def stored(url: str, user: str, subject: str, password: str | None = None) -> None:
    nc = await connect_as(url, user, password=password)
    try:
        assert (await nc.jetstream(timeout=2.0).publish(subject, b"{}")).stream == subjects.RUN_STREAM
    finally:
        await nc.close()


@pytest.mark.parametrize(("subject", "user"), [(s, u) for s, allowed in PUBLISHERS.items() for u in USERS
                                                if u not in allowed and u != "admin"])
async def test_every_other_role_is_refused_each_interview_subject(server, subject, user):
    admin, ajs = await admin_js(server.url)
    try:
        stream = subjects.CTL_STREAM if subject.startswith("ctl.") else subjects.RUN_STREAM
        before = await messages(ajs, stream)
        await refused(server.url, user, subject)
        assert await messages(ajs, stream) == before
    finally:
        await admin.close()


@pytest.mark.parametrize(("subject", "user"), [(s, u) for s, allowed in PUBLISHERS.items() for u in sorted(allowed)])
async def test_the_roles_allowed_publish_them(server, subject, user):
    admin, _ = await admin_js(server.url)
    try:
        nc = await connect_as(server.url, user)
        try:
            ack = await nc.jetstream(timeout=2.0).publish(subject, b"{}")
            assert ack.stream == (subjects.CTL_STREAM if subject.startswith("ctl.") else subjects.RUN_STREAM)
        finally:
            await nc.close()
    finally:
        await admin.close()


@pytest.mark.parametrize(("subject", "user"), [(s, u) for s, allowed in HEARERS.items() for u in USERS
                                                if u not in allowed and u != "admin"])
async def test_only_their_readers_hear_orders_and_placements(server, subject, user):
    errors: list[str] = []
    nc = await connect_as(server.url, user, errors)
    try:
        await nc.subscribe(subject)
        await nc.flush()
        await eventually(lambda: denied(errors, "subscription", subject), what=f"{user}'s violation on {subject}")
    finally:
        await nc.close()


async def test_an_agent_host_publishes_answers_a_hosts_own_user_only_its_own(server):
    admin, _ = await admin_js(server.url)
    try:
        await stored(server.url, "agent-host", subjects.run_interviews("x", 2, "any-host"))
        await stored(server.url, "host-a", ANSWERS, password=HOST_PASSWORDS["host-a"])
        await refused(server.url, "host-a", subjects.run_interviews("x", 1, "host-b"), password=HOST_PASSWORDS["host-a"])
        errors: list[str] = []
        nc = await connect_as(server.url, "host-a", errors, password=HOST_PASSWORDS["host-a"])
        try:  # its own orders it hears, another host's not
            await nc.subscribe(subjects.run_ask("x", "host-a"))
            await nc.subscribe(subjects.run_ask("x", "host-b"))
            await nc.flush()
            await eventually(lambda: denied(errors, "subscription", subjects.run_ask("x", "host-b")),
                             what="host-a's violation on host-b's orders")
            assert not denied(errors, "subscription", subjects.run_ask("x", "host-a"))
        finally:
            await nc.close()
    finally:
        await admin.close()
