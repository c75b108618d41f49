"""The manager against a real nats-server (no services): its pages read KV `runs` and `nodes`
and the RUN stream; the run page's live stream sums progress ticks per round and sends the
rounds closed since; the start form shows a bad scenario's CLI message under its field and
publishes nothing (the CTL stream's message count is unchanged), and submits a good one with
its manifest; cancel and resume refuse what the CLI refuses; a cross-site POST is refused."""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import pytest
from starlette.testclient import TestClient

from populace.core import bus, subjects
from populace.core.contracts import (
    ConfigRef,
    NodeInfo,
    ProcessInfo,
    Progress,
    RoundOpen,
    RoundResult,
    RunConfig,
    RunStart,
    RunStarted,
    RunState,
    Share,
    Usage,
)
from populace.core.contracts.node_messages import AgentHostSpec, RestartPolicy
from populace.manager import ManagerSettings, create_app
from populace.manager.app import _run_stream, _runs_stream

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

LOCAL = "http://127.0.0.1:8080"


def arun(coro_factory, url: str):
    async def go():
        nc = await bus.connect(url, "manager-test")
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


@pytest.fixture
def client(url):
    # without a token the manager answers loopback names only (TestClient's default is 'testserver')
    with TestClient(create_app(ManagerSettings(nats_url=url, sample_s=0.05)), base_url=LOCAL,
                    follow_redirects=False) as c:
        yield c


def rid() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def a_state(run_id: str, status: str = "running", rnd: int = 2) -> RunState:
    return RunState(run_id=run_id, status=status, round=rnd, config=RunConfig(agents=300, rounds=3, name="mgr"),
                    shares=[Share(host_id="h1", ranges=[(0, 300)])],
                    used=Usage(llm_calls=300, prompt_tokens=900, completion_tokens=100))


def a_result(run_id: str, n: int) -> RoundResult:
    return RoundResult(run_id=run_id, round=n, n=300, n_valid=299, summary={"mean": 40.0 - n, "target": 26.0 - n},
                       observation={}, closed_at=time.time(), usage=Usage(llm_calls=300, prompt_tokens=900))


def put_run(url: str, state: RunState, results: list[RoundResult] = ()) -> None:
    async def put(nc):
        js = nc.jetstream()
        kv = await js.key_value(subjects.RUNS_BUCKET)
        await kv.put(state.run_id, bus.encode(state))
        for r in results:
            await js.publish(subjects.run_round_result(r.run_id, r.round), bus.encode(r))

    arun(put, url)


def ctl_messages(url: str) -> int:
    async def count(nc):
        return (await nc.jetstream().stream_info(subjects.CTL_STREAM)).state.messages

    return arun(count, url)


def events(client: TestClient, path: str) -> dict:
    """The first event of a live stream (`?once=1` ends it after one)."""
    res = client.get(path + "?once=1")
    assert res.status_code == 200 and res.headers["content-type"].startswith("text/event-stream")
    [line] = [ln for ln in res.text.splitlines() if ln.startswith("data: ")]
    return json.loads(line.removeprefix("data: "))


# --- runs --------------------------------------------------------------------------------
def test_the_runs_page_and_its_live_stream_list_every_run(client, url):
    run_id = rid()
    put_run(url, a_state(run_id))
    page = client.get("/runs")
    assert page.status_code == 200 and f'data-run="{run_id}"' in page.text
    payload = events(client, "/events/runs")
    row = next(r for r in payload["runs"] if r["run_id"] == run_id)
    assert (row["status"], row["round"], row["completed"], row["tokens"], row["agents"]) == ("running", 2, 1, 1000, 300)


def test_the_run_page_streams_the_closed_rounds(client, url):
    run_id = rid()
    put_run(url, a_state(run_id, "running", 3), [a_result(run_id, 1), a_result(run_id, 2)])
    page = client.get(f"/runs/{run_id}")
    assert page.status_code == 200 and run_id in page.text and 'id="cancel-form"' in page.text
    d = events(client, f"/events/runs/{run_id}")
    assert [r["round"] for r in d["results"]] == [1, 2]
    assert d["results"][0]["series"] == {"mean": 39.0, "target": 25.0}
    assert (d["current_round"], d["expected"], d["can_cancel"]) == (3, 300, True)  # expected: config.agents
    unknown = events(client, f"/events/runs/{rid()}")
    assert (unknown["status"], unknown["known"]) == ("submitted", False)
    assert client.get("/runs/not.a.token").status_code == 404


def test_the_run_page_shows_the_manifest_and_links_the_trace(url):
    from populace.sdk.registry import load_simulation

    run_id = rid()
    put_run(url, a_state(run_id, "running", 1))
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    started = RunStarted(run_id=run_id, config=RunConfig(agents=300, rounds=3), started_at=time.time(), hosts=["h1"],
                         tables=load_simulation("ratio-game").tables(), manifest={"run_id": run_id, "seeds": {"run": 7}})

    async def publish(nc):
        await nc.jetstream().publish(subjects.run_started(run_id), bus.encode(started),
                                     headers={"traceparent": f"00-{trace}-00f067aa0ba902b7-01"})

    arun(publish, url)
    app = create_app(ManagerSettings(nats_url=url, jaeger_url="http://jaeger:16686/"))
    with TestClient(app, base_url=LOCAL) as c:
        page = c.get(f"/runs/{run_id}").text
    assert f'href="http://jaeger:16686/trace/{trace}"' in page
    assert 'id="manifest"' in page and "&#34;seeds&#34;" in page.replace("&quot;", "&#34;")
    with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=LOCAL) as c:
        page = c.get(f"/runs/{run_id}").text
    assert f'<code id="trace-id">{trace}</code>' in page and 'id="trace"' not in page


async def test_the_run_stream_sums_ticks_per_round_from_the_round_it_saw_open(url):
    run_id = rid()
    nc = await bus.connect(url, "manager-test")
    try:
        js = nc.jetstream()
        kv = await js.key_value(subjects.RUNS_BUCKET)
        await kv.put(run_id, bus.encode(a_state(run_id, "spawning", 0)))
        stream = _run_stream(nc, run_id, 0.05, once=False)
        first = json.loads((await anext(stream)).decode().removeprefix("data: "))
        assert (first["status"], first["current_round"]) == ("spawning", None)
        cfg = RunConfig(agents=300, rounds=3)
        await js.publish(subjects.run_round_open(run_id, 1),
                         bus.encode(RoundOpen(run_id=run_id, round=1, expected=250, config_ref=ConfigRef.of(cfg),
                                              opened_at=time.time())))
        await kv.put(run_id, bus.encode(a_state(run_id, "running", 1)))
        for answered in (100, 50):
            await nc.publish(subjects.progress(run_id, 1, "h1"),
                             bus.encode(Progress(run_id=run_id, round=1, host_id="h1", answered=answered)))
        await nc.publish(subjects.progress(run_id, 1, "h1"), b"garbage")
        await nc.flush()
        await asyncio.sleep(0.1)
        d = json.loads((await anext(stream)).decode().removeprefix("data: "))
        assert (d["current_round"], d["answered"], d["expected"], d["answered_lower_bound"]) == (1, 150, 250, False)
        await stream.aclose()
    finally:
        await nc.close()


async def test_the_runs_stream_watches_kv_and_sends_only_changes(url):
    run_id = rid()
    nc = await bus.connect(url, "manager-test")
    try:
        kv = await nc.jetstream().key_value(subjects.RUNS_BUCKET)
        await kv.put(run_id, bus.encode(a_state(run_id, "running", 1)))
        stream = _runs_stream(nc, 0.05, once=False)

        async def next_payload() -> dict:
            while True:
                chunk = (await asyncio.wait_for(anext(stream), 10)).decode()
                if chunk.startswith("data: "):
                    return json.loads(chunk.removeprefix("data: "))

        first = await next_payload()
        assert next(r for r in first["runs"] if r["run_id"] == run_id)["status"] == "running"
        await kv.put(run_id, bus.encode(a_state(run_id, "done", 3)))
        second = await next_payload()
        assert next(r for r in second["runs"] if r["run_id"] == run_id)["status"] == "done"
        await kv.delete(run_id)
        third = await next_payload()
        assert run_id not in [r["run_id"] for r in third["runs"]]
        await stream.aclose()
    finally:
        await nc.close()


async def test_the_runs_streams_first_payload_is_whole_while_runs_change(url):
    """The watcher's "initial values are in" comes early under concurrent writes (nats-io/nats.py
    #995): the first payload (all a `?once=1` page or script gets) once missed runs."""
    ids = [rid() for _ in range(6)]
    nc = await bus.connect(url, "manager-test")
    kv = await nc.jetstream().key_value(subjects.RUNS_BUCKET)
    writing = True

    async def write(run_id: str) -> None:
        n = 0
        while writing:
            n += 1
            await kv.put(run_id, bus.encode(a_state(run_id, "running", 1 + n % 2)))
            await asyncio.sleep(0.002)

    for run_id in ids:
        await kv.put(run_id, bus.encode(a_state(run_id, "running", 1)))
    writers = [asyncio.create_task(write(run_id)) for run_id in ids]
    try:
        missed = []
        for _ in range(300):
            stream = _runs_stream(nc, 0.05, once=True)
            chunk = (await anext(stream)).decode()
            await stream.aclose()
            listed = {r["run_id"] for r in json.loads(chunk.removeprefix("data: "))["runs"]}
            missed += [sorted(set(ids) - listed)] if not set(ids) <= listed else []
        assert missed == []
    finally:
        writing = False
        await asyncio.gather(*writers)
        for run_id in ids:
            await kv.delete(run_id)
        await nc.close()


# --- the start form ----------------------------------------------------------------------
@pytest.mark.parametrize(("scenario", "field", "says"), [
    ("agents: 0\nrounds: 3\n", "agents", "agents: Input should be greater than or equal to 1"),
    ("agents: 10\nmodel:\n  backend: gpt-9\n", "model.backend", "model.backend: Input should be"),
    ("agents: 10\nbogus: 1\n", "bogus", "bogus: unknown key"),
    ("simulation: no-such-sim\nagents: 10\n", "simulation", "simulation"),
    ("agents: [1,\n", "(scenario)", "(scenario): not valid YAML"),
])
def test_a_bad_scenario_is_shown_under_its_field_and_nothing_is_published(client, url, scenario, field, says):
    before = ctl_messages(url)
    res = client.post("/start", data={"scenario": scenario, "simulation": ""})
    assert res.status_code == 422
    items = re.findall(r'<li class="field-error" data-field="([^"]*)">(.*?)</li>', res.text, re.S)
    assert field in [f.replace("&#39;", "'") for f, _ in items], res.text
    text = next(body for f, body in items if f == field)
    assert says in text.replace("&#39;", "'").replace("&gt;", ">")
    assert scenario.split("\n")[0].replace("[", "") in res.text.replace("[", "")  # the text is kept in the form
    assert ctl_messages(url) == before


def test_a_good_scenario_is_submitted_with_its_manifest(client, url):
    before = ctl_messages(url)
    text = "simulation: ratio-game\nname: from-the-form\nagents: 2000\nrounds: 3\nmodel:\n  backend: dummy\n"
    res = client.post("/start", data={"scenario": text, "simulation": "ratio-game"})
    assert res.status_code == 303
    run_id = res.headers["location"].split("?")[0].removeprefix("/runs/")
    assert ctl_messages(url) == before + 1

    async def last_start(nc):
        msg = await nc.jetstream().get_last_msg(subjects.CTL_STREAM, subjects.RUN_START)
        return RunStart.model_validate_json(msg.data)

    start = arun(last_start, url)
    assert (start.run_id, start.config.agents, start.config.name) == (run_id, 2000, "from-the-form")
    assert start.manifest["run_id"] == run_id and start.manifest["scenario"]["text"] == text
    page = client.get(res.headers["location"])
    assert page.status_code == 200 and "submitted" in page.text


def test_the_parameter_form_shows_a_bad_field_next_to_its_input_and_publishes_nothing(client, url):
    page = client.get("/start?mode=form&simulation=ratio-game")
    assert page.status_code == 200
    for name in ("agents", "model.backend", "game.ratio", "prompt.answer"):
        assert f'name="p.{name}"' in page.text
    before = ctl_messages(url)
    res = client.post("/start", data={"mode": "form", "simulation": "ratio-game", "p.agents": "0", "p.rounds": "3"})
    assert res.status_code == 422
    cells = dict(re.findall(r'<td class="field-error" data-field="([^"]+)"[^>]*>(.*?)</td>', res.text, re.S))
    assert cells["agents"].startswith("agents: Input should be greater than or equal to 1")
    assert cells["rounds"] == ""
    assert ctl_messages(url) == before
    res = client.post("/start", data={"mode": "form", "simulation": "ratio-game", "p.agents": "40", "p.rounds": "2",
                                      "p.game.ratio": "1/2", "p.prompt.persona": "false"})
    assert res.status_code == 303 and ctl_messages(url) == before + 1

    async def last_start(nc):
        msg = await nc.jetstream().get_last_msg(subjects.CTL_STREAM, subjects.RUN_START)
        return RunStart.model_validate_json(msg.data)

    start = arun(last_start, url)
    assert (start.config.agents, start.config.rounds, start.config.simulation) == (40, 2, "ratio-game")
    assert start.config.params["game"]["ratio"] == "1/2" and start.config.params["prompt"]["persona"] is False


def test_the_start_page_lists_the_installed_simulations(client):
    page = client.get("/start")
    assert page.status_code == 200
    for name in ("ratio-game", "public-goods", "vote"):
        assert f'<option value="{name}"' in page.text


# --- steering ----------------------------------------------------------------------------
def test_cancel_and_resume_refuse_what_the_cli_refuses(client, url):
    done = rid()
    put_run(url, a_state(done, "done", 3))
    before = ctl_messages(url)
    res = client.post(f"/runs/{done}/cancel")
    assert res.status_code == 303 and "nothing+to+cancel" in res.headers["location"]
    res = client.post(f"/runs/{done}/resume")
    assert "only+a+failed" in res.headers["location"]
    paused = rid()
    put_run(url, a_state(paused, "paused", 1))
    res = client.post(f"/runs/{paused}/resume")
    assert "no+agent-host+is+up" in res.headers["location"]
    assert ctl_messages(url) == before  # nothing was asked of the orchestrator
    shown = client.get(res.headers["location"])
    assert 'id="flash-error"' in shown.text and "no agent-host is up" in shown.text


def test_the_interview_form_refuses_a_round_the_run_never_played(client, url):
    """Round 0 (it was a 500: the request itself refused it), and a fork's round before its fork
    point, saying whose round it was: beside the field, nothing asked."""
    from populace.core.contracts import Restore

    done, fork = rid(), rid()
    put_run(url, a_state(done, "done", 3))
    put_run(url, a_state(fork, "done", 3).model_copy(update={"restore": Restore(run_id=done, round=2)}))
    before = ctl_messages(url)
    for run, after, says in ((done, "0", "--after-round: round 0 is not one of the run&#39;s rounds (1..3)"),
                             (fork, "1", f"--after-round: this fork never played round 1; its parent {done} did")):
        res = client.post(f"/runs/{run}/interview", data={"after_round": after, "question": "Why?", "kind": "text",
                                                          "max_chars": "80"})
        assert res.status_code == 422
        shown = re.search(r'<span class="field-error" data-field="after_round"[^>]*>(.*?)</span>', res.text, re.S)
        assert shown is not None and shown.group(1).startswith(says), res.text[-2000:]
    assert ctl_messages(url) == before


def test_cancel_of_a_running_run_is_sent(client, url):
    running = rid()
    put_run(url, a_state(running, "running", 1))
    before = ctl_messages(url)
    res = client.post(f"/runs/{running}/cancel")
    assert res.status_code == 303 and "cancel+sent" in res.headers["location"]
    assert ctl_messages(url) == before + 1


def test_a_cross_site_post_is_refused(client, url):
    running = rid()
    put_run(url, a_state(running, "running", 1))
    res = client.post(f"/runs/{running}/cancel", headers={"origin": "http://evil.example"})
    assert res.status_code == 403
    ok = client.post(f"/runs/{running}/cancel", headers={"origin": LOCAL})
    assert ok.status_code == 303


# --- nodes -------------------------------------------------------------------------------
def test_the_nodes_page_shows_kv_nodes_and_a_missing_node_is_named(client, url):
    node_id = f"n-{uuid.uuid4().hex[:6]}"
    now = time.time()
    proc = ProcessInfo(proc_id="agent-host-1", spec=AgentHostSpec(max_in_flight=5000),
                       restart=RestartPolicy(mode="on-failure", max_restarts=3), state="running", pid=4321, restarts=1,
                       started_at=now - 5, cpu_percent=87.4, rss_bytes=300 * 2**20, log_path="/tmp/a.log")
    info = NodeInfo(node_id=node_id, hostname="box", pid=1, version="0.1.0", cpus=2, memory_bytes=2**32,
                    memory_available_bytes=2**31, log_dir="/tmp", started_at=now - 5, heartbeat_at=now,
                    heartbeat_s=2.0, processes=[proc])

    async def put(nc):
        kv = await nc.jetstream().key_value(subjects.NODES_BUCKET)
        await kv.put(node_id, bus.encode(info))

    arun(put, url)
    page = client.get("/nodes")
    assert page.status_code == 200 and f'id="node-{node_id}"' in page.text
    text = " ".join(page.text.split())
    assert "host box · 2 CPUs · memory 4,096 MB (2,048 MB free) · GPUs: none · populace 0.1.0 · up 5 s" in text
    assert '<span class="running-count">1</span> running / 1' in text
    row = text[text.index('<tr data-proc="agent-host-1" data-state="running" data-pid="4321">'):]
    assert ('<td class="num restarts">1/3</td> <td class="num cpu">87</td><td class="num memory">300 MB</td>'
            "<td>max_in_flight=5000</td>") in row[:row.index("</tr>")]
    assert node_id in [n["node_id"] for n in events(client, "/events/nodes")["nodes"]]
    # KV says it is there, but no daemon answers: the error comes back to the page
    res = client.post(f"/nodes/{node_id}/start", data={"kind": "agent-host", "count": "2"})
    assert res.status_code == 303 and "is+not+running" in res.headers["location"]
    res = client.post(f"/nodes/{node_id}/start", data={"kind": "agent-host", "count": "99"})
    assert "count" in res.headers["location"]
    assert client.get("/healthz").json() == {"nats": True}


# --- replicas ----------------------------------------------------------------------------
async def test_the_replicas_page_asks_each_replica_for_its_health_and_load(url):
    from populace.core.contracts import ReplicaInfo
    from populace.core.natsserver import free_port
    from populace.manager.app import probe_replicas
    from populace.replicas.sim import SimConfig, SimServer

    srv = await SimServer(SimConfig(replica_id="sim-mgr", time_scale=0)).start()
    try:
        now = time.time()
        live = ReplicaInfo(replica_id="sim-mgr", url=srv.url, backend="sim", kind="sim", model="sim", heartbeat_at=now)
        dead = ReplicaInfo(replica_id="sim-gone", url=f"http://127.0.0.1:{free_port()}", backend="sim", kind="sim",
                           model="sim", heartbeat_at=now)
        probed = {i.replica_id: (ok, m) for i, ok, m in await probe_replicas([live, dead])}
        assert probed["sim-mgr"][0] is True and "vllm:num_requests_running" in probed["sim-mgr"][1]
        assert probed["sim-gone"] == (False, None)
        nc = await bus.connect(url, "manager-test")
        try:
            kv = await nc.jetstream().key_value(subjects.REPLICAS_BUCKET)
            await kv.put("replicas.sim-mgr", bus.encode(live))
            # outside POPULACE_REPLICA_HOSTS (loopback by default): listed as refused, never asked
            away = live.model_copy(update={"replica_id": "sim-away", "url": "http://203.0.113.7:8000"})
            await kv.put("replicas.sim-away", bus.encode(away))
        finally:
            await nc.close()

        def pages() -> tuple[str, str, dict]:
            with TestClient(create_app(ManagerSettings(nats_url=url)), base_url=LOCAL) as c:
                return (c.get("/replicas").text, c.get("/events/replicas?once=1").text,
                        c.get("/replicas.json?backend=sim").json())

        text, events, summary = await asyncio.to_thread(pages)
        assert '<tr data-replica="replicas.sim-mgr" data-healthy="yes">' in text  # named by its key
        assert ("refused: 203.0.113.7:8000 registered by replicas is not in POPULACE_REPLICA_HOSTS "
                "(127.0.0.0/8,::1,localhost)") in text
        # the page's live update probes again; the run page's line sums the backend's replicas
        update = json.loads(events.removeprefix("data: ").strip())
        assert [(r["replica_id"], r["healthy"], r["refused"] is not None) for r in update["replicas"]
                if r["replica_id"].startswith("replicas.sim-")] == [  # the server may hold other tests' entries
            ("replicas.sim-away", None, True), ("replicas.sim-mgr", True, False)]
        assert (summary["backend"], summary["replicas"], summary["healthy"]) == ("sim", 1, 1)
    finally:
        await srv.stop()
