"""Issue 23, bad input: a world column of the wrong type or length, a view that raises, an edge edit
naming an agent that does not exist or a kind not declared. Each is the simulation's bug (not the
model's answer, not the infrastructure): the round stops, the run pauses naming the simulation,
the field and the round, and the rounds before stay as they were."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest

from populace.core.contracts import RunConfig
from populace.sdk.engine import DecideFailed, RuleBroken, WorldRefused
from populace.sdk.llm import InferError
from populace.sdk.local import run_local
from populace.sdk.play import RoundPaused
from populace.sdk.registry import resolve
from populace.sdk.testing import check_resume

sys.path.insert(0, str(Path(__file__).parents[1] / "e2e" / "sims"))
from bad_input_sims import Board, BoardEnv, Ledger


def buggy(bug: str) -> type[Ledger]:
    return type(f"Ledger_{bug}", (Ledger,), {"bug_name": bug})


def play(sim: type[Ledger], agents: int = 20, rounds: int = 3, hosts: int = 2, on_round=None):
    resolved = resolve(RunConfig(simulation="bad_input_sims:Ledger", agents=agents, rounds=rounds, seed=3), sim)
    return asyncio.run(run_local(resolved, hosts=hosts, on_round=on_round))


CASES = {
    "world_type": (WorldRefused, r"simulation 'ledger': its world after round 2 is refused: Board\.score: float64 "
                                 r"values do not fit a int32 column"),
    "world_length": (WorldRefused, r"simulation 'ledger': its world after round 2 is refused: Board\.score: 19 values, "
                                   r"but its size 'agents' is 20"),
    "view": (RoundPaused, r"simulation 'ledger': BoardEnv\.view raised in round 2 for agent 7: KeyError: "
                          r"'no such post for agent 7'"),
    "edge_kind": (RoundPaused, r"simulation 'ledger', round 2, agent 7: outcome\.edits\[0\]: edge kind 'like' is "
                               r"not declared \(follow\)"),
    "edge_agent": (RoundPaused, r"simulation 'ledger', round 2, agent 7: outcome\.edits\[0\]: agent 23 does not "
                                r"exist \(the run has 20 agents\)"),
    "claim": (RuleBroken, r"^simulation 'ledger': round 2: claims: agent 7 claims cell 21, which does not exist "
                          r"\(cells are 0\.\.15\)$"),
    "invariant": (RuleBroken, r"^simulation 'ledger': invariant 'no score below zero' is broken after round 2: "
                              r"\[7, 11\]$"),
    "invariant_raises": (RuleBroken, r"^simulation 'ledger': invariant 'no score below zero' raised after round 2: "
                                     r"ZeroDivisionError: division by zero$"),
    "shown_item": (RoundPaused, r"simulation 'ledger', round 2, agent 7: shown\.items: 9999 is not in the round's "
                                r"Board\.cells"),
    "shown_twice": (RoundPaused, r"simulation 'ledger': BoardEnv\.view raised in round 2 for agent 7: ShownError: "
                                 r"shown\.items: item 109 is shown twice"),
}


@pytest.mark.parametrize("bug", sorted(CASES))
def test_bad_input_pauses_the_run_naming_simulation_field_and_round(bug):
    kind, message = CASES[bug]
    closed: list[int] = []
    with pytest.raises(kind, match=message) as caught:
        play(buggy(bug), on_round=lambda n, row: closed.append(n))
    # the simulation's bug, resumable once fixed: neither the model's answer nor the infrastructure
    assert isinstance(caught.value, RoundPaused) and not isinstance(caught.value, InferError)
    assert closed == [1]  # round 1 closed and stays; round 2 never closed


def test_a_world_whose_agents_size_is_not_the_runs_is_refused_before_round_1():
    class ShortEnv(BoardEnv):
        def start_world(self, state):
            n = self.sim.agents - 1
            return Board({"agents": n, "cells": 4}, score=np.zeros(n, dtype=np.int32))

    sim = type("Short", (Ledger,), {"Env": ShortEnv})
    with pytest.raises(WorldRefused, match=r"simulation 'ledger': ShortEnv\.start_world\(\) gave a world whose size "
                                           r"'agents' is 19, but the run has 20 agents"):
        play(sim)


def test_a_world_of_the_wrong_type_before_round_1_is_refused_naming_the_column():
    class FloatEnv(BoardEnv):
        def start_world(self, state):
            n = self.sim.agents
            return Board({"agents": n, "cells": 4}, score=np.full(n, 0.5))

    sim = type("Floats", (Ledger,), {"Env": FloatEnv})
    with pytest.raises(WorldRefused, match=r"its world before round 1 is refused: Board\.score: float64 values do not "
                                           r"fit a int32 column") as caught:
        play(sim)
    assert isinstance(caught.value, DecideFailed)  # the environment service folds it as it folds decide's errors


def test_edits_from_a_simulation_that_declares_no_edge_kinds_are_refused_not_dropped():
    sim = type("NoKinds", (Ledger,), {"edge_kinds": ()})

    def no_follows(self, agent_id, kind=None):
        return ()

    sim.following = no_follows  # type: ignore[method-assign]
    with pytest.raises(RoundPaused, match=r"simulation 'ledger', round 1, agent \d+: outcome\.edits: the simulation "
                                          r"declares no edge kinds"):
        play(sim)


def test_an_edit_whose_author_is_not_a_whole_number_is_the_simulations_bug():
    from populace.sdk.edges import EdgeBook, EdgeError, Edit

    with pytest.raises(EdgeError, match=r"agent '3' does not exist"):
        EdgeBook(10, ("follow",)).check(1, [Edit("add", "3")], "ledger", 2)  # type: ignore[arg-type]


def test_the_fixed_simulation_resumes_exactly_after_the_round_the_bug_stopped():
    check_resume(Ledger, {"agents": 20, "rounds": 3, "seed": 3}, hosts=2)


def test_a_local_run_with_bad_input_names_the_bug_and_keeps_the_rounds_it_closed():
    from populace.client.api import simulate

    result = simulate(RunConfig(simulation="bad_input_sims:ViewBug", agents=20, rounds=3), local=True)
    assert result.status == "failed"
    assert result.reason.startswith("simulation 'ledger': BoardEnv.view raised in round 2 for agent 7: KeyError"), \
        result.reason
    assert "fix the simulation" in result.reason
    assert "engine.py" not in result.reason and "play.py" not in result.reason  # where the author's code raised
    assert result.rounds.column("round").to_pylist() == [1]


# -- a world too large for the hosts' memory is refused before the run starts ----------------------
def test_a_world_that_would_not_fit_a_hosts_memory_is_refused_before_the_run_with_the_estimate():
    from populace.client.prepare import checked
    from populace.core.scenario import ScenarioError

    town = RunConfig(simulation="schelling", agents=1000, rounds=1, grid={"width": 100_000, "height": 100_000})
    with pytest.raises(ScenarioError, match=r"world: the run needs about 37\.3 GiB on each agent-host "
                                            r"\(Town\.occupant \(int32 × cells 10,000,000,000\) = 37\.3 GiB, "
                                            r"Town\.cell \(int32 × agents 1,000\) = 3\.9 KiB"):
        checked(town)


def test_the_memory_estimate_counts_every_column_and_the_agents_a_host_takes(monkeypatch):
    from populace.client.prepare import check_memory, checked
    from populace.core.scenario import ScenarioError

    monkeypatch.setenv("POPULACE_HOST_CAPACITY", "1000")
    config = RunConfig(simulation="bad_input_sims:Ledger", agents=5000, rounds=1, cells=1_000_000)
    resolved = resolve(config, Ledger)
    # 1,000,000 cells × 8 B + 5,000 scores × 4 B + (at most) 1,000 agents on a host × 1,024 B
    need = 8_000_000 + 20_000 + 1_024_000
    check_memory(resolved, memory=need)  # fits exactly
    with pytest.raises(ScenarioError, match=r"Board\.cells \(int64 × cells 1,000,000\) = 7\.6 MiB, Board\.score "
                                            r"\(int32 × agents 5,000\) = 19\.5 KiB, 1,000 agents × 1,024 B = 1,000\.0 KiB"):
        check_memory(resolved, memory=need - 1)
    monkeypatch.setenv("POPULACE_HOST_MEMORY_BYTES", str(need - 1))
    with pytest.raises(ScenarioError, match=r"more than the 8\.6 MiB a host has \(POPULACE_HOST_MEMORY_BYTES"):
        checked(config)


def test_populace_validate_refuses_a_grid_too_large_for_memory(tmp_path):
    import subprocess

    scenario = tmp_path / "town.yaml"
    scenario.write_text("simulation: schelling\nagents: 1000\ngrid: {width: 100000, height: 100000}\n")
    res = subprocess.run([sys.executable, "-m", "populace.cli", "validate", str(scenario)], capture_output=True,
                         text=True, timeout=120)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "world: the run needs about 37.3 GiB on each agent-host" in res.stdout + res.stderr
