"""compose.yaml on a real Docker engine (host networking, images built here): a 10,000-agent
× 3-round game played from the host with `populace run --nats`, recorded exactly in the
recorder's volume; `--scale agent-host=4` places a run on four hosts; `docker kill` of one
agent-host mid-run, and `docker stop` (SIGTERM) of another, leave the result exact; a worker
compose file joins the first project's NATS as a second machine; `down -v` leaves nothing.
The tests run in file order on one stack."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time

import duckdb
import pytest
import yaml
from compose_project import ROOT, Project, new_project, sh

from populace.client.run import play, run_state
from populace.core import bus, subjects
from populace.core.contracts import HostInfo, Progress, RunConfig
from populace.sdk.local import run_local

pytestmark = pytest.mark.compose

AGENTS, ROUNDS = 10_000, 3
CONFIG = {
    "name": "compose-tier",
    "agents": AGENTS,
    "rounds": ROUNDS,
    "seed": 7,
    "model": {"backend": "dummy", "latency_s": 1.0, "seed": 3},
}
COLUMNS = "round, agent_id, value, valid, raw, error"
SERVICES = ("orchestrator", "environment", "gateway", "recorder", "agent-host")


@pytest.fixture(scope="module")
def stack(images):
    project = new_project(images, "populace-compose")
    # anonymous volumes carry no project label: compare the engine's volumes before and after
    project.volumes_before = set(sh(["docker", "volume", "ls", "-q"]).stdout.split())
    try:
        project.compose("up", "-d", "--wait", "--wait-timeout", "180", timeout=300)
        yield project
    finally:
        project.down()


@pytest.fixture(scope="module")
def reference() -> list[tuple]:
    """The game played in this process on the dummy model: what the fleet must record."""
    local = asyncio.run(run_local(RunConfig.model_validate(CONFIG)))
    cols = [c.strip() for c in COLUMNS.split(",")]
    return sorted(zip(*(local.outcomes[c] for c in cols)))


def recorded(project: Project, run_id: str) -> list[tuple]:
    db = project.volume_path("recorder-data") / "populace.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(
            f"SELECT {COLUMNS} FROM guesses WHERE run_id = ? ORDER BY round, agent_id", [run_id]
        ).fetchall()


def play_fleet(project: Project, fault=None, at_round: int = 2) -> tuple:
    """Play CONFIG through the stack from the host; once round `at_round` has its first
    answers, call `fault()` in a thread (it may block while containers stop)."""
    fired = threading.Event()

    def on_event(kind, model) -> None:
        if (
            fault is not None
            and not fired.is_set()
            and isinstance(model, Progress)
            and model.round == at_round
            and model.answered > 0
        ):
            fired.set()
            threading.Thread(target=fault, daemon=True).start()

    async def go():
        nc = await bus.connect(project.nats_url, "compose-tier")
        try:
            out = await asyncio.wait_for(
                play(nc, RunConfig.model_validate(CONFIG), on_event=on_event, stall_s=120), timeout=300
            )
            return out, await run_state(nc, out.run_id)
        finally:
            await nc.close()

    out, state = asyncio.run(go())
    assert fault is None or fired.is_set(), f"the fault never fired (run {out.status}: {out.reason})"
    return out, state


def host_pids(project: Project) -> dict[str, int]:
    """agent-host container -> the pid of its `populace service agent-host` (pid: host, so the
    pid in its host id <hostname>-<pid>)."""
    out = {}
    for cid in project.containers("agent-host"):
        top = sh(["docker", "top", cid, "-eo", "pid,args"]).stdout.splitlines()[1:]
        out[cid] = next(int(line.split()[0]) for line in top if "service agent-host" in line)
    return out


def wait_for_hosts(project: Project, pids: set[int], timeout: float = 60) -> None:
    """Until KV `hosts` holds a fresh entry of every agent-host process in `pids`: a container
    is healthy once its heartbeat file is written, which may come before the orchestrator can
    read the host's registration (a run placed then spreads over the hosts it sees)."""
    async def seen() -> set[int]:
        nc = await bus.connect(project.nats_url, "compose-tier")
        try:
            hosts = await bus.registry_entries(nc.jetstream(), subjects.HOSTS_BUCKET, HostInfo, fresh_within_s=10)
            return {int(h.host_id.rsplit("-", 1)[1]) for h in hosts}
        finally:
            await nc.close()

    deadline, found = time.monotonic() + timeout, set()
    while time.monotonic() < deadline:
        found = asyncio.run(seen())
        if pids <= found:
            return
        time.sleep(0.5)
    raise AssertionError(f"agent-hosts {sorted(pids - found)} never registered within {timeout:.0f} s (seen: {sorted(found)})")


def test_a_10k_agent_game_played_from_the_host_is_recorded_exactly(stack, reference, tmp_path):
    # every service healthy (the image's heartbeat-file check), as a non-root user
    for service in SERVICES:
        [cid] = stack.containers(service)
        info = stack.inspect(cid)
        assert info["State"]["Health"]["Status"] == "healthy", (service, info["State"]["Health"]["Log"][-1:])
        assert info["Config"]["User"] == "10001:10001"
    scenario = tmp_path / "scenario.yaml"
    scenario.write_text(yaml.safe_dump(CONFIG))
    # the README's command, from the host
    res = sh(
        [sys.executable, "-m", "populace.cli", "run", str(scenario), "--nats", stack.nats_url, "--no-progress"],
        timeout=600,
    )
    assert "completed" in res.stdout, res.stdout[-2000:]
    db = stack.volume_path("recorder-data") / "populace.duckdb"
    with duckdb.connect(str(db), read_only=True) as con:
        [run_id] = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM guesses").fetchall()]
        summary = con.execute("SELECT round, n FROM rounds WHERE run_id = ? ORDER BY round", [run_id]).fetchall()
    got = recorded(stack, run_id)
    assert [(r[0], r[1]) for r in got] == [(n, a) for n in range(1, ROUNDS + 1) for a in range(AGENTS)]
    assert got == reference
    assert summary == [(n, AGENTS) for n in range(1, ROUNDS + 1)]

    # traces went over OTLP to the receiver that stands in for Jaeger: one trace for the run,
    # with spans from every service
    deadline = time.monotonic() + 30
    while True:
        spans = [
            json.loads(line)
            for line in stack.compose("logs", "--no-log-prefix", "jaeger").stdout.splitlines()
            if line.startswith("{")
        ]
        runs = [
            s for s in spans if s["name"] == "orchestrator.run" and s["attributes"].get("populace.run_id") == run_id
        ]
        trace = {s["service"] for s in spans if runs and s["trace_id"] == runs[0]["trace_id"]}
        if {f"populace-{s}" for s in SERVICES} <= trace or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert {f"populace-{s}" for s in SERVICES} <= trace, trace


def test_scaled_to_four_agent_hosts_a_run_is_placed_on_all_four(stack, reference):
    stack.compose("up", "-d", "--wait", "--wait-timeout", "180", "--scale", "agent-host=4", timeout=300)
    pids = host_pids(stack)
    assert len(pids) == 4
    out, state = play_fleet(stack)
    assert out.status == "completed", out.reason
    placed = {int(sh.host_id.rsplit("-", 1)[1]) for sh in state.shares}
    assert placed == set(pids.values())
    assert recorded(stack, out.run_id) == reference


def test_docker_kill_of_an_agent_host_mid_run_leaves_the_result_exact(stack, reference):
    victim = sorted(host_pids(stack))[0]
    out, state = play_fleet(stack, lambda: sh(["docker", "kill", victim]))
    assert out.status == "completed", out.reason
    assert state.epoch >= 1  # its share was placed again
    assert recorded(stack, out.run_id) == reference
    stack.compose("up", "-d", "--wait", "--wait-timeout", "180", "--scale", "agent-host=4", timeout=300)


def test_docker_stop_sigterm_stops_an_agent_host_cleanly_and_its_share_is_replaced(stack, reference):
    victim = sorted(host_pids(stack))[-1]
    out, state = play_fleet(stack, lambda: sh(["docker", "stop", "--time", "20", victim]))
    assert out.status == "completed", out.reason
    assert state.epoch >= 1
    assert recorded(stack, out.run_id) == reference
    # it exited on SIGTERM by itself (0), not killed at the end of the grace period (137)
    assert stack.inspect(victim)["State"]["ExitCode"] == 0


def test_the_worker_compose_file_joins_as_a_second_machine(stack, images, reference):
    worker = Project(
        name=f"{stack.name}-worker",
        env={
            **stack.env,
            "COMPOSE_FILE": "deploy/compose.worker.yaml:deploy/compose.worker.host.yaml",
            "POPULACE_NATS_URL": stack.nats_url,
            "POPULACE_STREAM_REPLICAS": "1",
        },
    )
    stack.compose("up", "-d", "--wait", "--scale", "agent-host=1", timeout=300)
    try:
        worker.compose("up", "-d", "--wait", "--wait-timeout", "180", "--scale", "agent-host=2", timeout=300)
        pids = host_pids(worker)
        assert len(pids) == 2
        wait_for_hosts(stack, {*pids.values(), *host_pids(stack).values()})
        out, state = play_fleet(stack)
        assert out.status == "completed", out.reason
        placed = {int(sh.host_id.rsplit("-", 1)[1]) for sh in state.shares}
        assert len(placed) == 3 and set(pids.values()) < placed
        assert recorded(stack, out.run_id) == reference
    finally:
        worker.down()
        assert worker.leftovers() == {"containers": [], "volumes": [], "networks": []}


def test_down_v_leaves_no_container_volume_or_network(stack):
    assert stack.leftovers()["volumes"]  # the NATS store and DuckDB
    stack.down()
    assert stack.leftovers() == {"containers": [], "volumes": [], "networks": []}
    # nor an anonymous volume, e.g. of the agent-hosts `--scale agent-host=1` removed
    assert set(sh(["docker", "volume", "ls", "-q"]).stdout.split()) <= stack.volumes_before
    assert ROOT.exists()
