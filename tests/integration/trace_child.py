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

# Settings come from the environment the test set; import the services only now.
from populace.agent_host import app as agent_host  # noqa: E402
from populace.cli.client import play  # noqa: E402
from populace.core import bus  # noqa: E402
from populace.core.contracts import RunConfig  # noqa: E402
from populace.environment import app as environment  # noqa: E402
from populace.gateway import app as gateway  # noqa: E402
from populace.orchestrator import app as orchestrator  # noqa: E402
from populace.recorder import app as recorder  # noqa: E402


async def main() -> None:
    apps = [recorder.app, environment.app, gateway.app, orchestrator.app, agent_host.app]
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
