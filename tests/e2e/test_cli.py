"""The `populace` command as a user runs it, as real processes: a demo plays and `results`
prints the recorded run; the console script refuses, for each command family, a bad scenario,
option or file with exit code 2 and the field on stderr, before anything starts. Every other
refusal runs in process (typer's runner on the same app): tests/unit/test_cli_*_refusals.py and
tests/integration/test_cli_run_refusals.py."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.e2e

# the console script `uv sync` installs beside this interpreter (`populace = populace.cli.main:app`)
CONSOLE_SCRIPT = Path(sys.executable).with_name("populace")
BAD_POPULATION = "name: bad\ntotal: 10\nattributes:\n  education:\n    weights: {a: 1.5, b: -0.5}\n"


def populace(*args: str, timeout: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "populace.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=None if env is None else {**os.environ, **env})


def console_script(*args: str) -> subprocess.CompletedProcess:
    assert CONSOLE_SCRIPT.is_file(), f"{CONSOLE_SCRIPT} is missing: `uv sync` installs the console script"
    return subprocess.run([str(CONSOLE_SCRIPT), *args], capture_output=True, text=True, timeout=120)


def _files(tmp_path: Path) -> None:
    (tmp_path / "pop.yaml").write_text(BAD_POPULATION)
    (tmp_path / "scenario.yaml").write_text("rounds: 2\npopulation: {config: pop.yaml}\n")
    (tmp_path / "colour.yaml").write_text("agents: 10\ncolour: blue\n")
    (tmp_path / "sweep.yaml").write_text("grid: {game.ratio: ['2/3', 'zero']}\n")


@pytest.mark.parametrize("args, said", [
    (["run", "{tmp}/colour.yaml", "--nats", "nats://127.0.0.1:1"], "colour"),
    (["validate", "{tmp}/scenario.yaml"], "population.config"),
    (["demo", "--agents", "0", "--db", "{tmp}/demo.duckdb"], "agents"),
    (["personas", "generate", "{tmp}/pop.yaml", "--out", "{tmp}/p.jsonl"], "attributes.education.weights"),
    (["sweep", "{tmp}/sweep.yaml", "--db", "{tmp}/sweep.duckdb"], "grid.game.ratio = zero"),
], ids=["run", "validate", "demo", "personas-generate", "sweep"])
def test_the_console_script_refuses_with_exit_2_naming_the_field(tmp_path, args, said):
    _files(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())
    res = console_script(*(a.replace("{tmp}", str(tmp_path)) for a in args))
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert said in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert "starting nats-server" not in res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_demo_with_a_scenario_plays_the_agents_and_rounds_given(tmp_path, cli):
    """`demo --scenario X --agents 20` silently played the scenario's own 100 agents (issue 25).
    How the options merge with the scenario is the point, not the process: the command runs in this
    one (its stack's services are processes still, one host is enough); the demo below is a process."""
    scenario = tmp_path / "vote.yaml"
    scenario.write_text("simulation: vote\nagents: 100\nrounds: 2\nmodel: {latency_s: 0.0}\n")
    res = cli("demo", "--scenario", str(scenario), "--agents", "20", "--rounds", "1", "--hosts", "1",
              "--db", str(tmp_path / "demo.duckdb"))
    assert res.returncode == 0, res.stderr
    assert "vote, 20 agents × 1 rounds" in res.stderr and "recorded 20 outcomes (table votes)" in res.stdout


def test_demo_plays_and_results_reads_the_db(tmp_path, cli):
    """The demo and `results` as processes; `results --json` reads the same file in this one (the
    process boundary proved once). One agent-host: what is played and recorded is the same on two."""
    db = tmp_path / "p.duckdb"
    res = populace("demo", "--agents", "200", "--rounds", "2", "--latency", "0.01", "--hosts", "1", "--db", str(db),
                   timeout=180)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "recorded 400 outcomes (table guesses)" in res.stdout
    run_id = res.stdout.split("run ", 1)[1].split(" ", 1)[0]
    # the id comes first, before any round: a long run can be followed or cancelled from elsewhere
    assert res.stderr.index(f"run {run_id}: ratio-game, 200 agents × 2 rounds (model dummy)") < res.stderr.index("round 1")
    res2 = populace("results", "last", "--db", str(db), env={"COLUMNS": "250"})
    assert res2.returncode == 0, res2.stderr
    assert f"run {run_id} (completed; ratio-game, value)" in res2.stdout
    # each round's statistics, computed here from the recorded guesses, and its LLM work
    with duckdb.connect(str(db), read_only=True) as con:
        guesses = con.execute("SELECT round, value FROM guesses WHERE valid ORDER BY round").fetchall()
    stats, llm = [], []
    for line in res2.stdout.splitlines():
        cells = [c.strip() for c in line.strip("│").split("│")] if line.startswith("│") else []
        (stats if len(cells) == 11 else llm if len(cells) == 12 else []).append(cells)
    assert [c[0] for c in stats] == ["1", "2"] and [c[0] for c in llm] == ["1", "2"], res2.stdout
    for cells in stats:
        values = [v for r, v in guesses if r == int(cells[0])]
        assert cells[1] == f"{len(values)}/200" == "200/200"
        assert cells[2:7] == [f"{statistics.mean(values):.2f}", f"{statistics.median(values):.2f}",
                              f"{statistics.stdev(values):.2f}", f"{min(values):.1f}", f"{max(values):.1f}"]
        assert cells[7] == f"{2 / 3 * statistics.mean(values):.2f}"  # target: 2/3 of the mean
    # answers in, valid, invalid, simulation errors, infra retries, LLM calls: one dummy call per agent
    assert all(cells[1:7] == ["200", "200", "0", "0", "0", "200"] for cells in llm), llm
    res3 = cli("results", "last", "--json", "--db", str(db))
    run = json.loads(res3.stdout)["runs"][0]
    assert run["usage"] == {"llm_calls": 400, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                            "cached_tokens": 0, "dollars": 0.0, "invalid_answers": 0, "simulation_errors": 0}
    assert [r["usage"]["llm_calls"] for r in run["rounds"]] == [200, 200]
