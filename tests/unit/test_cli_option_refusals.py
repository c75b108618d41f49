"""The CLI's options as a new user meets them: choices checked before anything starts, the
backends listed in --help, and POPULACE_NATS_URL read when the command runs (not when the CLI
is imported). In process (the `cli` fixture); tests/e2e/test_cli_options.py runs `--version`
and a refused choice as real processes."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WIDE = {"COLUMNS": "300"}  # rich boxes: one line


@pytest.mark.parametrize("args, option, choices", [
    (["demo", "--model", "gpt"], "--model", "'dummy', 'local', 'sim', 'openai'"),
    (["bench", "dummy", "--storage", "disk"], "--storage", "'file', 'memory'"),
    (["personas", "generate", "x.yaml", "--out", "p.jsonl", "--model", "dummy"], "--model",
     "'template', 'local', 'sim', 'openai'"),
])
def test_a_choice_outside_the_list_is_refused_naming_the_option(cli, args, option, choices):
    res = cli(*args, env=WIDE)
    assert res.returncode == 2
    assert f"Invalid value for '{option}'" in res.stderr and choices in res.stderr
    assert "starting nats-server" not in res.stderr  # refused before anything started


def test_help_lists_every_backend(cli):
    res = cli("demo", "--help", env={"COLUMNS": "200"})
    assert res.returncode == 0 and "dummy|local|sim|openai" in res.stdout


def test_the_nats_url_comes_from_the_environment_at_run_time(cli, tmp_path):
    scenario = ROOT / "examples" / "guess-two-thirds.yaml"
    if not scenario.exists():  # any scenario will do
        scenario = next((ROOT / "examples").glob("*.yaml"))
    res = cli("run", str(scenario), "--no-progress", env={**WIDE, "POPULACE_NATS_URL": "nats://127.0.0.1:1"})
    assert res.returncode == 1
    assert "nats://127.0.0.1:1" in res.stderr and "Traceback" not in res.stderr
    res = cli("run", "--help", env={"COLUMNS": "200"})
    assert "POPULACE_NATS_URL" in res.stdout  # and --help says where it comes from
