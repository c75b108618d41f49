"""The Python API a notebook uses: `simulate` (blocking) and `await start(...)` (a handle with
the run id at once), on a private embedded stack and in one process; results as Arrow tables
named like the DuckDB tables; bad scenarios raise ScenarioError naming the field."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest

from populace.client import simulate, start
from populace.core.scenario import ScenarioError

pytestmark = pytest.mark.e2e


def test_simulate_locally_gives_the_tables_of_the_database():
    result = simulate({"simulation": "vote", "agents": 30, "rounds": 2}, local=True)
    assert result.status == "completed" and result.tables.outcomes == "votes"
    assert isinstance(result.outcomes, pa.Table) and result.outcomes.num_rows == 60
    assert {"run_id", "round", "agent_id", "choice", "valid", "raw", "latency_ms", "error"} <= set(
        result.outcomes.column_names)
    assert result.rounds.column("round").to_pylist() == [1, 2]
    assert result.manifest["simulation"]["name"] == "vote"


async def test_inside_a_running_loop_start_gives_the_run_id_at_once_and_simulate_still_works():
    run = await start({"simulation": "public-goods", "agents": 12, "rounds": 2}, local=True)
    assert run.run_id and not run.done()  # known before the run has played
    result = await run
    assert result.run_id == run.run_id and result.rounds.num_rows == 2
    # the blocking form, called from a coroutine (a notebook cell), runs in a worker thread
    again = simulate({"simulation": "public-goods", "agents": 12, "rounds": 2}, local=True)
    assert again.rounds.to_pylist()[0]["mean_contribution"] == result.rounds.to_pylist()[0]["mean_contribution"]


def test_simulate_on_a_private_stack_equals_the_local_run(tmp_path):
    scenario = {"simulation": "ratio-game", "agents": 200, "rounds": 2, "model": {"latency_s": 0.0, "seed": 3}}
    fleet = simulate(scenario, db=str(tmp_path / "api.duckdb"), hosts=2, progress=False)
    local = simulate(scenario, local=True)
    assert fleet.status == "completed" and fleet.db_path == str(tmp_path / "api.duckdb")
    columns = ["round", "n", "n_valid", "mean", "target", "winner_agent_id", "winner_value", "n_winners"]
    assert fleet.rounds.select(columns).to_pylist() == local.rounds.select(columns).to_pylist()
    assert fleet.outcomes.select(["round", "agent_id", "value", "valid"]).to_pylist() == \
        local.outcomes.select(["round", "agent_id", "value", "valid"]).to_pylist()


def test_overrides_and_bad_scenarios_name_the_field():
    result = simulate("examples/guess-two-thirds.yaml", local=True, agents=20, rounds=1)
    assert result.outcomes.num_rows == 20
    with pytest.raises(ScenarioError, match=r"^game.ratio: "):
        simulate({"game": {"ratio": "zero"}}, local=True)
    with pytest.raises(ScenarioError, match=r"^simulation: unknown simulation 'golf'"):
        simulate({"simulation": "golf"}, local=True)


# --- local runs are recorded like fleet runs (issue 25, items 1, 7 and 11) ---------------------
SIMS = Path(__file__).with_name("sims")  # faulty_sims and stranger_sims, importable through PYTHONPATH


@pytest.fixture
def populace(cli, monkeypatch):
    """`populace ARGS` in `cwd`, in this process (typer's runner on the real app, tests/conftest.py):
    a local run needs no process of its own, and each interpreter started cost seconds; the console
    script itself is run as a process by tests/e2e/test_cli.py."""
    monkeypatch.syspath_prepend(str(SIMS))  # what PYTHONPATH gave the process

    def invoke(*args: str, cwd: Path) -> subprocess.CompletedProcess:
        return cli(*args, cwd=cwd)

    return invoke


def test_a_local_run_is_recorded_like_a_fleet_run_and_results_report_and_export_read_it(tmp_path, populace):
    scenario = tmp_path / "vote.yaml"
    scenario.write_text("simulation: vote\nagents: 40\nrounds: 2\nballot: {options: [go, stay, wait]}\n")
    res = populace("run", str(scenario), "--local", "--no-progress", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "recorded 80 outcomes (table votes) in populace.duckdb" in res.stdout
    run_id = res.stdout.split("run ", 1)[1].split(" ", 1)[0]
    with duckdb.connect(str(tmp_path / "populace.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status, hosts, simulation FROM runs WHERE run_id = ?", [run_id]).fetchone() == \
            ("completed", ["local"], "vote")
        assert con.execute("SELECT count(*), count(DISTINCT agent_id) FROM votes WHERE run_id = ?",
                           [run_id]).fetchone() == (80, 40)
        assert con.execute("SELECT count(*) FROM agents WHERE run_id = ?", [run_id]).fetchone() == (40,)
        assert con.execute("SELECT list(round ORDER BY round) FROM vote_rounds WHERE run_id = ?",
                           [run_id]).fetchone() == ([1, 2],)
    out = json.loads(populace("results", "last", "--json", cwd=tmp_path).stdout)["runs"][0]
    assert out["run_id"] == run_id and out["status"] == "completed"
    assert out["usage"] == {"llm_calls": 80, "prompt_tokens": 0, "completion_tokens": 0, "infra_retries": 0,
                            "cached_tokens": 0, "dollars": 0.0, "invalid_answers": 0, "simulation_errors": 0}
    assert [r["options"] for r in out["rounds"]] == [["go", "stay", "wait"]] * 2  # the ballot's order
    assert populace("report", "last", "--out", "r.html", cwd=tmp_path).returncode == 0
    assert populace("export", "last", "--out", "export", cwd=tmp_path).returncode == 0
    assert (tmp_path / "r.html").stat().st_size > 0 and (tmp_path / "export" / "votes.parquet").exists()


def test_simulate_locally_records_to_its_db_or_a_temporary_one(tmp_path):
    given = simulate({"simulation": "ratio-game", "agents": 10, "rounds": 2}, local=True,
                     db=str(tmp_path / "mine.duckdb"))
    assert given.db_path == str(tmp_path / "mine.duckdb")
    anywhere = simulate({"simulation": "ratio-game", "agents": 10, "rounds": 2}, local=True)
    assert anywhere.db_path and Path(anywhere.db_path).exists()
    with duckdb.connect(given.db_path, read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [given.run_id]).fetchone() == ("completed",)


def test_local_and_fleet_runs_take_the_same_number_of_hosts_unless_told():
    """`simulate(local=True)` split the agents over 2 hosts, `run --local` over 1 (issue 25)."""
    import inspect

    from typer.main import get_command

    from populace.cli.main import app
    from populace.client import api

    command = get_command(app)
    hosts = {name: next(p.default for p in command.commands[name].params if p.name == "hosts")
             for name in ("run", "up", "demo")}
    assert hosts == {"run": api.DEFAULT_HOSTS, "up": api.DEFAULT_HOSTS, "demo": api.DEFAULT_HOSTS}
    assert inspect.signature(api.start).parameters["hosts"].default == api.DEFAULT_HOSTS


def test_a_local_run_whose_environment_raises_fails_with_one_line_and_keeps_the_reason(tmp_path, populace):
    scenario = tmp_path / "boom.yaml"
    scenario.write_text("simulation: faulty_sims:EnvBoom\nagents: 20\nrounds: 3\n")
    res = populace("run", str(scenario), "--local", "--no-progress", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr + res.stdout
    reason = ("simulation 'env-boom': round 2 failed: ZeroDivisionError: the environment's own bug "
              "(at faulty_sims.py:")
    assert [line for line in res.stderr.splitlines() if line.startswith("error:")] == [
        line for line in res.stderr.splitlines() if reason in line]
    shown = populace("results", "last", cwd=tmp_path)
    assert shown.returncode == 0 and f"failed: {reason}" in shown.stdout  # results says why
    out = json.loads(populace("results", "last", "--json", cwd=tmp_path).stdout)["runs"][0]
    assert out["status"] == "failed" and out["reason"].startswith(reason)
    assert [r["round"] for r in out["rounds"]] == [1]  # the round it closed


def test_a_local_run_refuses_agents_whose_state_a_resume_would_lose(tmp_path, populace):
    scenario = tmp_path / "walk.yaml"
    scenario.write_text("simulation: stranger_sims:Forgetful\nagents: 20\nrounds: 3\n")
    res = populace("run", str(scenario), "--local", "--no-progress", cwd=tmp_path)
    assert res.returncode == 1 and "Traceback" not in res.stderr
    assert "a resume or fork of this run would not continue it exactly after round 1" in res.stderr
    assert "'streak' changed" in res.stderr and "state_fields = ('streak',)" in res.stderr
    walk = tmp_path / "ok.yaml"
    walk.write_text("simulation: stranger_sims:Walk\nagents: 20\nrounds: 3\n")  # state_fields = ("score",)
    assert populace("run", str(walk), "--local", "--no-progress", cwd=tmp_path).returncode == 0


def test_results_says_why_a_run_failed_or_paused(tmp_path, populace):
    from populace.core.contracts import RunConfig
    from populace.sdk.registry import resolve
    from populace.store.local_runs import record_local

    resolved = resolve(RunConfig.model_validate({"agents": 5, "rounds": 3}))
    record_local(tmp_path / "populace.duckdb", run_id="r-paused", config=resolved.config, tables=resolved.tables(),
                 outcomes={}, rounds={}, status="paused", reason="budget: 4,000 of 4,500 LLM calls used")
    res = populace("results", "r-paused", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "paused: budget: 4,000 of 4,500 LLM calls used" in res.stdout
