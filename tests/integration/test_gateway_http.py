"""The gateway's calls over real HTTP (its aiohttp ChatClient, and the httpx client it
replaced, against small servers in this event loop): a 429 waited out as its Retry-After asks;
retries on another replica after a 5xx, a refused connection, a timeout or a malformed answer; a 4xx refusal not retried; the structured-output field each replica kind
gets; keep-alive connections reused; the trace context sent along."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from populace.core.contracts import InferBatch, ModelConfig, ReplicaInfo
from populace.core.natsserver import free_port
from populace.core.settings import Settings
from populace.gateway.dispatcher import Dispatcher
from populace.gateway.openai_api import ChatClient, HttpxPoster
from populace.gateway.replica_pool import ReplicaPool
from populace.gateway.routing import make_router

SCHEMA = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
          "required": ["guess"]}
ANSWER = {"choices": [{"index": 0, "message": {"role": "assistant", "content": '{"guess": 33}'},
                       "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 90, "completion_tokens": 6, "total_tokens": 96}}


class Replica:
    """An OpenAI-shaped replica that answers with `status` (and `body`), after `delay_s`, and
    remembers every request: its JSON body, headers and client port (one per connection)."""

    def __init__(self, status: int = 200, body: bytes | None = None, delay_s: float = 0.0,
                 first: list[tuple[int, dict]] | None = None) -> None:
        self.status, self.body, self.delay_s = status, body, delay_s
        self.first = list(first or [])  # (status, headers) of the first requests, before `status`
        self.requests: list[dict] = []
        self.headers: list[dict] = []
        self.client_ports: set[int] = set()
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self.chat)
        self.server = TestServer(app, host="127.0.0.1")

    async def chat(self, request: web.Request) -> web.Response:
        self.requests.append(await request.json())
        self.headers.append(dict(request.headers))
        self.client_ports.add(request.transport.get_extra_info("peername")[1])
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.first:
            status, headers = self.first.pop(0)
            return web.Response(status=status, body=b'{"error": {"message": "Rate limit reached"}}',
                                content_type="application/json", headers=headers)
        body = self.body if self.body is not None else json.dumps(ANSWER).encode()
        return web.Response(status=self.status, body=body, content_type="application/json")

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


@pytest.fixture
async def replicas():
    started: list[Replica] = []

    async def _start(**kw) -> Replica:
        r = Replica(**kw)
        await r.server.start_server()
        started.append(r)
        return r

    yield _start
    for r in started:
        await r.server.close()


@pytest.fixture(params=["aiohttp", "httpx"])
async def gateway(request):
    """A dispatcher over the given (id, url, kind) replicas; round-robin, so the first call
    goes to the first replica listed. Both HTTP clients (the httpx one is kept to compare)."""
    made: list[tuple[Dispatcher, ChatClient | HttpxPoster, httpx.AsyncClient]] = []

    def _make(urls: list[tuple[str, str, str]], max_concurrency: int = 8, **settings) -> Dispatcher:
        http = httpx.AsyncClient()
        chat = (ChatClient if request.param == "aiohttp" else HttpxPoster)(max_concurrency)
        pool = ReplicaPool(None, http)
        for rid, url, kind in urls:
            pool._add(ReplicaInfo(replica_id=rid, url=url, backend="sim", kind=kind, model="m",
                                  max_concurrency=max_concurrency, heartbeat_at=time.time()))
            pool.replicas[rid].load.healthy = True
        d = Dispatcher(pool, make_router("round-robin"), chat,
                       Settings(gateway_poll_s=3600, **{"gateway_request_timeout_s": 5.0, **settings}))
        made.append((d, chat, http))
        return d

    yield _make
    for _, chat, http in made:
        await chat.aclose()
        await http.aclose()


def one(prompts: int = 1) -> InferBatch:
    return InferBatch(batch_id="b", run_id="r", round=1, model=ModelConfig(backend="sim", max_tokens=16),
                      system="You are a player.", response_schema=SCHEMA, keys=list(range(prompts)),
                      prompts=[f"player {k}" for k in range(prompts)])


async def test_a_429_is_waited_out_as_its_retry_after_asks_never_a_failure(replicas, gateway):
    """A provider's rate limit is not a broken replica: the same call goes again once the provider's
    Retry-After has passed, without an attempt counted, a retry spent or the replica marked down."""
    limited = await replicas(first=[(429, {"Retry-After": "0"}), (429, {"Retry-After": "0"})])
    d = gateway([("limited", limited.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.texts == ['{"guess": 33}'] and reply.valid == [True] and reply.failed == []
    assert calls.attempts == [1] and len(limited.requests) == 3
    assert d.pool.replicas["limited"].load.healthy and d.retries == 0


@pytest.mark.parametrize("status", [500, 503])
async def test_a_5xx_is_retried_on_another_replica(replicas, gateway, status):
    bad, good = await replicas(status=status, body=b'{"error": "busy"}'), await replicas()
    d = gateway([("bad", bad.url, "sim"), ("good", good.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.texts == ['{"guess": 33}'] and reply.valid == [True] and reply.failed == []
    assert calls.replicas == ["good"] and calls.attempts == [2]
    assert len(bad.requests) == 1 and len(good.requests) == 1
    assert not d.pool.replicas["bad"].load.healthy and f"HTTP {status}" in d.pool.replicas["bad"].last_error


async def test_a_refused_connection_is_retried_on_another_replica(replicas, gateway):
    good = await replicas()
    d = gateway([("gone", f"http://127.0.0.1:{free_port()}", "sim"), ("good", good.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.valid == [True] and calls.replicas == ["good"] and calls.attempts == [2]
    assert "Connect" in d.pool.replicas["gone"].last_error  # aiohttp's ClientConnectorError, httpx's ConnectError


async def test_calls_a_replica_drops_move_to_another_without_spending_the_retry_budget(replicas, gateway):
    """A replica that dies with a burst in flight (its connections dropped, no answer): every call
    moves to a live replica, however young the gateway and its budget (here 0.0 × calls + 10
    retries for a 24-call burst, about 12 of them on the dead one). A replica that answers badly
    (503) still spends it: past the budget its calls fail."""
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)  # the request has started: the server dies before it answers, once the
        await asyncio.sleep(0.3)  # burst's share of it is in flight (round-robin sends it every other call)
        writer.transport.abort()

    dead = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    try:
        good = await replicas()
        d = gateway([("dead", f"http://127.0.0.1:{dead.sockets[0].getsockname()[1]}", "sim"),
                     ("good", good.url, "sim")], max_concurrency=24, gateway_retry_budget=0.0)
        reply, calls = await d.serve(one(24))
    finally:
        dead.close()
    assert reply.failed == [] and reply.valid == [True] * 24
    assert set(calls.replicas) == {"good"} and sum(calls.attempts) == 24 + d.failovers
    assert d.failovers >= 10 and d.retries == 0  # more moved than the budget's 10, none of them counted
    assert "Disconnected" in d.pool.replicas["dead"].last_error or "Protocol" in d.pool.replicas["dead"].last_error

    busy, live = await replicas(status=503, body=b'{"error": "busy"}'), await replicas()
    d = gateway([("busy", busy.url, "sim"), ("live", live.url, "sim")], max_concurrency=24, gateway_retry_budget=0.0)
    reply, calls = await d.serve(one(24))
    assert d.retries == 10 and d.failovers == 0
    failed = [f for f in reply.failed if f]  # the busy replica's calls past the budget
    assert len(failed) == len(busy.requests) - 10 > 0
    assert all(f.startswith("retry budget exhausted") for f in failed), failed


async def test_a_replica_slower_than_the_request_timeout_is_given_up_and_retried(replicas, gateway):
    slow, good = await replicas(delay_s=3.0), await replicas()
    d = gateway([("slow", slow.url, "sim"), ("good", good.url, "sim")], gateway_request_timeout_s=0.3)
    t0 = time.perf_counter()
    reply, calls = await d.serve(one())
    assert time.perf_counter() - t0 < 2.0
    assert reply.valid == [True] and calls.replicas == ["good"] and calls.attempts == [2]
    assert "Timeout" in d.pool.replicas["slow"].last_error


async def test_a_malformed_answer_is_a_replica_error(replicas, gateway):
    bad, good = await replicas(body=b'{"choices": []}'), await replicas()
    d = gateway([("bad", bad.url, "sim"), ("good", good.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.valid == [True] and calls.replicas == ["good"] and calls.attempts == [2]
    assert "malformed response" in d.pool.replicas["bad"].last_error


async def test_a_4xx_refusal_is_not_retried_and_not_an_infrastructure_failure(replicas, gateway):
    bad, other = await replicas(status=400, body=b'{"error": "prompt too long"}'), await replicas()
    d = gateway([("bad", bad.url, "sim"), ("other", other.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.valid == [False] and reply.failed == [] and calls.attempts == [1]
    assert reply.texts[0].startswith("<gateway error: bad: HTTP 400") and "prompt too long" in reply.texts[0]
    assert other.requests == [] and d.pool.replicas["bad"].load.healthy


async def test_every_replica_failing_is_an_infrastructure_failure(replicas, gateway):
    a, b = await replicas(status=500), await replicas(status=502)
    d = gateway([("a", a.url, "sim"), ("b", b.url, "sim")], gateway_attempts=2)
    reply, calls = await d.serve(one())
    assert reply.valid == [False] and reply.failed[0].startswith("failed on 2 replica(s)")
    assert calls.attempts == [2] and calls.replicas == [""]


@pytest.mark.parametrize(("kind", "expected"), [
    ("sim", {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}),
    ("vllm", {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA, "strict": True}}),
    ("llamacpp", {"type": "json_object", "schema": SCHEMA}),
])
async def test_the_structured_output_field_each_replica_kind_gets(replicas, gateway, kind, expected):
    r = await replicas()
    d = gateway([("r", r.url, kind)])
    await d.serve(one())
    body = r.requests[0]
    assert body["response_format"] == expected and "guided_json" not in body
    assert body["messages"] == [{"role": "system", "content": "You are a player."},
                                {"role": "user", "content": "player 0"}]
    assert body["max_tokens"] == 16 and body["model"] == "m"
    assert r.headers[0]["Content-Type"] == "application/json"


async def test_an_invalid_answer_is_re_asked_once_on_the_same_connection_pool(replicas, gateway):
    wrong = dict(ANSWER, choices=[{"index": 0, "message": {"role": "assistant", "content": '{"guess": 101}'}}])
    r = await replicas(body=json.dumps(wrong).encode())
    d = gateway([("r", r.url, "sim")])
    reply, calls = await d.serve(one())
    assert reply.valid == [False] and reply.texts == ['{"guess": 101}'] and calls.attempts == [2]
    assert calls.reasks == [1] and reply.prompt_tokens == [180]
    assert [m["role"] for m in r.requests[1]["messages"]] == ["system", "user", "assistant", "user"]


async def test_keep_alive_connections_are_reused(replicas, gateway):
    r = await replicas()
    d = gateway([("r", r.url, "sim")])
    for _ in range(5):
        reply, _ = await d.serve(one(20))  # 20 calls at once, 8 connections at most
        assert all(reply.valid)
    assert len(r.requests) == 100 and len(r.client_ports) <= 8


async def test_the_trace_context_goes_along(replicas, gateway):
    from opentelemetry.sdk.trace import TracerProvider

    r = await replicas()
    d = gateway([("r", r.url, "sim")])
    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("outer"):
        await d.serve(one())
    assert "traceparent" in {k.lower() for k in r.headers[0]}
