"""The simulated replica as a hosted provider, over real HTTP (uvicorn in this loop on a free port):
a required key (401, OpenAI's error body), requests- and tokens-per-minute limits over a sliding
window (429 + Retry-After), `usage.prompt_tokens_details.cached_tokens` read back by the gateway's
own client, and a provider's added latency."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from populace.core.contracts import ReplicaInfo
from populace.gateway.openai_api import ChatClient, KeyRefused, RateLimited, chat
from populace.replicas.sim import API_KEY_VARIABLE, SimConfig, SimServer, parse

KEY = "sk-sim-provider-test-0123456789"
CALL = {"schema": None, "max_tokens": 8, "temperature": 0.0, "seed": 1, "model": "sim", "timeout": 10}


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


def body(user: str = "How many?", system: str = "You are a player.", max_tokens: int = 16) -> dict:
    return {"model": "sim", "max_tokens": max_tokens,
            "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}]}


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def metric(text: str, name: str) -> float:
    line = next(line for line in text.splitlines() if line.startswith(name + "{"))
    return float(line.rsplit(" ", 1)[1])


async def test_a_key_is_required_on_v1_and_health_and_metrics_stay_open(start_sim):
    srv = await start_sim(time_scale=0, api_key=KEY)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        missing = await client.post("/v1/chat/completions", json=body())
        wrong = await client.post("/v1/chat/completions", json=body(), headers=bearer(KEY[:-1] + "x"))
        not_bearer = await client.post("/v1/chat/completions", json=body(), headers={"Authorization": KEY})
        models = await client.get("/v1/models")
        ok = await client.post("/v1/chat/completions", json=body(), headers=bearer(KEY))
        listed = await client.get("/v1/models", headers=bearer(KEY))
        health = await client.get("/health")
        metrics = await client.get("/metrics")
    for r in (missing, wrong, not_bearer, models):
        assert r.status_code == 401
        assert r.json() == {"error": {"message": "Incorrect API key provided. Send it as `Authorization: Bearer "
                                                 "<key>`.", "type": "invalid_request_error", "param": None,
                                      "code": "invalid_api_key"}}
        assert KEY[:12] not in r.text
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"]
    assert listed.status_code == 200 and listed.json()["data"][0]["id"] == "sim"
    assert health.status_code == 200 and metrics.status_code == 200
    assert metric(metrics.text, "sim:unauthorized_total") == 4
    assert metric(metrics.text, "sim:requests_received_total") == 1  # refused keys never reach the limits


async def test_the_gateways_client_sends_the_key_and_tells_a_refused_one(start_sim):
    srv = await start_sim(time_scale=0, api_key=KEY)
    info = ReplicaInfo(replica_id="provider", url=srv.url, backend="openai", kind="sim", model="sim",
                       heartbeat_at=time.time())
    http = ChatClient(4)
    try:
        args = CALL
        res = await chat(http, info, body()["messages"], auth=bearer(KEY), **args)
        with pytest.raises(KeyRefused, match="HTTP 401"):
            await chat(http, info, body()["messages"], auth=bearer("sk-not-it-0000"), **args)
    finally:
        await http.aclose()
    assert res.text and res.prompt_tokens > 0


async def test_requests_per_minute_answer_429_with_retry_after_then_admit_again(start_sim):
    srv = await start_sim(time_scale=0, requests_per_min=3, minute_s=1.0)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        first = [await client.post("/v1/chat/completions", json=body(f"q{i}")) for i in range(5)]
        limited = first[3]
        wait = float(limited.headers["Retry-After"])
        await asyncio.sleep(wait)
        again = await client.post("/v1/chat/completions", json=body("after the wait"))
        stats = (await client.get("/sim/stats")).json()
        metrics = (await client.get("/metrics")).text
    assert [r.status_code for r in first] == [200, 200, 200, 429, 429]
    # five arrived within the same second: a retry fits once they have all but two left, in 1 s
    assert [r.headers["Retry-After"] for r in first[3:]] == ["1", "1"]
    assert 0 < int(limited.headers["retry-after-ms"]) <= 1000
    error = limited.json()["error"]
    assert error["type"] == "requests" and error["code"] == "rate_limit_exceeded"
    assert error["message"].startswith("Rate limit reached for requests per min (RPM): Limit 3, Used 3")
    assert again.status_code == 200
    assert stats["requests_received"] == 6 and stats["rate_limited"] == 2 and stats["succeeded"] == 4
    assert len(stats["arrivals_s"]) == 6 and len(stats["rate_limited_s"]) == 2
    assert stats["max_requests_in_minute"] == 5
    assert metric(metrics, "sim:rate_limited_total") == 2 and metric(metrics, "sim:max_requests_in_minute") == 5


async def test_the_gateways_client_reads_the_429s_retry_after(start_sim):
    srv = await start_sim(time_scale=0, requests_per_min=1, minute_s=30.0)
    info = ReplicaInfo(replica_id="provider", url=srv.url, backend="openai", kind="sim", model="sim",
                       heartbeat_at=time.time())
    http = ChatClient(4)
    try:
        args = CALL
        await chat(http, info, body()["messages"], **args)
        with pytest.raises(RateLimited) as refused:
            await chat(http, info, body("again")["messages"], **args)
    finally:
        await http.aclose()
    assert refused.value.retry_after == 30.0  # both requests must leave the minute: ceil(30 - a few ms)


async def test_tokens_per_minute_count_prompt_and_max_tokens(start_sim):
    # each request: ceil(len("system\nS\nuser\nU\n") / 4) prompt tokens + max_tokens
    srv = await start_sim(time_scale=0, tokens_per_min=100)
    user = "x" * 83  # "system\n" + 17 + "\nuser\n" + 83 + "\n" = 114 chars: 29 tokens, + 16 = 45
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        rs = [await client.post("/v1/chat/completions", json=body(user)) for _ in range(3)]
        too_large = await client.post("/v1/chat/completions", json=body(user, max_tokens=90))
    assert [r.status_code for r in rs] == [200, 200, 429]
    assert rs[0].json()["usage"]["prompt_tokens"] == 29
    error = rs[2].json()["error"]
    assert error["type"] == "tokens"
    assert error["message"].startswith("Rate limit reached for tokens per min (TPM): Limit 100, Used 90, Requested 45")
    assert int(rs[2].headers["Retry-After"]) == 60
    # 29 + 90 > 100 whatever the window holds: never admitted, so not a 429 to wait out
    assert too_large.status_code == 400 and "too large" in too_large.json()["error"]["message"]


async def test_usage_reports_cached_tokens_as_openai_does(start_sim):
    srv = await start_sim(time_scale=0)
    system = "x" * 640  # 160 tokens: the shared prefix covers 10 full blocks of 16 tokens
    info = ReplicaInfo(replica_id="provider", url=srv.url, backend="openai", kind="sim", model="sim",
                       heartbeat_at=time.time())
    http = ChatClient(4)
    try:
        args = CALL
        cold = await chat(http, info, body("first question", system)["messages"], **args)
        warm = await chat(http, info, body("second question", system)["messages"], **args)
    finally:
        await http.aclose()
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        raw = (await client.post("/v1/chat/completions", json=body("fourth question", system))).json()
    assert (cold.cached_tokens, warm.cached_tokens) == (0, 160)
    assert raw["usage"]["prompt_tokens_details"] == {"cached_tokens": 160}
    assert raw["usage"]["prompt_tokens"] == warm.prompt_tokens == 168


async def test_a_providers_round_trip_delays_every_answer(start_sim):
    srv = await start_sim(time_scale=1.0, network_latency_s=0.3, api_key=KEY, decode_tokens_per_s=1e6,
                          prefill_tokens_per_s=1e9)
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        t0 = time.perf_counter()
        refused = await client.post("/v1/chat/completions", json=body())
        t1 = time.perf_counter()
        answered = await client.post("/v1/chat/completions", json=body(), headers=bearer(KEY))
        t2 = time.perf_counter()
    assert (refused.status_code, answered.status_code) == (401, 200)
    assert t1 - t0 >= 0.3 and t2 - t1 >= 0.3  # a lower bound: the sleep happened, however slow the machine


def test_the_command_line_takes_the_provider_flags_and_the_key_from_the_environment():
    cfg, _ = parse(["--port", "0", "--requests-per-min", "120", "--tokens-per-min", "5000", "--minute-s", "6",
                       "--network-latency-s", "0.05", "--latency-jitter-s", "0.02"], environ={API_KEY_VARIABLE: KEY})
    assert (cfg.requests_per_min, cfg.tokens_per_min, cfg.minute_s) == (120, 5000, 6.0)
    assert (cfg.network_latency_s, cfg.latency_jitter_s) == (0.05, 0.02)
    assert cfg.api_key is not None and cfg.api_key.get_secret_value() == KEY
    assert parse(["--api-key", "other-key"], environ={API_KEY_VARIABLE: KEY})[0].api_key.get_secret_value() == \
        "other-key"
    assert parse([], environ={})[0].api_key is None
    with pytest.raises(SystemExit):
        parse(["--requests-per-min", "0"], environ={})
