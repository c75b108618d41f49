"""Sugarscape's rules alone (pure functions and the environment's decide on a landscape built by
hand): the landscape and its growback, what an agent sees (vision along the lattice, free cells
only, the most sugar next round, the nearest on a tie, its own cell when nothing is better),
harvest and metabolism, starvation, the moves granted by claims (two after one cell: one moves,
the other stays), replacement, the Gini coefficient, and the parameters refused by name."""

from __future__ import annotations

import numpy as np
import pytest
from populace_sugarscape import Sugarscape
from populace_sugarscape.rules import capacity, gini, newcomers, regrow, settle, sight
from populace_sugarscape.simulation import Claimed, Landscape
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.sdk import Claims, resolve
from populace.sdk.space import EMPTY, Grid


def test_the_landscape_peaks_where_asked_and_falls_a_level_every_step_away():
    g = Grid(11, 11, torus=False)
    cap = capacity(g, [(0.5, 0.5)], top=4, reach=0.4)  # a level every 0.4 × 11 / 4 = 1.1 cells
    assert cap[g.cell(5, 5)] == 4 and cap.max() == 4
    assert [int(cap[g.cell(5 + d, 5)]) for d in range(6)] == [4, 4, 3, 2, 1, 0]  # distances 0, 1, 2 …
    assert cap[g.cell(0, 0)] == 0 and cap.dtype == np.int16
    # on a torus the shorter way round: a peak at the edge reaches the other edge
    t = capacity(Grid(10, 10, torus=True), [(0.0, 0.0)], top=4, reach=0.4)
    assert t[Grid(10, 10).cell(9, 0)] == t[Grid(10, 10).cell(1, 0)] == 3


def test_sugar_grows_back_by_the_rate_up_to_each_cell_s_capacity():
    level = np.array([0, 1, 3, 4], dtype=np.int16)
    cap = np.array([4, 4, 4, 4], dtype=np.int16)
    assert regrow(level, cap, 1).tolist() == [1, 2, 4, 4]
    assert regrow(level, cap, 10).tolist() == [4, 4, 4, 4]  # immediate growback
    assert regrow(level, cap, 0).tolist() == level.tolist()


def test_each_living_agent_harvests_its_cell_burns_its_metabolism_and_starves_at_zero():
    level = np.array([3, 0, 2, 5], dtype=np.int16)
    cell = np.array([0, 1, 2, -1])
    wealth = np.array([1, 2, 5, 9])
    metabolism = np.array([4, 2, 1, 1])
    alive = np.array([True, True, True, False])
    after, rich, starved = settle(level, cell, wealth, metabolism, alive)
    assert rich.tolist() == [0, 0, 6, 9]  # 1+3-4, 2+0-2, 5+2-1; the departed keeps what it had
    assert starved.tolist() == [0, 1]  # none left (zero counts)
    assert after.tolist() == [0, 0, 0, 5]  # harvested where someone stands
    assert level.tolist() == [3, 0, 2, 5]  # pure


def test_an_agent_sees_along_the_lattice_as_far_as_its_vision_the_most_sugar_first_then_its_own_cell():
    g = Grid(7, 7, torus=False)
    level = np.zeros(g.cells, dtype=np.int16)
    cap = np.full(g.cells, 4, dtype=np.int16)
    here = g.cell(3, 3)
    level[g.cell(3, 1)] = 3  # two north: 3 + 1 = 4 next round
    level[g.cell(5, 3)] = 3  # two east: 4 too, but east comes after north in the order of offsets
    level[g.cell(4, 3)] = 1  # one east: 2
    level[g.cell(4, 4)] = 3  # diagonal: never seen
    level[g.cell(3, 6)] = 3  # three south: beyond a vision of 2
    occupant = np.full(g.cells, EMPTY)
    occupant[here] = 0
    occupant[g.cell(2, 3)] = 1  # one west: occupied, never an option
    options, worth = sight(g, np.array([here]), np.array([2]), level, cap, occupant, rate=1, choices=4)
    row = options[0]
    # strictly better than staying (its own cell: harvested now, then 1): 4, 4, 2; then its own
    assert row.tolist() == [g.cell(3, 1), g.cell(5, 3), g.cell(4, 3), here, EMPTY]
    assert worth[0].tolist() == [4, 4, 2, 1, EMPTY]
    # at most `choices` before its own; with a vision of 3 the southern cell joins the 4s (farther)
    options, _ = sight(g, np.array([here]), np.array([3]), level, cap, occupant, rate=1, choices=2)
    assert options[0].tolist() == [g.cell(3, 1), g.cell(5, 3), here]
    # nothing better than staying: its own cell only
    flat = np.zeros(g.cells, dtype=np.int16)
    options, _ = sight(g, np.array([here]), np.array([2]), flat, cap, occupant, rate=1, choices=4)
    assert options[0].tolist() == [here, EMPTY, EMPTY, EMPTY, EMPTY]


def env_of(agents: int, **params):
    config = RunConfig.model_validate({"simulation": "sugarscape", "agents": agents, "rounds": 2, "seed": 1,
                                       "grid": {"width": 5, "height": 5, "torus": False},
                                       "sugar": {"max": 4, "peaks": [[0.5, 0.5]], "reach": 2.0}, **params})
    resolved = resolve(config)
    return resolved.simulation.Env(resolved.instance())


def landscape(env, cells: list[int], wealth: list[int], metabolism: list[int], level: np.ndarray | None = None):
    n = len(cells)
    occupant = np.full(env.grid.cells, EMPTY, dtype=np.int32)
    occupant[cells] = np.arange(n)
    return Landscape({"agents": n, "cells": env.grid.cells}, cell=cells, alive=np.ones(n, dtype=bool),
                     wealth=wealth, vision=[1] * n, metabolism=metabolism,
                     level=env.capacity.copy() if level is None else level, occupant=occupant)


def test_two_claimants_of_one_cell_move_one_the_other_stays_and_the_starved_leave_the_landscape():
    env = env_of(3)
    world = landscape(env, [0, 2, 24], wealth=[10, 10, 1], metabolism=[1, 1, 4])
    total = Claimed(agents=3, claims=Claims.ranked([0, 1, 2], [[1, 0], [1, 2], [23, 24]]))
    state, summary, after, changes = env.decide(env.start(), 1, total, world)
    assert sorted(after.cell.tolist()[:2]).count(1) == 1  # one of the two moved to cell 1
    stayed = 1 if after.cell[0] == 1 else 0
    assert after.cell[stayed] == world.cell[stayed]
    # agent 2 starved where it stood (1 + its cell's sugar - 4 <= 0): gone, its claim dropped, its cell free
    assert changes.departed.tolist() == [2] and after.alive.tolist() == [True, True, False]
    assert after.cell[2] == EMPTY and after.occupant[24] == EMPTY and after.occupant[23] == EMPTY
    assert summary.died == 1 and summary.moved == 1 and summary.blocked == 1 and summary.living == 2
    env.population = env.population.after(changes, 1)
    assert env.own_cell(state, after) is None and len(env.living(state, after)) == 0
    assert len(env.fed(state, after)) == 0


def test_replacement_gives_each_starved_agent_a_newcomer_on_a_free_cell_with_fresh_traits():
    env = env_of(2, rule={"replacement": True}, traits={"vision": 1, "metabolism": 2, "endowment": [3, 3]})
    world = landscape(env, [0, 12], wealth=[1, 1], metabolism=[2, 2], level=np.zeros(25, dtype=np.int16))
    _, summary, after, changes = env.decide(env.start(), 1, Claimed(), world)
    assert changes.departed.tolist() == [0, 1] and changes.births == 2
    assert summary.born == 2 and summary.living == 2 and after.sizes["agents"] == 4
    assert after.alive.tolist() == [False, False, True, True] and after.wealth[2:].tolist() == [3, 3]
    assert after.metabolism[2:].tolist() == [2, 2]
    assert after.occupant[after.cell[2]] == 2 and after.occupant[after.cell[3]] == 3
    env.population = env.population.after(changes, 1)
    assert env.own_cell(None, after) is None and len(env.living(None, after)) == 0
    # no room: fewer newcomers than asked
    cells, drawn = newcomers(np.random.default_rng(1), 5, np.array([0, EMPTY, 1]), {"vision": (1, 1)})
    assert cells.tolist() == [1] and drawn["vision"].tolist() == [1]


def test_the_gini_coefficient_is_exact():
    assert gini(np.array([5, 5, 5])) == 0.0
    assert gini(np.array([0, 0, 0, 10])) == 0.75
    assert gini(np.array([1, 2, 3, 4])) == 0.25
    assert gini(np.array([], dtype=np.int64)) is None


@pytest.mark.parametrize("data, says", [
    ({"traits": {"vision": [4, 2]}}, r"traits.vision\n.*\[4, 2\] is not a range within \[1, 50\]"),
    ({"sugar": {"peaks": [[1.5, 0.5]]}}, r"sugar.peaks\n.*peak 0, \(1.5, 0.5\), is not on the grid"),
    ({"rule": {"choices": 0}}, "rule.choices"),
    ({"grid": {"width": 0, "height": 5}}, r"grid.width\n.*greater than or equal to 2"),
    ({"rule": {"decider": "rules"}}, r"rule.decider\n.*'rule' or 'llm'"),
    ({"grid": {"width": 5, "height": 5, "depth": 2}}, r"grid.depth\n.*Extra inputs"),
    ({"agents": 30}, "agents: 30 agents do not fit the grid's 25 cells"),
    ({"grid": {"width": 5, "height": 5, "torus": True}}, "traits.vision: 6 is too far on a 5×5 torus"),
])
def test_a_bad_parameter_is_refused_naming_its_field(data, says):
    base = {"simulation": "sugarscape", "agents": 10, "rounds": 1, "grid": {"width": 5, "height": 5,
                                                                              "torus": False}}
    with pytest.raises(ValidationError, match=says):
        resolve(RunConfig.model_validate({**base, **data}))


def test_the_model_is_offered_the_cells_in_sight_and_one_outside_them_stays():
    sim = resolve(RunConfig.model_validate({"simulation": "sugarscape", "agents": 3, "rounds": 1,
                                            "grid": {"width": 20, "height": 20},
                                            "rule": {"decider": "llm"}})).instance()
    assert isinstance(sim, Sugarscape) and sim.answer_schema()["properties"]["move"]["maximum"] == 4
    from populace_sugarscape.simulation import Sight
    obs = Sight(1, 45, 2, 10, 3, 2, (5, 47, 45), (4, 3, 1))
    text = sim.prompt(obs)
    assert "0: 2 cells north, 4 sugar next round" in text and "1: 2 cells east, 3 sugar" in text
    assert "2: stay where you are, 1 sugar" in text
