"""End to end, agents talking on a graph across two agent-hosts: every inbox recomputed from
DuckDB is exactly the in-neighbours' posts of the round before, also when mail between hosts
is lost on the way (each host ignores the first message it gets and must read it back from
the stream, receiving the rest again) — and the fleet's results equal one process's."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from populace.analysis.inboxes import check_inboxes
from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig
from populace.graph.serial import loads
from populace.sdk.local import run_local

pytestmark = pytest.mark.e2e

SIMS = Path(__file__).with_name("sims")
sys.path.insert(0, str(SIMS))

SCENARIO = {
    "simulation": "gossip_sim:Gossip", "agents": 400, "rounds": 4, "seed": 3,
    "graph": {"generator": "small-world", "degree": 6, "rewire": 0.3},
    "broadcasts": [{"round": 3, "text": "breaking", "fields": {"level": 50}, "to": "top-degree", "count": 7}],
    "model": {"backend": "dummy", "latency_s": 0.01, "seed": 1},
}


def assert_exact_as_in_one_process(db: str, run_id: str, prepared) -> None:
    """Every inbox of the run recomputed from DuckDB is exact, and the fleet's levels and
    inbox sizes equal one process's on the same graph."""
    graph = loads(prepared.graph)
    rounds = prepared.config.rounds
    with duckdb.connect(db, read_only=True) as con:
        check = check_inboxes(con, run_id, graph, rounds=rounds)
        assert check.rows == prepared.config.agents * rounds and check.exact, check
        fleet = con.execute("SELECT agent_id, level, heard FROM gossip_outcomes WHERE run_id = ? "
                            "ORDER BY round, agent_id", [run_id]).fetchall()
        # every agent sees its own in-degree on the graph (obs.in_degree), on any host, in every round
        degrees = con.execute("SELECT list(in_degree ORDER BY agent_id) FROM gossip_outcomes WHERE run_id = ? "
                              "GROUP BY round", [run_id]).fetchall()
    assert degrees == [(graph.in_degree().tolist(),)] * rounds
    local = asyncio.run(run_local(prepared.resolved, graph=graph))
    assert list(zip(local.outcomes["agent_id"], local.outcomes["level"], local.outcomes["heard"], strict=True)) == fleet


def users_on(tmp: Path) -> dict:
    """Stack arguments: one NATS user per service and per host (deploy/nats/auth.conf, `populace
    auth host`), as the fuzz suite runs them."""
    from test_fuzz_e2e import HOSTS, USERS, auth_conf  # pytest puts tests/e2e on sys.path

    users = {u: f"graph-{u}-{os.getpid()}" for u in (*USERS, *HOSTS)}
    return {"users": users, "nats_args": ["-c", str(auth_conf(tmp, users))]}


async def connect(stack: Stack, name: str, user: str = "cli"):
    return await bus.connect(stack.url, name, **stack.credentials(user))


def play_on(stack: Stack, prepared, name: str):
    """Play a prepared graph run on `stack`, as the CLI user; its outcome."""

    async def go():
        nc = await connect(stack, name)
        try:
            return await play(nc, prepared.config, personas=prepared.personas, graph=prepared.graph_blobs,
                              manifest=prepared.manifest, stall_s=120)
        finally:
            await nc.close()

    return asyncio.run(go())


def no_violations(stack: Stack) -> None:
    """With users on, the server refused nothing any service or the client asked."""
    log = Path(stack.log_dir, "nats-server.log")
    refused = [line for line in log.read_text().splitlines() if "Violation" in line] if log.exists() else []
    assert not refused, refused[:5]


@pytest.fixture(scope="module")
def lossy(tmp_path_factory):
    """Two agent-hosts that each drop the first mail message they receive; a lost host is
    noticed within seconds (the kill test), as in the fault matrix. With users on (one NATS user
    per service and per host), the stricter of the two bus modes: the server must refuse nothing
    the mail, its re-reads and a re-placed share ask for. (Each test ran on an open bus too
    before; what that added, mail between hosts with no users, the opinion example below plays.)
    Its services share one process but agent-host-1, which the kill test SIGKILLs: host 0, the
    only host in the shared process, still drops its own first mail message."""
    tmp = tmp_path_factory.mktemp("graph")
    s = Stack(hosts=2, db=str(tmp / "populace.duckdb"),
              env={"PYTHONPATH": str(SIMS), "POPULACE_FAULT_DROP_MAIL": "1", "POPULACE_HOST_LOST_S": "4",
                   "POPULACE_HEARTBEAT_S": "0.5", "POPULACE_REGISTRY_TTL_S": "4"},
              one_process=True, apart=("agent-host-1",), **users_on(tmp))  # host 1: the kill test's
    with s.up(timeout=90):
        yield s


def test_inboxes_stay_exact_when_mail_between_hosts_is_lost(lossy):
    prepared = prepare(RunConfig.model_validate(SCENARIO))
    assert prepared.config.graph.digest is not None and prepared.graph is not None

    outcome = play_on(lossy, prepared, "e2e-graph")
    assert outcome.status == "completed", outcome
    # every service's log: host 0's lines are in the shared process's, host 1's in its own
    logs = "".join(log.read_text() for log in Path(lossy.log_dir).glob("*.log") if log.name != "nats-server.log")
    assert logs.count("mail_dropped_for_fault_test") == 2, "each host should have lost one mail message"
    assert "mail_refetched" in logs

    assert_exact_as_in_one_process(lossy.db, outcome.run_id, prepared)
    no_violations(lossy)
    with duckdb.connect(lossy.db, read_only=True) as con:
        # the broadcast reached exactly its 7 agents in round 3, and they passed it on
        assert con.execute("SELECT count(*) FROM gossip_outcomes WHERE run_id = ? AND round = 3 AND level = 51",
                           [outcome.run_id]).fetchone()[0] == 7
        fleet_rounds = con.execute("SELECT round, total FROM gossip_rounds WHERE run_id = ? ORDER BY round",
                                   [outcome.run_id]).fetchall()
    local = asyncio.run(run_local(prepared.resolved, graph=loads(prepared.graph)))
    assert list(zip(local.rounds["round"], local.rounds["total"], strict=True)) == fleet_rounds


def test_follows_and_unfollows_reach_the_mail_across_hosts_as_in_one_process(lossy):
    """A graph that changes (tests/e2e/sims/follow_sim.py: a follow each round, an unfollow every
    third): an agent hears its new authors on the other host from the next round on, and no
    longer hears whom it dropped; every inbox is exact against the graph rebuilt from `edges`,
    and the fleet's rows are one process's."""
    data = {"simulation": "follow_sim:Follow", "agents": 60, "rounds": 4, "seed": 2,
            "graph": {"generator": "small-world", "degree": 4, "rewire": 0.2},
            "model": {"backend": "dummy", "latency_s": 0.01, "seed": 1}}
    prepared = prepare(RunConfig.model_validate(data))

    outcome = play_on(lossy, prepared, "e2e-follow")
    assert outcome.status == "completed", outcome
    graph = loads(prepared.graph)
    local = asyncio.run(run_local(prepared.resolved, graph=graph))
    with duckdb.connect(lossy.db, read_only=True) as con:
        check = check_inboxes(con, outcome.run_id, graph, rounds=4)
        assert check.rows == 60 * 4 and check.exact, check
        fleet = con.execute("SELECT round, agent_id, level, heard, hears, authors FROM follow_outcomes "
                            "WHERE run_id = ? ORDER BY round, agent_id", [outcome.run_id]).fetchall()
        edges = con.execute("SELECT round, follower, author, op FROM edges WHERE run_id = ? "
                            "ORDER BY round, follower, rowid", [outcome.run_id]).fetchall()
    o = local.outcomes
    assert fleet == list(zip(o["round"], o["agent_id"], o["level"], o["heard"], o["hears"], o["authors"], strict=True))
    e = local.edges
    assert edges == list(zip(e["round"], e["follower"], e["author"], e["op"], strict=True))
    no_violations(lossy)


def test_the_opinion_example_records_every_post_and_stance_and_every_inbox_is_exact(tmp_path, cli):
    """examples/opinion.yaml as `populace demo --scenario` prepares it (prepare_file) and plays it:
    on a stack of its own with 2 agent-hosts and an open bus (no users: the module's stack has
    them), its services in one process, read once the stack stopped. The demo command itself is
    proved by tests/e2e/test_cli.py (test_demo_with_a_scenario_plays_the_agents_and_rounds_given,
    test_demo_plays_and_results_reads_the_db)."""
    import json

    from populace.client.prepare import prepare_file

    prepared = prepare_file(Path(__file__).parents[2] / "examples" / "opinion.yaml")
    db = tmp_path / "opinion.duckdb"
    with Stack(hosts=2, db=str(db), one_process=True).up(timeout=90) as stack:
        outcome = play_on(stack, prepared, "e2e-opinion")
    assert outcome.status == "completed", outcome.reason
    agents, rounds = prepared.config.agents, prepared.config.rounds
    with duckdb.connect(str(db), read_only=True) as con:
        run_id, config = con.execute("SELECT run_id, config_json FROM runs").fetchone()
        assert json.loads(config)["graph"]["digest"] == prepared.config.graph.digest
        assert con.execute("SELECT count(*), count(DISTINCT (round, agent_id)) FROM opinion_outcomes "
                           "WHERE run_id = ?", [run_id]).fetchone() == (agents * rounds, agents * rounds)
        assert con.execute("SELECT count(*), count(DISTINCT (round, agent_id)) FROM posts WHERE run_id = ?",
                           [run_id]).fetchone() == (agents * rounds, agents * rounds)
        # every valid stance was posted with its stance; an invalid answer posts nothing
        assert con.execute("SELECT count(*) FROM opinion_outcomes o JOIN posts p USING (run_id, round, agent_id) "
                           "WHERE o.run_id = ? AND o.valid AND (p.text IS NULL OR "
                           "CAST(json_extract(p.fields, '$.stance') AS DOUBLE) != o.stance)",
                           [run_id]).fetchone() == (0,)
        check = check_inboxes(con, run_id, loads(prepared.graph), rounds=rounds)
    assert check.exact, check
    shown = cli("results", run_id, "--db", str(db), env={"COLUMNS": "300"})  # in process: it only reads the file
    # the share of edges an even split over the 2 hosts cuts, computed here from the graph, and the posts stored
    g = loads(prepared.graph)
    part = np.arange(g.n) // -(-g.n // 2)
    cut = np.count_nonzero(part[g.sources] != part[g.targets()]) / g.entries
    with duckdb.connect(str(db), read_only=True) as con:
        (stored,) = con.execute("SELECT count(text) FROM posts WHERE run_id = ?", [run_id]).fetchone()
    line = next(x for x in shown.stdout.splitlines() if x.startswith("graph: "))
    assert line.startswith("graph: homophily, ") and f"; edges cut on 2 hosts: {cut:.1%}" in line, line
    assert f"; {stored:,} posts stored, an agent heard " in line, line


def test_a_cancelled_run_resumed_hears_exactly_what_it_would_have(lossy):
    """Cancelled while round 3 is in play, then resumed: every host's agents start from the
    round-2 checkpoints, whose posts rebuild every inbox (no host played round 2 in this epoch)."""
    from populace.client.run import cancel, resume
    from populace.core.contracts import RoundOpen

    data = {**SCENARIO, "seed": 11, "model": {"backend": "dummy", "latency_s": 0.5, "seed": 2}}
    prepared = prepare(RunConfig.model_validate(data))

    async def go():
        nc = await connect(lossy, "e2e-graph-resume")
        cancelled: list = []

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 3 and not cancelled:
                cancelled.append(asyncio.get_running_loop().create_task(cancel(nc, model.run_id)))

        try:
            first = await play(nc, prepared.config, graph=prepared.graph_blobs, manifest=prepared.manifest,
                               on_event=on_event, stall_s=120)
            assert first.status == "cancelled", first
            return await resume(nc, first.run_id, stall_s=120)
        finally:
            await nc.close()

    done = asyncio.run(go())
    assert done.status == "completed", done.reason
    assert_exact_as_in_one_process(lossy.db, done.run_id, prepared)
    no_violations(lossy)


def test_malformed_and_forged_mail_is_dead_lettered_and_changes_nothing(lossy):
    """While a graph run plays: garbage on a host's mail subject, a MailBatch whose body names
    another sender than its subject, and a well-formed batch from a share the run never placed.
    The first two are dead-lettered once; the third is never delivered (not a source of the
    round); every inbox stays exact."""
    from test_fuzz_e2e import dead_letters  # the DLQ reader the fuzz tests use (pytest puts tests/e2e on sys.path)

    from populace.core import subjects
    from populace.core.contracts import MailBatch, RoundOpen

    data = {**SCENARIO, "seed": 21, "model": {"backend": "dummy", "latency_s": 0.3, "seed": 4}}
    prepared = prepare(RunConfig.model_validate(data))
    sent: list[tuple[str, bytes]] = []

    async def go():
        nc = await connect(lossy, "e2e-graph-forge")
        # the forger: host-0's credentials may say nothing as host-9 (refused by the server), so
        # these come from an `admin` connection
        forger = await connect(lossy, "e2e-graph-forger", "admin")
        js = forger.jetstream()

        async def forge(run_id: str) -> None:
            forged = MailBatch(run_id=run_id, round=1, host_id="host-9", epoch=0, to="host-1@0", shard=0, shards=1,
                               authors=list(range(200)), texts=["forged"] * 200, fields=[{"level": 999}] * 200)
            claims = forged.model_copy(update={"host_id": "host-0"})
            for subject, payload in (
                (subjects.run_mail(run_id, 1, "host-1", 0, "host-0"), b"{not json"),
                (subjects.run_mail(run_id, 1, "host-1", 0, "host-9"), claims.model_dump_json().encode()),
                (subjects.run_mail(run_id, 1, "host-1", 0, "host-9"), forged.model_dump_json().encode()),
            ):
                sent.append((subject, payload))
                await js.publish(subject, payload)

        tasks: list = []

        def on_event(kind: str, model: object) -> None:
            if isinstance(model, RoundOpen) and model.round == 1 and not tasks:
                tasks.append(asyncio.get_running_loop().create_task(forge(model.run_id)))

        try:
            return await play(nc, prepared.config, graph=prepared.graph_blobs, manifest=prepared.manifest,
                              on_event=on_event, stall_s=120)
        finally:
            await forger.close()
            await nc.close()

    outcome = asyncio.run(go())
    assert outcome.status == "completed", outcome.reason
    assert_exact_as_in_one_process(lossy.db, outcome.run_id, prepared)
    no_violations(lossy)

    # a dead letter is the refused message's reference and its first DLQ_EXCERPT_BYTES (the
    # forged batches are longer; their excerpts differ in the body's host_id)
    lettered = [(subject, payload) for _, subject, payload, _ in asyncio.run(dead_letters(lossy))]
    garbage, claims, forged = ((subject, payload[:bus.DLQ_EXCERPT_BYTES]) for subject, payload in sent)
    assert claims != forged
    assert lettered.count(garbage) == 1, "garbage on a mail subject is dead-lettered once"
    assert lettered.count(claims) == 1, "a body naming another sender than its subject is dead-lettered once"
    assert forged not in lettered  # well-formed, from an unplaced share: ignored, not an error
    with duckdb.connect(lossy.db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM gossip_outcomes WHERE run_id = ? AND level >= 999",
                           [outcome.run_id]).fetchone() == (0,), "a forged post was heard"


def test_a_host_lost_mid_round_leaves_every_inbox_exact(lossy):
    """Round 2 in play, one agent-host is SIGKILLed: its agents are placed on the survivor,
    which reads their last posts from the checkpoints, and the survivor sends its own posts of
    the round again to the new share. The run equals one process's, inbox by inbox.

    On the module's stack (its own stack before), last in the module: the host
    started again after it drops the first mail it gets, as a new process of this stack does,
    which the first test counts."""
    import os
    import signal

    from populace.core.contracts import RoundOpen

    data = {**SCENARIO, "model": {"backend": "dummy", "latency_s": 1.5, "seed": 1}}
    prepared = prepare(RunConfig.model_validate(data))

    def on_event(kind: str, model: object) -> None:
        if isinstance(model, RoundOpen) and model.round == 2 and lossy.procs["agent-host-1"].poll() is None:
            os.kill(lossy.procs["agent-host-1"].pid, signal.SIGKILL)

    async def go():
        nc = await connect(lossy, "e2e-graph-loss")
        try:
            return await asyncio.wait_for(play(nc, prepared.config, graph=prepared.graph_blobs,
                                               manifest=prepared.manifest, on_event=on_event, stall_s=90), 180)
        finally:
            await nc.close()

    try:
        outcome = asyncio.run(go())
    finally:
        if lossy.procs["agent-host-1"].poll() is not None:  # started again for whatever follows
            lossy.restart("agent-host-1")
        asyncio.run(lossy.wait_ready(timeout=90))
    assert outcome.status == "completed", outcome.reason
    with duckdb.connect(lossy.db, read_only=True) as con:
        shares = con.execute("SELECT count(*) FROM _shares WHERE run_id = ?", [outcome.run_id]).fetchone()[0]
    assert shares == 3, "the lost host's agents should have been placed again, in a new share"
    assert_exact_as_in_one_process(lossy.db, outcome.run_id, prepared)
    no_violations(lossy)
