"""structlog setup: JSON when not on a TTY, console otherwise; run_id, round and host_id bound
from context where a service plays a round; trace and span ids on every line inside a span.
One line per batch, never per agent."""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable

import structlog


def add_trace_ids(_logger, _method, event: dict) -> dict:
    """trace_id / span_id of the current OpenTelemetry span on every line inside a span."""
    from opentelemetry import trace

    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = f"{ctx.trace_id:032x}"
        event["span_id"] = f"{ctx.span_id:016x}"
    return event


class _CurrentStderr:
    """sys.stderr as it is when a line is written, not when logging was configured: loggers
    are cached, and whoever swaps stderr (a test harness capturing each test's output, a
    daemon) would otherwise leave them writing to a closed file."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def configure(level: str = "INFO", fmt: str = "auto", service: str | None = None) -> None:
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    use_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = structlog.processors.JSONRenderer() if use_json else structlog.dev.ConsoleRenderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=_CurrentStderr()),
        cache_logger_on_first_use=True,
    )
    if service:
        structlog.contextvars.bind_contextvars(service=service)
    # FastStream and nats-py log through stdlib logging: keep them at warnings.
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr)


def get(name: str | None = None) -> structlog.stdlib.BoundLogger:
    return structlog.get_logger(name)


# What asyncio's default handler would have printed through stdlib logging, e.g. "Task exception
# was never retrieved": an e2e test greps service logs for both spellings.
UNOBSERVED_EVENT = "task_exception_unobserved"


def watch_unobserved(on_error: Callable[[], None] | None = None) -> None:
    """Route the running loop's unhandled errors (a task whose exception nobody retrieved, a
    callback that raised) to one structured error line each, with the exception's type, text and
    traceback, instead of asyncio's stdlib line that said nothing of the service or the run.
    `on_error` counts it (the service's metric). Idempotent: several services sharing one loop
    (`serve --together`) install it once."""
    loop = asyncio.get_running_loop()
    if getattr(loop.get_exception_handler(), "populace_watch", False):
        return
    log = get("populace.unobserved")

    def handle(_loop: asyncio.AbstractEventLoop, context: dict) -> None:
        exc = context.get("exception")
        where = context.get("task") or context.get("future") or context.get("handle")
        log.error(UNOBSERVED_EVENT, message=context.get("message", ""), where=repr(where)[:300] if where else None,
                  error=f"{type(exc).__name__}: {exc}" if exc is not None else None, exc_info=exc)
        if on_error is not None:
            on_error()

    handle.populace_watch = True  # type: ignore[attr-defined]
    loop.set_exception_handler(handle)
