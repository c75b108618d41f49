"""A simulated vLLM replica: a real OpenAI-compatible HTTP server that behaves like vLLM in timing,
concurrency, automatic prefix caching and Prometheus metrics, but computes no model.

Layers (each usable on its own):
- `SimModel`   pure model logic: token counting, vLLM-like block prefix cache (hash chain + LRU),
               per-request `Plan` (prompt/cached/completion tokens, prefill/decode seconds, answer).
- `SimReplica` the serving state: FIFO admission of at most `max_num_seqs` sequences, sleeps,
               counters, metrics text. No HTTP.
- `make_app`   a Starlette ASGI app over a `SimReplica` (`app.state.replica`).
- `SimServer`  runs uvicorn in the current event loop on a port it binds itself (port=0: any free one).
- `main`       CLI: `python -m populace.replicas.sim --port 8100 --replica-id sim-0 ...`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools
import json
import socket
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

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


# ----------------------------------------------------------------------------- metrics


@dataclass(slots=True)
class SimStats:
    running: int = 0
    waiting: int = 0
    active_blocks: int = 0  # KV blocks held by running sequences
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    request_success_total: int = 0


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


class SimReplica:
    """One simulated replica's serving state: admission, timing, counters. No HTTP."""

    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.model = SimModel(cfg)
        self.stats = SimStats()
        self._slots = asyncio.Semaphore(cfg.max_num_seqs)  # FIFO among waiters
        self._ids = itertools.count()

    async def complete(self, body: Any) -> dict:
        """Answer one OpenAI chat-completion request body (a parsed JSON value). Raises
        RequestError on a malformed one."""
        messages, max_tokens = _check_request(body)
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

    def json_response(obj: Any, status: int = 200) -> Response:
        return Response(json.dumps(obj, separators=(",", ":")).encode(), status, media_type="application/json")

    def error(message: str, status: int = 400) -> Response:
        return json_response(
            {"error": {"message": message, "type": "invalid_request_error", "param": None, "code": status}}, status
        )

    async def chat_completions(request: Request) -> Response:
        raw = await request.body()
        try:
            body = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as exc:
            return error(f"invalid JSON body: {exc}")
        try:
            return json_response(await replica.complete(body))
        except RequestError as exc:
            return error(str(exc))

    async def health(request: Request) -> Response:
        return Response(b"", 200)

    async def models(request: Request) -> Response:
        return Response(models_body, 200, media_type="application/json")

    async def metrics(request: Request) -> Response:
        return Response(replica.metrics_text(), 200, media_type="text/plain; version=0.0.4; charset=utf-8")

    app = Starlette(
        routes=[
            Route("/v1/chat/completions", chat_completions, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/v1/models", models, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
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
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=field.annotation, default=None,
                       help=f"default {field.default}")
    return p


def main(argv: Sequence[str] | None = None) -> None:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        cfg = SimConfig(**{k: v for k, v in vars(args).items() if k in SimConfig.model_fields and v is not None})
    except ValidationError as exc:
        parser.error(str(exc))
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
