"""One chat completion against an OpenAI-compatible replica (vLLM, llama.cpp, sim).

Structured output: vLLM and the simulator get `response_format: {type: json_schema}` (the
old `guided_*` fields are silently ignored by current vLLM, so they are never sent);
llama-cpp-python's server gets `{type: json_object, schema}`, which it turns into a grammar."""

from __future__ import annotations

from dataclasses import dataclass

import httpx
from opentelemetry.trace import SpanKind, StatusCode

from populace.core import telemetry
from populace.core.contracts import ReplicaInfo
from populace.core.telemetry import tracer


class ReplicaError(RuntimeError):
    """The replica failed (connection, 5xx, 429, timeout): retry on another replica."""


class RequestRejected(RuntimeError):
    """The replica rejected the request itself (4xx): retrying elsewhere will not help."""


@dataclass(slots=True)
class ChatResult:
    text: str
    prompt_tokens: int
    completion_tokens: int


def response_format(kind: str, schema: dict) -> dict:
    if kind == "llamacpp":
        return {"type": "json_object", "schema": schema}
    return {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema, "strict": True}}


async def chat(http: httpx.AsyncClient, replica: ReplicaInfo, messages: list[dict], *,
               schema: dict | None, max_tokens: int, temperature: float, seed: int | None,
               model: str | None, timeout: float) -> ChatResult:
    body: dict = {"model": model or replica.model, "messages": messages, "max_tokens": max_tokens,
                  "temperature": temperature}
    if seed is not None:
        body["seed"] = seed
    if schema is not None:
        body["response_format"] = response_format(replica.kind, schema)
    with tracer.start_as_current_span("gateway.http", kind=SpanKind.CLIENT,
                                      attributes={"http.request.method": "POST", "server.address": replica.url,
                                                  "populace.replica": replica.replica_id}) as span:
        try:
            # No pool timeout: waiting for one of our own connections is not the replica's
            # fault (per-replica caps bound how many calls can wait).
            r = await http.post(f"{replica.url}/v1/chat/completions", json=body, headers=telemetry.inject(),
                                timeout=httpx.Timeout(timeout, pool=None))
        except httpx.HTTPError as err:  # connect/read errors, timeouts, dropped connections
            span.set_status(StatusCode.ERROR, type(err).__name__)
            raise ReplicaError(f"{replica.replica_id}: {type(err).__name__}: {err}") from None
        span.set_attribute("http.response.status_code", r.status_code)
    if r.status_code == 429 or r.status_code >= 500:
        raise ReplicaError(f"{replica.replica_id}: HTTP {r.status_code}: {r.text[:200]}")
    if r.status_code >= 400:
        raise RequestRejected(f"{replica.replica_id}: HTTP {r.status_code}: {r.text[:300]}")
    try:
        data = r.json()
        text = data["choices"][0]["message"].get("content") or ""
        usage = data.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as err:
        raise ReplicaError(f"{replica.replica_id}: malformed response: {err}") from None
    return ChatResult(text, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0))
