"""A run's cast: persona texts, the population note and shared personas (populace.population.cast)."""

from __future__ import annotations

import pytest

from populace.population import PopulationError
from populace.population.cast import cast_from_jsonl, cast_from_records, persona_text, population_note

RECORD = {"profile": {"education": "Ph.D.", "age": 52, "gender": "female", "occupation": "game theory professor"},
          "persona": {"name": "Ada Okafor", "gender": "female", "age": 52,
                      "description": "A careful thinker who enjoys puzzles"}}


def test_persona_text_states_fields_and_every_other_profile_attribute():
    text = persona_text(RECORD)
    assert text.startswith("You are Ada Okafor, 52 years old, female.")
    assert "Education: Ph.D." in text and "Occupation: game theory professor." in text
    assert text.endswith("A careful thinker who enjoys puzzles.")
    assert text.count("52") == 1  # age is not repeated from the profile


def test_population_note_gives_shares_and_ranges():
    profiles = [{"education": "Ph.D.", "age": 30}, {"education": "Ph.D.", "age": 50},
                {"education": "high school", "age": 41}, {"education": "bachelor's", "age": 60}]
    note = population_note(profiles, "players")
    assert note.startswith("The players are 4 people.")
    assert "Education: 50% Ph.D., 25% high school, 25% bachelor's." in note
    assert "Age: from 30 to 60." in note


def test_population_note_skips_high_cardinality_attributes():
    note = population_note([{"name": f"n{i}"} for i in range(50)])
    assert "Name" not in note


def test_cast_shares_identical_texts_and_computes_the_note():
    cast = cast_from_records([RECORD, RECORD, {"profile": {"education": "high school"}}])
    assert len(cast) == 3 and cast.personas[0] is cast.personas[1]  # one shared object, not a copy
    assert cast.personas[2].index == 2 and cast.personas[0].profile["education"] == "Ph.D."
    assert "Education: 67% Ph.D., 33% high school." in cast.note("players")
    assert cast.note().startswith("The population is 3 people.")


def test_cast_from_bad_jsonl_names_the_line():
    with pytest.raises(PopulationError, match=r"p:2: each line must be an object with a `profile`"):
        cast_from_jsonl(b'{"profile": {}}\n{"persona": {}}\n', "p")
    with pytest.raises(PopulationError, match=r"p:1: not valid JSON"):
        cast_from_jsonl(b'{nope\n', "p")


def test_equal_profiles_share_one_mapping_and_a_file_is_read_line_by_line():
    import json

    from populace.population.cast import cast_from_jsonl

    records = [{"profile": {"group": "a", "age": 30}, "persona": {"name": f"P{i}"}} for i in range(3)]
    records.append({"profile": {"age": 30, "group": "b"}, "persona": {"name": "Q"}})
    # a raw U+2028 inside a JSON string is not a line break
    records.append({"profile": {"group": "a", "age": 30}, "persona": {"name": "R", "description": "x\u2028y"}})
    data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records).encode()
    cast = cast_from_jsonl(data)
    assert len(cast) == 5
    p = cast.personas
    assert p[0].profile is p[1].profile is p[2].profile is p[4].profile
    assert p[3].profile is not p[0].profile and p[3].profile == {"age": 30, "group": "b"}
    assert p[0].text != p[1].text and "x\u2028y" in p[4].text
