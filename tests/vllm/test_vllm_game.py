"""The ratio game on real vLLM: 10 agents × 2 rounds, the `openai` backend on the tier's vLLM
replica, the services in one process (one_process: the point is vLLM's answers; a gateway
process on real vLLM is tests/vllm/test_vllm_gateway.py's, every service its own process on a
real model tests/e2e/test_bench_llm_e2e.py's). At least 95% of the answers are valid; an
invalid one keeps the model's raw text; every `llm_calls` row names the vLLM replica."""

from __future__ import annotations

import asyncio

import duckdb
import pytest

from populace.client.prepare import prepare
from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus, subjects
from populace.core.contracts import RunConfig
from populace.replicas.launch import register_forever

pytestmark = pytest.mark.vllm


def test_ratio_game_10_agents_2_rounds_on_vllm(vllm_replica, tmp_path):
    db = str(tmp_path / "vllm.duckdb")
    replica = vllm_replica.replicas[0].info
    stack = Stack(hosts=1, db=db, env={"POPULACE_STORAGE": "memory"}, one_process=True)
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=120))
        config = RunConfig.model_validate({"agents": 10, "rounds": 2, "model": {"backend": "openai", "seed": 1}})

        async def go():
            registrar = asyncio.create_task(register_forever(stack.url, vllm_replica, every_s=1.0))
            nc = await bus.connect(stack.url, "vllm-game")
            try:
                await asyncio.sleep(2.5)  # registered, and the gateway's poll found it healthy
                manifest = prepare(config).manifest
                return await play(nc, config, stall_s=300, manifest=manifest)
            finally:
                await nc.close()
                registrar.cancel()
                await asyncio.gather(registrar, return_exceptions=True)

        out = asyncio.run(go())
    finally:
        assert stack.stop() == []
    assert out.status == "completed", out.reason
    with duckdb.connect(db, read_only=True) as con:
        n, valid = con.execute("SELECT count(*), sum(valid::INT) FROM guesses WHERE run_id = ?",
                               [out.run_id]).fetchone()
        assert n == 20
        assert valid >= 0.95 * n
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND NOT valid AND "
                           "(value IS NOT NULL OR raw IS NULL OR raw = '')", [out.run_id]).fetchone() == (0,)
        rows = con.execute("SELECT count(*), count(DISTINCT (round, agent_id)), list(DISTINCT replica), "
                           "sum((prompt_tokens > 0 AND completion_tokens > 0)::INT) FROM llm_calls WHERE run_id = ?",
                           [out.run_id]).fetchone()
    assert rows[0] == 20 and rows[1] == 20 and rows[3] == 20
    assert rows[2] == [subjects.replica_key(subjects.REPLICAS_WRITER, replica.replica_id)]  # named by its key
