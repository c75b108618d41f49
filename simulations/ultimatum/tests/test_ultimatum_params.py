"""The scenario's `game:` and `prompt:` sections: validated by the simulation, every error
naming the field as the scenario wrote it; the declaration the platform records from."""

from __future__ import annotations

import pytest
from populace_ultimatum import Ultimatum
from populace_ultimatum.params import UltimatumParams
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import resolve


def error_of(**scenario) -> str:
    config = RunConfig.model_validate({"simulation": "ultimatum", "agents": 20, **scenario})
    with pytest.raises(ValidationError) as info:
        resolve(config)
    return format_validation_error(info.value)


def test_defaults_resolve():
    r = resolve(RunConfig(simulation="ultimatum", agents=12))
    assert r.simulation is Ultimatum
    game = r.params.game
    assert (game.pie, game.block, game.show_history) == (10, 100, True)
    assert r.params.prompt.answer == "direct" and r.params.prompt.persona is True
    assert r.config.params["game"]["block"] == 100  # normalised into the recorded config


@pytest.mark.parametrize(("game", "field"), [
    ({"pie": 0}, "game.pie: Input should be greater than or equal to 1"),
    ({"pie": 1_000_001}, "game.pie: Input should be less than or equal to 1000000"),
    ({"pie": 2.5}, "game.pie:"),
    ({"pie": "ten"}, "game.pie:"),
    ({"pie": True}, "game.pie: must be a whole number, not true/false"),
    ({"block": 3}, "game.block: 3 must be even (a block is cut into pairs)"),
    ({"block": 0}, "game.block: Input should be greater than or equal to 2"),
    ({"block": True}, "game.block: must be a whole number, not true/false"),
    ({"show_history": "sometimes"}, "game.show_history:"),
    ({"pies": 4}, "game.pies: unknown key"),
])
def test_bad_game_params_name_their_field(game, field):
    assert error_of(game=game).startswith(field)


def test_the_params_alone_refuse_an_odd_block():
    # not only a run's check: `UltimatumParams` itself (what the scenario's `game:` validates to)
    with pytest.raises(ValidationError, match="must be even"):
        UltimatumParams.model_validate({"game": {"block": 5}})


def test_bad_prompt_params_name_their_field():
    assert error_of(prompt={"answer": "essay"}).startswith("prompt.answer:")
    assert error_of(prompt={"persona": "yes please"}).startswith("prompt.persona:")
    assert error_of(prompt={"personas": True}).startswith("prompt.personas: unknown key")


def test_a_run_needs_a_pair():
    assert error_of(agents=1) == "agents: the ultimatum game needs at least 2 agents (a pair)"
    resolve(RunConfig(simulation="ultimatum", agents=2))


def test_an_odd_agent_count_and_a_block_larger_than_the_run_are_fine():
    r = resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": 7, "game": {"block": 100}}))
    assert r.instance().placement_unit() == 100
    r = resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": 7, "game": {"block": 2}}))
    assert r.instance().placement_unit() == 2  # fixed partners: a pair is placed whole


def test_chain_of_thought_gets_room_to_think():
    def tokens(**scenario) -> int:
        return resolve(RunConfig.model_validate({"simulation": "ultimatum", "agents": 2, **scenario})
                       ).config.model.max_tokens

    direct = tokens()
    assert tokens(prompt={"answer": "cot"}) == 256 != direct
    assert tokens(prompt={"answer": "cot"}, model={"max_tokens": 99}) == 99  # the scenario's own wins


def test_the_declaration_is_valid_with_an_acts_table():
    Ultimatum.check()
    t = Ultimatum.tables()
    assert (t.outcomes, t.rounds, t.acts, t.grouped) == ("ultimatum_outcomes", "ultimatum_rounds",
                                                         "ultimatum_acts", True)
    assert [(c.name, c.type) for c in t.outcome_columns] == [
        ("role", "VARCHAR"), ("partner", "BIGINT"), ("offer", "BIGINT"), ("accepted", "BOOLEAN"),
        ("payoff", "BIGINT")]
    assert [(c.name, c.type) for c in t.act_columns] == [("offer", "BIGINT"), ("accept", "BOOLEAN")]
    assert (t.measure, t.measure_kind) == ("offer", "numeric")
    assert [c.name for c in t.summary_columns] == ["pairs", "mean_offer", "offer_share", "acceptance_rate",
                                                   "mean_accepted_offer"]


def test_report_hints():
    params = UltimatumParams.model_validate({"game": {"pie": 100, "block": 10}})
    assert Ultimatum.measure_range(params) == (0.0, 100.0)
    assert Ultimatum.tables_for(params).measure_range == (0.0, 100.0)
    assert Ultimatum.describe(params) == "ultimatum game over 100 coins, pairs drawn again within blocks of 10"
    # the mean offer is drawn on the offers' histogram (the measure's scale); the rates over rounds
    assert Ultimatum.reference_columns == ("mean_offer",)
    assert Ultimatum.trend_columns == ("offer_share", "acceptance_rate")
