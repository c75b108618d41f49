"""The gateway's view of its LLM replicas: who they are (KV `replicas` self-registrations
plus static config), whether they are healthy (`/health`, else `/v1/models`), how loaded
they are (`/metrics`: vLLM `num_requests_waiting`, llama.cpp `requests_deferred`) — and the
gateway's own in-flight counts, which polling never resets.

A self-registration is taken only if its key names its writer and its replica, and its URL is
in the replica allow-list for that writer (POPULACE_REPLICA_HOSTS; populace.core.replica_hosts):
anything else is never called, probed or routed to, and is logged once (`replica_refused`)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from nats.js import JetStreamContext

from populace.core import bus, logs, metrics, replica_hosts, subjects
from populace.core.contracts import ModelEndpoint, ReplicaInfo
from populace.core.replica_hosts import ReplicaHosts
from populace.gateway.routing import ReplicaLoad

log = logs.get("populace.gateway.replica_pool")

# Queue-length gauges by replica kind (summed over label sets).
WAITING_GAUGES = {
    "vllm": ("vllm:num_requests_waiting",),
    "sim": ("vllm:num_requests_waiting",),
    "llamacpp": ("llamacpp:requests_deferred",),
    "openai": ("vllm:num_requests_waiting", "llamacpp:requests_deferred"),
}


def parse_gauges(text: str, names: tuple[str, ...]) -> float | None:
    """Sum of the samples of the named metrics in Prometheus text format; None if absent."""
    total, seen = 0.0, False
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
                seen = True
            except (IndexError, ValueError):
                continue
    return total if seen else None


def static_replicas(spec: str) -> list[ReplicaInfo]:
    """POPULACE_REPLICAS="id=http://host:port,…" (a bare URL gets an id from its position)."""
    out = []
    for i, item in enumerate(x.strip() for x in spec.split(",") if x.strip()):
        rid, _, url = item.partition("=") if "=" in item else (f"static-{i}", "", item)
        out.append(ReplicaInfo(replica_id=rid, url=url.rstrip("/"), backend="openai", kind="openai",
                               model="default", max_concurrency=64, heartbeat_at=time.time()))
    return out


def pool_of(endpoint: ModelEndpoint | None, backend: str) -> str:
    """The pool a batch's calls go to: a run model's (by its name, and for a model at a URL its
    identity: two runs may give one name different URLs), or the backend's (a run without `models:`)."""
    if endpoint is None:
        return backend
    if endpoint.base_url is None:
        return f"model:{endpoint.name}"
    return f"model:{endpoint.name}@{endpoint_digest(endpoint)}"


def endpoint_digest(endpoint: ModelEndpoint) -> str:
    ident = "\n".join(str(x) for x in (endpoint.kind, endpoint.base_url, endpoint.model, endpoint.api_key_env,
                                       endpoint.api_key_file))
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


class KeyProbeRefused(RuntimeError):
    """A replica's probe was answered 401/403: the model's key is refused there."""


@dataclass
class Replica:
    info: ReplicaInfo
    load: ReplicaLoad
    static: bool = False
    last_error: str | None = None
    slow_probes: int = 0  # consecutive health checks that timed out
    pool: str = ""  # populace.gateway.replica_pool.pool_of
    endpoint: ModelEndpoint | None = None  # a run model at its URL: how to call it
    probed: bool = True  # False: a hosted API, never polled (its health costs requests against its limit)
    failed_at: float = 0.0  # when an unprobed replica last failed (healthy again after UNPROBED_RETRY_S)
    key_refused: str | None = None  # its last probe: the server refused the model's key (401/403)


# A replica busy generating on a starved CPU can miss a health check's deadline: only this
# many timeouts in a row mark it unhealthy. A refused connection or an error status does at once.
SLOW_PROBES_TOLERATED = 3
PROBE_TIMEOUT_S = 5.0
UNPROBED_RETRY_S = 5.0  # a hosted API that failed is tried again after this long


class ReplicaPool:
    def __init__(self, js: JetStreamContext | None, http: httpx.AsyncClient, *, static: str = "",
                 ttl_s: float = 10.0, poll_s: float = 1.0, allowed: ReplicaHosts | None = None) -> None:
        self._js, self._http, self._ttl, self._poll = js, http, ttl_s, poll_s
        self.allowed = allowed or replica_hosts.parse(replica_hosts.LOOPBACK)
        self.replicas: dict[str, Replica] = {}
        self.refused: dict[str, str] = {}  # registry key -> why it is not called (logged when it changes)
        self.on_refresh = lambda: None  # called after each refresh: capacity may have appeared
        # a replica's Authorization header for its probes (a keyed model's server checks it on
        # /v1/models): set by the gateway from its key ring; raises when the key cannot be read
        self.auth: Callable[[Replica], dict[str, str]] = lambda r: {}
        for info in static_replicas(static):
            self._add(info, static=True)
        self._task: asyncio.Task | None = None

    def _add(self, info: ReplicaInfo, static: bool = False) -> None:
        cur = self.replicas.get(info.replica_id)
        pool = f"model:{info.serves}" if info.serves else info.backend
        if cur is None:
            self.replicas[info.replica_id] = Replica(
                info, ReplicaLoad(info.replica_id, max_concurrency=info.max_concurrency, healthy=False), static,
                pool=pool)
            log.info("replica_added", replica=info.replica_id, url=info.url, backend=info.backend, pool=pool)
        else:
            cur.info = info
            cur.pool = pool
            cur.load.max_concurrency = info.max_concurrency

    def add_endpoint(self, endpoint: ModelEndpoint) -> str:
        """A run model at its URL, as a replica of its own pool (once; its pool's name is returned).
        A hosted API (kind openai) is never polled: it is healthy until a call fails, and tried
        again UNPROBED_RETRY_S later."""
        pool = pool_of(endpoint, "")
        rid = f"{endpoint.name}@{endpoint_digest(endpoint)}"
        if rid in self.replicas:
            return pool
        assert endpoint.base_url is not None
        base = endpoint.base_url.removesuffix("/v1")
        kind = endpoint.kind if endpoint.kind != "dummy" else "openai"
        info = ReplicaInfo(replica_id=rid, url=base, backend="openai", kind=kind, model=endpoint.model or "default",
                           max_concurrency=endpoint.limits.concurrency, heartbeat_at=time.time())
        probed = endpoint.kind != "openai"
        self.replicas[rid] = Replica(info, ReplicaLoad(rid, max_concurrency=endpoint.limits.concurrency,
                                                       healthy=not probed),
                                     static=True, pool=pool, endpoint=endpoint, probed=probed)
        log.info("replica_added", replica=rid, url=base, backend=endpoint.kind, pool=pool)
        return pool

    def loads(self, pool: str) -> list[ReplicaLoad]:
        now = time.monotonic()
        out = []
        for r in self.replicas.values():
            if r.pool != pool:
                continue
            if not r.probed and not r.load.healthy and now - r.failed_at >= UNPROBED_RETRY_S:
                r.load.healthy = True  # a hosted API's failure is not forever: try it again
            out.append(r.load)
        return out

    def has_backend(self, backend: str) -> bool:
        return any(r.pool == backend for r in self.replicas.values())

    def replica(self, replica_id: str) -> Replica:
        return self.replicas[replica_id]

    def key_refused(self, pool: str) -> str | None:
        """Why no replica of `pool` will answer: every one of them refused the model's key at its
        last probe (None: not so)."""
        members = [r for r in self.replicas.values() if r.pool == pool]
        if members and all(r.key_refused for r in members):
            return members[0].key_refused
        return None

    def info(self, replica_id: str) -> ReplicaInfo:
        return self.replicas[replica_id].info

    def mark_failed(self, replica_id: str, error: str) -> None:
        r = self.replicas.get(replica_id)
        if r and r.load.healthy:
            r.load.healthy = False
            r.last_error = error
            r.failed_at = time.monotonic()
            log.warning("replica_unhealthy", replica=replica_id, error=error)

    async def refresh(self) -> None:
        if self._js is not None:
            items = await bus.registry_items(self._js, subjects.REPLICAS_BUCKET, ReplicaInfo,
                                             fresh_within_s=self._ttl)
            fresh = {key for key, info in items if self._admitted(key, info)}
            for key, info in items:
                if key in fresh:
                    self._add(replica_hosts.named_by_key(key, info))
            listed = {key for key, _ in items}
            for key in [k for k in self.refused if k not in listed]:
                del self.refused[key]  # gone from the registry: said again if it comes back
            for rid in [k for k, r in self.replicas.items() if not r.static and k not in fresh]:
                log.info("replica_removed", replica=rid)
                del self.replicas[rid]
                for gauge in (metrics.REPLICA_UP, metrics.REPLICA_IN_FLIGHT, metrics.REPLICA_WAITING):
                    with contextlib.suppress(KeyError):  # never exported: it went before a poll
                        gauge.remove(rid)
        await asyncio.gather(*(self._probe(r) for r in list(self.replicas.values()) if r.probed))
        self.export_metrics()
        self.on_refresh()

    def _admitted(self, key: str, info: ReplicaInfo) -> bool:
        """May the replica registered under `key` be called? A refusal is logged when it is new
        (or its reason changed), never at every poll."""
        why = replica_hosts.entry_refusal(key, info.replica_id, info.url, self.allowed)
        if why is None:
            self.refused.pop(key, None)
            return True
        if self.refused.get(key) != why:
            self.refused[key] = why
            log.warning("replica_refused", key=key, url=info.url[:200], reason=why,
                        effect="never called; its calls go to the replicas that are allowed")
        return False

    def export_metrics(self) -> None:
        """Each replica's health and load, sampled once per poll (not at every call)."""
        for rid, r in self.replicas.items():
            metrics.REPLICA_UP.labels(rid).set(1 if r.load.healthy else 0)
            metrics.REPLICA_IN_FLIGHT.labels(rid).set(r.load.in_flight)
            metrics.REPLICA_WAITING.labels(rid).set(r.load.waiting)

    async def _probe(self, r: Replica) -> None:
        try:
            headers = self.auth(r)
        except Exception as err:  # the key cannot be read: the model cannot be called
            headers, r.last_error = None, str(err)
        try:
            healthy = headers is not None and await self._healthy(r.info.url, headers)
            r.slow_probes = 0
            r.key_refused = None
        except KeyProbeRefused as err:
            healthy, r.key_refused, r.slow_probes = False, str(err), 0
        except httpx.TimeoutException:
            r.slow_probes += 1
            healthy = r.load.healthy and r.slow_probes < SLOW_PROBES_TOLERATED
        if healthy != r.load.healthy:
            log.info("replica_health", replica=r.info.replica_id, healthy=healthy)
        r.load.healthy = healthy
        if healthy:
            try:
                resp = await self._http.get(f"{r.info.url}/metrics", timeout=PROBE_TIMEOUT_S, headers=headers)
                if resp.status_code == 200:
                    waiting = parse_gauges(resp.text, WAITING_GAUGES.get(r.info.kind, ()))
                    r.load.waiting = int(waiting or 0)
            except httpx.HTTPError:
                pass

    async def _healthy(self, url: str, headers: dict[str, str] | None = None) -> bool:
        """Raises httpx.TimeoutException when the replica is too slow to say."""
        try:
            resp = await self._http.get(f"{url}/health", timeout=PROBE_TIMEOUT_S, headers=headers)
            if resp.status_code == 200:
                return True
            if resp.status_code in (401, 403):
                raise KeyProbeRefused(f"HTTP {resp.status_code} on /health: the key was refused")
            if resp.status_code == 404:  # servers without /health (llama-cpp-python)
                resp = await self._http.get(f"{url}/v1/models", timeout=PROBE_TIMEOUT_S, headers=headers)
                if resp.status_code in (401, 403):
                    raise KeyProbeRefused(f"HTTP {resp.status_code} on /v1/models: the key was refused")
                return resp.status_code == 200
            return False  # llama.cpp answers 503 while loading
        except httpx.TimeoutException:
            raise
        except httpx.HTTPError:
            return False

    async def start(self) -> None:
        await self.refresh()
        self._task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._poll)
            try:
                await self.refresh()
            except Exception as err:
                log.warning("replica_refresh_failed", error=str(err))

    async def stop(self) -> None:
        if self._task:
            self._task.cancel()
