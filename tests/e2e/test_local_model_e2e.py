"""A game on a real LLM: SmolLM2-135M-Instruct on a llama.cpp replica (`populace replicas
local`, its own process), through the gateway. At least 90% of guesses must be valid; every
invalid one keeps the model's raw text; every decision is in `llm_calls`. The services share one
process (one_process: what is checked is the model's answers and their accounting, not the
process boundary; tests/e2e/test_bench_llm_e2e.py drives SmolLM2 through a stack with every
service its own process, and tests/vllm/test_vllm_gateway.py a gateway process on real vLLM).

10 agents for 2 rounds (20 decisions; it was 20 agents, 40 decisions): every row and count is
still checked exactly against the run's own size, a second round still shows the per-round
accounting, and the share of valid answers is held to the same 90%. `populace results` runs in
this process (typer's runner): what it prints from the rows is the point, not its process
(tests/e2e/test_cli.py starts the console script)."""

from __future__ import annotations

import asyncio
import json

import duckdb
import pytest

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig

pytestmark = pytest.mark.e2e

AGENTS, ROUNDS = 10, 2
DECISIONS = AGENTS * ROUNDS


def test_smollm2_game_through_the_gateway(tmp_path, cli):
    db = str(tmp_path / "local.duckdb")
    stack = Stack(hosts=1, db=db, env={"POPULACE_STORAGE": "memory"},
                  extra={"replicas-local": ["replicas", "local", "--count", "1"]}, replicas=1, one_process=True)
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=180))
        config = RunConfig.model_validate({"agents": AGENTS, "rounds": ROUNDS, "model": {"backend": "local", "seed": 1}})
        manifest = prepare(config).manifest  # as the CLI submits it: the replicas serving the run go in

        async def go():
            nc = await bus.connect(stack.url, "e2e-local")
            try:
                return await play(nc, config, stall_s=300, manifest=manifest)
            finally:
                await nc.close()

        out = asyncio.run(go())
    finally:
        assert stack.stop() == []
    assert out.status == "completed", out.reason
    with duckdb.connect(db, read_only=True) as con:
        n, valid = con.execute("SELECT count(*), sum(valid::INT) FROM guesses WHERE run_id = ?",
                               [out.run_id]).fetchone()
        assert n == DECISIONS
        assert valid >= 0.9 * n
        # invalid answers keep the model's own text, never a made-up number
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND NOT valid AND "
                           "(value IS NOT NULL OR raw IS NULL OR raw = '')", [out.run_id]).fetchone() == (0,)
        calls = con.execute("SELECT count(*), count(DISTINCT (round, agent_id)), min(attempts), "
                            "sum(prompt_tokens > 0 AND completion_tokens > 0)::INT, count(DISTINCT replica) "
                            "FROM llm_calls WHERE run_id = ?", [out.run_id]).fetchone()
        assert calls[:4] == (DECISIONS, DECISIONS, 1, DECISIONS)
        assert calls[4] == 1
        assert con.execute("SELECT count(*) FROM rounds WHERE run_id = ?", [out.run_id]).fetchone() == (ROUNDS,)
        truth = con.execute("SELECT round, count(*), sum(attempts), sum(reasks), sum(prompt_tokens), "
                            "sum(completion_tokens), max(latency_ms), count(*) FILTER (WHERE valid) FROM llm_calls "
                            "WHERE run_id = ? GROUP BY round ORDER BY round", [out.run_id]).fetchall()
        invalid = con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND NOT valid", [out.run_id]).fetchone()
    # `populace results --json` tells the same story as the rows it reads
    res = cli("results", out.run_id, "--json", "--db", db)
    assert res.returncode == 0, res.stderr
    run = json.loads(res.stdout)["runs"][0]
    got = [(r["round"], r["calls"]["calls"], r["calls"]["attempts"], r["calls"]["reasks"], r["calls"]["prompt_tokens"],
            r["calls"]["completion_tokens"], r["calls"]["latency_ms_max"], r["calls"]["valid"]) for r in run["rounds"]]
    assert got == [(*t[:6], round(t[6], 1), t[7]) for t in truth]
    assert run["usage"]["invalid_answers"] == invalid[0] and run["usage"]["infra_retries"] == 0
    assert run["usage"]["simulation_errors"] == 0  # the model's invalid answers are never the simulation's bugs
    assert run["usage"]["prompt_tokens"] == sum(t[4] for t in truth) > 0  # the hosts counted what the gateway did
    assert run["usage"]["completion_tokens"] == sum(t[5] for t in truth) > 0
    assert run["model"]["backend"] == "local" and run["model"]["name"] and len(run["model"]["replicas"]) == 1
    assert run["calls"]["calls"] == DECISIONS and run["calls"]["replicas"] == {run["model"]["replicas"][0]: DECISIONS}
    table = cli("results", out.run_id, "--db", db)
    assert table.returncode == 0, table.stderr
    assert "LLM work — model: local, " in table.stdout and "re-asks" in table.stdout
    assert "latency p50 / p95 / max (ms)" in table.stdout
