"""The manager's run page against a real nats-server (no services): its agents table and
distribution are asked of the recorder over `recorder.read.*` (here a stand-in answering on
those subjects), with no recorder the page still renders and its reads say so; the fork form
refuses what `populace fork` refuses, each message beside its field with what was typed kept,
and a valid fork is submitted (a RunStart carrying the parent's state) and the browser sent to
its page; a cancel the CLI would refuse is refused in the CLI's words."""

from __future__ import annotations

import asyncio
import re
import threading
import uuid

import pytest
from starlette.testclient import TestClient

from populace.core import bus, subjects
from populace.core.contracts import (
    AgentRound,
    AgentRow,
    AgentsReply,
    AgentsRequest,
    DistributionReply,
    DistributionRequest,
    GroupsReply,
    GroupsRequest,
    ProfileReply,
    ProfileRequest,
    RunConfig,
    RunStart,
    RunState,
    Share,
    Usage,
)
from populace.manager import ManagerSettings, create_app

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]


def arun(coro_factory, url: str):
    async def go():
        nc = await bus.connect(url, "manager-run-page-test")
        try:
            return await coro_factory(nc)
        finally:
            await nc.close()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def url(nats_server):
    async def setup(nc):
        await bus.provision(nc.jetstream(), storage="memory")

    arun(setup, nats_server.url)
    return nats_server.url


@pytest.fixture
def client(url):
    settings = ManagerSettings(nats_url=url, sample_s=0.05, read_timeout_s=1.0)
    # without a token the manager answers loopback names only (TestClient's default is 'testserver')
    with TestClient(create_app(settings), base_url="http://127.0.0.1:8080", follow_redirects=False) as c:
        yield c


def rid() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def put_run(url: str, state: RunState) -> None:
    async def put(nc):
        kv = await nc.jetstream().key_value(subjects.RUNS_BUCKET)
        await kv.put(state.run_id, bus.encode(state))

    arun(put, url)


def a_state(run_id: str, status: str = "done", rnd: int = 3) -> RunState:
    return RunState(run_id=run_id, status=status, round=rnd, config=RunConfig(agents=300, rounds=3, name="pg"),
                    shares=[Share(host_id="h1", ranges=[(0, 300)])], used=Usage(llm_calls=900))


class StandIn:
    """Answers recorder.read.agents/distribution as the recorder would, and keeps the requests."""

    def __init__(self, url: str) -> None:
        self.url, self.requests = url, []
        self.ready, self.stop = threading.Event(), None
        self.thread = threading.Thread(target=lambda: asyncio.run(self.serve()), daemon=True)

    async def serve(self) -> None:
        nc = await bus.connect(self.url, "stand-in-recorder")
        self.stop = asyncio.Event()

        async def agents(msg):
            req = AgentsRequest.model_validate_json(msg.data)
            self.requests.append(req)
            if req.run_id == "refused":
                await msg.respond(bus.encode(AgentsReply(ok=False, error="run 'refused' is not recorded (yet)")))
                return
            rows = [AgentRow(agent_id=i, profile="job: teacher", persona="Maria — a teacher",
                             rounds=[AgentRound(round=1, values={"value": 33.0}, valid=True, raw='{"guess": 33}')])
                    for i in range(req.offset, min(req.offset + req.limit, 300))]
            await msg.respond(bus.encode(AgentsReply(ok=True, run_id=req.run_id, search=req.search or "",
                                                     offset=req.offset, limit=req.limit, total=300, columns=["value"],
                                                     rounds=[1], rounds_total=1, personas=True, agents=rows)))

        async def distribution(msg):
            req = DistributionRequest.model_validate_json(msg.data)
            self.requests.append(req)
            await msg.respond(bus.encode(DistributionReply(ok=True, run_id=req.run_id, round=2, closed=2,
                                                           measure="value", kind="numeric", n=3, edges=[0, 50, 100],
                                                           counts=[2, 1], mean=40.0, summary={"target": 26.0})))

        async def profile(msg):
            req = ProfileRequest.model_validate_json(msg.data)
            self.requests.append(req)
            rows = [{"round": 1, "role": "host", "host_id": "h1", "epoch": 0, "agents": 300, "wall_s": 9.5,
                     "view_s": 8.75, "turn_s": 0.25, "merge_s": 0.01, "model_wait_s": 1.0, "decide_s": None,
                     "record_s": None, "view_bytes": 3_000_000, "view_max_bytes": 10_000, "observation_bytes": 40,
                     "held": 280, "note": None},
                    {"round": 1, "role": "environment", "host_id": "environment", "epoch": 0, "decide_s": 0.5}]
            await msg.respond(bus.encode(ProfileReply(ok=True, run_id=req.run_id, rows=rows, rounds_total=1,
                                                      seconds={"view_s": 8.75, "decide_s": 0.5},
                                                      top=("view_s", 8.75), notes=["Env.view returned 98 KB"])))

        async def groups(msg):
            req = GroupsRequest.model_validate_json(msg.data)
            self.requests.append(req)
            rows = [{"group": "smol-llamacpp", "n": 20, "mean": 14.55, "ci_low": 11.88, "ci_high": 17.22},
                    {"group": "smol-vllm", "n": 20, "mean": 23.0, "ci_low": 13.69, "ci_high": 32.31}]
            await msg.respond(bus.encode(GroupsReply(ok=True, run_id=req.run_id, by=req.by, rows=rows,
                                                     attributes=["model"])))

        await nc.subscribe(subjects.recorder_read("agents"), cb=agents)
        await nc.subscribe(subjects.recorder_read("groups"), cb=groups)
        await nc.subscribe(subjects.recorder_read("profile"), cb=profile)
        await nc.subscribe(subjects.recorder_read("distribution"), cb=distribution)
        await nc.flush()
        self.loop = asyncio.get_running_loop()
        self.ready.set()
        await self.stop.wait()
        await nc.close()

    def __enter__(self) -> StandIn:
        self.thread.start()
        assert self.ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)


def test_the_run_page_reads_agents_and_the_distribution_from_the_recorder(client, url):
    run_id = rid()
    put_run(url, a_state(run_id))
    with StandIn(url) as recorder:
        page = client.get(f"/runs/{run_id}")
        assert page.status_code == 200
        for part in ('id="agents-table"', 'id="agent-q"', 'id="agents-next"', 'id="dist"', 'id="fork-form"'):
            assert part in page.text
        got = client.get(f"/runs/{run_id}/agents.json", params={"search": "teacher", "offset": "25", "limit": "25"})
        assert got.status_code == 200
        d = got.json()
        assert d["ok"] and d["total"] == 300 and [a["agent_id"] for a in d["agents"]][:2] == [25, 26]
        assert d["agents"][0]["rounds"][0]["raw"] == '{"guess": 33}'
        assert (recorder.requests[-1].search, recorder.requests[-1].offset) == ("teacher", 25)
        dist = client.get(f"/runs/{run_id}/distribution.json").json()
        assert dist["ok"] and dist["counts"] == [2, 1] and dist["summary"] == {"target": 26.0}
        assert isinstance(recorder.requests[-1], DistributionRequest) and recorder.requests[-1].round is None
        refused = client.get("/runs/refused/agents.json").json()
        assert refused == {**refused, "ok": False, "error": "run 'refused' is not recorded (yet)"}
        # the request's bounds are checked before anything is asked
        n = len(recorder.requests)
        bad = client.get(f"/runs/{run_id}/agents.json", params={"limit": "1000"})
        assert bad.status_code == 400 and "limit" in bad.json()["error"]
        assert client.get(f"/runs/{run_id}/agents.json", params={"search": "x" * 201}).status_code == 400
        assert client.get(f"/runs/{run_id}/distribution.json", params={"bins": "0"}).status_code == 400
        assert client.get(f"/runs/{run_id}/profile.json", params={"rounds": "0"}).status_code == 400
        assert len(recorder.requests) == n
        # where each round went: the page's table, from the recorder's round_profile rows
        assert 'id="profile-table"' in page.text
        prof = client.get(f"/runs/{run_id}/profile.json", params={"rounds": "20"}).json()
        assert prof["ok"] and prof["top"] == ["view_s", 8.75] and prof["notes"] == ["Env.view returned 98 KB"]
        assert [(r["role"], r.get("view_s"), r.get("decide_s")) for r in prof["rows"]] == [("host", 8.75, None),
                                                                                       ("environment", None, 0.5)]
        assert isinstance(recorder.requests[-1], ProfileRequest) and recorder.requests[-1].rounds == 20
        # a run with several models: its measure per model, from the recorder's group table
        assert 'id="groups-table"' in page.text
        groups = client.get(f"/runs/{run_id}/groups.json").json()
        assert [(r["group"], r["n"], r["mean"]) for r in groups["rows"]] == [("smol-llamacpp", 20, 14.55),
                                                                             ("smol-vllm", 20, 23.0)]
        assert isinstance(recorder.requests[-1], GroupsRequest) and recorder.requests[-1].by == "model"


def test_with_no_recorder_the_page_renders_and_its_reads_say_so(client, url):
    run_id = rid()
    put_run(url, a_state(run_id))
    assert client.get(f"/runs/{run_id}").status_code == 200
    for path in ("agents.json", "distribution.json", "profile.json"):
        res = client.get(f"/runs/{run_id}/{path}")
        assert res.status_code == 503
        body = res.json()
        assert body["ok"] is False and body["unreachable"] and "recorder" in body["error"]
        assert "Traceback" not in res.text


def ctl_starts(url: str) -> list[RunStart]:
    async def read(nc):
        js = nc.jetstream()
        sub = await js.subscribe(subjects.RUN_START, ordered_consumer=True)
        out = []
        while True:
            try:
                msg = await sub.next_msg(timeout=0.5)
            except Exception:
                break
            out.append(RunStart.model_validate_json(msg.data))
        await sub.unsubscribe()
        return out

    return arun(read, url)


def field_error(html: str, name: str) -> str:
    m = re.search(rf'class="field-error" data-field="{name}"[^>]*>([^<]*)<', html)
    return m.group(1) if m else ""


def test_the_fork_form_refuses_what_populace_fork_refuses_beside_the_field(client, url):
    parent = rid()
    put_run(url, a_state(parent, "running", 3))  # rounds 1 and 2 completed
    before = len(ctl_starts(url))
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "3", "changes": ""})
    assert res.status_code == 422
    assert field_error(res.text, "after_round") == f"--from-round: run {parent} has completed 2 round(s); fork from 1..2"
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "two", "changes": "rounds=5"})
    assert "not a round number" in field_error(res.text, "after_round")
    assert ">rounds=5</textarea>" in res.text  # what was typed is kept
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "2", "changes": "just words"})
    assert field_error(res.text, "changes").startswith("--set: &#39;just words&#39; is not KEY=VALUE")
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "2", "changes": "agents=10"})
    assert "a fork keeps its parent&#39;s agents" in field_error(res.text, "changes")
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "2", "changes": "rounds=2"})
    assert field_error(res.text, "changes").startswith("rounds: the fork continues after round 2")
    res = client.post("/runs/nobody-here/fork", data={"after_round": "1", "changes": "rounds=4"})
    assert res.status_code == 422 and "is not known on this stack" in field_error(res.text, "")
    assert len(ctl_starts(url)) == before  # nothing was asked of the orchestrator


def test_a_valid_fork_is_submitted_and_the_browser_goes_to_its_page(client, url):
    parent = rid()
    put_run(url, a_state(parent, "done", 3))
    before = len(ctl_starts(url))
    res = client.post(f"/runs/{parent}/fork", data={"after_round": "2", "changes": "# a comment\nrounds=5\n\n"
                                                                                     "game.ratio=1/2\n"})
    assert res.status_code == 303, res.text[-2000:]
    location = res.headers["location"]
    fork_id = location.split("?")[0].removeprefix("/runs/")
    assert fork_id != parent and "submitted" in location
    starts = ctl_starts(url)
    assert len(starts) == before + 1
    start = starts[-1]
    assert start.run_id == fork_id and (start.fork.run_id, start.fork.round) == (parent, 2)
    assert start.config.rounds == 5 and start.config.params["game"]["ratio"] == "1/2"
    assert start.manifest["fork"] == {"parent": parent, "after_round": 2,
                                      "changes": {"rounds": 5, "game": {"ratio": "1/2"}}}


def test_cancel_is_refused_in_the_clis_words(client, url):
    from populace.client.steer import cancel_refusal

    done = rid()
    state = a_state(done, "done", 3)
    put_run(url, state)
    res = client.post(f"/runs/{done}/cancel")
    shown = client.get(res.headers["location"])
    assert cancel_refusal(state) == f"run {done} is done (3 of 3 rounds completed): nothing to cancel"
    assert cancel_refusal(state) in shown.text
