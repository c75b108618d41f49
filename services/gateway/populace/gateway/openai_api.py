"""One chat completion against an OpenAI-compatible replica (vLLM, llama.cpp, sim).

Structured output: vLLM and the simulator get `response_format: {type: json_schema}` (the
old `guided_*` fields are silently ignored by current vLLM, so they are never sent);
llama-cpp-python's server gets `{type: json_object, schema}`, which it turns into a grammar."""

from __future__ import annotations

import email.utils
import json
import time
from dataclasses import dataclass
from typing import Protocol

import aiohttp
import httpx
from opentelemetry.trace import SpanKind, StatusCode

from populace.core import telemetry
from populace.core.contracts import ReplicaInfo
from populace.core.telemetry import tracer


class ReplicaError(RuntimeError):
    """The replica failed (connection, 5xx, 429, timeout): retry on another replica. `gone`: no
    answer because its connection was refused or dropped (the server is not there, or died with
    the call in flight), not a timeout or a bad answer from a server that is still up."""

    def __init__(self, message: str, gone: bool = False) -> None:
        super().__init__(message)
        self.gone = gone


class RequestRejected(RuntimeError):
    """The replica rejected the request itself (4xx): retrying elsewhere will not help."""


class KeyRefused(RequestRejected):
    """The provider refused the key (401/403): no call of this model will succeed until the key is
    fixed, so the run pauses naming the model instead of retrying."""


class RateLimited(ReplicaError):
    """429: the provider's limit, not a failure. `retry_after`: seconds it asked us to wait
    (its Retry-After header), None when it did not say."""

    def __init__(self, message: str, retry_after: float | None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(slots=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0  # of the prompt tokens, those the provider served from its prompt cache


class Poster(Protocol):
    """What `chat` needs of an HTTP client: POST `body` (JSON) to `url`, answer (status, body).
    Raises ReplicaError when no answer came (connection refused or dropped, timeout)."""

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float
                   ) -> tuple[int, bytes] | tuple[int, bytes, dict[str, str]]: ...


# Idle connections are closed after this long: below the keep-alive of uvicorn (vLLM, the
# simulator, llama-cpp-python: 5 s) and llama.cpp's server (5 s), so a call never goes out on
# a connection the replica is closing at that moment (which would fail it as a replica error).
KEEPALIVE_S = 2.0


class ChatClient:
    """The gateway's HTTP/1.1 client for chat completions: aiohttp, keep-alive connections
    reused across calls, at most `connections` to all replicas together (calls beyond wait
    for one, in order, with no time limit: waiting for our own connection is not the
    replica's fault; per-replica caps bound how many can wait).

    aiohttp, not httpx (which the gateway keeps for its once-a-second health and load probes):
    on this 2-core machine, against one simulated replica in its own process at time scale 0,
    3,000 calls 256 at a time cost the client 130 µs of CPU each with aiohttp 3.14 (llhttp's C
    parser; a pool that hands a freed connection to the next waiter) and 1,300–2,300 µs with
    httpx 0.28 / httpcore 1.0.9, whose pool scans every connection for every queued request
    on each request and release (664 vs 5,851 calls/s with 16 vs 128 connections). Through
    NATS and the gateway process that was 391 requests/s; see the README's gateway table."""

    def __init__(self, connections: int = 128, keepalive_s: float = KEEPALIVE_S) -> None:
        self.connections, self.keepalive_s = connections, keepalive_s
        self._session: aiohttp.ClientSession | None = None  # made in the running loop, on first use
        self._timeouts: dict[float, aiohttp.ClientTimeout] = {}

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.connections, keepalive_timeout=self.keepalive_s)
        self._session = aiohttp.ClientSession(connector=connector, skip_auto_headers=("User-Agent",))
        return self._session

    def _timeout(self, seconds: float) -> aiohttp.ClientTimeout:
        # As httpx.Timeout(seconds, pool=None) was: connecting and each read bounded, the whole
        # call and the wait for a free connection not.
        t = self._timeouts.get(seconds)
        if t is None:
            t = self._timeouts[seconds] = aiohttp.ClientTimeout(total=None, connect=None, sock_connect=seconds,
                                                                sock_read=seconds)
        return t

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float
                   ) -> tuple[int, bytes, dict[str, str]]:
        session = self._session or self._open()
        try:
            async with session.post(url, data=body, headers=headers, timeout=self._timeout(timeout)) as r:
                retry = r.headers.get("Retry-After")
                return r.status, await r.read(), ({"retry-after": retry} if retry is not None else {})
        except (aiohttp.ClientError, TimeoutError, OSError) as err:  # refused, dropped, timed out
            gone = isinstance(err, aiohttp.ClientConnectionError | ConnectionError) and not isinstance(
                err, TimeoutError)  # aiohttp's socket-read timeout is a connection error too
            raise ReplicaError(f"{type(err).__name__}: {err}", gone=gone) from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class HttpxPoster:
    """The chat calls on httpx, as the gateway made them before ChatClient: kept so that
    `populace bench gateway` measures both in one run (POPULACE_GATEWAY_HTTP_CLIENT=httpx)."""

    def __init__(self, connections: int = 128) -> None:
        self.http = httpx.AsyncClient(limits=httpx.Limits(max_connections=connections,
                                                          max_keepalive_connections=connections))

    async def post(self, url: str, body: bytes, headers: dict[str, str], timeout: float
                   ) -> tuple[int, bytes, dict[str, str]]:
        try:
            r = await self.http.post(url, content=body, headers=headers, timeout=httpx.Timeout(timeout, pool=None))
        except httpx.HTTPError as err:  # connect/read errors, timeouts, dropped connections
            gone = isinstance(err, httpx.NetworkError | httpx.RemoteProtocolError)  # not its timeouts
            raise ReplicaError(f"{type(err).__name__}: {err}", gone=gone) from None
        retry = r.headers.get("retry-after")
        return r.status_code, r.content, ({"retry-after": retry} if retry is not None else {})

    async def aclose(self) -> None:
        await self.http.aclose()


def response_format(kind: str, schema: dict) -> dict:
    if kind == "llamacpp":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


async def chat(http: Poster, replica: ReplicaInfo, messages: list[dict], *,
               schema: dict | None, max_tokens: int, temperature: float, seed: int | None,
               model: str | None, timeout: float, auth: dict[str, str] | None = None,
               url: str | None = None, redact=lambda text: text) -> ChatResult:
    """One chat completion. `auth`: the model's Authorization header (populace.gateway.keys), sent
    and never recorded (spans carry the URL, never headers); `url`: where completions go (default:
    the replica's `/v1/chat/completions`); `redact` takes any key out of a provider's error text."""
    body: dict = {"model": model or replica.model, "messages": messages, "max_tokens": max_tokens,
                  "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    if schema is not None:
        body["response_format"] = response_format(replica.kind, schema)
    target = url or f"{replica.url}/v1/chat/completions"
    headers = telemetry.inject(JSON_HEADERS)
    with tracer.start_as_current_span("gateway.http", kind=SpanKind.CLIENT,
                                      attributes={"http.request.method": "POST", "server.address": replica.url,
                                                  "populace.replica": replica.replica_id}) as span:
        try:
            answer = await http.post(target, json.dumps(body, separators=(",", ":")).encode(),
                                     {**headers, **auth} if auth else headers, timeout)
        except ReplicaError as err:
            span.set_status(StatusCode.ERROR, str(err).split(":", 1)[0])
            raise ReplicaError(f"{replica.replica_id}: {redact(str(err))}", gone=err.gone) from None
        status, content = answer[0], answer[1]
        reply_headers = answer[2] if len(answer) > 2 else {}
        span.set_attribute("http.response.status_code", status)
    if status in (401, 403):
        raise KeyRefused(f"{replica.replica_id}: HTTP {status}, the key was refused: {redact(text(content))[:200]}")
    if status == 429:
        raise RateLimited(f"{replica.replica_id}: HTTP 429: {redact(text(content))[:200]}",
                          retry_after(reply_headers.get("retry-after")))
    if status >= 500:
        raise ReplicaError(f"{replica.replica_id}: HTTP {status}: {redact(text(content))[:200]}")
    if status >= 400:
        raise RequestRejected(f"{replica.replica_id}: HTTP {status}: {redact(text(content))[:300]}")
    try:
        data = json.loads(content)
        reply = data["choices"][0]["message"].get("content") or ""
        usage = data.get("usage") or {}
        details = usage.get("prompt_tokens_details") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as err:
        raise ReplicaError(f"{replica.replica_id}: malformed response: {err}") from None
    return ChatResult(reply, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
                      _count(details.get("cached_tokens") if isinstance(details, dict) else None))


def _count(value: object) -> int:
    """A token count from a provider's usage: a whole number >= 0, else 0 (never a crash on junk)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds a Retry-After header asks for (delta-seconds, or an HTTP date), at most an hour;
    None when absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds:  # NaN
        return None
    return min(3600.0, max(0.0, seconds))


JSON_HEADERS = {"Content-Type": "application/json"}


def text(content: bytes) -> str:
    return content.decode("utf-8", "replace")
