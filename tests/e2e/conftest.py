"""What the browser tests share: the system's Chromium, or a clear skip (a failure in CI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
