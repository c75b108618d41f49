"""Real vLLM, directly: the structured output the gateway sends (`response_format`
json_schema) is enforced, range included; the gateway's replica pool reads health from
/health and load from vLLM's own gauges. Formats and schemas only, never exact text (greedy
output differs between builds)."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from populace.gateway.openai_api import response_format
from populace.gateway.replica_pool import WAITING_GAUGES, ReplicaPool, parse_gauges

pytestmark = pytest.mark.vllm

SCHEMA = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
          "required": ["guess"], "additionalProperties": False}
# prompts that pull the model out of the range the schema allows
BURST_TIMEOUT_S = 300.0  # each call's own timeout
PROMPTS = ["Answer with the number 500.", "Say -40.", "What is 1000 times 7?", "Give a negative number.",
           "Reply with 123456.", "Pick a number between 0 and 100.", "Write a poem about the sea.", "Say 99.5."]


async def chat(http: httpx.AsyncClient, url: str, prompt: str, *, schema: dict | None, max_tokens: int = 48) -> dict:
    body = {"model": "SmolLM2-135M-Instruct", "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0.7}
    if schema is not None:
        body["response_format"] = response_format("vllm", schema)  # exactly what the gateway sends
    r = await http.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


async def test_json_schema_is_enforced_including_minimum_and_maximum(vllm_replica):
    url = vllm_replica.replicas[0].info.url
    async with httpx.AsyncClient() as http:
        out = await asyncio.gather(*(chat(http, url, p, schema=SCHEMA) for p in PROMPTS * 2))
    for data in out:
        text = data["choices"][0]["message"]["content"]
        assert data["choices"][0]["finish_reason"] == "stop", text  # a whole answer, not cut off
        answer = json.loads(text)  # well-formed JSON, every time
        assert set(answer) == {"guess"}, text
        assert isinstance(answer["guess"], int | float) and 0 <= answer["guess"] <= 100, text
        assert data["usage"]["prompt_tokens"] > 0 and data["usage"]["completion_tokens"] > 0


async def test_health_and_load_come_from_vllm_itself(vllm_replica):
    """/health says healthy; under a burst larger than --max-num-seqs, vLLM's
    num_requests_running and num_requests_waiting gauges rise, the pool's load follows the
    waiting one, and both go back to 0 when the burst is done."""
    info = vllm_replica.replicas[0].info
    assert info.kind == "vllm" and info.backend == "openai"
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{info.url}/health")).status_code == 200
        pool = ReplicaPool(None, http)
        pool._add(info)
        await pool.refresh()
        assert pool.replicas[info.replica_id].load.healthy
        assert pool.replicas[info.replica_id].load.waiting == 0
        burst = [asyncio.create_task(chat(http, info.url, f"Tell a story about player {i}.", schema=None,
                                          max_tokens=32)) for i in range(16)]
        seen_waiting, seen_running = 0, 0.0
        deadline = asyncio.get_running_loop().time() + BURST_TIMEOUT_S
        while not all(t.done() for t in burst):
            assert asyncio.get_running_loop().time() < deadline, \
                f"{sum(not t.done() for t in burst)} of the burst's 16 calls unanswered after {BURST_TIMEOUT_S:g}s"
            await pool.refresh()
            seen_waiting = max(seen_waiting, pool.replicas[info.replica_id].load.waiting)
            text = (await http.get(f"{info.url}/metrics")).text
            seen_running = max(seen_running, parse_gauges(text, ("vllm:num_requests_running",)) or 0)
            await asyncio.sleep(0.1)
        await asyncio.gather(*burst)
        await pool.refresh()
        text = (await http.get(f"{info.url}/metrics")).text
    assert seen_running >= 2, "vLLM never ran requests in a batch"
    assert seen_waiting > 0, "the pool never saw vLLM's waiting queue"
    assert pool.replicas[info.replica_id].load.waiting == 0
    assert parse_gauges(text, WAITING_GAUGES["vllm"]) == 0
    queries = parse_gauges(text, ("vllm:prefix_cache_queries_total",))
    hits = parse_gauges(text, ("vllm:prefix_cache_hits_total",))
    assert queries and queries > 0 and hits is not None and 0 <= hits <= queries
