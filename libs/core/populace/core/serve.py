"""Run one service by name in the foreground (uvloop when available):
`python -m populace.core.serve orchestrator`, or `populace service orchestrator`.

Services are found by entry point (group `populace.services`, name -> `module:create`), so
the launcher imports none of them: each service package declares itself.

Several services in one process and one event loop (`python -m populace.core.serve
--together`, the services and each one's own settings in TOGETHER_VARIABLE as JSON: a list of
[name, {setting: value}]): what a test's one-process stack runs (populace.client.stack), so the
world is imported once, not once per service. Each service is built and run in its own context
(`own_context`), which gives it what a process of its own gave it: its `service` on every log
line and its own cache of run configs. One SIGTERM/SIGINT stops them all."""

from __future__ import annotations

import gc
import sys

if __name__ == "__main__":
    # A service process: no cyclic collection while it imports and builds its service (some
    # 1,100 modules leave 170,000 long-lived objects the collector tracks, and the collections
    # on the way walked them: about a tenth of the import's CPU). `settled` turns the collector
    # back on with those objects frozen out of it, before the service runs.
    gc.disable()

import asyncio
import contextvars
import json
import os
import signal
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any

import structlog

from populace.core import runconfigs
from populace.core.metrics import MetricsPortUnavailable
from populace.core.service import Service
from populace.core.settings import Settings

ENTRY_POINT_GROUP = "populace.services"
# `--together`'s services: JSON, a list of [name, {setting: value}] (the settings override the
# environment's, as pydantic-settings init arguments do). In the environment, not on the command
# line: the settings hold NATS passwords.
TOGETHER_VARIABLE = "POPULACE_TOGETHER"


def names() -> list[str]:
    return sorted(ep.name for ep in entry_points(group=ENTRY_POINT_GROUP))


def factory(name: str) -> Callable[[Settings | None], Service]:
    """The factory of the service `name`, its module imported (KeyError when no such service is
    installed)."""
    found = [ep for ep in entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        raise KeyError(f"unknown service {name!r}; installed: {', '.join(names())}")
    return found[0].load()


def build(name: str, settings: Settings | None = None) -> Service:
    """The service `name`, built by its factory (KeyError when no such service is installed)."""
    return factory(name)(settings)


def settled() -> None:
    """Everything a service process imports is loaded: freeze those objects out of the cyclic
    collector (they live as long as the process; a full collection no longer walks them) and
    turn the collector on (`python -m populace.core.serve` starts with it off). No collection
    first: what the imports left in cycles is a few dozen objects, not worth a full pass."""
    gc.freeze()
    gc.enable()


def event_loop_runner() -> asyncio.Runner:
    """The runner every long-lived Populace process uses: uvloop where it exists."""
    try:
        import uvloop

        return asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:  # pragma: no cover - Windows
        return asyncio.Runner()


def run(name: str) -> None:
    service = build(name)
    settled()
    with event_loop_runner() as runner:
        try:
            runner.run(serve_until_stopped([(contextvars.copy_context(), service)]))
        except MetricsPortUnavailable as err:  # a setting to change, not a bug: no traceback
            sys.exit(f"error: {err}")


def own_context(name: str) -> contextvars.Context:
    """A context for one of several services in a process: what is per process when each
    service has its own (its name on log lines, its cache of run configs) is its own. Build the
    service and run it in this context: every task it starts inherits it."""
    ctx = contextvars.copy_context()

    def separate() -> None:
        structlog.contextvars.bind_contextvars(service=name)
        runconfigs.own_cache()

    ctx.run(separate)
    return ctx


def metrics_owner(specs: list[tuple[str, dict[str, Any]]]) -> None:
    """Refuse several metrics ports in one process: there is one Prometheus registry per process,
    so every port would serve every service's series (and `populace_agents_hosted` would be
    whichever host set it last), which is not what a scrape of a service's port means."""
    ported = [name for name, overrides in specs if int(overrides.get("metrics_port") or 0)]
    if len(ported) > 1:
        raise MetricsPortUnavailable(f"{', '.join(ported)} each have a metrics port, but services in one process "
                                     "share one registry: give one a port (it serves all), or run each in its own "
                                     "process")


async def run_together(specs: list[tuple[str, dict[str, Any]]]) -> None:
    """Run the services `specs` names (each with its own settings: `Settings(**overrides)` over
    the environment) in this event loop until SIGTERM or SIGINT, or until one of them fails."""
    metrics_owner(specs)
    services = []
    for name, overrides in specs:
        ctx = own_context(name)
        services.append((ctx, ctx.run(build, name, Settings(**overrides))))
    await serve_until_stopped(services)


async def serve_until_stopped(services: list[tuple[contextvars.Context, Service]]) -> None:
    """Start each service's app in order (each in its context), serve until SIGTERM or SIGINT,
    then stop the started ones in reverse order. Not FastStream's `app.run()`: it looks at its
    exit flag ten times a second, about 2 ms of CPU a second per idle service; here an idle
    service waits on nothing but its sockets and timers, and stops as soon as it is told."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    started = []
    try:
        for ctx, service in services:  # in order, as a stack starts its processes
            await asyncio.create_task(service.app.start(), context=ctx)
            started.append((ctx, service.app))
        await stop.wait()
    finally:
        for ctx, app in reversed(started):
            try:
                await asyncio.create_task(app.stop(), context=ctx)
            except Exception as err:  # the others still stop
                print(f"error stopping a service: {type(err).__name__}: {err}", file=sys.stderr)


def together_specs(raw: str) -> list[tuple[str, dict[str, Any]]]:
    """TOGETHER_VARIABLE's services: [name, {setting: value}] pairs, each name installed."""
    try:
        specs = [(str(name), dict(overrides)) for name, overrides in json.loads(raw)]
    except (ValueError, TypeError) as err:
        raise ValueError(f"{TOGETHER_VARIABLE} is not a JSON list of [name, {{setting: value}}]: {err}") from None
    unknown = sorted({name for name, _ in specs} - set(names()))
    if unknown or not specs:
        raise ValueError(f"{TOGETHER_VARIABLE}: unknown services {unknown or '(none given)'}; installed: "
                         f"{', '.join(names())}")
    return specs


def run_all(raw: str) -> None:
    try:
        specs = together_specs(raw)
    except ValueError as err:
        sys.exit(f"error: {err}")
    for name in {name for name, _ in specs}:
        factory(name)  # every service's module imported before the collector is back
    settled()
    with event_loop_runner() as runner:
        try:
            runner.run(run_together(specs))
        except MetricsPortUnavailable as err:
            sys.exit(f"error: {err}")


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--together"]:
        run_all(os.environ.get(TOGETHER_VARIABLE, ""))
    elif len(sys.argv) != 2:
        sys.exit(f"usage: python -m populace.core.serve NAME  (one of: {', '.join(names())}), "
                 f"or --together with {TOGETHER_VARIABLE} set")
    else:
        run(sys.argv[1])
