"""The CLI's options as a new user meets them, from the console script as a real process:
--version, and a choice outside the list refused (exit 2, naming the option) before anything
starts. The other option checks run in process: tests/unit/test_cli_option_refusals.py."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

# the console script `uv sync` installs beside this interpreter (`populace = populace.cli.main:app`)
CONSOLE_SCRIPT = Path(sys.executable).with_name("populace")


def populace(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT} is missing: `uv sync` installs the console script"
    return subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "300", **(env or {})})  # rich boxes: one line


def test_version():
    from importlib.metadata import version

    res = populace("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"populace {version('populace')}"


def test_a_choice_outside_the_list_is_refused_naming_the_option():
    res = populace("demo", "--model", "gpt")
    assert res.returncode == 2
    assert "Invalid value for '--model'" in res.stderr and "'dummy', 'local', 'sim', 'openai'" in res.stderr
    assert "starting nats-server" not in res.stderr  # refused before anything started
