"""The Replicas page: every model server in KV `replicas`, asked over HTTP for its health and
load while a page that shows them is open. An entry the gateways would refuse (its key names no
writer or another replica, or its URL is outside POPULACE_REPLICA_HOSTS: populace.core.replica_hosts)
is listed as refused, with why, and never asked anything: a `replicas` credential cannot make the
manager send requests where it likes.

    GET  /replicas               every replica, probed now (live from /events/replicas)
    GET  /replicas.json          one backend's replicas in one line, for a run's page
"""

from __future__ import annotations

import asyncio
import functools
import time

from nats.js.errors import BucketNotFoundError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from populace.core import bus, replica_hosts, subjects
from populace.core.contracts import ReplicaInfo
from populace.core.settings import Settings
from populace.manager import views
from populace.manager.web import nc_of, page

PROBE_TIMEOUT_S = 2.0


async def replicas_page(request: Request) -> Response:
    return page(request, "replicas.html", replicas=await replica_rows(nc_of(request)))


async def replicas_json(request: Request) -> Response:
    """The replicas of one backend (`?backend=`) in one line, for a run's page."""
    backend = request.query_params.get("backend") or None
    return JSONResponse(views.replicas_summary(await replica_rows(nc_of(request)), backend))


@functools.cache
def allowed() -> replica_hosts.ReplicaHosts:
    return replica_hosts.parse(Settings().replica_hosts)


async def replica_rows(nc) -> list[dict]:
    """Every replica in KV `replicas` as the replicas page shows it (named by its key), probed
    now unless refused."""
    try:
        items = await bus.registry_items(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo)
    except BucketNotFoundError:
        items = []
    named = sorted(((replica_hosts.named_by_key(key, info),
                     replica_hosts.entry_refusal(key, info.replica_id, info.url, allowed())) for key, info in items),
                   key=lambda pair: pair[0].replica_id)
    probed = iter(await probe_replicas([info for info, why in named if why is None]))
    now = time.time()
    return [views.replica_row(*next(probed), now) if why is None else views.replica_row(info, None, None, now, why)
            for info, why in named]


async def probe_replicas(entries: list[ReplicaInfo]) -> list[tuple[ReplicaInfo, bool | None, dict | None]]:
    """Each replica's health (`/health`, else `/v1/models` where there is none) and its
    `/metrics`, asked once when the page is loaded (the gateways poll them for routing; this
    page only looks): all at once, each bounded by PROBE_TIMEOUT_S."""
    import httpx

    async def one(http, info: ReplicaInfo):
        url = info.url.rstrip("/")
        try:
            res = await http.get(f"{url}/health")
            if res.status_code == 404:
                res = await http.get(f"{url}/v1/models")
            healthy = res.status_code == 200
        except httpx.HTTPError:
            return info, False, None
        try:
            res = await http.get(f"{url}/metrics")
            metrics = views.parse_metrics(res.text) if res.status_code == 200 else None
        except httpx.HTTPError:
            metrics = None
        return info, healthy, metrics

    if not entries:
        return []
    async with httpx.AsyncClient(timeout=PROBE_TIMEOUT_S, follow_redirects=False) as http:
        return list(await asyncio.gather(*(one(http, e) for e in entries)))


routes = [Route("/replicas", replicas_page), Route("/replicas.json", replicas_json)]
