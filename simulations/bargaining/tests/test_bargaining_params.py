"""The scenario's `game:` and `prompt:` sections: validated by the simulation, every error
naming the field as the scenario wrote it; the declaration the platform records from."""

from __future__ import annotations

import pytest
from populace_bargaining import Bargaining
from populace_bargaining.params import BargainingParams
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import resolve


def error_of(**scenario) -> str:
    config = RunConfig.model_validate({"simulation": "bargaining", "agents": 20, **scenario})
    with pytest.raises(ValidationError) as info:
        resolve(config)
    return format_validation_error(info.value)


def test_defaults_resolve():
    r = resolve(RunConfig(simulation="bargaining", agents=12))
    assert r.simulation is Bargaining
    game = r.params.game
    assert (game.pie, game.turns, game.say_chars, game.block, game.show_history) == (10, 6, 200, 100, True)
    assert r.params.prompt.answer == "direct" and r.params.prompt.persona is True
    assert r.config.params["game"]["turns"] == 6  # normalised into the recorded config


@pytest.mark.parametrize(("game", "field"), [
    ({"pie": 0}, "game.pie: Input should be greater than or equal to 1"),
    ({"pie": 2.5}, "game.pie:"),
    ({"pie": True}, "game.pie: must be a whole number, not true/false"),
    ({"turns": 1}, "game.turns: Input should be greater than or equal to 2"),
    ({"turns": 21}, "game.turns: Input should be less than or equal to 20"),
    ({"say_chars": 5}, "game.say_chars: Input should be greater than or equal to 10"),
    ({"block": 3}, "game.block: 3 must be even (a block is cut into pairs)"),
    ({"block": 0}, "game.block: Input should be greater than or equal to 2"),
    ({"turn": 4}, "game.turn: unknown key"),
])
def test_bad_game_params_name_their_field(game, field):
    assert error_of(game=game).startswith(field)


def test_bad_prompt_params_name_their_field():
    assert error_of(prompt={"answer": "essay"}).startswith("prompt.answer:")
    assert error_of(prompt={"personas": True}).startswith("prompt.personas: unknown key")


def test_a_run_needs_a_pair():
    assert error_of(agents=1) == "agents: bargaining needs at least 2 agents (a pair)"
    resolve(RunConfig(simulation="bargaining", agents=2))


def test_an_odd_turn_count_and_a_block_larger_than_the_run_are_fine():
    r = resolve(RunConfig.model_validate({"simulation": "bargaining", "agents": 7, "game": {"turns": 5}}))
    assert r.params.game.turns == 5 and r.instance().placement_unit() == 100


def test_the_answer_budget_fits_the_longest_message_and_chain_of_thought_gets_room_to_think():
    def tokens(**scenario) -> int:
        return resolve(RunConfig.model_validate({"simulation": "bargaining", "agents": 2, **scenario})
                       ).config.model.max_tokens

    assert tokens() == 32 + 67  # 200 characters at 3 a token, and the JSON around them
    assert tokens(game={"say_chars": 20}) == 32 + 7
    assert tokens(prompt={"answer": "cot"}) == 256 + 32 + 67
    assert tokens(prompt={"answer": "cot"}, model={"max_tokens": 99}) == 99  # the scenario's own wins


def test_the_declaration_is_valid_with_an_acts_table():
    Bargaining.check()
    t = Bargaining.tables()
    assert (t.outcomes, t.rounds, t.acts, t.grouped) == ("bargaining_outcomes", "bargaining_rounds",
                                                         "bargaining_acts", True)
    assert [(c.name, c.type) for c in t.outcome_columns] == [
        ("role", "VARCHAR"), ("partner", "BIGINT"), ("deal", "BOOLEAN"), ("share", "BIGINT"), ("turns", "BIGINT")]
    assert [(c.name, c.type) for c in t.act_columns] == [
        ("say", "VARCHAR"), ("propose", "BIGINT"), ("accept", "BOOLEAN")]
    assert (t.measure, t.measure_kind) == ("share", "numeric")
    assert [c.name for c in t.summary_columns] == ["pairs", "deals", "deal_rate", "mean_turns", "mean_turns_to_deal",
                                                   "mean_first_share", "first_share_of_pie", "unmatched"]
    titles = {name: f.title for name, f in Bargaining.Summary.model_fields.items()}
    assert all(titles.values()), titles  # every summary column has a table label


def test_report_hints():
    params = BargainingParams.model_validate({"game": {"pie": 100, "turns": 4, "block": 10}})
    assert Bargaining.measure_range(params) == (0.0, 100.0)
    assert Bargaining.tables_for(params).measure_range == (0.0, 100.0)
    assert Bargaining.describe(params) == ("bargaining over 100 coins in at most 4 messages, pairs drawn again "
                                           "within blocks of 10")
