"""The manager's ASGI application: `create_app(settings)` builds a Starlette app whose one NATS
connection is opened in its lifespan; every page reads KV and streams on request, and every
live update is a server-sent event stream sampled at most once per `sample_s` per open page.

Routes, by area (each module lists its own):
    GET  /                       -> /runs
    GET  /healthz                200 once connected
    populace.manager.nodes       /nodes…: the nodes, their processes, start / stop / clean up, logs
    populace.manager.runs        /runs…: the runs, a run's page, cancel / resume / fork, the recorder's reads
    populace.manager.start       /start: a scenario validated and submitted
    populace.manager.replicas    /replicas…: the model servers, probed
    populace.manager.streams     /events/…: the pages' live updates
With a token (ManagerSettings.token) every route but /healthz asks for it, and GET/POST /login
signs a browser in; without one, only a loopback Host is served (populace.manager.access).
Every request body is at most MAX_FORM_BYTES (a 413 before it is read or as it passes it).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from populace.core import bus, logs, metrics
from populace.manager import interviews, nodes, replicas, runs, start, streams
from populace.manager.access import TokenAccess
from populace.manager.nodes import start_request
from populace.manager.replicas import probe_replicas, replica_rows
from populace.manager.runs import run_state
from populace.manager.settings import ManagerSettings
from populace.manager.streams import _run_stream, _runs_stream
from populace.manager.web import MAX_FORM_BYTES, nc_of, templates
from populace.manager.web import same_origin as _same_origin

# what was importable from here before the routes moved to their areas' modules
__all__ = ["MAX_FORM_BYTES", "ManagerSettings", "_run_stream", "_runs_stream", "_same_origin", "create_app",
           "probe_replicas", "replica_rows", "run_state", "start_request"]


async def healthz(request: Request) -> Response:
    nc = nc_of(request)
    return JSONResponse({"nats": nc.is_connected}, status_code=200 if nc.is_connected else 503)


async def home(request: Request) -> Response:
    return RedirectResponse("/runs", status_code=307)


def create_app(settings: ManagerSettings) -> Starlette:
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        logs.watch_unobserved(metrics.UNOBSERVED.labels("manager").inc)  # no exception goes unsaid
        nc = await bus.connect_or_fail(settings.nats_url, "populace-manager")
        app.state.nc = nc
        try:
            yield
        finally:
            await nc.close()

    routes = [Route("/", home), Route("/healthz", healthz),
              *nodes.routes, *runs.routes, *interviews.routes, *start.routes, *replicas.routes, *streams.routes]
    app = Starlette(routes=routes, lifespan=lifespan, max_body_size=MAX_FORM_BYTES)
    app.add_middleware(TokenAccess, token=settings.token, limits=settings.login_limits)
    app.state.settings = settings
    app.state.templates = templates()
    return app
