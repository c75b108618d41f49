"""The manager's ASGI application: `create_app(settings)` builds a Starlette app whose one NATS
connection is opened in its lifespan; every page reads KV and streams on request, and every
live update is a server-sent event stream sampled at most once per `sample_s` per open page.

Routes:
    GET  /                       -> /runs
    GET  /nodes                  every node (KV `nodes`), its resources and processes, and forms
    POST /nodes/{node}/start     start N agent-hosts / a replica / a service on a node
    POST /nodes/{node}/stop      stop one process
    POST /nodes/{node}/cleanup   stop every process the node started
    GET  /nodes/{node}/logs/{p}  the end of a process's log
    GET  /runs                   every run (KV `runs`), updated live from /events/runs
    GET  /runs/{run}             one run, updated live from /events/runs/{run}
    POST /runs/{run}/cancel      as `populace cancel` (refused unless the run is spawning or running)
    POST /runs/{run}/resume      as `populace resume` (refused unless it can resume)
    POST /runs/{run}/fork        as `populace fork RUN --from-round K --set …`, then to the fork's page
    GET  /runs/{run}/agents.json a page of the run's agents (search, offset, limit), asked of the recorder
    GET  /runs/{run}/distribution.json   a round's histogram or shares (round, bins), asked of the recorder
    GET  /start, POST /start     choose a simulation, paste or load a scenario YAML, validate, submit
    GET  /healthz                200 once connected
With a token (ManagerSettings.token) every route but /healthz asks for it, and GET/POST /login
signs a browser in (populace.manager.access).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from urllib.parse import parse_qs, quote, urlencode, urlsplit

import jinja2
import nats.errors
from nats.js.errors import BucketNotFoundError
from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.templating import Jinja2Templates

from populace.client.nodes import NodeError, NodeUnreachable, list_nodes, node_request
from populace.client.reads import ReadError, RecorderUnreachable, request_agents, request_distribution
from populace.client.run import cancel as cancel_run
from populace.client.run import new_run_id, request_resume, submit
from populace.client.run import run_state as client_run_state
from populace.client.steer import (
    OverrideError,
    SteerError,
    cancel_refusal,
    overrides,
    prepare_fork_of,
    resume_refusal,
    submit_fork,
)
from populace.core import bus, subjects
from populace.core.contracts import (
    Cleanup,
    NodeInfo,
    ProcessSpec,
    ReplicaInfo,
    RestartPolicy,
    RoundOpen,
    RoundResult,
    RunStarted,
    RunState,
    StartProcess,
    StopProcess,
    TailLog,
)
from populace.manager import scenarios, views
from populace.manager.access import LoginLimits, TokenAccess

# Every request body (a scenario pasted or loaded into the form is the largest): one declared
# larger is refused by its Content-Length before it is read, one without a length is cut off
# as it passes the limit (Starlette's max_body_size; a 413 either way).
MAX_FORM_BYTES = 1_048_576
RESULTS_PER_UPDATE = 200  # round results fetched per live update (a long run's page catches up over a few)


@dataclass(frozen=True)
class ManagerSettings:
    nats_url: str
    sample_s: float = 1.0  # live updates: at most one per open page per this many seconds
    cancel_reason: str = "cancelled from the manager"
    title: str = "Populace manager"
    jaeger_url: str | None = None  # e.g. http://localhost:16686: the run page links its trace
    token: str | None = field(default=None, repr=False)  # every route asks for it (populace.manager.access)
    read_timeout_s: float = 10.0  # the run page's reads of the recorder (agents, distribution)
    login_limits: LoginLimits = field(default_factory=LoginLimits)  # wrong tokens: how late, how many


def _templates() -> Jinja2Templates:
    env = jinja2.Environment(loader=jinja2.PackageLoader("populace.manager", "templates"),
                             autoescape=True, undefined=jinja2.StrictUndefined)
    return Jinja2Templates(env=env)


# --- helpers -----------------------------------------------------------------------------
async def _form(request: Request) -> dict[str, str]:
    """An urlencoded form (the pages post nothing else: a scenario file is read into the
    textarea by the page's script), last value per key. At most MAX_FORM_BYTES: the app
    refuses a larger body with a 413 before this reads it."""
    body = await request.body()
    pairs = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
    return {k: v[-1] for k, v in pairs.items()}


def _same_origin(request: Request) -> bool:
    """A POST from one of our own pages: a browser sends Origin (or at least Referer) with a
    form's POST; one from another site is refused (with an access token too)."""
    origin = request.headers.get("origin") or request.headers.get("referer")
    if not origin:
        return True  # not a browser (curl, a test client): nothing to forge
    host = request.headers.get("host", "")
    return urlsplit(origin).netloc == host


def _back(path: str, **params: object) -> RedirectResponse:
    """303 to one of our own pages (the path quoted), with a message or an error to show."""
    query = urlencode({k: v for k, v in params.items() if v not in (None, "")})
    return RedirectResponse(quote(path) + (f"?{query}" if query else ""), status_code=303)


def create_app(settings: ManagerSettings) -> Starlette:
    templates = _templates()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        nc = await bus.connect_or_fail(settings.nats_url, "populace-manager")
        app.state.nc = nc
        try:
            yield
        finally:
            await nc.close()

    def nc_of(request: Request):
        return request.app.state.nc

    def page(request: Request, name: str, status_code: int = 200, **context) -> Response:
        context = {"title": settings.title, "msg": request.query_params.get("msg", ""),
                   "error": request.query_params.get("error", ""), **context}
        return templates.TemplateResponse(request, name, context, status_code=status_code)

    def forbidden() -> Response:
        return PlainTextResponse("cross-site form posts are refused", status_code=403)

    # --- nodes -------------------------------------------------------------------------
    async def nodes_page(request: Request) -> Response:
        js = nc_of(request).jetstream()
        found = await list_nodes(js, include_gone=request.query_params.get("all") == "1")
        now = time.time()
        # one id per page: a form posted twice (a double click) starts its processes once
        return page(request, "nodes.html", nodes=[views.node_row(n, now) for n in found],
                    request_id=uuid.uuid4().hex)

    async def _ask(request: Request, node_id: str, build) -> Response:
        if not _same_origin(request):
            return forbidden()
        try:
            form = await _form(request)
            req = build(form)
        except (ValueError, ValidationError) as err:
            return _back("/nodes", error=f"node {node_id}: {_short(err)}")
        try:
            reply = await node_request(nc_of(request), node_id, req)
        except NodeUnreachable as err:
            return _back("/nodes", error=str(err))
        except NodeError as err:
            return _back("/nodes", error=f"node {node_id}: {err}")
        return _back("/nodes", msg=_said(node_id, req, reply))

    async def nodes_events(request: Request) -> Response:
        once = request.query_params.get("once") == "1"
        return _sse(_nodes_stream(nc_of(request), settings.sample_s, once))

    async def node_start(request: Request) -> Response:
        return await _ask(request, request.path_params["node"], start_request)

    async def node_stop(request: Request) -> Response:
        return await _ask(request, request.path_params["node"],
                          lambda f: StopProcess(proc_id=f.get("proc_id", ""), grace_s=float(f.get("grace") or 10)))

    async def node_cleanup(request: Request) -> Response:
        return await _ask(request, request.path_params["node"],
                          lambda f: Cleanup(grace_s=float(f.get("grace") or 10)))

    async def node_logs(request: Request) -> Response:
        node_id, proc_id = request.path_params["node"], request.path_params["proc"]
        try:
            lines = int(request.query_params.get("lines") or 100)
            reply = await node_request(nc_of(request), node_id, TailLog(proc_id=proc_id, lines=lines))
        except (ValueError, ValidationError) as err:
            return _back("/nodes", error=f"log of {proc_id}: {_short(err)}")
        except NodeError as err:
            return _back("/nodes", error=f"log of {proc_id} on node {node_id}: {err}")
        return page(request, "log.html", node_id=node_id, proc_id=proc_id, lines=lines, log=reply.log or "",
                    truncated=reply.log_truncated)

    # --- runs --------------------------------------------------------------------------
    async def runs_page(request: Request) -> Response:
        states = await _run_states(nc_of(request))
        return page(request, "runs.html", payload=views.runs_payload(states))

    async def runs_events(request: Request) -> Response:
        once = request.query_params.get("once") == "1"
        return _sse(_runs_stream(nc_of(request), settings.sample_s, once))

    async def run_context(request: Request, rid: str) -> dict:
        state = await run_state(nc_of(request), rid)
        manifest, trace_id = await _started(nc_of(request).jetstream(), rid)
        trace_url = (f"{settings.jaeger_url.rstrip('/')}/trace/{trace_id}"
                     if settings.jaeger_url and trace_id else None)
        done = views.last_completed(state) if state else 0
        return {"run_id": rid, "state": state, "row": views.run_row(state) if state else None,
                "config": state.config.model_dump_json(indent=2) if state else "",
                "manifest": json.dumps(manifest, indent=2, default=str) if manifest else "",
                "trace_id": trace_id, "trace_url": trace_url, "sample_ms": int(settings.sample_s * 1000),
                "fork_errors": {}, "fork_values": {"after_round": str(done) if done else "", "changes": ""}}

    async def run_page(request: Request) -> Response:
        rid = request.path_params["run"]
        if not subjects.valid_token(rid):
            return page(request, "missing.html", status_code=404, what=f"run {rid!r}")
        return page(request, "run.html", **await run_context(request, rid))

    async def run_fork(request: Request) -> Response:
        """A fork from the run page: the CLI's checks and words (populace.client.steer), each
        refusal beside the field it names with what was typed kept; the fork is submitted, not
        followed, and the browser goes to its page."""
        if not _same_origin(request):
            return forbidden()
        rid = request.path_params["run"]
        if not subjects.valid_token(rid):
            return page(request, "missing.html", status_code=404, what=f"run {rid!r}")
        form = await _form(request)
        values = {"after_round": form.get("after_round", "").strip(), "changes": form.get("changes", "")}
        errors: dict[str, str] = {}
        after = 0
        try:
            after = int(values["after_round"])
            if after < 1:
                raise ValueError
        except ValueError:
            errors["after_round"] = f"--from-round: {values['after_round']!r} is not a round number (1 or more)"
        try:
            changes = overrides(views.change_lines(values["changes"]))
        except OverrideError as err:
            errors["changes"] = str(err)
        nc = nc_of(request)
        if not errors:
            try:
                _, prepared = await prepare_fork_of(nc, rid, after, changes)
            except SteerError as err:
                errors[views.fork_field(str(err))] = str(err)
        if errors:
            ctx = await run_context(request, rid)
            return page(request, "run.html", status_code=422, **{**ctx, "fork_errors": errors, "fork_values": values})
        fid = new_run_id()
        try:
            await submit_fork(nc, rid, after, prepared, fid)
        except (nats.errors.Error, TimeoutError, OSError) as err:
            return _back(f"/runs/{rid}", error=f"fork {fid} was not submitted: the bus refused or did not answer "
                                               f"({type(err).__name__}: {err}); nothing was started")
        said = f", changed: {json.dumps(changes)}" if changes else ""
        return _back(f"/runs/{fid}", msg=f"fork {fid} of {rid} after round {after} submitted{said}")

    async def _read(request: Request, ask) -> Response:
        """A read of the recorder for the run page's script: its reply as JSON, or `ok` false
        with the reason (no recorder, a refusal, a bad parameter), never a traceback."""
        rid = request.path_params["run"]
        if not subjects.valid_token(rid):
            return JSONResponse({"ok": False, "error": "not a run id"}, status_code=404)
        q = request.query_params
        try:
            reply = await ask(nc_of(request), rid, q)
        except (ValueError, ValidationError) as err:
            return JSONResponse({"ok": False, "error": _short(err)}, status_code=400)
        except RecorderUnreachable as err:
            return JSONResponse({"ok": False, "unreachable": True,
                                 "error": f"no answer from the recorder: {err}"}, status_code=503)
        except ReadError as err:
            return JSONResponse({"ok": False, "error": str(err)})
        return Response(reply.model_dump_json(), media_type="application/json")

    async def run_agents(request: Request) -> Response:
        def num(q, key: str, default: int) -> int:
            return int(q.get(key) or default)

        return await _read(request, lambda nc, rid, q: request_agents(
            nc, rid, search=q.get("search") or None, offset=num(q, "offset", 0), limit=num(q, "limit", 50),
            timeout=settings.read_timeout_s))

    async def run_distribution(request: Request) -> Response:
        return await _read(request, lambda nc, rid, q: request_distribution(
            nc, rid, int(q["round"]) if q.get("round") else None, int(q.get("bins") or 30),
            timeout=settings.read_timeout_s))

    async def run_events(request: Request) -> Response:
        rid = request.path_params["run"]
        if not subjects.valid_token(rid):
            return PlainTextResponse("not a run id", status_code=404)
        nc = nc_of(request)
        once = request.query_params.get("once") == "1"
        return _sse(_run_stream(nc, rid, settings.sample_s, once))

    async def run_cancel(request: Request) -> Response:
        if not _same_origin(request):
            return forbidden()
        rid = request.path_params["run"]
        nc = nc_of(request)
        state = await run_state(nc, rid) if subjects.valid_token(rid) else None
        if state is None:
            return _back(f"/runs/{rid}", error=f"run {rid!r} is not known on this stack (KV '{subjects.RUNS_BUCKET}')")
        refusal = cancel_refusal(state)  # what `populace cancel` says
        if refusal:
            return _back(f"/runs/{rid}", error=refusal)
        await cancel_run(nc, rid, settings.cancel_reason)
        return _back(f"/runs/{rid}", msg=f"cancel sent for run {rid}")

    async def run_resume(request: Request) -> Response:
        if not _same_origin(request):
            return forbidden()
        rid = request.path_params["run"]
        nc = nc_of(request)
        state = await run_state(nc, rid) if subjects.valid_token(rid) else None
        if state is None:
            return _back(f"/runs/{rid}", error=f"run {rid!r} is not known on this stack")
        refusal = await resume_refusal(nc, state, start_hosts="Nodes")
        if refusal:
            return _back(f"/runs/{rid}", error=refusal)
        await request_resume(nc, rid)
        return _back(f"/runs/{rid}", msg=f"resume sent for run {rid} (after round {state.round})")

    # --- start a run -------------------------------------------------------------------
    async def start_page(request: Request) -> Response:
        if request.query_params.get("mode") == "form":
            chosen = request.query_params.get("simulation") or scenarios.DEFAULT_SIMULATION
            return page(request, "params.html", **scenarios.param_form_context(chosen))
        return page(request, "start.html", **scenarios.form_context())

    async def start_submit(request: Request) -> Response:
        if not _same_origin(request):
            return forbidden()
        form = await _form(request)
        simulation = form.get("simulation", "")
        if form.get("mode") == "form":
            simulation = simulation or scenarios.DEFAULT_SIMULATION
            _, checked = await asyncio.to_thread(scenarios.validate_form, form, simulation)
            if checked.errors:
                return page(request, "params.html", status_code=422,
                            **scenarios.param_form_context(simulation, form, checked.errors))
        else:
            text = form.get("scenario", "")
            checked = await asyncio.to_thread(scenarios.validate, text, simulation)
            if checked.errors:
                return page(request, "start.html", status_code=422,
                            **scenarios.form_context(text, simulation, checked.errors))
        rid = new_run_id()
        p = checked.prepared
        try:
            await submit(nc_of(request), p.config, run_id=rid, personas=p.personas, graph=p.graph_blobs,
                         manifest=p.manifest)
        except (nats.errors.Error, TimeoutError, OSError) as err:  # the bus, not the scenario
            return _back("/start", error=f"run {rid} was not submitted: the bus refused or did not answer "
                                         f"({type(err).__name__}: {err}); nothing was started")
        return _back(f"/runs/{rid}", msg=f"run {rid} submitted: {p.config.simulation}, "
                                         f"{p.config.agents:,} agents × {p.config.rounds} rounds")

    async def replicas_page(request: Request) -> Response:
        return page(request, "replicas.html", replicas=await replica_rows(nc_of(request)))

    async def replicas_events(request: Request) -> Response:
        once = request.query_params.get("once") == "1"
        return _sse(_replicas_stream(nc_of(request), max(settings.sample_s, REPLICAS_SAMPLE_S), once))

    async def replicas_json(request: Request) -> Response:
        """The replicas of one backend (`?backend=`) in one line, for a run's page."""
        backend = request.query_params.get("backend") or None
        return JSONResponse(views.replicas_summary(await replica_rows(nc_of(request)), backend))

    async def healthz(request: Request) -> Response:
        nc = nc_of(request)
        return JSONResponse({"nats": nc.is_connected}, status_code=200 if nc.is_connected else 503)

    async def home(request: Request) -> Response:
        return RedirectResponse("/runs", status_code=307)

    routes = [
        Route("/", home), Route("/healthz", healthz),
        Route("/nodes", nodes_page), Route("/events/nodes", nodes_events),
        Route("/nodes/{node}/start", node_start, methods=["POST"]),
        Route("/nodes/{node}/stop", node_stop, methods=["POST"]),
        Route("/nodes/{node}/cleanup", node_cleanup, methods=["POST"]),
        Route("/nodes/{node}/logs/{proc}", node_logs),
        Route("/runs", runs_page), Route("/events/runs", runs_events),
        Route("/runs/{run}", run_page), Route("/events/runs/{run}", run_events),
        Route("/runs/{run}/cancel", run_cancel, methods=["POST"]),
        Route("/runs/{run}/resume", run_resume, methods=["POST"]),
        Route("/runs/{run}/fork", run_fork, methods=["POST"]),
        Route("/runs/{run}/agents.json", run_agents), Route("/runs/{run}/distribution.json", run_distribution),
        Route("/start", start_page), Route("/start", start_submit, methods=["POST"]),
        Route("/replicas", replicas_page), Route("/events/replicas", replicas_events),
        Route("/replicas.json", replicas_json),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, max_body_size=MAX_FORM_BYTES)
    app.add_middleware(TokenAccess, token=settings.token, limits=settings.login_limits)
    app.state.settings = settings
    return app


def start_request(form: dict[str, str]) -> StartProcess:
    """The node form's fields as a StartProcess: kind agent-host (with max in flight),
    replicas (sim or local, servers) or a service by name."""
    kind = form.get("kind", "agent-host")

    def num(key: str) -> int | None:
        value = form.get(key, "").strip()
        return int(value) if value else None

    if kind == "agent-host":
        body: dict = {"kind": kind, "max_in_flight": num("max_in_flight")}
    elif kind == "replicas":
        body = {"kind": kind, "backend": form.get("backend") or "sim", "servers": num("servers") or 1}
    elif kind == "gateway":
        body = {"kind": kind}
    else:
        body = {"kind": "service", "name": kind}
    spec = TypeAdapter(ProcessSpec).validate_python({k: v for k, v in body.items() if v is not None})
    restart = RestartPolicy(mode="on-failure") if form.get("restart") == "on-failure" else RestartPolicy()
    return StartProcess(spec=spec, count=num("count") or 1, restart=restart,
                        request_id=form.get("request_id") or None)


def _short(err: Exception) -> str:
    return bus.short_error(err) if isinstance(err, ValidationError) else str(err)


def _said(node_id: str, req, reply) -> str:
    names = ", ".join(p.proc_id for p in reply.processes)
    if isinstance(req, StartProcess):
        return f"node {node_id} started {names}"
    if isinstance(req, StopProcess):
        p = reply.processes[0] if reply.processes else None
        return f"node {node_id} stopped {req.proc_id}" + (f" (exit code {p.exit_code})" if p else "")
    return f"node {node_id} cleaned up: {names or 'nothing was running'}"


def _sse(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})


async def _run_states(nc) -> list[RunState]:
    try:
        return await bus.registry_entries(nc.jetstream(), subjects.RUNS_BUCKET, RunState)
    except BucketNotFoundError:
        return []  # a stack no service has provisioned yet: no runs


async def run_state(nc, rid: str) -> RunState | None:
    """The run's state in KV `runs` (None: no such run, or no bucket yet)."""
    try:
        return await client_run_state(nc, rid)
    except BucketNotFoundError:
        return None


PROBE_TIMEOUT_S = 2.0


# Replicas are probed over HTTP (health, /metrics) while a page that shows them is open: not
# more often than this, whatever the manager's sample_s (the gateways poll them to route).
REPLICAS_SAMPLE_S = 2.0


async def replica_rows(nc) -> list[dict]:
    """Every replica in KV `replicas` as the replicas page shows it, probed now."""
    try:
        entries = await bus.registry_entries(nc.jetstream(), subjects.REPLICAS_BUCKET, ReplicaInfo)
    except BucketNotFoundError:
        entries = []
    probed = await probe_replicas(sorted(entries, key=lambda r: r.replica_id))
    now = time.time()
    return [views.replica_row(i, ok, m, now) for i, ok, m in probed]


async def _replicas_stream(nc, every_s: float, once: bool) -> AsyncIterator[bytes]:
    """The replicas page's live update: every replica probed every `every_s` seconds."""
    while True:
        yield views.sse({"replicas": await replica_rows(nc)})
        if once:
            return
        await asyncio.sleep(every_s)


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


async def _started(js, rid: str) -> tuple[dict | None, str | None]:
    """The run's manifest and trace id, from its RunStarted event on the RUN stream (the
    orchestrator publishes it inside the run's root span, whose W3C traceparent it carries)."""
    try:
        msg = await js.get_last_msg(subjects.RUN_STREAM, subjects.run_started(rid))
    except Exception:  # not started yet, aged out of RUN, or RUN not there: nothing to show
        return None, None
    try:
        started = RunStarted.model_validate_json(msg.data or b"")
    except ValidationError:
        return None, None
    if started.run_id != rid:
        return None, None
    return started.manifest, views.trace_id((msg.headers or {}).get("traceparent", ""))


KEEPALIVE_S = 15.0  # an event stream with nothing new sends a comment this often (proxies close idle ones)


async def _runs_stream(nc, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The runs list's live updates: KV `runs` watched (see _kv_stream)."""
    async for chunk in _kv_stream(nc, subjects.RUNS_BUCKET, RunState,
                                  lambda states: views.runs_payload(list(states.values())), sample_s, once):
        yield chunk


async def _nodes_stream(nc, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The nodes page's live updates: KV `nodes` watched (each heartbeat is a change)."""
    async for chunk in _kv_stream(nc, subjects.NODES_BUCKET, NodeInfo,
                                  lambda nodes: views.nodes_payload(list(nodes.values())), sample_s, once):
        yield chunk


async def _kv_stream(nc, bucket: str, model, payload, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """A KV bucket watched (one ordered consumer per open page: each key's latest value, then
    its changes), its entries as `payload(entries by key)` sent at most once per `sample_s`
    and only when something changed. A bucket that does not exist yet is asked for again
    until it does."""
    entries: dict[str, object] = {}
    ready = asyncio.Event()
    changed = asyncio.Event()

    async def drain(watcher) -> None:
        async for entry in watcher:
            if entry is None:  # the initial values are in
                ready.set()
                continue
            if entry.operation in ("DEL", "PURGE"):
                entries.pop(entry.key, None)
            else:
                try:
                    entries[entry.key] = model.model_validate_json(entry.value)
                except ValidationError:
                    continue  # malformed: skipped, as registry readers skip it
            if ready.is_set():
                changed.set()

    watcher = task = None
    try:
        while watcher is None:
            try:
                watcher = await (await nc.jetstream().key_value(bucket)).watchall()
            except BucketNotFoundError:
                yield views.sse(payload({}))
                if once:
                    return
                await asyncio.sleep(max(sample_s, 1.0))
        task = asyncio.get_running_loop().create_task(drain(watcher))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(ready.wait(), 10.0)
        quiet_since = time.monotonic()
        yield views.sse(payload(entries))
        while not once:
            await asyncio.sleep(sample_s)
            if changed.is_set():
                changed.clear()
                quiet_since = time.monotonic()
                yield views.sse(payload(entries))
            elif time.monotonic() - quiet_since > KEEPALIVE_S:
                quiet_since = time.monotonic()
                yield b": keepalive\n\n"
    finally:
        if task is not None:
            task.cancel()
        if watcher is not None:
            with contextlib.suppress(Exception):
                await watcher.stop()


async def _run_stream(nc, rid: str, sample_s: float, once: bool) -> AsyncIterator[bytes]:
    """The run page's live updates: every `sample_s`, the run's state from KV, the round in
    play's answers (summed from progress ticks this stream subscribed to) out of its
    RoundOpen's `expected`, and the round results closed since the last update (read from the
    RUN stream by subject, newest version of each)."""
    ticks = views.RoundTicks(rid)
    js = nc.jetstream()

    async def on_tick(msg) -> None:
        ticks.add(msg.data)

    sub = await nc.subscribe(subjects.progress_all(rid), cb=on_tick)
    sent = 0  # rounds whose results this stream has sent: 1..sent
    expected: dict[int, int] = {}
    try:
        while True:
            state = await run_state(nc, rid)
            if ticks.first_round is None:
                # the first round counted from its opening: the next one (a round in play when
                # the page opened had ticks before it listened); all of them for a run not yet known
                ticks.opened(1 if state is None else state.round + 1)
            new: list[RoundResult] = []
            if state is not None:
                done = views.last_completed(state)
                for n in range(sent + 1, min(done, sent + RESULTS_PER_UPDATE) + 1):
                    result = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_round_result(rid, n), RoundResult)
                    if result is not None and result.run_id == rid:
                        new.append(result)
                    sent = n
            current = state.round if state is not None and state.status == "running" else None
            if current and current not in expected:
                opened = await bus.last_on(js, subjects.RUN_STREAM, subjects.run_round_open(rid, current), RoundOpen)
                if opened is not None:
                    expected[current] = opened.expected
            exp = expected.get(current) if current else None
            yield views.sse(views.run_payload(rid, state, ticks, exp or (state.config.agents if current else None),
                                              new))
            if once:
                return
            await asyncio.sleep(sample_s)
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
