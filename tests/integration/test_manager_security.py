"""The manager attacked as issue 26 describes it, against a real nats-server: each test tries
the attack and checks what it gets now.

- DNS rebinding: without a token (loopback mode) a request whose Host names another site (what
  a browser sends to a page whose name was rebound to 127.0.0.1) is refused, and nothing is
  published on the CTL stream; loopback names and addresses are still served."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from starlette.testclient import TestClient

from populace.core import bus, subjects
from populace.manager import ManagerSettings, create_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GOOD = "agents: 20\nrounds: 1\nmodel:\n  backend: dummy\n"


def arun(coro_factory, url: str):
    async def go():
        nc = await bus.connect(url, "manager-security-test")
        try:
            return await coro_factory(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def url(nats_server):
    async def setup(nc):
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        await bus.provision_nodes(js, storage="memory")

    arun(setup, nats_server.url)
    return nats_server.url


def ctl_messages(url: str) -> int:
    async def count(nc):
        return (await nc.jetstream().stream_info(subjects.CTL_STREAM)).state.messages

    return arun(count, url)


def run_ids(url: str) -> set[str]:
    async def keys(nc):
        kv = await nc.jetstream().key_value(subjects.RUNS_BUCKET)
        try:
            return set(await kv.keys())
        except Exception:  # no keys yet
            return set()

    return arun(keys, url)


# --- item 10: DNS rebinding ----------------------------------------------------------------
@pytest.mark.parametrize("evil", ["http://evil.example:8080", "http://evil.example", "http://127.0.0.1.evil.example",
                                  "http://localhost.evil.example:8080", "http://10.0.0.5:8080"])
def test_a_rebound_page_cannot_start_a_run_or_read_a_page_without_a_token(url, evil):
    before = ctl_messages(url)
    with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=evil, follow_redirects=False) as c:
        # a browser after rebinding: Host and Origin both name the attacker's site, so the
        # same-origin check alone lets it through
        res = c.post("/start", data={"scenario": GOOD, "simulation": ""}, headers={"origin": evil})
        assert res.status_code == 421, res.text
        assert "loopback" in res.text and "token" in res.text
        for path in ("/runs", "/events/runs?once=1", "/nodes", "/start", "/healthz"):
            assert c.get(path).status_code == 421, path
        assert c.post(f"/runs/r-{uuid.uuid4().hex[:6]}/cancel", headers={"origin": evil}).status_code == 421
    assert ctl_messages(url) == before  # nothing was submitted


@pytest.mark.parametrize("base", ["http://localhost:8080", "http://127.0.0.1", "http://127.8.9.10:8080",
                                  "http://[::1]:8080", "http://[::1]", "http://LOCALHOST"])
def test_loopback_names_and_addresses_are_served_without_a_token(url, base):
    with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=base, follow_redirects=False) as c:
        assert c.get("/runs").status_code == 200
        before = ctl_messages(url)
        # a browser sends the origin lower-cased, as httpx sends the Host
        res = c.post("/start", data={"scenario": GOOD, "simulation": ""}, headers={"origin": base.lower()})
        assert res.status_code == 303 and res.headers["location"].startswith("/runs/"), res.text
        assert ctl_messages(url) == before + 1


def test_with_a_token_another_name_is_served_and_a_cross_site_post_still_refused(url):
    token = "rebinding-test-token"
    app = create_app(ManagerSettings(nats_url=url, token=token))
    auth = {"authorization": f"Bearer {token}"}
    with TestClient(app, base_url="http://manager.example:8080", follow_redirects=False) as c:
        assert c.get("/runs", headers=auth).status_code == 200
        before = ctl_messages(url)
        res = c.post("/start", data={"scenario": GOOD}, headers={**auth, "origin": "http://evil.example"})
        assert res.status_code == 403
        assert ctl_messages(url) == before
