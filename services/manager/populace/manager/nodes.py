"""The Nodes page and what its forms ask of a node (populace.client.nodes): start N processes
of a kind, stop one, clean up all, tail a process's log.

    GET  /nodes                  every node (KV `nodes`), its resources and processes, and forms
    POST /nodes/{node}/start     start N agent-hosts / a replica / a service on a node
    POST /nodes/{node}/stop      stop one process
    POST /nodes/{node}/cleanup   stop every process the node started
    GET  /nodes/{node}/logs/{p}  the end of a process's log
"""

from __future__ import annotations

import time
import uuid

from pydantic import TypeAdapter, ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from populace.client.nodes import NodeError, NodeUnreachable, list_nodes, node_request
from populace.core.contracts import Cleanup, ProcessSpec, RestartPolicy, StartProcess, StopProcess, TailLog
from populace.manager import views
from populace.manager.web import back, forbidden, nc_of, page, read_form, same_origin, short


async def nodes_page(request: Request) -> Response:
    js = nc_of(request).jetstream()
    found = await list_nodes(js, include_gone=request.query_params.get("all") == "1")
    now = time.time()
    # one id per page: a form posted twice (a double click) starts its processes once
    return page(request, "nodes.html", nodes=[views.node_row(n, now) for n in found],
                request_id=uuid.uuid4().hex)


async def _ask(request: Request, node_id: str, build) -> Response:
    if not same_origin(request):
        return forbidden()
    try:
        form = await read_form(request)
        req = build(form)
    except (ValueError, ValidationError) as err:
        return back("/nodes", error=f"node {node_id}: {short(err)}")
    try:
        reply = await node_request(nc_of(request), node_id, req)
    except NodeUnreachable as err:
        return back("/nodes", error=str(err))
    except NodeError as err:
        return back("/nodes", error=f"node {node_id}: {err}")
    return back("/nodes", msg=_said(node_id, req, reply))


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
        return back("/nodes", error=f"log of {proc_id}: {short(err)}")
    except NodeError as err:
        return back("/nodes", error=f"log of {proc_id} on node {node_id}: {err}")
    return page(request, "log.html", node_id=node_id, proc_id=proc_id, lines=lines, log=reply.log or "",
                truncated=reply.log_truncated)


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


def _said(node_id: str, req, reply) -> str:
    names = ", ".join(p.proc_id for p in reply.processes)
    if isinstance(req, StartProcess):
        return f"node {node_id} started {names}"
    if isinstance(req, StopProcess):
        p = reply.processes[0] if reply.processes else None
        return f"node {node_id} stopped {req.proc_id}" + (f" (exit code {p.exit_code})" if p else "")
    return f"node {node_id} cleaned up: {names or 'nothing was running'}"


routes = [
    Route("/nodes", nodes_page),
    Route("/nodes/{node}/start", node_start, methods=["POST"]),
    Route("/nodes/{node}/stop", node_stop, methods=["POST"]),
    Route("/nodes/{node}/cleanup", node_cleanup, methods=["POST"]),
    Route("/nodes/{node}/logs/{proc}", node_logs),
]
