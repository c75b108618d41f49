"""End to end: nats-server and the services, a game played over the bus and the DuckDB file
checked exactly. The module's stack runs the services in one process (`one_process=True`: no
test here kills or measures one service); the stack `populace demo` uses, every service its own
OS process, exports each service's metrics on its own port (their counters moved exactly by a
game on a simulated vLLM replica), stops on SIGTERM, and records the same rows as the one-process
stack for the same seeded game (the last test)."""

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
    """One process-per-service stack for four checks (each used to start its own; the first was
    tests/e2e/test_metrics_scrape.py's): every service exports on its own port, in
    POPULACE_METRICS_PORT's layout, every series from its start, and a small game on a simulated
    vLLM replica moves the counters exactly; a seeded game on the dummy model moves them again;
    then every service stops on SIGTERM (none needs SIGKILL), having served two runs; and the
    same seeded game on the module's one-process stack records exactly the same rows (so what
    the one-process stacks of the other tests record is what the product's stack records)."""
    from test_metrics_scrape import expected_names, free_ports_from, scrape, total  # tests/e2e is on sys.path

    from populace.client.stack import CORE_SERVICES, metrics_layout, service_keys

    AGENTS, ROUNDS = 40, 2  # the run on the simulated replica
    first = free_ports_from(len(CORE_SERVICES) + 1)
    s = Stack(hosts=1, db=str(tmp_path / "m.duckdb"),
              env={"POPULACE_STORAGE": "memory", "POPULACE_METRICS_PORT": str(first)},
              extra={"replicas-sim": ["replicas", "sim", "--count", "1"]}, replicas=1)
    s.start()
    try:
        asyncio.run(s.wait_ready(timeout=120))
        assert s.metrics_ports == metrics_layout(service_keys(1), first)
        procs = {key: p for key, p in s.procs.items() if key in service_keys(1)}
        before = {key: scrape(port) for key, port in s.metrics_ports.items()}
        on_sim = run_game(s, RunConfig.model_validate({"agents": AGENTS, "rounds": ROUNDS,
                                                       "model": {"backend": "sim", "seed": 3}}))
        assert on_sim.status == "completed", on_sim.reason
        after = {key: scrape(port) for key, port in s.metrics_ports.items()}
        game = RunConfig.model_validate({"agents": 120, "rounds": 2, "seed": 4, "model": {"latency_s": 0, "seed": 9}})
        out = run_game(s, game)
        assert out.status == "completed", out.reason
        again = {key: scrape(port) for key, port in s.metrics_ports.items()}
    finally:
        killed = s.stop(timeout=30)  # SIGTERM is what is proven, not how fast on a loaded machine
    assert killed == []
    assert {k: p.returncode for k, p in procs.items() if p.returncode not in (0, -15)} == {}

    for key, series in before.items():  # every name is there before the first run
        assert expected_names(key) <= set(series), (key, expected_names(key) - set(series))
    decisions = AGENTS * ROUNDS  # the run on the simulated replica, alone on the stack
    orch, host, gw, rec = after["orchestrator"], after["agent-host-0"], after["gateway"], after["recorder"]
    assert total(orch, "populace_round_seconds_count", service="orchestrator") == ROUNDS
    assert total(orch, "populace_round_seconds_sum", service="orchestrator") > 0
    assert total(orch, "populace_runs_total", status="started") == 1
    assert total(orch, "populace_runs_total", status="completed") == 1
    assert total(orch, "populace_runs_active") == 0
    assert total(after["environment"], "populace_rounds_total", service="environment") == ROUNDS
    assert total(host, "populace_round_seconds_count", service="agent-host") == ROUNDS
    assert total(host, "populace_batch_seconds_count", service="agent-host", kind="infer") >= ROUNDS
    assert total(host, "populace_items_total", service="agent-host", kind="infer") == decisions
    assert total(host, "populace_invalid_answers_total", service="agent-host") == 0
    assert total(host, "populace_retries_total", service="agent-host") == 0
    assert total(gw, "populace_batch_seconds_count", service="gateway", kind="infer") >= ROUNDS
    assert total(gw, "populace_llm_calls_total") == decisions
    assert total(gw, "populace_llm_seconds_count") == decisions
    assert total(gw, "populace_llm_tokens_total", kind="prompt") > 0
    assert total(gw, "populace_llm_tokens_total", kind="completion") > 0
    assert total(gw, "populace_reasks_total") >= 0  # the simulated replica answers to the schema
    assert total(gw, "populace_invalid_answers_total", service="gateway") == 0
    # one replica, named by its registry key: replicas.sim-0-<port>
    (replica,) = {labels["replica"] for labels, _ in gw["populace_llm_calls_total"]}
    assert replica.startswith("replicas.sim-0")
    assert total(gw, "populace_replica_up", replica=replica) == 1
    assert total(rec, "populace_batch_seconds_count", service="recorder", kind="messages") >= 1
    assert total(rec, "populace_items_total", service="recorder", kind="outcomes") == decisions

    def moved(key: str, name: str, **labels: str) -> float:  # by the dummy game, the second run
        return total(again[key], name, **labels) - total(after[key], name, **labels)

    assert moved("orchestrator", "populace_rounds_total", service="orchestrator") == 2
    assert moved("environment", "populace_rounds_total", service="environment") == 2
    assert moved("agent-host-0", "populace_rounds_total", service="agent-host") == 2
    assert total(again["agent-host-0"], "populace_agents_hosted") == 0  # the runs are over: agents released
    assert moved("agent-host-0", "populace_items_total", kind="outcomes", service="agent-host") == 240
    assert total(again["agent-host-0"], "populace_llm_in_flight", service="agent-host") == 0
    assert moved("gateway", "populace_items_total", kind="infer", service="gateway") == 240
    assert moved("recorder", "populace_items_total", kind="outcomes", service="recorder") == 240
    assert total(again["orchestrator"], "populace_runs_total", status="completed") == 2
    for key, series in again.items():
        assert total(series, "populace_dead_letters_total") == 0, key

    together = run_game(stack, game)  # two hosts in one process: the split does not change a row either
    assert together.status == "completed", together.reason
    assert rows(stack.db, together.run_id) == rows(s.db, out.run_id)
    assert len(rows(s.db, out.run_id)["guesses"]) == 240
