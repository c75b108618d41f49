"""The scenario's `game:` and `prompt:` sections: validated by the simulation, every error naming
the field as the scenario wrote it; the tables the platform records from the declaration."""

from __future__ import annotations

from fractions import Fraction

import pytest
from populace_punishment import Punishment
from populace_punishment.params import PunishmentParams
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import resolve


def error_of(agents: int = 20, **scenario) -> str:
    config = RunConfig.model_validate({"simulation": "punishment", "agents": agents, **scenario})
    with pytest.raises((ValidationError, ValueError)) as info:
        resolve(config)
    err = info.value
    return format_validation_error(err) if isinstance(err, ValidationError) else str(err)


def test_defaults_are_fehr_and_gaechters_design():
    r = resolve(RunConfig(simulation="punishment", agents=12))
    assert r.simulation is Punishment
    g = r.params.game
    assert (g.group_size, g.block, g.endowment, g.multiplier, g.max_points, g.cost, g.fine, g.show_history) == (
        4, 100, 20, 1.6, 10, 1, 3, True)
    assert g.multiplier_fraction == Fraction(8, 5)
    assert r.params.prompt.answer == "direct" and r.params.prompt.persona is True
    assert r.config.params["game"]["block"] == 100  # normalised into the recorded config
    assert r.config.model.max_tokens == 48  # three letters' points fit the default budget


@pytest.mark.parametrize(("game", "field"), [
    ({"group_size": 1}, "game.group_size: Input should be greater than or equal to 2"),
    ({"group_size": 28}, "game.group_size: Input should be less than or equal to 27"),
    ({"group_size": True}, "game.group_size:"),
    ({"group_size": 2.5}, "game.group_size:"),
    ({"block": 10}, "game.block: must be a multiple of game.group_size (4): a block is cut into groups (got 10)"),
    ({"group_size": 5, "block": 12}, "game.block: must be a multiple of game.group_size (5): a block is cut into groups (got 12)"),
    ({"block": 0}, "game.block: Input should be greater than or equal to 2"),
    ({"endowment": 0}, "game.endowment: Input should be greater than or equal to 1"),
    ({"multiplier": 0}, "game.multiplier: Input should be greater than 0"),
    ({"multiplier": "inf"}, "game.multiplier:"),
    ({"max_points": -1}, "game.max_points: Input should be greater than or equal to 0"),
    ({"max_points": 1001}, "game.max_points: Input should be less than or equal to 1000"),
    ({"cost": -1}, "game.cost: Input should be greater than or equal to 0"),
    ({"fine": 1.5}, "game.fine:"),
    ({"fine": True}, "game.fine:"),
    ({"show_history": "sometimes"}, "game.show_history:"),
    ({"punish": 4}, "game.punish: unknown key"),
])
def test_bad_game_params_name_their_field(game, field):
    assert error_of(game=game).startswith(field), error_of(game=game)


def test_the_params_alone_refuse_a_block_that_is_not_whole_groups():
    with pytest.raises(ValidationError, match="must be a multiple of game.group_size"):
        PunishmentParams.model_validate({"game": {"group_size": 3, "block": 10}})


def test_bad_prompt_params_name_their_field():
    assert error_of(prompt={"answer": "essay"}).startswith("prompt.answer:")
    assert error_of(prompt={"persona": "yes please"}).startswith("prompt.persona:")


def test_a_run_needs_a_whole_group():
    assert "game.group_size: 4 is more than the run's 3 agents" in error_of(agents=3)
    assert resolve(RunConfig.model_validate({"simulation": "punishment", "agents": 2,
                                             "game": {"group_size": 2, "block": 2}})).params.game.group_size == 2


def test_the_answer_budget_has_room_for_every_members_points():
    big = resolve(RunConfig.model_validate({"simulation": "punishment", "agents": 30,
                                            "game": {"group_size": 27, "block": 27}}))
    assert big.config.model.max_tokens == 8 + 6 * 26
    cot = resolve(RunConfig.model_validate({"simulation": "punishment", "agents": 30, "prompt": {"answer": "cot"}}))
    assert cot.config.model.max_tokens == 256 + 8 + 6 * 3
    mine = resolve(RunConfig.model_validate({"simulation": "punishment", "agents": 30, "model": {"max_tokens": 30},
                                             "prompt": {"answer": "cot"}}))
    assert mine.config.model.max_tokens == 30  # the scenario's own setting wins


def test_the_tables_are_declared_from_the_outcome_act_and_summary():
    t = Punishment.tables_for(PunishmentParams())
    assert (t.outcomes, t.rounds, t.acts, t.measure, t.measure_kind, t.measure_range) == (
        "punishment_outcomes", "punishment_rounds", "punishment_acts", "contribution", "numeric", (0.0, 20.0))
    assert [(c.name, c.type) for c in t.outcome_columns] == [
        ("contribution", "BIGINT"), ("group_total", "BIGINT"), ("group_size", "BIGINT"), ("points_given", "BIGINT"),
        ("points_antisocial", "BIGINT"), ("points_received", "BIGINT"), ("payoff", "DOUBLE"),
        ("punish_valid", "BOOLEAN")]
    assert [(c.name, c.type) for c in t.act_columns] == [("contribution", "BIGINT"), ("targets", "BIGINT[]"),
                                                         ("points", "BIGINT[]")]
    assert [c.name for c in t.summary_columns] == ["mean_contribution", "mean_payoff", "free_riders", "punish_answers",
                                                   "share_punishing", "mean_points", "antisocial_share"]
    assert t.grouped and Punishment.equilibrium(PunishmentParams()) == 0.0
    Punishment.check()
