"""The manager attacked as issue 26 describes it, against a real nats-server: each test tries
the attack and checks what it gets now.

- DNS rebinding: without a token (loopback mode) a request whose Host names another site (what
  a browser sends to a page whose name was rebound to 127.0.0.1) is refused, and nothing is
  published on the CTL stream; loopback names and addresses are still served.
- Files: the start form's edge list or personas outside the working directory (a '..' path, an
  absolute one, a link inside it that leads out) is refused before it is read, and a bad file
  inside it is named without its content; a good one is read and the run submitted.
(Guessing the token and oversized bodies: tests/unit/test_manager_access.py and
tests/e2e/test_manager_limits.py.)"""

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


# --- item 11: files the start form names ---------------------------------------------------
SECRET = "TOPSECRET-column"
INNER = "INNERSECRET-column"


@pytest.fixture
def workdir(tmp_path, monkeypatch):
    """The manager's working directory `work/`, beside an `outside/` it must never read: a
    secret CSV edge list and personas JSONL there, symbolic links to them inside `work/`, and
    a CSV inside `work/` that is not an edge list."""
    outside, work = tmp_path / "outside", tmp_path / "work"
    outside.mkdir()
    work.mkdir()
    (outside / "secret.csv").write_text(f"{SECRET},pw\n1,2\n")
    (outside / "secret.jsonl").write_text("".join(f'{{"profile": {{"{SECRET}": {i}}}}}\n' for i in range(20)))
    (work / "link.csv").symlink_to(outside / "secret.csv")
    (work / "link.jsonl").symlink_to(outside / "secret.jsonl")
    (work / "inner.csv").write_text(f"{INNER},x\n1,2\n")
    (work / "edges.csv").write_text("source,target\n" + "".join(f"{i},{(i + 1) % 20}\n" for i in range(20)))
    monkeypatch.chdir(work)
    return work


def post_scenario(c: TestClient, text: str):
    return c.post("/start", data={"scenario": text, "simulation": ""}, headers={"origin": LOCAL})


LOCAL = "http://127.0.0.1:8080"


@pytest.mark.parametrize(("section", "field"), [
    ("graph: {{generator: edges, path: {p}}}", "graph.path"),
    ("population: {{personas: {p}}}", "population.personas"),
])
@pytest.mark.parametrize("where", ["outside", "link"])
def test_the_start_form_reads_no_file_outside_the_working_directory(url, workdir, section, field, where):
    ext = "csv" if field == "graph.path" else "jsonl"
    paths = {"outside": [f"../outside/secret.{ext}", f"{workdir.parent}/outside/secret.{ext}"],
             "link": [f"link.{ext}", f"./link.{ext}"]}[where]
    with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=LOCAL, follow_redirects=False) as c:
        for path in paths:
            before = ctl_messages(url)
            res = post_scenario(c, "agents: 20\nrounds: 1\n" + section.format(p=path) + "\n")
            assert res.status_code == 422, (path, res.text[:300])
            assert field in res.text and "working directory" in res.text, path
            assert SECRET not in res.text, path  # neither read nor shown
            assert ctl_messages(url) == before


def test_a_bad_file_inside_the_working_directory_is_named_but_its_content_is_not_shown(url, workdir):
    with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=LOCAL, follow_redirects=False) as c:
        res = post_scenario(c, "agents: 20\nrounds: 1\ngraph: {generator: edges, path: inner.csv}\n")
        assert res.status_code == 422 and "graph.path" in res.text and "inner.csv" in res.text
        assert "populace validate" in res.text  # where to see why
        assert INNER not in res.text and str(workdir) not in res.text
        # a good edge list under the working directory is read and the run submitted
        before = ctl_messages(url)
        res = post_scenario(c, "agents: 20\nrounds: 1\ngraph: {generator: edges, path: edges.csv}\n")
        assert res.status_code == 303 and res.headers["location"].startswith("/runs/"), res.text[:500]
        assert ctl_messages(url) == before + 1
