"""OpenTelemetry for every service, configured by the standard variables:
OTEL_TRACES_EXPORTER (otlp | console | none; default otlp when an OTLP endpoint is set,
else none), OTEL_EXPORTER_OTLP_ENDPOINT (OTLP over HTTP, e.g. Jaeger's :4318),
OTEL_SERVICE_NAME (default populace-<service>).

Spans are per run, per round and per batch — never per agent. The W3C `traceparent`
travels in NATS headers: `inject()` on publish, `extract()` on receipt (there is no official
NATS instrumentation for Python)."""

from __future__ import annotations

import os

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Span

tracer = trace.get_tracer("populace")  # a proxy: picks up the provider set by setup() or a test
_provider = None
# Services in this process that set tracing up and have not shut it down: the provider is
# flushed and shut down when the last one stops (several share a process in a one-process stack:
# the first to stop must not end the others' spans). Its resource names the first service.
_services = 0


def setup(service: str) -> None:
    """Install a tracer provider from the OTEL_* environment (once per process)."""
    global _provider, _services
    _services += 1
    has_endpoint = any(os.environ.get(k) for k in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    exporters = os.environ.get("OTEL_TRACES_EXPORTER", "otlp" if has_endpoint else "none")
    names = [e.strip() for e in exporters.split(",") if e.strip() and e.strip() != "none"]
    # Tracing off: nothing to install, and the SDK (with psutil, which its resources import) is
    # never imported: a service process starts without it unless tracing is configured.
    if not names:
        return
    if _provider is not None or isinstance(trace.get_tracer_provider(), _sdk_provider_type()):
        return  # already configured (a second service in the process, or a test's provider)
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    provider = TracerProvider(resource=Resource.create(
        {"service.name": os.environ.get("OTEL_SERVICE_NAME", f"populace-{service}")}))
    for name in names:
        if name == "otlp":
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        elif name == "console":
            provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER: unknown exporter {name!r} (otlp, console, none)")
    trace.set_tracer_provider(provider)
    _provider = provider


def shutdown() -> None:
    """Flush spans before the process exits (once its last service stops)."""
    global _services
    _services = max(0, _services - 1)
    if _provider is not None and _services == 0:
        _provider.shutdown()


def _sdk_provider_type():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider


def inject(headers: dict | None = None, span: Span | None = None) -> dict:
    """Headers carrying the trace context of `span` (default: the current span)."""
    carrier = dict(headers or {})
    ctx = trace.set_span_in_context(span) if span is not None else None
    propagate.inject(carrier, context=ctx)
    return carrier


def extract(headers: dict | None) -> Context:
    return propagate.extract(headers or {})


def context_of(span: Span) -> Context:
    return trace.set_span_in_context(span)
