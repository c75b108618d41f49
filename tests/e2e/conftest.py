"""What the end-to-end tests share: a module's stacks (`stacks`), and for the browser tests the
system's Chromium, or a clear skip (a failure in CI)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from populace.client.stack import Stack

# what a service logs for an exception nobody retrieved: asyncio's own line, and populace.core.logs'
# (watch_unobserved) that replaces it; no stack of the suite may log either
UNOBSERVED = ("Task exception was never retrieved", "task_exception_unobserved")

# Debian's chromium: `playwright install` would download one from a CDN this machine cannot reach
CHROMIUM = Path("/usr/bin/chromium")


@pytest.fixture(scope="session")
def chromium() -> Path:
    """The browser's path; without it a skip naming how to install it, unless
    POPULACE_REQUIRE_BROWSER=1 (.ci/run sets it), where the browser test fails instead. Ask for
    it before any costly set-up, so a machine without a browser skips at once."""
    if CHROMIUM.exists():
        return CHROMIUM
    message = f"{CHROMIUM} is missing: install it with `apt-get install -y chromium` (never `playwright install`)"
    if os.environ.get("POPULACE_REQUIRE_BROWSER") == "1":
        pytest.fail(message + "; POPULACE_REQUIRE_BROWSER=1 requires the browser test to run")
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser(chromium):
    """Headless Chromium through Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(chromium), args=["--headless", "--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def stacks(tmp_path_factory) -> Iterator[Callable[..., Stack]]:
    """A factory of ready stacks, each stopped when the module ends: `stacks(hosts=2, env={…},
    one_process=True, timeout=90)` takes Stack's settings (db defaults to a new temporary file)
    and returns the stack once every service has registered. A module whose tests need no
    process per service (none kills, restarts or measures one, or reads its own log or metrics
    port) asks for `one_process=True`: the world is imported once, not once per service. A test
that kills, restarts or reads the log of a few services names them in `apart=(…)`: those keep a
process each, the rest still share one."""
    started: list[Stack] = []

    def start(*, timeout: float = 90, **settings) -> Stack:
        settings.setdefault("db", str(tmp_path_factory.mktemp("stack") / "populace.duckdb"))
        # under pytest's temporary root (kept for the last few sessions), not a /tmp directory of
        # its own per stack that nothing ever removes
        settings.setdefault("log_dir", str(tmp_path_factory.mktemp("logs")))
        stack = Stack(**settings).up(timeout=timeout)  # stopped again if it never gets ready
        started.append(stack)
        return stack

    yield start
    for stack in reversed(started):
        stack.stop()
    unobserved = [f"{log.name}: {line[:400]}" for stack in started for log in sorted(Path(stack.log_dir).glob("*.log"))
                  for line in log.read_text(errors="replace").splitlines() if any(m in line for m in UNOBSERVED)]
    assert not unobserved, "an exception no code waited for, in a service log:\n" + "\n".join(unobserved[:10])


@pytest.fixture(scope="module")
def managers() -> Iterator[Callable[[str], str]]:
    """A factory of managers served in this process, each stopped when the module ends:
    `managers(nats_url)` returns the base URL once it serves. The manager's app (create_app) as
    `populace manager` serves it, uvicorn on a free port of 127.0.0.1, in a thread of its own (its
    own event loop; Playwright's sync API holds this thread's): no interpreter to start for pages
    that are the point. `populace manager` as a process is proved by test_manager_limits.py and
    test_manager_browser.py."""
    import uvicorn

    from populace.manager import ManagerSettings, create_app

    served: list[tuple[uvicorn.Server, threading.Thread]] = []

    def serve(nats_url: str) -> str:
        # as populace.manager.serve runs it: open pages hold event streams, shutdown waits briefly;
        # port 0: the kernel's free port, bound at once (a port picked first can be taken before)
        server = uvicorn.Server(uvicorn.Config(create_app(ManagerSettings(nats_url=nats_url)), host="127.0.0.1",
                                               port=0, log_level="warning", lifespan="on",
                                               timeout_graceful_shutdown=2))
        thread = threading.Thread(target=server.run, name="manager", daemon=True)
        thread.start()
        served.append((server, thread))
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive(), "the manager stopped before it served (its error is in the captured log)"
            assert time.monotonic() < deadline, "the manager did not serve within 60 s"
            time.sleep(0.1)
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield serve
    for server, thread in reversed(served):
        server.should_exit = True
        thread.join(30)
    assert not any(thread.is_alive() for _, thread in served), "a manager did not stop within 30 s"
