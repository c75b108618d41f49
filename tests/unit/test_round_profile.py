"""Where a round goes (populace.sdk.profile, table round_profile) in one process: a slow view's
seconds land in `view_s` (none without one), a slow turn's in `turn_s`, the model's latency in
`model_wait_s`; and a view over its budget is said once per run, naming the hook, the agent, the
round and its size — not once per agent or round. (Fleet: tests/e2e/test_slow_author_e2e.py.)"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from populace.core.contracts import RunConfig
from populace.sdk.local import run_local
from populace.sdk.mock import DummyLLM
from populace.sdk.profile import RoundCost, Timed, budget_bytes, human

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))

AGENTS = 40


def play(slow: dict | None = None, rounds: int = 2, simulation: str = "slow_sims:SlowView", llm=None,
         budget: int | None = None):
    config = {"simulation": simulation, "agents": AGENTS, "rounds": rounds, **({"slow": slow} if slow else {})}
    kw = {"llm": llm} if llm is not None else {}
    return asyncio.run(run_local(RunConfig.model_validate(config), view_budget_bytes=budget, **kw))


def rows(result, role: str) -> list[dict]:
    p = result.profile
    out = [dict(zip(p, r)) for r in zip(*p.values())]
    return [r for r in out if r["role"] == role]


def test_a_slow_view_is_where_the_round_went_and_a_cheap_one_costs_next_to_nothing():
    slow = play({"view_ms": 5})
    cheap = play()
    for r in rows(slow, "host"):
        assert r["agents"] == AGENTS
        assert r["view_s"] >= AGENTS * 0.005  # each view burnt 5 ms of CPU
        assert r["turn_s"] < r["view_s"] / 4  # the turns are the ratio game's: cheap
        assert r["wall_s"] >= r["view_s"]
    quick = [r["view_s"] for r in rows(cheap, "host")]
    assert len(quick) == 2
    assert max(quick) < min(r["view_s"] for r in rows(slow, "host")) / 10
    # the environment's row each round: its merge and decide, the observation it announced
    env = rows(slow, "environment")
    assert [r["round"] for r in env] == [1, 2]
    assert all(r["decide_s"] > 0 and r["merge_s"] > 0 and r["observation_bytes"] > 0 for r in env)


def test_a_run_without_a_view_has_no_view_seconds():
    result = play(simulation="ratio-game")
    assert [(r["round"], r["view_s"], r["view_bytes"]) for r in rows(result, "host")] == [(1, 0.0, 0), (2, 0.0, 0)]
    assert all(r["turn_s"] > 0 for r in rows(result, "host"))


def test_the_models_latency_is_model_wait():
    def slow_model(run, round_):
        m = run.resolved.config.model
        return DummyLLM(seed=m.seed, round_=round_, system=run.sim.system_prompt(), schema=run.sim.answer_schema(),
                        latency_s=0.2)

    result = play(rounds=1, simulation="ratio-game", llm=slow_model)
    (host,) = rows(result, "host")
    # every call out at once for 0.2 s (overlapping calls count once)
    assert 0.2 <= host["model_wait_s"] < host["wall_s"] + 1e-9


def test_a_view_over_its_budget_is_said_once_per_run_naming_it():
    with capture_logs() as logs:
        result = play({"pad_bytes": 100_000}, rounds=3)
    said = [e for e in logs if e["event"] == "view_over_budget"]
    assert len(said) == 1  # 40 agents × 3 rounds of views over it: said once
    note = said[0]["note"]
    assert note.startswith("SlowEnv.view returned 98 KB for agent 0 in round 1; budget 64 KB")
    assert "POPULACE_VIEW_BUDGET_BYTES" in note
    assert said[0]["bytes"] == len('{"round":1,"history":[],"pad":""}') + 100_000
    hosts = rows(result, "host")
    assert [r["note"] for r in hosts] == [note, None, None]  # recorded with the round it was said in
    assert all(r["view_max_bytes"] == said[0]["bytes"] for r in hosts)
    assert hosts[0]["view_bytes"] == AGENTS * said[0]["bytes"]  # every view sized, its bytes all counted


def test_a_view_within_its_budget_is_not_said():
    with capture_logs() as logs:
        play({"pad_bytes": 100_000}, rounds=1, budget=200_000)
        play({"pad_bytes": 1000}, rounds=1)
    assert [e for e in logs if e["event"] == "view_over_budget"] == []


def test_an_observation_over_its_budget_is_said_once_by_the_environment():
    with capture_logs() as logs:
        result = play(rounds=3, simulation="ratio-game", budget=20)  # its observation: ~30 bytes
    said = [e for e in logs if e["event"] == "view_over_budget"]
    assert len(said) == 1
    assert said[0]["note"].startswith("RatioEnv.observe returned ")
    assert "for round 2 (every agent sees it)" in said[0]["note"]
    assert [r["note"] is not None for r in rows(result, "environment")] == [True, False, False]


def test_the_budget_setting_is_read_and_checked(monkeypatch):
    monkeypatch.setenv("POPULACE_VIEW_BUDGET_BYTES", "1000")
    assert budget_bytes() == 1000
    monkeypatch.setenv("POPULACE_VIEW_BUDGET_BYTES", "lots")
    with pytest.raises(ValueError, match="POPULACE_VIEW_BUDGET_BYTES: 'lots'"):
        budget_bytes()
    monkeypatch.delenv("POPULACE_VIEW_BUDGET_BYTES")
    assert budget_bytes() == 64 * 1024
    assert (human(1_258_291), human(65_536), human(900)) == ("1.2 MB", "64 KB", "900 B")


def test_a_timed_turn_counts_its_steps_not_its_waits():
    cost = RoundCost()

    async def turn():
        import time

        t = time.perf_counter()
        while time.perf_counter() - t < 0.01:
            pass
        await asyncio.sleep(0.2)  # waiting (the model): not the turn's
        return 7

    async def cancelled():
        await asyncio.sleep(10)

    async def main():
        assert await Timed(turn(), cost) == 7
        task = asyncio.ensure_future(Timed(cancelled(), cost))
        await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert cost.turns_timed == 2
    assert 0.01 <= cost.turn_timed_s < 0.2


def test_results_profile_reads_a_local_runs_rows_and_refuses_what_it_cannot_show(cli, tmp_path):
    """`populace run --local` records round_profile (its one process as host `local`, the
    environment, the recorder); `populace results RUN --profile` shows it, and refuses, in one
    line with exit 2, a flag it cannot show beside it or a run the file does not have."""
    scenario = tmp_path / "slow.yaml"
    scenario.write_text("simulation: slow_sims:SlowView\nagents: 40\nrounds: 2\nslow:\n  view_ms: 10\n")
    db = str(tmp_path / "p.duckdb")
    assert cli("run", scenario, "--local", "--db", db).returncode == 0
    res = cli("results", "last", "--profile", "--json", "--db", db)
    assert res.returncode == 0, res.stdout + res.stderr
    (run,) = json.loads(res.stdout)["runs"]
    assert [(r["round"], r["role"], r["host_id"]) for r in run["rows"]] == [
        (n, role, host) for n in (1, 2) for role, host in (("host", "local"), ("environment", "environment"),
                                                            ("recorder", "recorder"))]
    assert all(r["view_s"] >= 40 * 0.010 and r["agents"] == 40 for r in run["rows"] if r["role"] == "host")
    assert run["top"][0] == "view_s"  # 0.4 s of views a round: the top even on a loaded machine (0.08 s was not)
    for args, says in ((("--by", "education"), "--profile: not with --by"),
                       (("--round", "1"), "--profile: not with --round")):
        refused = cli("results", "last", "--profile", *args, "--db", db)
        assert refused.returncode == 2 and says in refused.stdout + refused.stderr
    unknown = cli("results", "no-such-run", "--profile", "--db", db)
    assert unknown.returncode == 2 and "run 'no-such-run' is not in" in unknown.stdout + unknown.stderr
