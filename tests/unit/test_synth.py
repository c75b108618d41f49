"""The dummy model: answers that satisfy the request's JSON schema, seeded per (seed, round,
agent), independent of batching — and the ratio game's answers exactly as before the seam."""

from __future__ import annotations

import json

import pytest

from populace.core import synth
from populace.core.contracts import InferBatch, ModelConfig
from populace.core.synth import seeded_value
from populace.gateway.backends.dummy import DummyBackend

GUESS = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
         "required": ["guess"]}
COT = {"type": "object", "properties": {"reasoning": {"type": "string"}, **GUESS["properties"]},
       "required": ["reasoning", "guess"]}


def test_seeded_value_deterministic_and_in_range():
    for max_value in (0, 1, 10, 100, 1000):
        vals = [seeded_value(5, r, k, max_value) for r in (1, 2) for k in range(500)]
        assert vals == [seeded_value(5, r, k, max_value) for r in (1, 2) for k in range(500)]
        assert all(isinstance(v, int) and 0 <= v <= max_value for v in vals)
    assert {seeded_value(0, 1, k, 0) for k in range(50)} == {0}


def test_seeded_value_depends_on_seed_round_and_key():
    base = [seeded_value(1, 1, k, 100) for k in range(200)]
    assert base != [seeded_value(2, 1, k, 100) for k in range(200)]
    assert base != [seeded_value(1, 2, k, 100) for k in range(200)]
    many = [seeded_value(3, 1, k, 100) for k in range(5000)]
    assert min(many) == 0 and max(many) == 100 and 40 < sum(many) / len(many) < 60


def test_the_ratio_games_answers_are_what_they_were():
    # Before the seam the dummy backend answered f'{{"guess": {seeded_value(seed, round, key, 100)}}}';
    # recorded runs rerun on the dummy model must stay identical.
    for key in range(300):
        assert synth.answer(GUESS, 4, 2, key) == f'{{"guess": {seeded_value(4, 2, key, 100)}}}'
        # chain of thought draws its guess from the same stream: reasoning takes no draw
        assert json.loads(synth.answer(COT, 4, 2, key))["guess"] == seeded_value(4, 2, key, 100)


@pytest.mark.parametrize("schema,check", [
    ({"type": "integer", "minimum": 3, "maximum": 7}, lambda v: isinstance(v, int) and 3 <= v <= 7),
    ({"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 5}, lambda v: 1 <= v <= 4),
    ({"type": "number", "minimum": 2.5, "maximum": 3.5}, lambda v: v == 3),
    ({"type": "string", "enum": ["yes", "no", "abstain"]}, lambda v: v in ("yes", "no", "abstain")),
    ({"type": "boolean"}, lambda v: isinstance(v, bool)),
    ({"const": "fixed"}, lambda v: v == "fixed"),
    ({"type": ["integer", "null"], "minimum": 0, "maximum": 1}, lambda v: v in (0, 1)),
    ({"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "integer",
      "minimum": 0, "maximum": 9}}}}}, lambda v: 0 <= v["a"]["b"] <= 9),
])
def test_answers_satisfy_their_schema(schema, check):
    for key in range(100):
        assert check(json.loads(synth.answer(schema, 1, 1, key)))


def test_an_enum_is_spread_over_its_options_and_independent_draws_differ():
    schema = {"type": "object", "properties": {"choice": {"type": "string", "enum": ["a", "b", "c"]},
                                               "n": {"type": "integer", "minimum": 0, "maximum": 1000}}}
    answers = [json.loads(synth.answer(schema, 7, 1, k)) for k in range(600)]
    counts = {o: sum(a["choice"] == o for a in answers) for o in "abc"}
    assert all(150 < c < 250 for c in counts.values())
    assert sum(a["n"] % 3 == "abc".index(a["choice"]) for a in answers) < 300  # not the same draw


def test_no_schema_gives_plain_text():
    assert synth.answer(None, 1, 1, 5) == str(seeded_value(1, 1, 5, 100))


def batch(keys: list[int], round_: int = 1, seed: int = 4, schema: dict | None = GUESS) -> InferBatch:
    return InferBatch(batch_id="b", run_id="r1", round=round_, model=ModelConfig(latency_s=0, seed=seed),
                      system="sys", keys=keys, prompts=[f"p{k}" for k in keys], response_schema=schema)


async def test_dummy_backend_is_independent_of_batching():
    keys = list(range(40))
    whole = await DummyBackend().complete(batch(keys, round_=2))
    parts = await DummyBackend().complete(batch(keys[:13], round_=2)) + \
        await DummyBackend().complete(batch(keys[13:], round_=2))
    assert whole == parts
    assert await DummyBackend().complete(batch(keys[::-1], round_=2)) == whole[::-1]
    reply, calls = await DummyBackend().serve(batch(keys[:5], round_=2))
    assert reply.texts == whole[:5] and reply.error is None
    assert calls is None  # no LLM call happened, so nothing goes to llm_calls


@pytest.mark.parametrize("schema", [GUESS, COT, {
    "type": "object", "properties": {"choice": {"type": "string", "enum": ["a", "b"]}, "sure": {"type": "boolean"},
                                     "n": {"type": "integer", "minimum": 3, "maximum": 9}, "tag": {"const": "x"}}}])
def test_the_fast_path_for_flat_objects_writes_what_the_general_one_writes(schema):
    general = synth._compile(schema)
    fast = synth.renderer(schema)
    for key in range(200):
        text = fast(3, 2, key)
        assert text == general(synth._Draws(3, 2, key)) == json.dumps(json.loads(text))
