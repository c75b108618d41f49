"""The runs list, a run's page and what its buttons send (populace.client.run, .steer), and
the run page's reads of the recorder.

    GET  /runs                   every run (KV `runs`), updated live from /events/runs
    GET  /runs/{run}             one run, updated live from /events/runs/{run}
    POST /runs/{run}/cancel      as `populace cancel` (refused unless the run is spawning or running)
    POST /runs/{run}/resume      as `populace resume` (refused unless it can resume)
    POST /runs/{run}/fork        as `populace fork RUN --from-round K --set …`, then to the fork's page
    GET  /runs/{run}/agents.json a page of the run's agents (search, offset, limit), asked of the recorder
    GET  /runs/{run}/distribution.json   a round's histogram or shares (round, bins), asked of the recorder
    GET  /runs/{run}/profile.json        where its last rounds went (table round_profile), asked of the recorder
    GET  /runs/{run}/groups.json?by=X    its measure per group of X (an attribute, or `model`), asked of the recorder
"""

from __future__ import annotations

import json

import nats.errors
from nats.js.errors import BucketNotFoundError
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from populace.client.reads import (
    ReadError,
    RecorderUnreachable,
    request_agents,
    request_distribution,
    request_groups,
    request_profile,
)
from populace.client.run import cancel as cancel_run
from populace.client.run import new_run_id, recorded_event, request_resume
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
from populace.core.contracts import RunStarted, RunState
from populace.manager import views
from populace.manager.web import back, forbidden, nc_of, page, read_form, same_origin, settings_of, short


async def runs_page(request: Request) -> Response:
    states = await run_states(nc_of(request))
    return page(request, "runs.html", payload=views.runs_payload(states))


async def run_context(request: Request, rid: str) -> dict:
    settings = settings_of(request)
    state = await run_state(nc_of(request), rid)
    manifest, trace_id = await _started(nc_of(request).jetstream(), rid)
    trace_url = (f"{settings.jaeger_url.rstrip('/')}/trace/{trace_id}"
                 if settings.jaeger_url and trace_id else None)
    done = views.last_completed(state) if state else 0
    recorded = await recorded_event(nc_of(request), rid) if state is not None and state.status == "done" else None
    return {"run_id": rid, "state": state, "row": views.run_row(state, recorded) if state else None,
            "config": state.config.model_dump_json(indent=2) if state else "",
            "manifest": json.dumps(manifest, indent=2, default=str) if manifest else "",
            "trace_id": trace_id, "trace_url": trace_url, "sample_ms": int(settings.sample_s * 1000),
            "fork_errors": {}, "fork_values": {"after_round": str(done) if done else "", "changes": ""},
            # the interview form (populace.manager.interviews), and the interview the page shows
            "interview_errors": {}, "interview_values": {"after_round": str(done) if done else "", "kind": "options"},
            "interview_request": request.query_params.get("interview", ""),
            "interview_by": request.query_params.get("by", "")}


async def run_page(request: Request) -> Response:
    rid = request.path_params["run"]
    if not subjects.valid_token(rid):
        return page(request, "missing.html", status_code=404, what=f"run {rid!r}")
    return page(request, "run.html", **await run_context(request, rid))


async def run_fork(request: Request) -> Response:
    """A fork from the run page: the CLI's checks and words (populace.client.steer), each
    refusal beside the field it names with what was typed kept; the fork is submitted, not
    followed, and the browser goes to its page."""
    if not same_origin(request):
        return forbidden()
    rid = request.path_params["run"]
    if not subjects.valid_token(rid):
        return page(request, "missing.html", status_code=404, what=f"run {rid!r}")
    form = await read_form(request)
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
        return back(f"/runs/{rid}", error=f"fork {fid} was not submitted: the bus refused or did not answer "
                                          f"({type(err).__name__}: {err}); nothing was started")
    said = f", changed: {json.dumps(changes)}" if changes else ""
    return back(f"/runs/{fid}", msg=f"fork {fid} of {rid} after round {after} submitted{said}")


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
        return JSONResponse({"ok": False, "error": short(err)}, status_code=400)
    except RecorderUnreachable as err:
        return JSONResponse({"ok": False, "unreachable": True,
                             "error": f"no answer from the recorder: {err}"}, status_code=503)
    except ReadError as err:
        return JSONResponse({"ok": False, "error": str(err)})
    return Response(reply.model_dump_json(), media_type="application/json")


async def run_agents(request: Request) -> Response:
    timeout = settings_of(request).read_timeout_s

    def num(q, key: str, default: int) -> int:
        return int(q.get(key) or default)

    return await _read(request, lambda nc, rid, q: request_agents(
        nc, rid, search=q.get("search") or None, offset=num(q, "offset", 0), limit=num(q, "limit", 50),
        timeout=timeout))


async def run_distribution(request: Request) -> Response:
    timeout = settings_of(request).read_timeout_s
    return await _read(request, lambda nc, rid, q: request_distribution(
        nc, rid, int(q["round"]) if q.get("round") else None, int(q.get("bins") or 30), timeout=timeout))


async def run_profile(request: Request) -> Response:
    timeout = settings_of(request).read_timeout_s
    return await _read(request, lambda nc, rid, q: request_profile(nc, rid, int(q.get("rounds") or 50),
                                                                   timeout=timeout))


async def run_groups(request: Request) -> Response:
    timeout = settings_of(request).read_timeout_s
    return await _read(request, lambda nc, rid, q: request_groups(
        nc, rid, (q.get("by") or "model")[:100], int(q["round"]) if q.get("round") else None, timeout=timeout))


async def run_cancel(request: Request) -> Response:
    if not same_origin(request):
        return forbidden()
    rid = request.path_params["run"]
    nc = nc_of(request)
    state = await run_state(nc, rid) if subjects.valid_token(rid) else None
    if state is None:
        return back(f"/runs/{rid}", error=f"run {rid!r} is not known on this stack (KV '{subjects.RUNS_BUCKET}')")
    refusal = cancel_refusal(state)  # what `populace cancel` says
    if refusal:
        return back(f"/runs/{rid}", error=refusal)
    await cancel_run(nc, rid, settings_of(request).cancel_reason)
    return back(f"/runs/{rid}", msg=f"cancel sent for run {rid}")


async def run_resume(request: Request) -> Response:
    if not same_origin(request):
        return forbidden()
    rid = request.path_params["run"]
    nc = nc_of(request)
    state = await run_state(nc, rid) if subjects.valid_token(rid) else None
    if state is None:
        return back(f"/runs/{rid}", error=f"run {rid!r} is not known on this stack")
    refusal = await resume_refusal(nc, state, start_hosts="Nodes")
    if refusal:
        return back(f"/runs/{rid}", error=refusal)
    await request_resume(nc, rid)
    return back(f"/runs/{rid}", msg=f"resume sent for run {rid} (after round {state.round})")


async def run_states(nc) -> list[RunState]:
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


routes = [
    Route("/runs", runs_page),
    Route("/runs/{run}", run_page),
    Route("/runs/{run}/cancel", run_cancel, methods=["POST"]),
    Route("/runs/{run}/resume", run_resume, methods=["POST"]),
    Route("/runs/{run}/fork", run_fork, methods=["POST"]),
    Route("/runs/{run}/agents.json", run_agents),
    Route("/runs/{run}/distribution.json", run_distribution),
    Route("/runs/{run}/profile.json", run_profile),
    Route("/runs/{run}/groups.json", run_groups),
]
