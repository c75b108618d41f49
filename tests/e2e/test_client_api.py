"""The Python API a notebook uses: `simulate` (blocking) and `await start(...)` (a handle with
the run id at once), on a private embedded stack and in one process; results as Arrow tables
named like the DuckDB tables; bad scenarios raise ScenarioError naming the field."""

from __future__ import annotations

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
