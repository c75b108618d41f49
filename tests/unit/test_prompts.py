"""The prompt library: the paper's variants as pure functions of the scenario."""

from __future__ import annotations

import pytest

from populace.core.contracts import GameConfig, PromptConfig
from populace.games.cast import cast_from_jsonl, cast_from_records
from populace.games.parsing import parse_guess
from populace.games.prompts import (
    ANSWER_INSTRUCTIONS, SYSTEM_FAMILIES, answer_schema, persona_text, population_note, system_prompt,
    user_prompt,
)
from populace.population import PopulationError

RECORD = {"profile": {"education": "Ph.D.", "age": 52, "gender": "female", "occupation": "game theory professor"},
          "persona": {"name": "Ada Okafor", "gender": "female", "age": 52,
                      "description": "A careful thinker who enjoys puzzles"}}


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


def test_persona_text_states_fields_and_every_other_profile_attribute():
    text = persona_text(RECORD)
    assert text.startswith("You are Ada Okafor, 52 years old, female.")
    assert "Education: Ph.D." in text and "Occupation: game theory professor." in text
    assert text.endswith("A careful thinker who enjoys puzzles.")
    assert text.count("52") == 1  # age is not repeated from the profile


def test_user_prompt_uses_persona_memory_and_history():
    text = user_prompt(7, "30, 20", ((1, 40.0), (2, None)), persona="You are Ada.")
    assert text == "You are Ada. Winning numbers of previous rounds: 30, 20. Your previous numbers: 40. Report your number."
    assert user_prompt(7, "", ()).startswith("You are player 7.")


def test_population_note_gives_shares_and_ranges():
    profiles = [{"education": "Ph.D.", "age": 30}, {"education": "Ph.D.", "age": 50},
                {"education": "high school", "age": 41}, {"education": "bachelor's", "age": 60}]
    note = population_note(profiles)
    assert note.startswith("The players are 4 people.")
    assert "Education: 50% Ph.D., 25% high school, 25% bachelor's." in note
    assert "Age: from 30 to 60." in note


def test_population_note_skips_high_cardinality_attributes():
    note = population_note([{"name": f"n{i}"} for i in range(50)])
    assert "Name" not in note


def test_cast_shares_identical_texts_and_computes_the_note():
    cast = cast_from_records([RECORD, RECORD, {"profile": {"education": "high school"}}])
    assert len(cast) == 3 and cast.texts[0] is cast.texts[1]
    assert "Education: 67% Ph.D., 33% high school." in cast.note


def test_cast_from_bad_jsonl_names_the_line():
    with pytest.raises(PopulationError, match=r"p:2: each line must be an object with a `profile`"):
        cast_from_jsonl(b'{"profile": {}}\n{"persona": {}}\n', "p")
    with pytest.raises(PopulationError, match=r"p:1: not valid JSON"):
        cast_from_jsonl(b'{nope\n', "p")
