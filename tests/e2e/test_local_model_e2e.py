"""A game on a real LLM: SmolLM2-135M-Instruct on a llama.cpp replica, through the gateway,
every service its own process. At least 90% of guesses must be valid; every invalid one
keeps the model's raw text; every decision is in `llm_calls`."""

from __future__ import annotations

import asyncio

import duckdb
import pytest

from populace.client.run import play
from populace.client.stack import Stack
from populace.core import bus
from populace.core.contracts import RunConfig

pytestmark = pytest.mark.e2e


def test_smollm2_game_through_the_gateway(tmp_path):
    db = str(tmp_path / "local.duckdb")
    stack = Stack(hosts=1, db=db, env={"POPULACE_STORAGE": "memory"},
                  extra={"replicas-local": ["replicas", "local", "--count", "1"]}, replicas=1)
    stack.start()
    try:
        asyncio.run(stack.wait_ready(timeout=180))
        config = RunConfig.model_validate({"agents": 20, "rounds": 2, "model": {"backend": "local", "seed": 1}})

        async def go():
            nc = await bus.connect(stack.url, "e2e-local")
            try:
                return await play(nc, config, stall_s=300)
            finally:
                await nc.close()

        out = asyncio.run(go())
    finally:
        assert stack.stop() == []
    assert out.status == "completed", out.reason
    with duckdb.connect(db, read_only=True) as con:
        n, valid = con.execute("SELECT count(*), sum(valid::INT) FROM guesses WHERE run_id = ?",
                               [out.run_id]).fetchone()
        assert n == 40
        assert valid >= 0.9 * n
        # invalid answers keep the model's own text, never a made-up number
        assert con.execute("SELECT count(*) FROM guesses WHERE run_id = ? AND NOT valid AND "
                           "(value IS NOT NULL OR raw IS NULL OR raw = '')", [out.run_id]).fetchone() == (0,)
        calls = con.execute("SELECT count(*), count(DISTINCT (round, agent_id)), min(attempts), "
                            "sum(prompt_tokens > 0 AND completion_tokens > 0)::INT, count(DISTINCT replica) "
                            "FROM llm_calls WHERE run_id = ?", [out.run_id]).fetchone()
        assert calls[:4] == (40, 40, 1, 40)
        assert calls[4] == 1
        assert con.execute("SELECT count(*) FROM rounds WHERE run_id = ?", [out.run_id]).fetchone() == (2,)
