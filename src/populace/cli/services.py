"""`populace service <name>`: run one service in the foreground (uvloop when available)."""

from __future__ import annotations

import asyncio
import importlib

SERVICES = {
    "orchestrator": "populace.orchestrator.app",
    "agent-host": "populace.agent_host.app",
    "environment": "populace.environment.app",
    "gateway": "populace.gateway.app",
    "recorder": "populace.recorder.app",
}


def run_service(name: str) -> None:
    module = importlib.import_module(SERVICES[name])
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - Windows
        runner = asyncio.Runner()
    with runner:
        runner.run(module.app.run())
