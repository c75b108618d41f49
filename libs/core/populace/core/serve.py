"""Run one service by name in the foreground (uvloop when available):
`python -m populace.core.serve orchestrator`, or `populace service orchestrator`.

Services are found by entry point (group `populace.services`, name -> `module:create`), so
the launcher imports none of them: each service package declares itself."""

from __future__ import annotations

import asyncio
import sys
from importlib.metadata import entry_points

from populace.core.metrics import MetricsPortUnavailable
from populace.core.service import Service
from populace.core.settings import Settings

ENTRY_POINT_GROUP = "populace.services"


def names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def build(name: str, settings: Settings | None = None) -> Service:
    """The service `name`, built by its factory (KeyError when no such service is installed)."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise KeyError(f"unknown service {name!r}; installed: {', '.join(names())}")
    return found[0].load()(settings)


def event_loop_runner() -> asyncio.Runner:
    """The runner every long-lived Populace process uses: uvloop where it exists."""
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - Windows
        return asyncio.Runner()


def run(name: str) -> None:
    service = build(name)
    with event_loop_runner() as runner:
        try:
            runner.run(service.app.run())
        except MetricsPortUnavailable as err:  # a setting to change, not a bug: no traceback
            sys.exit(f"error: {err}")


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) != 2:
        sys.exit(f"usage: python -m populace.core.serve NAME  (one of: {', '.join(names())})")
    run(sys.argv[1])
