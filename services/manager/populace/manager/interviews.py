"""Interviews from a run's page: a form that asks its agents a question after a round (as
`populace interview`: the orchestrator places it, the agent-hosts answer from the round's
checkpoint, nothing of the run changes), and its answers as a chart by group.

    POST /runs/{run}/interview        the form: checked as the CLI checks it, each refusal beside its field
    GET  /runs/{run}/interviews.json  ?request=ID&by=ATTR: placed, refused or recorded, and the answers
                                      per question and group (asked of the recorder); no request: the
                                      run's planned interviews
"""

from __future__ import annotations

import uuid

from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from populace.client.interviews import InterviewRefused, check_who, state_refusal
from populace.client.reads import ReadError, RecorderUnreachable, request_interviews
from populace.core import bus, subjects
from populace.core.contracts import InterviewPlaced, InterviewRequest, InterviewsRecorded, Question, Survey
from populace.core.scenario import format_validation_error
from populace.manager.runs import run_context, run_state
from populace.manager.web import back, forbidden, nc_of, page, read_form, same_origin, settings_of, short

FIELDS = ("after_round", "question", "kind", "options", "points", "labels", "min", "max", "max_chars", "sample", "by")
# a validation error's field -> the form's field it is shown beside
SHOWN_AT = {"text": "question", "options": "options", "points": "points", "labels": "labels", "min": "min",
            "max": "max", "max_chars": "max_chars", "kind": "kind"}


def _items(text: str) -> list[str]:
    """Options or labels as typed: one a line, or comma-separated."""
    parts = text.splitlines() if "\n" in text.strip() else text.split(",")
    return [p.strip() for p in parts if p.strip()]


def survey_of(values: dict[str, str]) -> tuple[Survey | None, dict[str, str]]:
    """The form's question as a survey, or the errors by field."""
    errors: dict[str, str] = {}
    kind = values["kind"] or "options"
    spec: dict = {"id": "q1", "text": values["question"], "kind": kind}
    try:
        if kind == "options":
            spec["options"] = _items(values["options"])
        elif kind == "likert":
            if values["labels"].strip():
                spec["labels"] = _items(values["labels"])
            if values["points"].strip():
                spec["points"] = int(values["points"])
        elif kind == "number":
            spec["min"] = float(values["min"]) if values["min"].strip() else None
            spec["max"] = float(values["max"]) if values["max"].strip() else None
        elif values["max_chars"].strip():
            spec["max_chars"] = int(values["max_chars"])
    except ValueError as err:
        errors[{"likert": "points", "number": "min", "text": "max_chars"}.get(kind, "kind")] = f"not a number ({err})"
        return None, errors
    try:
        return Survey(id="interview", questions=[Question.model_validate(spec)]), errors
    except ValidationError as err:
        for line in format_validation_error(err).splitlines():
            head = line.split(":", 1)[0].split(",")[0].strip().split(".")[-1]
            errors.setdefault(SHOWN_AT.get(head, "question"), line)
        return None, errors


async def run_interview(request: Request) -> Response:
    """The interview form: every refusal beside the field it names (what was typed kept);
    nothing is asked before the request is checked here and by the orchestrator."""
    if not same_origin(request):
        return forbidden()
    rid = request.path_params["run"]
    if not subjects.valid_token(rid):
        return page(request, "missing.html", status_code=404, what=f"run {rid!r}")
    form = await read_form(request)
    values = {k: form.get(k, "") for k in FIELDS}
    nc = nc_of(request)
    survey, errors = survey_of(values)
    after = 0
    try:
        after = int(values["after_round"])
    except ValueError:
        errors["after_round"] = f"--after-round: {values['after_round']!r} is not a round number"
    sample = None
    if values["sample"].strip():
        try:
            sample = float(values["sample"])
            check_who(sample, None)
        except ValueError as err:
            errors["sample"] = str(err) if isinstance(err, InterviewRefused) else f"--sample: not a number ({err})"
    state = await run_state(nc, rid)
    if "after_round" not in errors and (why := state_refusal(state, rid, after)):
        errors["after_round"] = why
    if errors or survey is None:
        ctx = await run_context(request, rid)
        return page(request, "run.html", status_code=422, **{**ctx, "interview_errors": errors,
                                                             "interview_values": values})
    req = InterviewRequest(run_id=rid, request=f"iv-{uuid.uuid4().hex[:12]}", after_round=after, survey=survey,
                           sample=sample)
    await bus.publish_js(nc.jetstream(), subjects.RUN_INTERVIEW, req, msg_id=f"interview.{rid}.{req.request}")
    return back(f"/runs/{rid}", msg=f"interview {req.request} sent: the agents as they were after round {after}",
                interview=req.request, by=values["by"].strip() or None)


async def _last(js, subject: str, model):
    try:
        msg = await js.get_last_msg(subjects.RUN_STREAM, subject)
    except Exception:  # nothing yet (or RUN not there)
        return None
    try:
        return model.model_validate_json(msg.data or b"")
    except ValidationError:
        return None


async def run_interviews(request: Request) -> Response:
    """Where an interview is (pending, refused, placed, recorded) and, once recorded, its answers."""
    rid = request.path_params["run"]
    if not subjects.valid_token(rid):
        return JSONResponse({"ok": False, "error": "not a run id"}, status_code=404)
    q = request.query_params
    req_id, by = q.get("request") or None, q.get("by") or None
    nc = nc_of(request)
    status = "planned"
    if req_id is not None:
        if not subjects.valid_token(req_id):
            return JSONResponse({"ok": False, "error": "not a request id"}, status_code=400)
        js = nc.jetstream()
        placed = await _last(js, subjects.run_asked(rid, req_id), InterviewPlaced)
        recorded = await _last(js, subjects.run_interviewed(rid, req_id), InterviewsRecorded)
        if placed is None:
            return JSONResponse({"ok": True, "status": "pending"})
        if placed.error:  # refused before anything was asked, or failed once placed (a lost host, …)
            return JSONResponse({"ok": True, "status": "failed" if placed.expected else "refused",
                                 "error": placed.error})
        if recorded is None:
            return JSONResponse({"ok": True, "status": "placed", "expected": placed.expected,
                                 "hosts": sorted(placed.hosts)})
        status = "recorded"
    try:
        reply = await request_interviews(nc, rid, request=req_id, by=by, timeout=settings_of(request).read_timeout_s)
    except ValidationError as err:
        return JSONResponse({"ok": False, "error": short(err)}, status_code=400)
    except RecorderUnreachable as err:
        return JSONResponse({"ok": False, "unreachable": True, "error": f"no answer from the recorder: {err}"},
                            status_code=503)
    except ReadError as err:
        return JSONResponse({"ok": False, "error": str(err)})
    return JSONResponse({"ok": True, "status": status, **reply.model_dump(mode="json", exclude={"v", "ok"})})


routes = [
    Route("/runs/{run}/interview", run_interview, methods=["POST"]),
    Route("/runs/{run}/interviews.json", run_interviews),
]
