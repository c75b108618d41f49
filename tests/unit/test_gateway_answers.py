"""The gateway's answer check (populace.gateway.schema_check): the JSON-schema keywords it checks
(type, required, properties, minimum/maximum, enum) and finite numbers; pattern and
additionalProperties are left to the replica's grammar and the simulation's parser."""

from __future__ import annotations

import pytest

from populace.gateway import schema_check as answers

GUESS = {"type": "object", "properties": {"guess": {"type": "number", "minimum": 0, "maximum": 100}},
         "required": ["guess"]}
COUNT = {"type": "object", "properties": {"reasoning": {"type": "string"},
                                          "n": {"type": "integer", "minimum": 0, "maximum": 20}},
         "required": ["reasoning", "n"]}
CHOICE = {"type": "object", "properties": {"choice": {"type": "string", "enum": ["a", "b"]}},
          "required": ["choice"], "additionalProperties": False}


@pytest.mark.parametrize(("schema", "text", "ok"), [
    (GUESS, '{"guess": 5}', True),
    (GUESS, '{"guess": 100}', True),
    (GUESS, '{"guess": 5.5, "other": 1}', True),
    (GUESS, '{"guess": -1}', False),
    (GUESS, '{"guess": 101}', False),
    (GUESS, '{"guess": NaN}', False),
    (GUESS, '{"guess": Infinity}', False),
    (GUESS, '{"guess": 1e999}', False),  # parsed as inf
    (GUESS, '{"guess": 1' + "0" * 400 + "}", False),  # a finite int too large for a float: out of range
    (GUESS, '{"guess": "5"}', False),
    (GUESS, '{"guess": true}', False),
    (GUESS, "{}", False),
    (GUESS, "5", False),
    (GUESS, "not json", False),
    (COUNT, '{"reasoning": "r", "n": 3}', True),
    (COUNT, '{"reasoning": "r", "n": 3.0}', True),
    (COUNT, '{"reasoning": "r", "n": 3.5}', False),
    (COUNT, '{"reasoning": 1, "n": 3}', False),
    (COUNT, '{"n": 3}', False),
    (CHOICE, '{"choice": "a", "x": 1}', True),  # additionalProperties: not the gateway's to check
    # an answer outside a categorical's options is re-asked, as an out-of-range number is (issue 25)
    (CHOICE, '{"choice": "c"}', False),
    (CHOICE, '{"choice": "A"}', False),
    ({"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}}, '{"n": true}', False),
    ({"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}}, '{"n": 2}', True),
    (CHOICE, '{"choice": 1}', False),
    (None, " x ", True),
    (None, "  ", False),
])
def test_check(schema, text, ok):
    assert answers.check(text, schema) is ok
