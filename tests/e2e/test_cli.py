"""The `populace` command as a user runs it: bad scenarios exit 2 naming the field and
publish nothing; `results` prints a recorded run."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from populace.core import bus, subjects

pytestmark = pytest.mark.e2e

GOOD = """\
name: guess-two-thirds
agents: 1000
rounds: 3
game: {ratio: "2/3", offset: 0, max_value: 100}
model: {backend: dummy, latency_s: 0.05}
placement: {agents_per_process: 0}
"""


def populace(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "populace.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.parametrize("yaml_text, field", [
    (GOOD + "colour: blue\n", "colour"),
    (GOOD.replace('ratio: "2/3"', "ratio: 0"), "game.ratio"),
    (GOOD.replace('ratio: "2/3"', "ratio: -1/3"), "game.ratio"),
    (GOOD.replace('ratio: "2/3"', 'ratio: "two thirds"'), "game.ratio"),
    (GOOD.replace("rounds: 3", "rounds: 0"), "rounds"),
    (GOOD.replace("agents: 1000", "agents: 0"), "agents"),
    (GOOD.replace("agents: 1000", "agents: many"), "agents"),
    (GOOD.replace("latency_s: 0.05", "latency_s: soon"), "model.latency_s"),
    (GOOD.replace("max_value: 100", "max_value: lots"), "game.max_value"),
    (GOOD.replace("backend: dummy", "backend: gpt-17"), "model.backend"),
    (GOOD.replace("game: {", "game: {shape: round, "), "game.shape"),
    (GOOD.replace("agents_per_process: 0", "agents_per_process: 3"), "placement.agents_per_process"),
    (GOOD + "simulation: chess\n", "simulation: unknown simulation 'chess'"),
    (GOOD + "simulation: no_such_pkg:Sim\n", "cannot import: ModuleNotFoundError"),
    ("simulation: public-goods\nagents: 4\ngame: {group_size: 5}\n", "game.group_size: 5 is more than"),
    ("simulation: vote\nballot: {options: [yes, yes]}\n", "ballot.options.0"),
])
def test_bad_scenario_exits_2_naming_the_field_and_publishes_nothing(tmp_path, nats_server, yaml_text, field):
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml_text)

    async def ctl_messages() -> int:
        nc = await bus.connect(nats_server.url, "cli-test")
        js = nc.jetstream()
        await bus.provision(js, storage="memory")
        n = (await js.stream_info(subjects.CTL_STREAM)).state.messages
        await nc.close()
        return n

    before = asyncio.run(ctl_messages())
    res = populace("run", str(path), "--nats", nats_server.url, "--no-progress")
    assert res.returncode == 2, res.stderr
    assert field in res.stderr
    assert asyncio.run(ctl_messages()) == before


def test_validate_accepts_the_example_scenario(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    res = populace("validate", str(path))
    assert res.returncode == 0, res.stderr
    assert '"ratio": "2/3"' in res.stdout


@pytest.mark.parametrize("args, field", [
    (["--agents", "0"], "agents"),
    (["--rounds", "0"], "rounds"),
    (["--set", "game.ratio=0"], "game.ratio"),
    (["--latency", "-1"], "model.latency_s"),
])
def test_demo_rejects_bad_options_before_starting_anything(args, field):
    res = populace("demo", *args, timeout=30)
    assert res.returncode == 2
    assert field in res.stderr
    assert "starting nats-server" not in res.stderr


@pytest.mark.parametrize("args, said", [
    (["--simulation", "vote"], "--simulation: --scenario names its own simulation"),
    (["--model", "sim"], "--model: --scenario names its own model"),
    (["--agents", "0"], "agents: Input should be greater than or equal to 1"),  # applied, so checked
])
def test_demo_with_a_scenario_refuses_or_checks_the_options_given_with_it(tmp_path, args, said):
    scenario = tmp_path / "vote.yaml"
    scenario.write_text("simulation: vote\nagents: 100\nrounds: 2\n")
    res = populace("demo", "--scenario", str(scenario), *args, timeout=180)
    assert res.returncode == 2 and said in res.stderr.replace("\n", "")
    assert "starting nats-server" not in res.stderr


def test_demo_with_a_scenario_plays_the_agents_and_rounds_given(tmp_path):
    """`demo --scenario X --agents 20` silently played the scenario's own 100 agents (issue 25)."""
    scenario = tmp_path / "vote.yaml"
    scenario.write_text("simulation: vote\nagents: 100\nrounds: 2\nmodel: {latency_s: 0.0}\n")
    res = populace("demo", "--scenario", str(scenario), "--agents", "20", "--rounds", "1",
                   "--db", str(tmp_path / "demo.duckdb"), timeout=600)
    assert res.returncode == 0, res.stderr
    assert "vote, 20 agents × 1 rounds" in res.stderr and "recorded 20 outcomes (table votes)" in res.stdout


def test_missing_scenario_file_is_a_clear_error(tmp_path):
    res = populace("run", str(tmp_path / "nope.yaml"), "--nats", "nats://127.0.0.1:1")
    assert res.returncode == 2
    assert "cannot read" in res.stderr


def test_demo_plays_and_results_reads_the_db(tmp_path):
    db = tmp_path / "p.duckdb"
    res = populace("demo", "--agents", "200", "--rounds", "2", "--latency", "0.01", "--db", str(db), timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recorded 400 outcomes (table guesses)" in res.stdout
    run_id = res.stdout.split("run ", 1)[1].split(" ", 1)[0]
    # the id comes first, before any round: a long run can be followed or cancelled from elsewhere
    assert res.stderr.index(f"run {run_id}: ratio-game, 200 agents × 2 rounds (model dummy)") < res.stderr.index("round 1")
    res2 = populace("results", "last", "--db", str(db))
    assert res2.returncode == 0, res2.stderr
    assert "completed" in res2.stdout and "200/200" in res2.stdout
    assert "LLM calls" in res2.stdout and "infra retries" in res2.stdout
    res3 = populace("results", "last", "--json", "--db", str(db))
    run = json.loads(res3.stdout)["runs"][0]
    assert run["usage"] == {"llm_calls": 400, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                            "invalid_answers": 0, "simulation_errors": 0}
    assert [r["usage"]["llm_calls"] for r in run["rounds"]] == [200, 200]


def test_unreachable_nats_is_a_clear_error_not_a_hang(tmp_path):
    path = tmp_path / "scenario.yaml"
    path.write_text(GOOD)
    res = populace("run", str(path), "--nats", "nats://127.0.0.1:1", "--no-progress", timeout=60)
    assert res.returncode == 1
    assert "cannot connect to NATS at nats://127.0.0.1:1" in res.stderr
    assert "Traceback" not in res.stderr
