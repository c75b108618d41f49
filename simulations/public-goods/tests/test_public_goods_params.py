"""The scenario's `game:` and `prompt:` sections: validated by the simulation, every error
naming the field as the scenario wrote it; the declaration the platform records from."""

from __future__ import annotations

from fractions import Fraction

import pytest
from populace_public_goods import PublicGoods, PublicGoodsParams
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import resolve


def error_of(**scenario) -> str:
    config = RunConfig.model_validate({"simulation": "public-goods", "agents": 20, **scenario})
    with pytest.raises(ValidationError) as info:
        resolve(config)
    return format_validation_error(info.value)


def test_defaults_resolve():
    r = resolve(RunConfig(simulation="public-goods", agents=12))
    assert r.simulation is PublicGoods
    game = r.params.game
    assert (game.group_size, game.endowment, game.multiplier, game.history_window) == (5, 20, 1.6, 5)
    assert r.config.params["game"]["group_size"] == 5  # normalised into the recorded config


@pytest.mark.parametrize(("game", "field"), [
    ({"group_size": 1}, "game.group_size: Input should be greater than or equal to 2"),
    ({"group_size": 2.5}, "game.group_size:"),
    ({"endowment": 0}, "game.endowment: Input should be greater than or equal to 1"),
    ({"endowment": True}, "game.endowment: must be a number, not true/false"),
    ({"multiplier": 0}, "game.multiplier: Input should be greater than 0"),
    ({"multiplier": -1.5}, "game.multiplier: Input should be greater than 0"),
    ({"multiplier": float("inf")}, "game.multiplier:"),
    ({"history_window": 11}, "game.history_window: Input should be less than or equal to 10"),
    ({"multiplyer": 2}, "game.multiplyer: unknown key"),
])
def test_bad_game_params_name_their_field(game, field):
    assert error_of(game=game).startswith(field)


def test_bad_prompt_params_name_their_field():
    assert error_of(prompt={"answer": "essay"}).startswith("prompt.answer:")
    assert error_of(prompt={"population_note": True}).startswith("prompt.population_note: needs a `population`")


def test_a_group_larger_than_the_run_is_refused_naming_the_field():
    assert error_of(agents=4, game={"group_size": 5}) == (
        "game.group_size: 5 is more than the run's 4 agents (a group needs that many players)")
    resolve(RunConfig.model_validate({"simulation": "public-goods", "agents": 5, "game": {"group_size": 5}}))


def test_chain_of_thought_gets_room_to_think_unless_the_scenario_says_otherwise():
    cot = resolve(RunConfig.model_validate({"simulation": "public-goods", "agents": 5, "prompt": {"answer": "cot"}}))
    assert cot.config.model.max_tokens == 256
    given = resolve(RunConfig.model_validate({"simulation": "public-goods", "agents": 5,
                                              "prompt": {"answer": "cot"}, "model": {"max_tokens": 99}}))
    assert given.config.model.max_tokens == 99
    direct = resolve(RunConfig(simulation="public-goods", agents=5))
    assert direct.config.model.max_tokens == RunConfig().model.max_tokens  # the platform's default


def test_the_multiplier_is_the_decimal_the_scenario_wrote():
    assert PublicGoodsParams.model_validate({"game": {"multiplier": 1.6}}).game.multiplier_fraction == Fraction(8, 5)
    assert PublicGoodsParams.model_validate({"game": {"multiplier": 3}}).game.multiplier_fraction == 3


def test_the_declaration_is_valid_and_grouped():
    PublicGoods.check()
    t = PublicGoods.tables()
    assert (t.outcomes, t.rounds, t.grouped) == ("public_goods_outcomes", "public_goods_rounds", True)
    assert [(c.name, c.type) for c in t.outcome_columns] == [("contribution", "BIGINT"), ("payoff", "DOUBLE")]
    assert (t.measure, t.measure_kind) == ("contribution", "numeric")
    assert [c.name for c in t.summary_columns] == ["mean_contribution", "mean_payoff", "total_contribution",
                                                   "groups", "free_riders", "full_contributors"]
    titles = {name: f.title for name, f in PublicGoods.Summary.model_fields.items()}
    assert all(titles.values()), titles  # every summary column has a table label


def test_report_hints():
    params = PublicGoodsParams.model_validate({"game": {"endowment": 10, "multiplier": 1.6, "group_size": 4}})
    assert PublicGoods.measure_range(params) == (0.0, 10.0)
    assert PublicGoods.equilibrium(params) == 0.0  # 1.6 < 4: free riding
    assert PublicGoods.equilibrium(params.model_copy(update={"game": params.game.model_copy(
        update={"multiplier": 5.0})})) == 10.0
