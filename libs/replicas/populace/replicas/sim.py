"""A simulated vLLM replica: a real OpenAI-compatible HTTP server that behaves like vLLM in timing,
concurrency, automatic prefix caching and Prometheus metrics, but computes no model. Given a key,
limits or latency it behaves like a hosted provider: a Bearer key required on /v1 (401 otherwise),
requests and tokens per minute over a sliding window (429 + Retry-After), a network round trip
and a seeded jitter.

Layers (each usable on its own):
- `SimModel`   pure model logic: token counting, vLLM-like block prefix cache (hash chain + LRU),
               per-request `Plan` (prompt/cached/completion tokens, prefill/decode seconds, answer).
- `RateWindow` pure limit logic: what a provider counts in its sliding minute, and when a
               refused request may come back (Retry-After).
- `SimReplica` the serving state: key check, limits, FIFO admission of at most `max_num_seqs`
               sequences, sleeps, counters, metrics text. No HTTP.
- `make_app`   a Starlette ASGI app over a `SimReplica` (`app.state.replica`).
- `SimServer`  runs uvicorn in the current event loop on a port it binds itself (port=0: any free one).
- `main`       CLI: `python -m populace.replicas.sim --port 8100 --replica-id sim-0 ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import itertools
import json
import math
import os
import socket
import time
import types
import typing
from collections import OrderedDict, deque
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError

from populace.core import synth
from populace.core.natsserver import bound_socket

CHARS_PER_TOKEN = 4
"""The tokenizer approximation: one token per 4 characters (a prompt's block boundaries too)."""


class SimConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    replica_id: str = "sim-0"
    model_name: str = "sim"  # served model name: /v1/models and the metrics' model_name label
    prefill_tokens_per_s: float = Field(20000.0, gt=0)
    decode_tokens_per_s: float = Field(50.0, gt=0)  # per sequence
    max_num_seqs: int = Field(16, ge=1)  # concurrent sequences; the rest wait in a FIFO queue
    block_size: int = Field(16, ge=1)  # tokens per KV block
    cache_blocks: int = Field(4096, ge=1)  # KV capacity in blocks (prefix-cache LRU capacity)
    max_tokens_default: int = Field(16, ge=1)
    seed: int = 0
    time_scale: float = Field(1.0, ge=0)  # multiplies every sleep; 0 answers at once
    # --- a hosted provider (all off by default: a vLLM replica) ---
    # /v1 routes need `Authorization: Bearer <key>` (401 otherwise); /health and /metrics stay open,
    # as vLLM's --api-key leaves them. Also read from POPULACE_SIM_API_KEY (keeps it out of `ps`).
    api_key: SecretStr | None = Field(None, repr=False)
    requests_per_min: int | None = Field(None, ge=1)  # requests received (refused ones too) per minute
    tokens_per_min: int | None = Field(None, ge=1)  # prompt tokens + max_tokens of admitted requests per minute
    minute_s: float = Field(60.0, gt=0)  # how long the limits' sliding minute lasts (shorter in tests)
    network_latency_s: float = Field(0.0, ge=0)  # a hosted API's round trip, added to every /v1 answer
    latency_jitter_s: float = Field(0.0, ge=0)  # mean of a seeded exponential delay added to each completion


# ----------------------------------------------------------------------------- pure model


@dataclass(frozen=True, slots=True)
class Plan:
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    prefill_s: float  # only the uncached prompt tokens
    decode_s: float
    content: str = ""
    finish_reason: str = "stop"  # "length" when max_tokens cut the answer

    @property
    def total_s(self) -> float:
        return self.prefill_s + self.decode_s


def count_tokens(text: str) -> int:
    """~1 token per CHARS_PER_TOKEN characters, at least 1 for non-empty text."""
    return -(-len(text) // CHARS_PER_TOKEN)


def message_text(content: Any) -> str:
    """A message's content as text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(p.get("text"), str))
    return ""


def prompt_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """The prompt the cache sees: every message's role and content, in order."""
    return "".join(f"{m.get('role', '')}\n{message_text(m.get('content'))}\n" for m in messages)


def last_user_text(messages: Sequence[Mapping[str, Any]]) -> str:
    for m in reversed(messages):
        if m.get("role") == "user":
            return message_text(m.get("content"))
    return ""


def response_schema(response_format: Any) -> dict | None:
    """The JSON schema of an OpenAI `response_format` ({"type": "json_schema", "json_schema":
    {"schema": …}}; the schema one level up is tolerated), or None."""
    if not isinstance(response_format, Mapping) or response_format.get("type") != "json_schema":
        return None
    js = response_format.get("json_schema")
    schema = js.get("schema") if isinstance(js, Mapping) else None
    if not isinstance(schema, Mapping):
        schema = response_format.get("schema")
    return dict(schema) if isinstance(schema, Mapping) else None


class SimModel:
    """Pure simulation logic, no I/O. `plan()` both looks up and fills the prefix cache."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self._block_chars = cfg.block_size * CHARS_PER_TOKEN
        self._lru: OrderedDict[int, None] = OrderedDict()  # block hash -> None, oldest first
        self.prefix_cache_queries = 0  # prompt tokens looked up
        self.prefix_cache_hits = 0  # prompt tokens found cached

    # -- prefix cache ------------------------------------------------------------------

    def block_hashes(self, text: str) -> list[int]:
        """One hash per *full* block of the prompt; each chains every block before it, so a block
        matches only when its whole prefix matches (vLLM's automatic prefix caching)."""
        bc = self._block_chars
        h = hash(("sim-prefix", self.cfg.block_size))
        out = []
        for start in range(0, len(text) - bc + 1, bc):
            h = hash((h, text[start : start + bc]))
            out.append(h)
        return out

    def cached_blocks(self) -> int:
        return len(self._lru)

    def _lookup_and_insert(self, hashes: list[int], prompt_tokens: int) -> int:
        """Number of leading blocks already cached (stopping at the first miss), then every full
        block becomes most recently used. Like vLLM, at least the last prompt token is computed,
        so a fully cached prompt still misses its last block."""
        lru = self._lru
        hit_limit = max(0, (prompt_tokens - 1) // self.cfg.block_size)
        hits = 0
        for h in hashes:
            if hits >= hit_limit or h not in lru:
                break
            hits += 1
        cap = self.cfg.cache_blocks
        for h in hashes:
            if h in lru:
                lru.move_to_end(h)
            else:
                lru[h] = None
                if len(lru) > cap:
                    lru.popitem(last=False)
        return hits

    # -- answers -----------------------------------------------------------------------

    def answer(self, messages: Sequence[Mapping[str, Any]], response_format: Any = None, seed: Any = None) -> str:
        """An answer that satisfies the request's JSON schema (`populace.core.synth`), drawn
        deterministically from a hash of (cfg.seed, request seed, last user message)."""
        key = f"{self.cfg.seed}\x00{seed!r}\x00{last_user_text(messages)}".encode()
        n = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big")
        return synth.answer(response_schema(response_format), n, 0, 0)

    # -- the plan ------------------------------------------------------------------------

    def plan(
        self,
        messages: Sequence[Mapping[str, Any]],
        max_tokens: int | None = None,
        response_format: Any = None,
        seed: Any = None,
    ) -> Plan:
        cfg = self.cfg
        text = prompt_text(messages)
        prompt_tokens = count_tokens(text)
        cached_tokens = self._lookup_and_insert(self.block_hashes(text), prompt_tokens) * cfg.block_size
        self.prefix_cache_queries += prompt_tokens
        self.prefix_cache_hits += cached_tokens

        content = self.answer(messages, response_format, seed)
        completion_tokens = count_tokens(content)
        finish_reason = "stop"
        limit = cfg.max_tokens_default if max_tokens is None else max_tokens
        if completion_tokens > limit:
            content = content[: limit * CHARS_PER_TOKEN]
            completion_tokens = limit
            finish_reason = "length"
        return Plan(
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            completion_tokens=completion_tokens,
            prefill_s=(prompt_tokens - cached_tokens) / cfg.prefill_tokens_per_s,
            decode_s=completion_tokens / cfg.decode_tokens_per_s,
            content=content,
            finish_reason=finish_reason,
        )

    def kv_blocks(self, plan: Plan) -> int:
        """KV blocks a running sequence holds (prompt + completion)."""
        return -(-(plan.prompt_tokens + plan.completion_tokens) // self.cfg.block_size)


# ----------------------------------------------------------------------------- a provider's limits


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the limits refuse now: which limit, and the seconds until a retry would fit
    (inf: never, the request alone is larger than the limit)."""

    limit: str  # "requests" or "tokens"
    retry_after_s: float
    message: str


class RateWindow:
    """A provider's per-minute limits over a sliding window `minute_s` long, counted as OpenAI
    documents them: every request received counts toward requests per minute, refused ones too
    ("unsuccessful requests contribute to your per-minute limit"), and an admitted request's prompt
    tokens plus its max_tokens count toward tokens per minute, on arrival. Pure: the caller gives
    the time. Without limits it only counts (`max_received`)."""

    def __init__(self, requests_per_min: int | None = None, tokens_per_min: int | None = None,
                 minute_s: float = 60.0) -> None:
        self.requests_per_min, self.tokens_per_min, self.minute_s = requests_per_min, tokens_per_min, minute_s
        self._received: deque[float] = deque()  # arrival times in the window, refused requests included
        self._tokens: deque[tuple[float, int]] = deque()  # (arrival, tokens) of admitted requests in the window
        self._token_sum = 0
        self.max_received = 0  # the most requests received in one window so far

    def _expire(self, now: float) -> None:
        edge = now - self.minute_s
        received, tokens = self._received, self._tokens
        while received and received[0] <= edge:
            received.popleft()
        while tokens and tokens[0][0] <= edge:
            self._token_sum -= tokens.popleft()[1]

    def received(self, now: float) -> int:
        """Requests received in the window ending now."""
        self._expire(now)
        return len(self._received)

    def admit(self, now: float, tokens: int) -> Refusal | None:
        """Count a request of `tokens` tokens arriving at `now`: None when admitted, else why not."""
        self._expire(now)
        received = self._received
        received.append(now)
        self.max_received = max(self.max_received, len(received))
        rpm, tpm = self.requests_per_min, self.tokens_per_min
        if rpm is not None and len(received) > rpm:
            # a retry fits once all but rpm - 1 of the requests now in the window have left it
            wait = (received[len(received) - rpm] - now) + self.minute_s
            return Refusal("requests", wait, f"Rate limit reached for requests per min (RPM): Limit {rpm}, Used "
                                             f"{len(received) - 1}, Requested 1. Please try again in {wait:.3g}s.")
        if tpm is not None and self._token_sum + tokens > tpm:
            if tokens > tpm:
                return Refusal("tokens", math.inf, f"Request too large for tokens per min (TPM): Limit {tpm}, "
                                                   f"Requested {tokens} (prompt tokens + max_tokens).")
            need, wait = self._token_sum + tokens - tpm, 0.0
            for at, n in self._tokens:  # the oldest leave first
                need -= n
                if need <= 0:
                    wait = (at - now) + self.minute_s
                    break
            return Refusal("tokens", wait, f"Rate limit reached for tokens per min (TPM): Limit {tpm}, Used "
                                           f"{self._token_sum}, Requested {tokens}. Please try again in {wait:.3g}s.")
        if tpm is not None:
            self._tokens.append((now, tokens))
            self._token_sum += tokens
        return None


def retry_after_header(seconds: float) -> str:
    """Retry-After as HTTP has it: whole seconds, rounded up (at least 1)."""
    return str(max(1, math.ceil(seconds)))


# ----------------------------------------------------------------------------- metrics


@dataclass(slots=True)
class SimStats:
    running: int = 0
    waiting: int = 0
    active_blocks: int = 0  # KV blocks held by running sequences
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    request_success_total: int = 0
    requests_received_total: int = 0  # chat requests past the key check, refused ones included
    rate_limited_total: int = 0  # answered 429
    unauthorized_total: int = 0  # answered 401
    max_requests_in_minute: int = 0  # the most requests received in one sliding minute (minute_s)


_METRICS = (
    # name, type, help, getter(model, stats, cfg)
    ("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.",
     lambda m, s, c: s.running),
    ("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.",
     lambda m, s, c: s.waiting),
    ("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
     lambda m, s, c: min(1.0, s.active_blocks / c.cache_blocks)),
    ("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
     lambda m, s, c: m.prefix_cache_queries),
    ("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
     lambda m, s, c: m.prefix_cache_hits),
    ("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.",
     lambda m, s, c: s.prompt_tokens_total),
    ("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.",
     lambda m, s, c: s.generation_tokens_total),
    ("vllm:request_success_total", "counter", "Count of successfully processed requests.",
     lambda m, s, c: s.request_success_total),
    # the simulated provider's own counts (not vLLM's)
    ("sim:requests_received_total", "counter", "Chat requests received with a valid key, refused ones included.",
     lambda m, s, c: s.requests_received_total),
    ("sim:rate_limited_total", "counter", "Chat requests answered 429 (requests or tokens per minute).",
     lambda m, s, c: s.rate_limited_total),
    ("sim:unauthorized_total", "counter", "Requests answered 401 (no key, or not the key).",
     lambda m, s, c: s.unauthorized_total),
    ("sim:max_requests_in_minute", "gauge", "The most chat requests received in one sliding minute (minute_s).",
     lambda m, s, c: s.max_requests_in_minute),
)


def _label_value(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def render_metrics(model: SimModel, stats: SimStats) -> str:
    """Prometheus text exposition format (0.0.4), vLLM's metric names."""
    cfg = model.cfg
    label = f'{{model_name="{_label_value(cfg.model_name)}"}}'
    lines = []
    for name, kind, help_, get in _METRICS:
        value = get(model, stats, cfg)
        lines.append(f"# HELP {name} {help_}")
        lines.append(f"# TYPE {name} {kind}")
        lines.append(f"{name}{label} {float(value)!r}")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- serving state


class RequestError(ValueError):
    """A malformed chat-completion request (→ HTTP 400)."""


class RateLimitedError(RuntimeError):
    """The provider's limits refuse the request now (→ HTTP 429 with Retry-After)."""

    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


def _check_request(body: Any) -> tuple[list[dict], int | None]:
    if not isinstance(body, dict):
        raise RequestError("request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("'messages' must be a non-empty list")
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("each message must be an object with a string 'role'")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1):
        raise RequestError("'max_tokens' must be a positive integer")
    rf = body.get("response_format")
    if rf is not None and not isinstance(rf, dict):
        raise RequestError("'response_format' must be an object")
    return messages, max_tokens


ARRIVALS_KEPT = 100_000  # the arrival times /sim/stats lists (the most recent)


class SimReplica:
    """One simulated replica's serving state: key check, limits, admission, timing, counters. No HTTP."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.model = SimModel(cfg)
        self.stats = SimStats()
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)  # FIFO among waiters
        self._ids = itertools.count()
        self._key = cfg.api_key.get_secret_value().encode() if cfg.api_key is not None else None
        self.window = RateWindow(cfg.requests_per_min, cfg.tokens_per_min, cfg.minute_s)
        self.started = time.monotonic()
        # seconds since `started` of every chat request received (refused ones too), and of each 429
        self.arrivals: deque[float] = deque(maxlen=ARRIVALS_KEPT)
        self.refusals: deque[float] = deque(maxlen=ARRIVALS_KEPT)

    def authorized(self, authorization: str | None) -> bool:
        """Whether a request's Authorization header carries the key (always, when there is none)."""
        if self._key is None:
            return True
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self._key):
            return True
        self.stats.unauthorized_total += 1
        return False

    def admit(self, messages: list[dict], max_tokens: int | None) -> None:
        """Count a request against the limits on arrival; raises RateLimitedError (429) when they
        refuse it, RequestError (400) when it alone is larger than the tokens-per-minute limit."""
        now = time.monotonic()
        stats = self.stats
        stats.requests_received_total += 1
        self.arrivals.append(now - self.started)
        cost = 0  # tokens are counted only against a tokens-per-minute limit (the prompt's text is built again)
        if self.cfg.tokens_per_min is not None:
            cost = count_tokens(prompt_text(messages)) + (self.cfg.max_tokens_default if max_tokens is None
                                                          else max_tokens)
        refusal = self.window.admit(now, cost)
        stats.max_requests_in_minute = self.window.max_received
        if refusal is None:
            return
        if math.isinf(refusal.retry_after_s):
            raise RequestError(refusal.message)
        stats.rate_limited_total += 1
        self.refusals.append(now - self.started)
        raise RateLimitedError(refusal)

    def jitter_s(self, messages: Sequence[Mapping[str, Any]], seed: Any = None) -> float:
        """A completion's seeded extra latency: exponential with mean `latency_jitter_s`, drawn from a
        hash of (cfg.seed, request seed, last user message), so the same request waits the same."""
        mean = self.cfg.latency_jitter_s
        if mean <= 0:
            return 0.0
        key = f"{self.cfg.seed}\x00latency\x00{seed!r}\x00{last_user_text(messages)}".encode()
        u = int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "big") / 2**64
        return -mean * math.log1p(-u)

    async def network(self, extra_s: float = 0.0) -> None:
        """A hosted API's round trip (and a completion's jitter), scaled like every sleep."""
        delay = (self.cfg.network_latency_s + extra_s) * self.cfg.time_scale
        if delay > 0:
            await asyncio.sleep(delay)

    async def complete(self, body: Any) -> dict:
        """Answer one OpenAI chat-completion request body (a parsed JSON value), after the limits
        admitted it. Raises RequestError on a malformed one, RateLimitedError when the limits refuse it."""
        messages, max_tokens = _check_request(body)
        self.admit(messages, max_tokens)
        stats = self.stats
        stats.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            stats.waiting -= 1
        try:
            stats.running += 1
            plan = self.model.plan(messages, max_tokens, body.get("response_format"), body.get("seed"))
            blocks = self.model.kv_blocks(plan)
            stats.active_blocks += blocks
            try:
                scale = self.cfg.time_scale
                if scale > 0 and plan.prefill_s > 0:
                    await asyncio.sleep(plan.prefill_s * scale)
                stats.prompt_tokens_total += plan.prompt_tokens
                if scale > 0 and plan.decode_s > 0:
                    await asyncio.sleep(plan.decode_s * scale)
                stats.generation_tokens_total += plan.completion_tokens
                stats.request_success_total += 1
            finally:
                stats.active_blocks -= blocks
                stats.running -= 1
        finally:
            self._slots.release()
        model = body.get("model")
        return {
            "id": f"chatcmpl-{self.cfg.replica_id}-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model if isinstance(model, str) and model else self.cfg.model_name,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": plan.content},
                    "finish_reason": plan.finish_reason,
                }
            ],
            "usage": {
                "prompt_tokens": plan.prompt_tokens,
                "completion_tokens": plan.completion_tokens,
                "total_tokens": plan.prompt_tokens + plan.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": plan.cached_tokens},
            },
        }

    def metrics_text(self) -> str:
        return render_metrics(self.model, self.stats)

    def stats_body(self) -> dict:
        """/sim/stats: the provider's own counts, and when each request (and each 429) arrived."""
        s = self.stats
        return {"requests_received": s.requests_received_total, "rate_limited": s.rate_limited_total,
                "unauthorized": s.unauthorized_total, "succeeded": s.request_success_total,
                "max_requests_in_minute": s.max_requests_in_minute, "minute_s": self.cfg.minute_s,
                "arrivals_s": list(self.arrivals), "rate_limited_s": list(self.refusals)}


# ----------------------------------------------------------------------------- HTTP


def make_app(cfg: SimConfig):
    """The Starlette ASGI app of one simulated replica; its state is `app.state.replica`."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    replica = SimReplica(cfg)
    models_body = json.dumps(
        {"object": "list", "data": [{"id": cfg.model_name, "object": "model", "created": int(time.time()),
                                     "owned_by": "populace-sim"}]}
    ).encode()

    def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
        return Response(json.dumps(obj, separators=(",", ":")).encode(), status, headers=headers,
                        media_type="application/json")

    def error(message: str, status: int = 400, type_: str = "invalid_request_error", code: Any = None,
              headers: dict[str, str] | None = None) -> Response:
        # OpenAI's error body
        return json_response({"error": {"message": message, "type": type_, "param": None,
                                        "code": status if code is None else code}}, status, headers)

    async def unauthorized() -> Response:
        await replica.network()
        # never the key, not even part of it: an error body may end up in someone's log
        return error("Incorrect API key provided. Send it as `Authorization: Bearer <key>`.", 401,
                     code="invalid_api_key")

    async def chat_completions(request: Request) -> Response:
        if not replica.authorized(request.headers.get("authorization")):
            return await unauthorized()
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            await replica.network()
            return error(f"invalid JSON body: {exc}")
        try:
            answer = await replica.complete(body)
        except RequestError as exc:
            await replica.network()
            return error(str(exc))
        except RateLimitedError as exc:
            await replica.network()
            wait = exc.refusal.retry_after_s
            return error(exc.refusal.message, 429, type_=exc.refusal.limit, code="rate_limit_exceeded",
                         headers={"Retry-After": retry_after_header(wait),
                                  "retry-after-ms": str(max(1, math.ceil(wait * 1000)))})
        await replica.network(replica.jitter_s(body["messages"], body.get("seed")))
        return json_response(answer)

    async def health(request: Request) -> Response:
        return Response(b"", 200)

    async def models(request: Request) -> Response:
        if not replica.authorized(request.headers.get("authorization")):
            return await unauthorized()
        return Response(models_body, 200, media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(replica.metrics_text(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")

    async def sim_stats(request: Request) -> Response:
        return json_response(replica.stats_body())

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            Route("/sim/stats", sim_stats, methods=["GET"]),
        ]
    )
    app.state.replica = replica
    return app


def _uvicorn_server(app, **kwargs):
    import uvicorn

    class _EmbeddedServer(uvicorn.Server):
        @contextmanager
        def capture_signals(self):  # leave the host process's signal handlers alone
            yield

    return _EmbeddedServer(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", **kwargs))


class SimServer:
    """A simulated replica served by uvicorn inside the current event loop.

        async with SimServer(SimConfig(time_scale=0)) as srv:
            ... srv.url ...   # http://127.0.0.1:<bound port>
    """

    def __init__(self, cfg: SimConfig, host: str = "127.0.0.1", port: int = 0):
        self.cfg = cfg
        self.host = host
        self.port = port  # the bound port after start()
        self.app = make_app(cfg)
        self.replica: SimReplica = self.app.state.replica
        self._server = None
        self._task: asyncio.Task | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> Self:
        sock = bound_socket(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._server = _uvicorn_server(self.app, timeout_graceful_shutdown=5)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]), name=f"sim-{self.cfg.replica_id}")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the startup error
                raise RuntimeError("sim server exited during startup")
            await asyncio.sleep(0.005)
        return self

    async def stop(self) -> None:
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await self._task
        finally:
            self._task = None

    async def __aenter__(self) -> Self:
        return await self.start()

    async def __aexit__(self, *exc) -> None:
        await self.stop()


async def serve(cfg: SimConfig, host: str = "127.0.0.1", port: int = 0) -> SimServer:
    """Start a SimServer in the current loop and return it (call `await server.stop()`)."""
    return await SimServer(cfg, host, port).start()


# ----------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m populace.replicas.sim", description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--fd", type=int, default=None,
                   help="serve on this inherited, bound socket instead of --host/--port (populace replicas sim)")
    for name, field in SimConfig.model_fields.items():
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=_arg_type(field.annotation), default=None,
                       help=f"default {field.default}")
    return p


def _arg_type(annotation: Any) -> Any:
    """What parses a config field's flag: its type, the non-None one of `X | None`, a secret as text."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    return str if annotation is SecretStr else annotation


API_KEY_VARIABLE = "POPULACE_SIM_API_KEY"  # the key, kept off the command line (ps shows it there)


def parse(argv: Sequence[str] | None = None, environ: Mapping[str, str] = os.environ
          ) -> tuple[SimConfig, argparse.Namespace]:
    """The config and the serving flags of a command line (the key from API_KEY_VARIABLE when
    --api-key is not given); a bad value exits with argparse's usage error naming the field."""
    parser = _parser()
    args = parser.parse_args(argv)
    given = {k: v for k, v in vars(args).items() if k in SimConfig.model_fields and v is not None}
    if "api_key" not in given and environ.get(API_KEY_VARIABLE):
        given["api_key"] = environ[API_KEY_VARIABLE]
    try:
        return SimConfig(**given), args
    except ValidationError as exc:
        parser.error(str(exc))
        raise  # unreachable: parser.error exits


def main(argv: Sequence[str] | None = None) -> None:
    cfg, args = parse(argv)
    import uvicorn

    server = uvicorn.Server(
        uvicorn.Config(make_app(cfg), host=args.host, port=args.port, log_level="warning", access_log=False,
                       lifespan="off")
    )
    if args.fd is None:
        server.run()
    else:
        server.run(sockets=[socket.socket(fileno=args.fd)])


if __name__ == "__main__":
    main()
