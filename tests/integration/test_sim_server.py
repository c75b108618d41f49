"""The simulated vLLM replica over real HTTP: uvicorn in this event loop on a free port, httpx clients."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from populace.replicas.sim import SimConfig, SimServer

SYSTEM = "You are one of many players in a number-guessing game. Answer in JSON. " * 30


@pytest.fixture
async def start_sim():
    servers: list[SimServer] = []

    async def _start(**cfg) -> SimServer:
        srv = await SimServer(SimConfig(**cfg)).start()
        servers.append(srv)
        return srv

    yield _start
    for srv in servers:
        await srv.stop()


# The structured answer every agent asks for: the simulated replica answers within it.
GUESS_FORMAT = {"type": "json_schema", "json_schema": {"name": "guess", "schema": {
    "type": "object", "properties": {"guess": {"type": "integer", "minimum": 0, "maximum": 100}},
    "required": ["guess"]}}}


def chat(user: str, system: str = "You are a player.", **extra) -> dict:
    return {"model": "sim", "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
            "max_tokens": 16, "temperature": 0.7, "some_unknown_field": True, "response_format": GUESS_FORMAT,
            **extra}


def parse_metrics(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name_labels, value = line.rsplit(" ", 1)
            out[name_labels.split("{", 1)[0]] = float(value)
    return out


async def test_concurrent_requests_get_openai_shaped_answers(start_sim):
    srv = await start_sim(time_scale=0)
    rf = {"type": "json_schema", "json_schema": {"name": "g", "schema": {
        "type": "object", "properties": {"guess": {"type": "integer", "minimum": 0, "maximum": 10}}}}}
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        rs = await asyncio.gather(*(client.post("/v1/chat/completions", json=chat(f"round {i}", response_format=rf))
                                    for i in range(40)))
        metrics = parse_metrics((await client.get("/metrics")).text)
    ids = set()
    for r in rs:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/json")
        body = r.json()
        ids.add(body["id"])
        assert body["object"] == "chat.completion"
        assert isinstance(body["created"], int)
        assert body["model"] == "sim"
        (choice,) = body["choices"]
        assert choice["index"] == 0 and choice["finish_reason"] == "stop"
        assert choice["message"]["role"] == "assistant"
        assert 0 <= json.loads(choice["message"]["content"])["guess"] <= 10
        u = body["usage"]
        assert u["prompt_tokens"] > 0 and u["completion_tokens"] > 0
        assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"]
        assert u["prompt_tokens_details"]["cached_tokens"] >= 0
    assert len(ids) == 40
    assert metrics["vllm:request_success_total"] == 40
    assert metrics["vllm:num_requests_running"] == 0
    assert metrics["vllm:generation_tokens_total"] == sum(r.json()["usage"]["completion_tokens"] for r in rs)
    assert metrics["vllm:prompt_tokens_total"] == sum(r.json()["usage"]["prompt_tokens"] for r in rs)


async def test_admission_queues_beyond_max_num_seqs(start_sim):
    # 4 completion tokens at 10 tok/s = 0.4 s, x time_scale 0.4 = 0.16 s a request; 6 requests on 2 slots = 3 waves
    srv = await start_sim(max_num_seqs=2, decode_tokens_per_s=10, time_scale=0.4)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        t0 = time.perf_counter()
        burst = asyncio.gather(*(client.post("/v1/chat/completions", json=chat(f"q{i}")) for i in range(6)))
        for _ in range(100):  # until the whole burst has arrived (no fixed sleep: CI may be slow)
            await asyncio.sleep(0.01)
            during = parse_metrics((await client.get("/metrics")).text)
            if during["vllm:num_requests_running"] + during["vllm:num_requests_waiting"] == 6:
                break
        rs = await burst
        elapsed = time.perf_counter() - t0
        after = parse_metrics((await client.get("/metrics")).text)
    assert all(r.status_code == 200 for r in rs)
    assert during["vllm:num_requests_running"] == 2
    assert during["vllm:num_requests_waiting"] == 4
    assert during["vllm:kv_cache_usage_perc"] > 0
    assert after["vllm:num_requests_waiting"] == 0 and after["vllm:num_requests_running"] == 0
    assert after["vllm:kv_cache_usage_perc"] == 0
    assert elapsed >= 3 * 0.16 * 0.9  # three waves, not one


async def test_shared_system_prompt_is_served_from_the_prefix_cache(start_sim):
    srv = await start_sim(time_scale=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        first = (await client.post("/v1/chat/completions", json=chat("player 1", system=SYSTEM))).json()
        second = (await client.post("/v1/chat/completions", json=chat("player 2", system=SYSTEM))).json()
        other = (await client.post("/v1/chat/completions", json=chat("player 3", system="Different. " + SYSTEM))).json()
        metrics = parse_metrics((await client.get("/metrics")).text)
    assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < second["usage"]["prompt_tokens"]
    assert cached >= len(SYSTEM) // 4 - 2 * 16  # nearly the whole system prompt
    assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert metrics["vllm:prefix_cache_hits_total"] == cached
    assert metrics["vllm:prefix_cache_queries_total"] == sum(
        r["usage"]["prompt_tokens"] for r in (first, second, other))


async def test_health_models_and_metrics_format(start_sim):
    srv = await start_sim(time_scale=0, model_name="qwen-sim")
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        health = await client.get("/health")
        models = await client.get("/v1/models")
        metrics = await client.get("/metrics")
    assert health.status_code == 200
    assert models.status_code == 200
    body = models.json()
    assert body["object"] == "list"
    assert [(m["id"], m["object"]) for m in body["data"]] == [("qwen-sim", "model")]
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    for name in ("num_requests_running", "num_requests_waiting", "kv_cache_usage_perc",
                 "prefix_cache_queries_total", "prefix_cache_hits_total", "prompt_tokens_total",
                 "generation_tokens_total", "request_success_total"):
        assert f'vllm:{name}{{model_name="qwen-sim"}} ' in metrics.text
        assert f"# TYPE vllm:{name} " in metrics.text


async def test_malformed_requests_get_400_with_an_openai_error(start_sim):
    srv = await start_sim(time_scale=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        bad_json = await client.post("/v1/chat/completions", content=b"{not json",
                                     headers={"content-type": "application/json"})
        no_messages = await client.post("/v1/chat/completions", json={"model": "sim"})
        bad_max = await client.post("/v1/chat/completions", json=chat("x", max_tokens=-1))
        not_object = await client.post("/v1/chat/completions", json=[1, 2])
        ok = await client.post("/v1/chat/completions", json=chat("still fine"))
        metrics = parse_metrics((await client.get("/metrics")).text)
    for r in (bad_json, no_messages, bad_max, not_object):
        assert r.status_code == 400
        err = r.json()["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert err["type"] == "invalid_request_error"
    assert ok.status_code == 200
    assert metrics["vllm:request_success_total"] == 1


async def test_stop_frees_the_port(start_sim):
    srv = await start_sim(time_scale=0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        assert (await client.get("/health")).status_code == 200
    await srv.stop()
    async with httpx.AsyncClient(base_url=srv.url, timeout=2) as client:
        with pytest.raises(httpx.ConnectError):
            await client.get("/health")


async def test_launched_replicas_own_their_port_from_the_moment_they_are_started():
    """`populace replicas sim` hands each replica a socket already bound: no other process can take
    its port while the replica starts (one that did answered the lost replica's health check, and
    that replica was never registered: a CI stack waited 90 s for 1 of 2 replicas)."""
    import errno
    import socket

    from populace.replicas.launch import start_sim, wait_healthy

    rs = start_sim(2, extra_args=["--time-scale", "0"])
    try:
        for r in rs.replicas:  # at once, before the child has even imported its server
            port = int(r.info.url.rsplit(":", 1)[1])
            with socket.socket() as s, pytest.raises(OSError) as taken:
                s.bind(("127.0.0.1", port))
            assert taken.value.errno == errno.EADDRINUSE
        await wait_healthy(rs, timeout=60)
        async with httpx.AsyncClient() as http:
            for r in rs.replicas:
                assert r.alive()
                assert (await http.get(r.info.url + "/v1/models")).status_code == 200
    finally:
        rs.stop()
