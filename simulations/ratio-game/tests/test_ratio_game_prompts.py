"""The prompt library: the paper's variants as pure functions of the scenario."""

from __future__ import annotations

import pytest
from populace_ratio_game.params import GameConfig, PromptConfig
from populace_ratio_game.parsing import parse_guess
from populace_ratio_game.prompts import ANSWER_INSTRUCTIONS, SYSTEM_FAMILIES, answer_schema, system_prompt, user_prompt


@pytest.mark.parametrize("ratio", ["2/3", "51/100", "0.5"])
def test_ratio_is_shown_as_written(ratio):
    assert f"closest to {ratio} of the average" in system_prompt(GameConfig(ratio=ratio))


def test_offset_variant_states_the_offset():
    text = system_prompt(GameConfig(ratio="1/2", offset=5))
    assert "closest to 5 plus 1/2 of the average" in text


@pytest.mark.parametrize("family", ["rational", "strategies", "variant"])
def test_each_family_adds_its_sentence_to_the_basic_rules(family):
    game = GameConfig()
    basic = system_prompt(game, PromptConfig(system="basic"))
    text = system_prompt(game, PromptConfig(system=family))
    assert SYSTEM_FAMILIES[family] in text and SYSTEM_FAMILIES[family] not in basic
    assert text.startswith(basic.split(" Report your number")[0])


def test_families_are_distinct():
    texts = {system_prompt(GameConfig(), PromptConfig(system=f)) for f in SYSTEM_FAMILIES}
    assert len(texts) == len(SYSTEM_FAMILIES)


def test_direct_and_cot_answers_differ_in_instruction_schema_and_request():
    game = GameConfig(max_value=50)
    direct = system_prompt(game, PromptConfig(answer="direct"))
    cot = system_prompt(game, PromptConfig(answer="cot"))
    assert ANSWER_INSTRUCTIONS["direct"] in direct and "step by step" not in direct
    assert ANSWER_INSTRUCTIONS["cot"] in cot
    assert answer_schema(game, "direct")["required"] == ["guess"]
    schema = answer_schema(game, "cot")
    assert schema["required"] == ["reasoning", "guess"]  # reasoning first: think, then commit
    assert schema["properties"]["guess"]["maximum"] == 50
    assert user_prompt(1, "", (), answer="cot").endswith("Think step by step, then report your number.")


def test_a_cot_answer_parses_to_its_guess():
    assert parse_guess('{"reasoning": "others pick 33, so 22", "guess": 22}', 100) == 22.0


def test_population_note_only_when_asked():
    game = GameConfig()
    assert "The players are" not in system_prompt(game, PromptConfig(), "The players are 3 people.")
    assert "The players are 3 people." in system_prompt(game, PromptConfig(population_note=True),
                                                        "The players are 3 people.")


def test_user_prompt_uses_persona_memory_and_history():
    text = user_prompt(7, "30, 20", ((1, 40.0), (2, None)), persona="You are Ada.")
    assert text == "You are Ada. Winning numbers of previous rounds: 30, 20. Your previous numbers: 40. Report your number."
    assert user_prompt(7, "", ()).startswith("You are player 7.")
