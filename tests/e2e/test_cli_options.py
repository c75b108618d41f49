"""The CLI's options as a new user meets them: --version, choices checked before anything
starts, and POPULACE_NATS_URL read when the command runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]


def populace(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "populace.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "COLUMNS": "300", **(env or {})})  # rich boxes: one line


def test_version():
    from importlib.metadata import version

    res = populace("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"populace {version('populace')}"


@pytest.mark.parametrize("args, option, choices", [
    (["demo", "--model", "gpt"], "--model", "'dummy', 'local', 'sim', 'openai'"),
    (["bench", "dummy", "--storage", "disk"], "--storage", "'file', 'memory'"),
    (["personas", "generate", "x.yaml", "--out", "p.jsonl", "--model", "dummy"], "--model",
     "'template', 'local', 'sim', 'openai'"),
])
def test_a_choice_outside_the_list_is_refused_naming_the_option(args, option, choices):
    res = populace(*args)
    assert res.returncode == 2
    assert f"Invalid value for '{option}'" in res.stderr and choices in res.stderr
    assert "starting nats-server" not in res.stderr  # refused before anything started


def test_help_lists_every_backend():
    res = populace("demo", "--help", env={"COLUMNS": "200"})
    assert res.returncode == 0 and "dummy|local|sim|openai" in res.stdout


def test_the_nats_url_comes_from_the_environment_at_run_time(tmp_path):
    scenario = ROOT / "examples" / "guess-two-thirds.yaml"
    if not scenario.exists():  # any scenario will do
        scenario = next((ROOT / "examples").glob("*.yaml"))
    res = populace("run", str(scenario), "--no-progress", env={"POPULACE_NATS_URL": "nats://127.0.0.1:1"})
    assert res.returncode == 1
    assert "nats://127.0.0.1:1" in res.stderr and "Traceback" not in res.stderr
    res = populace("run", "--help", env={"COLUMNS": "200"})
    assert "POPULACE_NATS_URL" in res.stdout  # and --help says where it comes from
