"""Who may publish interviews' subjects (deploy/nats/auth.conf), by attempted publishes on a
server running the deploy file: an agent-host its answers (`run.<rid>.interviews.<n>.<host>`,
a host with its own user only under its own id); every other role is refused."""

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


@pytest.mark.parametrize("user", [u for u in USERS if u not in ("agent-host", "admin")])
async def test_only_an_agent_host_publishes_answers(server, user):
    admin, ajs = await admin_js(server.url)
    try:
        before = await messages(ajs, subjects.RUN_STREAM)
        await refused(server.url, user, ANSWERS)
        assert await messages(ajs, subjects.RUN_STREAM) == before
    finally:
        await admin.close()


async def test_an_agent_host_publishes_answers_a_hosts_own_user_only_its_own(server):
    admin, _ = await admin_js(server.url)
    try:
        await stored(server.url, "agent-host", subjects.run_interviews("x", 2, "any-host"))
        await stored(server.url, "host-a", ANSWERS, password=HOST_PASSWORDS["host-a"])
        await refused(server.url, "host-a", subjects.run_interviews("x", 1, "host-b"), password=HOST_PASSWORDS["host-a"])
    finally:
        await admin.close()
