"""Scenario sections are validated by the opinion simulation's params; every error names its
field as the scenario wrote it."""

from __future__ import annotations

import pytest
from populace_opinion import Opinion
from populace_opinion.params import DEFAULT_STATEMENT, MAX_STATEMENT_CHARS
from pydantic import ValidationError

from populace.core.contracts import RunConfig
from populace.core.scenario import format_validation_error
from populace.sdk import load_simulation, resolve

GRAPH = {"generator": "small-world", "degree": 4}


def resolved(**sections):
    return resolve(RunConfig.model_validate({"simulation": "opinion", **sections}))


def error_of(**sections) -> str:
    with pytest.raises(ValidationError) as info:
        resolved(**sections)
    return format_validation_error(info.value)


def test_the_entry_point_names_the_class():
    assert load_simulation(Opinion.name) is Opinion
    tables = Opinion.tables()
    assert tables.outcomes == "opinion_outcomes" and tables.rounds == "opinion_rounds"
    assert [c.name for c in tables.outcome_columns] == ["stance", "heard", "heard_mean"]
    assert tables.measure == "stance" and tables.measure_kind == "numeric"


def test_defaults_discuss_a_statement_with_room_for_the_post():
    r = resolved()
    assert r.params.statement == DEFAULT_STATEMENT and r.params.extreme == 0.8
    assert (r.params.prompt.answer, r.params.prompt.persona, r.params.prompt.max_posts) == ("direct", True, 10)
    assert r.config.model.max_tokens == 96  # the platform's 48 would cut a 200-character post off
    assert resolved(prompt={"answer": "cot"}).config.model.max_tokens == 320
    assert resolved(prompt={"answer": "cot"}, model={"max_tokens": 500}).config.model.max_tokens == 500
    assert Opinion.tables_for(r.params).measure_range == (-1.0, 1.0)


def test_the_statement_is_trimmed_to_one_line():
    assert resolved(statement="  Taxes on meat\n are fair. ").params.statement == "Taxes on meat are fair."


@pytest.mark.parametrize(("sections", "expected"), [
    ({"statement": "   "}, "statement: must not be empty"),
    ({"statement": 3}, "statement: must be text, not int"),
    ({"statement": True}, "statement: must be text, not bool"),
    ({"statement": "x" * (MAX_STATEMENT_CHARS + 1)}, f"statement: must be at most {MAX_STATEMENT_CHARS} characters"),
    ({"extreme": 0}, "extreme: Input should be greater than 0"),
    ({"extreme": 1.5}, "extreme: Input should be less than or equal to 1"),
    ({"extreme": True}, "extreme:"),
    ({"extreme": "high"}, "extreme:"),
    ({"prompt": {"answer": "essay"}}, "prompt.answer:"),
    ({"prompt": {"persona": "maybe"}}, "prompt.persona:"),
    ({"prompt": {"max_posts": 0}}, "prompt.max_posts: Input should be greater than or equal to 1"),
    ({"prompt": {"max_posts": 1000}}, "prompt.max_posts: Input should be less than or equal to 100"),
    ({"prompt": {"max_post": 5}}, "prompt.max_post: unknown key"),
    ({"stance": 0.5}, "stance: unknown key"),
])
def test_bad_sections_name_the_field(sections, expected):
    assert error_of(**sections).startswith(expected)


def test_a_broadcast_may_only_carry_the_posts_fields():
    ok = {"round": 1, "text": "Ban them.", "fields": {"stance": 1}}
    assert resolved(graph=GRAPH, agents=20, broadcasts=[ok]).config.broadcasts[0].fields == {"stance": 1}
    assert resolved(graph=GRAPH, agents=20, broadcasts=[{"round": 1, "text": "News."}]).config.broadcasts
    bad_key = error_of(graph=GRAPH, agents=20, broadcasts=[ok, {**ok, "fields": {"stanse": 1}}])
    assert bad_key.startswith("broadcasts.1.fields.stanse: not a field of this simulation's post (its fields: stance)")
    assert error_of(graph=GRAPH, agents=20, broadcasts=[{**ok, "fields": {"stance": 2}}]).startswith(
        "broadcasts.0.fields.stance: must be a number from -1 to 1 (got 2)")
    assert error_of(graph=GRAPH, agents=20, broadcasts=[{**ok, "fields": {"stance": "yes"}}]).startswith(
        "broadcasts.0.fields.stance: must be a number from -1 to 1")
