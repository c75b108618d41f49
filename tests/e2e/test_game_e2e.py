"""End to end: nats-server and the services, a game played over the bus and the DuckDB file
checked exactly. The module's stack runs the services in one process (`one_process=True`: no
test here kills or measures one service); the stack `populace demo` uses, every service its own
OS process, exports each service's metrics, stops on SIGTERM, and records the same rows as the
one-process stack for the same seeded game (the last test)."""

from __future__ import annotations

import asyncio
from fractions import Fraction

import duckdb
import pytest

from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus, replies, subjects
from populace.core.contracts import RunConfig

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def stack(stacks):
    return stacks(hosts=2, env={"POPULACE_STORAGE": "memory"}, one_process=True)


def run_game(stack: Stack, config: RunConfig):
    async def go():
        nc = await bus.connect(stack.url, "e2e")
        try:
            return await play(nc, config, stall_s=120)
        finally:
            await nc.close()

    return asyncio.run(go())


def check_recorded_game(db: str, run_id: str, agents: int, rounds: int, ratio: Fraction, offset: float) -> None:
    with duckdb.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs WHERE run_id = ? AND finished_at IS NOT NULL AND status = 'completed'",
                           [run_id]).fetchone() == (1,)
        assert con.execute("SELECT count(*), count(DISTINCT agent_id), min(agent_id), max(agent_id) FROM agents "
                           "WHERE run_id = ?", [run_id]).fetchone() == (agents, agents, 0, agents - 1)
        # exactly one guess per agent per round
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ?", [run_id]).fetchone() == (agents * rounds,)
        assert con.execute("SELECT count(*) FROM (SELECT round, agent_id FROM guesses WHERE run_id = ? "
                           "GROUP BY 1, 2 HAVING count(*) <> 1)", [run_id]).fetchone() == (0,)
        assert con.execute("SELECT count(DISTINCT round), min(round), max(round) FROM guesses WHERE run_id = ?",
                           [run_id]).fetchone() == (rounds, 1, rounds)
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND (value IS NULL) <> (NOT valid)",
                           [run_id]).fetchone() == (0,)
        rounds_rows = con.execute("SELECT round, n_valid, mean, target, winner_agent_id, winner_value FROM rounds "
                                  "WHERE run_id = ? ORDER BY round", [run_id]).fetchall()
        assert [r[0] for r in rounds_rows] == list(range(1, rounds + 1))
        for rnd, n_valid, mean, target, winner, winner_value in rounds_rows:
            vals = con.execute("SELECT agent_id, value FROM guesses WHERE run_id = ? AND round = ? AND valid",
                               [run_id, rnd]).fetchall()
            assert n_valid == len(vals)
            m = sum(v for _, v in vals) / len(vals)
            t = float(ratio) * m + offset  # recomputed from the recorded guesses
            assert mean == pytest.approx(m, rel=1e-12)
            assert target == pytest.approx(t, rel=1e-12)
            best = min(abs(v - t) for _, v in vals)
            winners = sorted(a for a, v in vals if abs(abs(v - t) - best) <= 1e-9)
            assert winner == winners[0]
            assert dict(vals)[winner] == winner_value


def test_1000_agents_3_rounds_recorded_exactly(stack):
    config = RunConfig.model_validate({"agents": 1000, "rounds": 3, "game": {"ratio": "2/3"},
                                       "model": {"latency_s": 0.01, "seed": 3}})
    out = run_game(stack, config)
    assert out.status == "completed", out.reason
    assert out.recorded is not None and out.recorded.outcomes == 3000
    assert [r.round for r in out.results] == [1, 2, 3]
    check_recorded_game(stack.db, out.run_id, 1000, 3, Fraction(2, 3), 0.0)


def test_variant_five_plus_half_the_mean(stack):
    config = RunConfig.model_validate({"agents": 333, "rounds": 2, "game": {"ratio": "1/2", "offset": 5},
                                       "model": {"latency_s": 0.0, "seed": 11}})
    out = run_game(stack, config)
    assert out.status == "completed", out.reason
    check_recorded_game(stack.db, out.run_id, 333, 2, Fraction(1, 2), 5.0)


def test_one_agent_per_process(stack):
    config = RunConfig.model_validate({"agents": 12, "rounds": 2, "model": {"latency_s": 0.0},
                                       "placement": {"agents_per_process": 1}})
    out = run_game(stack, config)
    assert out.status == "completed", out.reason
    check_recorded_game(stack.db, out.run_id, 12, 2, Fraction(2, 3), 0.0)
    # round 2's prompt carried round 1's winning number and each agent's own memory
    with duckdb.connect(stack.db, read_only=True) as con:
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND round = 2",
                           [out.run_id]).fetchone() == (12,)


def test_malformed_messages_are_dead_lettered_and_services_keep_serving(stack):
    garbage = b"\x00{definitely not a message"
    targets = {
        "orchestrator": [subjects.RUN_START, "run.junk.spawned.host-0", "run.junk.round.1.result"],
        "environment": ["run.junk.round.1.open", "run.junk.partial.1.host-0.0"],
        "agent-host": ["run.junk.spawn.host-0", "run.junk.round.7.open"],
        "gateway": [subjects.llm_infer(replies.ANONYMOUS)],
        "recorder": ["run.junk.outcomes.1.host-0"],
    }

    async def go():
        nc = await bus.connect(stack.url, "e2e-dlq")
        js = nc.jetstream()
        try:
            before = (await js.stream_info(subjects.DLQ_STREAM)).state.messages
            for subs in targets.values():
                for s in subs:
                    if s.startswith(subjects.LLM_INFER):
                        reply = await replies.request(nc, "gateway", s, garbage, timeout=5)
                        assert b"malformed" in reply.data  # an explicit error, not a timeout
                    else:
                        await js.publish(s, garbage)
            deadline = asyncio.get_running_loop().time() + 20
            by_service: dict[str, int] = {}
            while asyncio.get_running_loop().time() < deadline:
                info = await js.stream_info(subjects.DLQ_STREAM, subjects_filter="dlq.>")
                by_service = dict(info.state.subjects or {})
                if all(by_service.get(subjects.dlq(s), 0) >= 1 for s in targets):
                    break
                await asyncio.sleep(0.2)
            return before, by_service
        finally:
            await nc.close()

    _, by_service = asyncio.run(go())
    for service in targets:
        assert by_service.get(subjects.dlq(service), 0) >= 1, (service, by_service)
    stack.check_alive()
    # and a game still plays to the end
    out = run_game(stack, RunConfig.model_validate({"agents": 50, "rounds": 1, "model": {"latency_s": 0}}))
    assert out.status == "completed" and out.recorded.outcomes == 50


def rows(db: str, run_id: str) -> dict[str, list[tuple]]:
    """A run's recorded guesses and rounds, without what differs from run to run (its id, times)."""
    with duckdb.connect(db, read_only=True) as con:
        return {"guesses": con.execute("SELECT round, agent_id, value, valid, raw FROM guesses WHERE run_id = ? "
                                       "ORDER BY round, agent_id", [run_id]).fetchall(),
                "rounds": con.execute("SELECT round, n_valid, mean, target, winner_agent_id, winner_value FROM rounds "
                                      "WHERE run_id = ? ORDER BY round", [run_id]).fetchall()}


def test_a_process_per_service_stack_exports_metrics_stops_on_sigterm_and_records_what_one_process_does(
        tmp_path, stack):
    """One process-per-service stack for three checks (each used to start its own): its services
    export metrics while a game plays, then every one of them stops on SIGTERM (none needs
    SIGKILL), having served a run; and the same seeded game on the module's one-process stack
    records exactly the same rows (so what the one-process stacks of the other tests record is
    what the product's stack records)."""
    import httpx

    game = RunConfig.model_validate({"agents": 120, "rounds": 2, "seed": 4, "model": {"latency_s": 0, "seed": 9}})
    s = Stack(hosts=1, db=str(tmp_path / "m.duckdb"), env={"POPULACE_STORAGE": "memory"}, metrics=True)
    s.start()
    try:
        asyncio.run(s.wait_ready(timeout=90))
        procs = dict(s.procs)
        out = run_game(s, game)
        assert out.status == "completed"
        scraped = {key: httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
                   for key, port in s.metrics_ports.items()}
    finally:
        killed = s.stop(timeout=30)  # SIGTERM is what is proven, not how fast on a loaded machine
    assert killed == []
    assert {k: p.returncode for k, p in procs.items() if p.returncode not in (0, -15)} == {}

    def value(text: str, series: str) -> float:
        for line in text.splitlines():
            name, _, number = line.rpartition(" ")
            if name == series:
                return float(number)
        raise KeyError(f"{series} not exposed")

    assert value(scraped["orchestrator"], 'populace_rounds_total{service="orchestrator"}') == 2
    assert value(scraped["environment"], 'populace_rounds_total{service="environment"}') == 2
    host = scraped["agent-host-0"]
    assert value(host, 'populace_rounds_total{service="agent-host"}') == 2
    assert value(host, "populace_agents_hosted") == 0  # the run is over: agents released
    assert value(host, 'populace_items_total{kind="outcomes",service="agent-host"}') == 240
    assert value(host, 'populace_llm_in_flight{service="agent-host"}') == 0
    assert value(scraped["gateway"], 'populace_items_total{kind="infer",service="gateway"}') == 240
    assert value(scraped["recorder"], 'populace_items_total{kind="outcomes",service="recorder"}') == 240
    for key in ("orchestrator", "environment", "gateway", "recorder", "agent-host-0"):
        assert "populace_dead_letters_total" in scraped[key]

    together = run_game(stack, game)  # two hosts in one process: the split does not change a row either
    assert together.status == "completed", together.reason
    assert rows(stack.db, together.run_id) == rows(s.db, out.run_id)
    assert len(rows(s.db, out.run_id)["guesses"]) == 240
