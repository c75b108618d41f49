"""What `populace validate`, `demo`, `run` and `sweep` refuse before they start anything: bad
options and scenarios exit 2 naming the field, a missing file or an unreachable NATS is a clear
error, not a traceback or a hang. In process (the `cli` fixture: typer's runner on the real app);
tests/e2e/test_cli.py runs each command once as a real process, and
tests/integration/test_cli_run_refusals.py checks that a refused `run` publishes nothing."""

from __future__ import annotations

import pytest

GOOD = """\
name: guess-two-thirds
agents: 1000
rounds: 3
game: {ratio: "2/3", offset: 0, max_value: 100}
model: {backend: dummy, latency_s: 0.05}
placement: {agents_per_process: 0}
"""


def test_validate_accepts_the_example_scenario(cli, tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    res = cli("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert '"ratio": "2/3"' in res.stdout


@pytest.mark.parametrize("args, field", [
    (["--agents", "0"], "agents"),
    (["--rounds", "0"], "rounds"),
    (["--set", "game.ratio=0"], "game.ratio"),
    (["--latency", "-1"], "model.latency_s"),
])
def test_demo_rejects_bad_options_before_starting_anything(cli, args, field):
    res = cli("demo", *args)
    assert res.returncode == 2
    assert field in res.stderr
    assert "starting nats-server" not in res.stderr


@pytest.mark.parametrize("args, said", [
    (["--simulation", "vote"], "--simulation: --scenario names its own simulation"),
    (["--model", "sim"], "--model: --scenario names its own model"),
    (["--agents", "0"], "agents: Input should be greater than or equal to 1"),  # applied, so checked
])
def test_demo_with_a_scenario_refuses_or_checks_the_options_given_with_it(cli, tmp_path, args, said):
    scenario = tmp_path / "vote.yaml"
    scenario.write_text("simulation: vote\nagents: 100\nrounds: 2\n")
    res = cli("demo", "--scenario", str(scenario), *args)
    assert res.returncode == 2 and said in res.stderr.replace("\n", "")
    assert "starting nats-server" not in res.stderr


def test_missing_scenario_file_is_a_clear_error(cli, tmp_path):
    res = cli("run", str(tmp_path / "nope.yaml"), "--nats", "nats://127.0.0.1:1")
    assert res.returncode == 2
    assert "cannot read" in res.stderr


def test_unreachable_nats_is_a_clear_error_not_a_hang(cli, tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    res = cli("run", str(path), "--nats", "nats://127.0.0.1:1", "--no-progress")
    assert res.returncode == 1
    assert "cannot connect to NATS at nats://127.0.0.1:1" in res.stderr
    assert "Traceback" not in res.stderr  # and the fixture fails on any exception the command let out


def test_a_sweep_with_a_bad_cell_runs_nothing(cli, tmp_path):
    (tmp_path / "sweep.yaml").write_text("grid: {game.ratio: ['2/3', 'zero']}\n")
    res = cli("sweep", str(tmp_path / "sweep.yaml"))
    assert res.returncode == 2
    assert "grid.game.ratio = zero" in res.stderr and "game.ratio" in res.stderr
    assert "starting nats-server" not in res.stderr
