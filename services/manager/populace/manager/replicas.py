"""The Replicas page: every model server in KV `replicas`, asked over HTTP for its health and
load while a page that shows them is open.

    GET  /replicas               every replica, probed now (live from /events/replicas)
    GET  /replicas.json          one backend's replicas in one line, for a run's page
"""

from __future__ import annotations

import asyncio
import time

from nats.js.errors import BucketNotFoundError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from populace.core import bus, subjects
from populace.core.contracts import ReplicaInfo
from populace.manager import views
from populace.manager.web import nc_of, page

PROBE_TIMEOUT_S = 2.0


async def replicas_page(request: Request) -> Response:
    return page(request, "replicas.html", replicas=await replica_rows(nc_of(request)))


async def replicas_json(request: Request) -> Response:
    """The replicas of one backend (`?backend=`) in one line, for a run's page."""
    backend = request.query_params.get("backend") or None
    return JSONResponse(views.replicas_summary(await replica_rows(nc_of(request)), backend))


async def replica_rows(nc) -> list[dict]:
    """Every replica in KV `replicas` as the replicas page shows it, probed now."""
    try:
        entries = await bus.registry_entries(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo)
    except BucketNotFoundError:
        entries = []
    probed = await probe_replicas(sorted(entries, key=lambda r: r.replica_id))
    now = time.time()
    return [views.replica_row(i, ok, m, now) for i, ok, m in probed]


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
