"""`populace bench llm`'s pure parts (populace.bench.llm): the sweep's choice, a run's figures, the
result's keys and ratio, the workload both paths play, and the direct path's calls (the gateway's
body, seed and re-ask, against a fake HTTP client). tests/e2e/test_bench_llm.py runs it on SmolLM2."""

from __future__ import annotations

import asyncio
import json

import pytest

from populace.bench import llm
from populace.core.contracts import ModelConfig, ReplicaInfo
from populace.core.scenario import ScenarioError
from populace.gateway.dispatcher import call_seed


def run(path: str = "direct", concurrency: int = 4, decisions: int = 100, seconds: float = 10.0, **kw) -> llm.PathRun:
    fields = {"valid": decisions, "calls": decisions, "prompt_tokens": 130 * decisions,
              "cached_tokens": 80 * decisions, "completion_tokens": 8 * decisions, **kw}
    return llm.PathRun(path, concurrency, decisions, round_s=[seconds / 2, seconds / 2], **fields)


def test_the_sweep_keeps_the_fastest_and_of_near_ties_the_fewest_in_flight():
    sweep = [run(concurrency=1, seconds=40), run(concurrency=4, seconds=10.1), run(concurrency=8, seconds=10),
             run(concurrency=16, seconds=12)]
    assert llm.best_concurrency(sweep) == 4  # 9.90 decisions/s is within 2% of 8's 10.0
    assert llm.best_concurrency([run(concurrency=2, seconds=10), run(concurrency=8, seconds=5)]) == 8
    with pytest.raises(ValueError):
        llm.best_concurrency([])


@pytest.mark.parametrize(("text", "kind", "levels"), [
    ("", "vllm", (1, 2, 4, 8, 16, 32)),
    ("", "openai", (1, 2, 4, 8, 16, 32)),
    ("", "llamacpp", (1, 2, 4)),  # llama-cpp-python's server answers one call at a time
    ("16, 4,4,1", "vllm", (1, 4, 16)),
])
def test_the_sweep_option(text, kind, levels):
    assert llm.parse_sweep(text, kind) == levels


@pytest.mark.parametrize("text", ["0", "1,x", "4,-2", "1.5", "5000"])
def test_a_sweep_that_is_not_counts_of_calls_is_refused(text):
    with pytest.raises(ValueError, match="not a number of calls in flight"):
        llm.parse_sweep(text)


def test_a_runs_figures():
    r = run(decisions=120, seconds=8, valid=114, prefix_cache_hits=600.0, prefix_cache_queries=1000.0)
    assert r.decisions_per_s == 15.0 and r.valid_share == 0.95
    assert r.uncached_prompt_tokens_per_decision == 50.0  # (130 - 80) per decision
    assert r.prefix_hit_rate == 0.6  # vLLM's own counters first
    assert run(prompt_tokens=1000, cached_tokens=250).prefix_hit_rate == 0.25  # else the usage's cached tokens
    assert run(cached_tokens=0).prefix_hit_rate is None  # a server that reports neither (llama.cpp)
    d = r.to_dict()
    assert d["decisions_per_s"] == 15.0 and d["seconds"] == 8.0 and d["prefix_hit_rate"] == 0.6


def result(direct_s: list[float], populace_s: list[float]) -> llm.LlmBenchResult:
    return llm.LlmBenchResult(
        server="vllm", model="SmolLM2-135M-Instruct", replicas=1, direct_concurrency=16, populace_concurrency=16,
        sweep=[run(concurrency=4, seconds=20), run(concurrency=16, seconds=10)],
        direct=[run(concurrency=16, seconds=s) for s in direct_s],
        populace=[run("populace", 16, seconds=s, valid=90 + i) for i, s in enumerate(populace_s)],
        workload={"agents": 100, "rounds": 3})


def test_the_result_has_the_headline_keys_medians_and_their_ratio():
    res = result(direct_s=[10, 8, 12.5], populace_s=[10, 11, 20])
    s = res.summary()
    assert {"decisions_per_s", "direct_decisions_per_s", "uncached_prompt_tokens_per_decision", "prefix_hit_rate",
            "valid_share", "model", "replicas"} <= set(s)
    assert s["direct_decisions_per_s"] == 10.0  # the median of 10, 12.5 and 8 decisions/s
    assert s["decisions_per_s"] == pytest.approx(100 / 11, abs=1e-3)  # of 10, 9.09 and 5
    assert s["ratio"] == pytest.approx(100 / 11 / 10, abs=1e-3)
    assert s["valid_share"] == 0.91  # the median run's (the second)
    assert s["uncached_prompt_tokens_per_decision"] == 50.0 and s["prefix_hit_rate"] == pytest.approx(80 / 130,
                                                                                                     abs=1e-4)
    assert s["model"] == "SmolLM2-135M-Instruct" and s["replicas"] == 1
    doc = json.loads(res.to_json())
    assert doc["ratio"] == s["ratio"] and len(doc["sweep"]) == 2 and len(doc["populace_runs"]) == 3
    assert [r["path"] for r in doc["direct_runs"]] == ["direct"] * 3


def test_the_table_shows_both_paths():
    from rich.console import Console

    console = Console(width=200, record=True)
    console.print(result(direct_s=[10], populace_s=[11]).table())
    text = console.export_text()
    assert "Populace / direct" in text and "90.9%" in text and "4: 5.00, 16: 10.00" in text


def test_the_workload_is_the_bench_model_on_these_replicas(tmp_path):
    endpoint = llm.url_endpoint("http://127.0.0.1:9/v1", "m1", "vllm", "BENCH_KEY")
    prepared = llm.workload(agents=5, rounds=2, simulation="ratio-game", params={"prompt": {"answer": "cot"}},
                            personas=None, endpoint=endpoint, concurrency=8, workdir=str(tmp_path))
    c = prepared.config
    assert (c.agents, c.rounds, c.model.temperature, c.model.seed) == (5, 2, 0.7, 1)
    assert c.model.max_tokens == 256  # the game's own default for chain of thought
    m = c.models[0]
    assert (m.name, m.kind, m.base_url, m.model, m.api_key_env, m.limits.concurrency) == (
        "bench", "vllm", "http://127.0.0.1:9/v1", "m1", "BENCH_KEY", 8)
    assert len(prepared.cast.personas) == 5 and prepared.cast.personas[0].text.startswith("You are ")
    started = llm.Endpoint("llamacpp", [], "SmolLM2-135M-Instruct")
    assert started.model_entry(None) == {"name": "bench", "kind": "llamacpp"}  # replicas registered for it


def test_bad_options_are_refused_naming_them():
    with pytest.raises(ScenarioError, match="^--url: must be an http"):
        llm.check(url="ftp://example.org")
    with pytest.raises(ScenarioError, match="^--server"):
        llm.check(server="tgi")
    with pytest.raises(ScenarioError, match="unknown simulation"):
        llm.check(simulation="no-such-game")


class FakePoster:
    """The replica: an invalid answer to a first call, a valid one to its re-ask."""

    def __init__(self) -> None:
        self.bodies: list[dict] = []

    async def post(self, url, body, headers, timeout):
        b = json.loads(body)
        self.bodies.append({"url": url, **b})
        text = '{"guess": 180}' if len(b["messages"]) == 2 else '{"guess": 18}'
        usage = {"prompt_tokens": 100, "completion_tokens": 6, "prompt_tokens_details": {"cached_tokens": 64}}
        return 200, json.dumps({"choices": [{"message": {"content": text}}], "usage": usage}).encode()

    async def aclose(self):
        pass


def test_the_direct_path_sends_the_gateways_call_and_re_asks_as_it_does():
    info = ReplicaInfo(replica_id="r", url="http://127.0.0.1:9", backend="openai", kind="vllm", model="smol",
                       max_concurrency=4, heartbeat_at=0)
    endpoint = llm.Endpoint("vllm", [info], "smol")
    schema = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
              "required": ["guess"]}

    async def go():
        client = llm.DirectClient(endpoint, ModelConfig(temperature=0.7, seed=3, max_tokens=48), concurrency=2)
        client.http = fake = FakePoster()
        await client.start()
        port = llm.DirectPort(client, "the rules", schema)
        try:
            text = await port.ask("You are player 7.", key=7)
        finally:
            await client.stop()
        return client, fake, text

    client, fake, text = asyncio.run(go())
    assert text == '{"guess": 18}'
    first, again = fake.bodies
    assert first["url"] == "http://127.0.0.1:9/v1/chat/completions" and first["model"] == "smol"
    assert first["messages"] == [{"role": "system", "content": "the rules"},
                                 {"role": "user", "content": "You are player 7."}]
    assert first["seed"] == call_seed(3, 7) == 3 * 1_000_003 + 7 and again["seed"] == first["seed"]
    assert (first["max_tokens"], first["temperature"]) == (48, 0.7)
    assert first["response_format"]["json_schema"]["schema"] == schema
    assert again["messages"][2] == {"role": "assistant", "content": '{"guess": 180}'}  # the gateway's re-ask
    assert (client.decisions, client.valid, client.calls) == (1, 1, 2)
    assert (client.prompt_tokens, client.cached_tokens, client.completion_tokens) == (200, 128, 12)


def test_the_calls_seed_as_the_gateways():
    assert call_seed(0, 5) is None  # an unseeded model
    assert call_seed(1, 5) == 1_000_008
    assert call_seed(1, 5, 2) == (1_000_008 + 2 * 1_000_000_007) % 2**31  # an agent's third call samples apart
