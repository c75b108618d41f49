"""`populace bench llm` on a real model: SmolLM2 on one llama.cpp replica, which the bench starts,
answers the same agents directly and through a private stack (every service its own process), and
the command prints the keys the docs quote. Kept tiny (2 agents, 1 round, one concurrency): the
figures themselves are measured by the bench on a quiet machine (bench/results/stop35/), never
asserted here; what is checked is that both paths answered every call and the result adds up.
The command runs in this process (typer's runner); the replica and the stack are real processes."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.e2e

KEYS = {"decisions_per_s", "direct_decisions_per_s", "ratio", "uncached_prompt_tokens_per_decision",
        "prefix_hit_rate", "valid_share", "model", "replicas"}


def test_the_bench_measures_smollm2_directly_and_through_populace(cli, tmp_path):
    out = tmp_path / "llm.json"
    res = cli("bench", "llm", "--server", "llamacpp", "--agents", "2", "--rounds", "1", "--sweep", "1",
              "--repeat", "1", "--json", "--out", out)
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc == json.loads(out.read_text())
    assert set(doc) >= KEYS
    assert (doc["model"], doc["replicas"], doc["server"]) == ("SmolLM2-135M-Instruct", 1, "llamacpp")
    assert (doc["direct_concurrency"], doc["populace_concurrency"]) == (1, 2)  # the sweep's, `replicas local`'s cap
    direct, through = doc["direct_runs"][0], doc["populace_runs"][0]
    assert direct["decisions"] == through["decisions"] == 2  # every agent's call answered, both ways
    assert len(direct["round_s"]) == len(through["round_s"]) == 1
    assert doc["decisions_per_s"] == through["decisions_per_s"] > 0
    assert doc["direct_decisions_per_s"] == direct["decisions_per_s"] > 0
    # (of the unrounded figures: 3 decimals of a slow SmolLM2's decisions/s are a coarse ratio)
    assert doc["ratio"] == pytest.approx(doc["decisions_per_s"] / doc["direct_decisions_per_s"], rel=0.02), res.stdout
    assert 0 <= doc["valid_share"] <= 1 and through["valid"] <= through["decisions"] <= through["calls"]
    # llama-cpp-python's server reports no cached tokens: no hit rate, every prompt token uncached
    assert doc["prefix_hit_rate"] is None
    assert doc["uncached_prompt_tokens_per_decision"] == pytest.approx(through["prompt_tokens"] / 2, abs=0.01)
    assert set(through["cpu_s"]) >= {"gateway", "recorder", "agent-host-0", "nats"}  # where a round's CPU went
