"""Log lines carry the ids of the current span and of the bound run context."""

from __future__ import annotations

import json

import structlog
from opentelemetry.sdk.trace import TracerProvider

from populace.core import logs


def test_lines_inside_a_span_carry_trace_and_span_ids_and_bound_context(capsys):
    logs.configure("INFO", "json")
    tracer = TracerProvider().get_tracer("t")
    log = structlog.get_logger("t")
    with structlog.contextvars.bound_contextvars(run_id="r1", round=2, host_id="h"):
        with tracer.start_as_current_span("batch") as span:
            log.info("inside")
        log.info("outside")
    lines = [json.loads(x) for x in capsys.readouterr().err.splitlines() if x.startswith("{")]
    inside = next(x for x in lines if x["event"] == "inside")
    outside = next(x for x in lines if x["event"] == "outside")
    assert inside["trace_id"] == f"{span.get_span_context().trace_id:032x}"
    assert inside["span_id"] == f"{span.get_span_context().span_id:016x}"
    assert (inside["run_id"], inside["round"], inside["host_id"]) == ("r1", 2, "h")
    assert "trace_id" not in outside and outside["run_id"] == "r1"
