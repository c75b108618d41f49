"""Schelling's world rules (issue 37), on a town built by hand: a nearby mover's option is the empty
cell within its radius with the largest share of its kind (itself not counted), two movers after
one cell get one move between them (the other stays, and the town keeps each resident on its own
cell), and `ask: unhappy` selects exactly the residents a turn would find unhappy."""

from __future__ import annotations

import asyncio

import numpy as np
from populace_schelling import Schelling
from populace_schelling.simulation import Counts, Town

from populace.core.contracts import RunConfig
from populace.sdk import Claims, resolve
from populace.sdk.local import run_local
from populace.sdk.space import EMPTY


def env_of(agents: int, rule: dict, width: int = 5, height: int = 5, torus: bool = False):
    config = RunConfig.model_validate({"simulation": "schelling", "agents": agents, "rounds": 1, "seed": 1,
                                       "grid": {"width": width, "height": height, "torus": torus},
                                       "rule": {"threshold": 0.5, **rule}})
    resolved = resolve(config)
    return resolved.simulation.Env(resolved.instance())


def town(env, cells: list[int], kinds: list[int]) -> Town:
    occupant = np.full(env.grid.cells, EMPTY, dtype=np.int32)
    occupant[cells] = np.arange(len(cells))
    return env._town({"agents": len(cells), "cells": env.grid.cells}, np.asarray(cells, dtype=np.int32),
                     np.asarray(kinds, dtype=np.int8), occupant)


def test_a_nearby_mover_sees_the_empty_cell_with_the_most_of_its_kind_around_it_itself_not_counted():
    env = env_of(4, {"move": "nearby", "radius": 1})
    g = env.grid
    # 5×5, no wrap: agent 0 (kind 0) at (2,2) between agents 1 and 2 (kind 1); agent 3 (kind 0) at (4,4)
    world = town(env, [g.cell(2, 2), g.cell(1, 2), g.cell(3, 2), g.cell(4, 4)], [0, 1, 1, 0])
    assert world.unhappy.tolist() == [True, True, True, False]
    # around (2,2), only (3,3) has one of its kind (agent 3) among its neighbours other than itself
    assert env._nearby(world)[0] == g.cell(3, 3)
    assert env._nearby(world)[3] == EMPTY  # content: not a mover


def test_two_movers_after_one_cell_move_one_the_other_stays_and_each_resident_keeps_its_own_cell():
    env = env_of(3, {"move": "nearby"})
    world = town(env, [0, 2, 4], [0, 1, 0])
    total = Counts(agents=3, unhappy=2, claims=Claims.of([0, 2], [1, 1]))
    _, summary, after = env.decide(env.start(), 1, total, world)
    assert summary.moved == 1 and sorted(after.cell.tolist()).count(1) == 1
    stayed = 2 if after.cell[0] == 1 else 0
    assert after.cell[stayed] == world.cell[stayed]
    assert env.own_cell(None, after) is None


def test_ask_unhappy_selects_the_residents_a_turn_would_find_unhappy():
    result = asyncio.run(run_local(RunConfig.model_validate(
        {"simulation": "schelling", "agents": 300, "rounds": 3, "seed": 4, "grid": {"width": 20, "height": 20},
         "rule": {"threshold": 0.5, "ask": "unhappy"}})))
    moved = result.rounds["moved"]
    assert all(result.outcomes["move"])  # by the rule, every resident asked wants to move
    assert moved[0] <= result.rounds["n"][0] and result.rounds["n"][2] < 300
    every = asyncio.run(run_local(RunConfig.model_validate(
        {"simulation": "schelling", "agents": 300, "rounds": 3, "seed": 4, "grid": {"width": 20, "height": 20},
         "rule": {"threshold": 0.5}})))
    # the same residents move to the same cells: the content ones only sat out their turns
    assert result.rounds["moved"] == every.rounds["moved"]
    assert result.rounds["like_share"] == every.rounds["like_share"]
    unhappy = [(r, a) for r, a, m in zip(every.outcomes["round"], every.outcomes["agent_id"], every.outcomes["move"]) if m]
    assert list(zip(result.outcomes["round"], result.outcomes["agent_id"])) == unhappy
    assert Schelling.describe(resolve(result.config).params).endswith("only the unhappy take a turn")
