"""Run by test_tracing.py in its own process: every service in-process with an in-memory
span exporter, one game, then the finished spans as JSON on stdout."""

from __future__ import annotations

import asyncio
import json
import os

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

# Settings come from the environment the test set; build the services only now, by their
# factories, all in this process.
from populace.client.run import play  # noqa: E402
from populace.core import bus, serve  # noqa: E402
from populace.core.contracts import RunConfig  # noqa: E402


async def main() -> None:
    apps = [serve.build(name).app for name in ("recorder", "environment", "gateway", "orchestrator", "agent-host")]
    for app in apps:
        await app.start()
    nc = await bus.connect(os.environ["POPULACE_NATS_URL"], "trace-test")
    try:
        config = RunConfig.model_validate({"agents": 60, "rounds": 2, "model": {"latency_s": 0}})
        out = await play(nc, config, stall_s=60)
    finally:
        await nc.close()
        for app in reversed(apps):
            await app.stop()
    spans = [{"name": s.name, "trace_id": f"{s.context.trace_id:032x}", "span_id": f"{s.context.span_id:016x}",
              "parent_id": f"{s.parent.span_id:016x}" if s.parent else None,
              "run_id": (s.attributes or {}).get("populace.run_id")}
             for s in exporter.get_finished_spans()]
    print(json.dumps({"status": out.status, "run_id": out.run_id, "spans": spans}))


asyncio.run(main())
